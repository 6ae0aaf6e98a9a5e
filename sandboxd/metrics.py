"""Prometheus metrics: one registry per app (no module globals), rendered at /metrics.

Step latency is a histogram per runner and outcome with buckets fine enough for
p99 between 1 ms and 1 s. Pool occupancy and sandbox starts come from the
workers' last health answer, collected at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sandboxd.constants import LATENCY_BUCKETS_S


class _WorkerCollector(Collector):
    def __init__(self, snapshot: Callable[[], list[tuple[int, dict[str, Any]]]], replays: Callable[[], int]) -> None:
        self.snapshot = snapshot
        self.replays = replays

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
        for index, health in self.snapshot():
            for runner, h in (health.get("runners") or {}).items():
                w = str(index)
                cap = int(h.get("capacity", 0))
                free = int(h.get("free_slots", cap))
                slots.add_metric([runner, w, "free"], free)
                slots.add_metric([runner, w, "busy"], cap - free)
                sessions.add_metric([runner, w], int(h.get("sessions", 0)))
                if "sandbox_starts" in h:
                    starts.add_metric([runner, w, "sandbox"], int(h["sandbox_starts"]))
                if "jail_starts" in h:
                    starts.add_metric([runner, w, "jail"], int(h["jail_starts"]))
        yield slots
        yield starts
        yield sessions
        yield CounterMetricFamily(
            "sandboxd_idempotent_replays", "Requests answered from the idempotency store", value=self.replays()
        )


class Metrics:
    def __init__(
        self, worker_snapshot: Callable[[], list[tuple[int, dict[str, Any]]]], replays: Callable[[], int]
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.step_latency = Histogram(
            "sandboxd_step_latency_seconds",
            "Step latency at the gateway (queue + execution), by runner and outcome",
            ["runner", "outcome"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.queue_depth = Gauge("sandboxd_queue_depth", "Steps waiting for a slot", ["runner"], registry=r)
        self.inflight = Gauge("sandboxd_inflight_steps", "Steps running now", ["runner"], registry=r)
        self.kills = Counter("sandboxd_kills_total", "Programs killed at a limit", ["runner", "limit"], registry=r)
        self.limits_hit = Counter(
            "sandboxd_limits_hit_total", "Limits a program ran into", ["runner", "limit"], registry=r
        )
        self.rejected = Counter(
            "sandboxd_rejected_total", "Steps refused at admission", ["runner", "reason"], registry=r
        )
        self.sessions = Gauge("sandboxd_sessions", "Live sessions", ["runner"], registry=r)
        self.sessions_reaped = Counter(
            "sandboxd_sessions_reaped_total", "Sessions closed by the reaper", ["reason"], registry=r
        )
        self.worker_restarts = Counter(
            "sandboxd_worker_restarts_total", "Workers replaced after dying or hanging", registry=r
        )
        self.forks = Counter(
            "sandboxd_forks_total", "Sessions forked (one per fork, whatever its n)", ["runner"], registry=r
        )
        self.forwarded = Counter(
            "sandboxd_forwarded_total",
            "Session requests forwarded to the node that owns the session, by operation and outcome "
            "('answered', or the error code of the hop: node_unreachable, session_lost, store_unavailable)",
            ["op", "outcome"],
            registry=r,
        )
        r.register(_WorkerCollector(worker_snapshot, replays))

    def observe_step(
        self, runner: str, outcome: str, seconds: float, killed_by: str | None, limits_hit: tuple[str, ...]
    ) -> None:
        self.step_latency.labels(runner, outcome).observe(seconds)
        if killed_by:
            self.kills.labels(runner, killed_by).inc()
        for limit in limits_hit:
            self.limits_hit.labels(runner, limit).inc()
