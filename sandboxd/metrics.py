"""Prometheus metrics: one node's view across its processes.

Steps are counted where they run, in the workers; forwarded requests and idempotent replays where they
are taken, in the front processes. Each writes its values to files in the node's metrics directory
(prometheus-client's multiprocess mode: ``PROMETHEUS_MULTIPROC_DIR``, set by the node for every process
it starts), and ``/metrics`` on any front sums them, so a scrape of any front process is the node's.
What only the node process knows (worker restarts, pool occupancy and queues from the workers' last
pings) is added at scrape time from its status.

Step latency is a histogram per runner and outcome with buckets fine enough for p99 between 1 ms and 1 s.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from sandboxd.constants import LATENCY_BUCKETS_S

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def _step_latency() -> Histogram:
    """Steps are counted where they end: in a worker, or in the front that refused or lost them."""
    return Histogram(
        "sandboxd_step_latency_seconds",
        "Step latency from the front's arrival to the answer (queue + execution), by runner and outcome",
        ["runner", "outcome"],
        buckets=LATENCY_BUCKETS_S,
        registry=None,
    )


class WorkerMetrics:
    """What a worker counts (its values go to the node's metrics directory)."""

    def __init__(self, index: int) -> None:
        self.step_latency = _step_latency()
        self.kills = Counter("sandboxd_kills_total", "Programs killed at a limit", ["runner", "limit"], registry=None)
        self.limits_hit = Counter(
            "sandboxd_limits_hit_total", "Limits a program ran into", ["runner", "limit"], registry=None
        )
        self.rejected = Counter(
            "sandboxd_rejected_total", "Steps refused at admission", ["runner", "reason"], registry=None
        )
        self.sessions = Gauge(
            "sandboxd_sessions", "Live sessions", ["runner"], registry=None, multiprocess_mode="livesum"
        )
        self.sessions_reaped = Counter(
            "sandboxd_sessions_reaped_total", "Sessions closed by the reaper", ["reason"], registry=None
        )
        self.forks = Counter(
            "sandboxd_forks_total", "Sessions forked (one per fork, whatever its n)", ["runner"], registry=None
        )

    def observe_step(
        self, runner: str, outcome: str, seconds: float, killed_by: str | None, limits_hit: tuple[str, ...]
    ) -> None:
        self.step_latency.labels(runner, outcome).observe(seconds)
        if killed_by:
            self.kills.labels(runner, killed_by).inc()
        for limit in limits_hit:
            self.limits_hit.labels(runner, limit).inc()


class FrontMetrics:
    """What a front process counts."""

    def __init__(self) -> None:
        self.forwarded = Counter(
            "sandboxd_forwarded_total",
            "Session requests forwarded to the node that owns the session, by operation and outcome "
            "('answered', or the error code of the hop: node_unreachable, session_lost, store_unavailable)",
            ["op", "outcome"],
            registry=None,
        )
        self.replays = Counter(
            "sandboxd_idempotent_replays_total", "Requests answered from the idempotency store", registry=None
        )
        self.step_latency = _step_latency()
        self.rejected = Counter(
            "sandboxd_rejected_total", "Steps refused at admission", ["runner", "reason"], registry=None
        )


class _NodeCollector(Collector):
    """The node process's figures, from its status (collected once per scrape)."""

    def __init__(self, status: dict[str, Any]) -> None:
        self.status = status

    def collect(self) -> Iterable[Metric]:
        slots = GaugeMetricFamily(
            "sandboxd_pool_slots", "Warm sandbox slots per worker and state", labels=["runner", "worker", "state"]
        )
        starts = CounterMetricFamily(
            "sandboxd_sandbox_starts",
            "Sandboxes (jails and per-execution sandboxes) started",
            labels=["runner", "worker", "what"],
        )
        sessions = GaugeMetricFamily(
            "sandboxd_worker_sessions", "Live sessions held by each worker", labels=["runner", "worker"]
        )
        queue = GaugeMetricFamily("sandboxd_queue_depth", "Steps waiting for a slot", labels=["runner"])
        inflight = GaugeMetricFamily("sandboxd_inflight_steps", "Steps running now", labels=["runner"])
        queued: dict[str, int] = {}
        running: dict[str, int] = {}
        for w in self.status.get("workers", []):
            health = w.get("health") or {}
            for runner, h in (health.get("runners") or {}).items():
                idx = str(w["index"])
                cap = int(h.get("capacity", 0))
                free = int(h.get("free_slots", cap))
                slots.add_metric([runner, idx, "free"], free)
                slots.add_metric([runner, idx, "busy"], cap - free)
                sessions.add_metric([runner, idx], int(h.get("sessions", 0)))
                if "sandbox_starts" in h:
                    starts.add_metric([runner, idx, "sandbox"], int(h["sandbox_starts"]))
                if "jail_starts" in h:
                    starts.add_metric([runner, idx, "jail"], int(h["jail_starts"]))
            for runner, n in (health.get("queue") or {}).items():
                queued[runner] = queued.get(runner, 0) + int(n)
            for runner, n in (health.get("inflight") or {}).items():
                running[runner] = running.get(runner, 0) + int(n)
        for runner, n in queued.items():
            queue.add_metric([runner], n)
        for runner, n in running.items():
            inflight.add_metric([runner], n)
        yield slots
        yield starts
        yield sessions
        yield queue
        yield inflight
        yield CounterMetricFamily(
            "sandboxd_worker_restarts", "Workers replaced after dying or hanging", value=self.status.get("restarts", 0)
        )


def render(status: dict[str, Any]) -> bytes:
    """The node's metrics in Prometheus text format: every process's values and the node's status."""
    registry = CollectorRegistry()
    path = os.environ.get(MULTIPROC_ENV)
    if path:
        MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    registry.register(_NodeCollector(status))
    return generate_latest(registry)
