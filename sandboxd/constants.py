"""Named constants with their units; configuration lives in config.py, not here."""

from __future__ import annotations

# Buckets fine enough that p99 between 1 ms and 1 s can be read off a histogram.
LATENCY_BUCKETS_S = (
    0.0005,
    0.001,
    0.0015,
    0.002,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.0125,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.125,
    0.15,
    0.2,
    0.25,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    3.0,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
WORKER_RESTART_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)
IPC_MAX_FRAME_BYTES = 512 << 20
SESSION_ID_BYTES = 12
CLOSED_REASONS_KEPT = 10_000  # ended sessions remembered, so a late step's 404 can say why
LOST_SESSION_KEPT_S = 60.0  # a lost session leaves the table this long after its last use (it still answers 410)
SESSION_HOME = "/home/user"  # a python session's /tmp again, under the name E2B's sandboxes give their home
