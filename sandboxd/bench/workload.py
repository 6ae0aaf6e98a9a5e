"""What every workload is made of: one op's result, a load loop, the samples a level collects, and the
``Workload`` base class that names a workload, builds its pool and runs and grades one op (``workloads.py``
has the workloads themselves)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from sandboxd.bench.stats import summary
from sandboxd.wire import Connection


@dataclass(frozen=True)
class OpResult:
    error: str | None = None  # client or infrastructure failure (non-2xx, not a program's failure)
    status: int | None = None  # with error: the HTTP status that made it one (None: a transport error)
    passed: bool | None = None  # graded outcome where the workload defines one
    channel: str | None = None  # per-task / per-query latency channel
    units: int = 1  # sub-units done by the op (B7: episodes), for throughput
    steps: int = 0  # B3: tool calls, B4: actions, B7: game steps
    reward: float = 0.0  # B7: reward collected
    misses: int = 0  # B4: actions that failed (selector misses, by design of the suite's templates)
    subs: tuple[tuple[str, float], ...] = ()  # B9: (task, ms) of each sub-operation, for per-task channels
    blame: str | None = None  # with error: whose failure the server said it was (client, infra, ...)


@dataclass
class Loop:
    """One closed loop of the load generator: its connection, its RNG, what ``setup`` built, its own state."""

    conn: Connection
    rng: random.Random
    shared: Any
    options: dict[str, Any]
    index: int
    state: dict[str, Any] = field(default_factory=dict)
    target: str = ""  # the node it drives (a URL without credentials)


@dataclass
class TargetTally:
    """One node's share of a level driven over several (``--target`` given more than once)."""

    ops: int = 0
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)

    def merge(self, other: TargetTally) -> None:
        self.ops += other.ops
        self.errors += other.errors
        self.latencies_ms += other.latencies_ms


@dataclass
class Samples:
    """What one level collected, merged over the load processes. ``ops`` and the latencies are the ops that
    completed; an op answered with a non-2xx status (or a transport error) is an error, never an op."""

    latencies_ms: list[float] = field(default_factory=list)
    channels: dict[str, list[float]] = field(default_factory=dict)
    ops: int = 0
    errors: int = 0
    passed: int = 0
    graded: int = 0
    units: int = 0
    steps: int = 0
    reward: float = 0.0
    misses: int = 0
    client_cpu_s: float = 0.0
    nprocs: int = 0
    window: tuple[float, float] | None = None  # monotonic [from, to) the ops were counted in (all processes)
    error_examples: list[str] = field(default_factory=list)
    errors_by_blame: dict[str, int] = field(default_factory=dict)
    errors_by_status: dict[str, int] = field(default_factory=dict)  # "401", "503", "transport", ...
    by_target: dict[str, TargetTally] = field(default_factory=dict)

    @property
    def pass_rate(self) -> float | None:
        return round(self.passed / self.graded, 4) if self.graded else None

    @property
    def error_rate(self) -> float:
        attempts = self.ops + self.errors
        return self.errors / attempts if attempts else 0.0


def _error_of(body: Any) -> dict[str, Any]:
    err = (body or {}).get("error") if isinstance(body, dict) else None
    return err if isinstance(err, dict) else {}


def http_error(status: int, body: Any, what: str = "") -> str:
    err = _error_of(body)
    return f"HTTP {status}{what} {err.get('code')}: {err.get('message')}"


def http_failure(status: int, body: Any, what: str = "", **fields: Any) -> OpResult:
    """A non-2xx answer as an op's result: the error line and whose failure the server said it was."""
    return OpResult(error=http_error(status, body, what), blame=_error_of(body).get("blame"), status=status, **fields)


class Workload:
    id: ClassVar[str]
    name: ClassVar[str]
    title: ClassVar[str]
    unit: ClassVar[str]  # one op's unit, singular
    rate_unit: ClassVar[str]  # how throughput reads in tables and plots
    throughput_key: ClassVar[str]
    seed_base: ClassVar[int]
    mode: ClassVar[Literal["timed", "trials"]] = "timed"
    listed: ClassVar[bool] = True
    runners: ClassVar[tuple[str, ...]] = ()  # the kinds an embedded node must enable for it
    min_duration_s: ClassVar[float] = 0.0  # a shorter measure window (smoke) is stretched to this

    def setup(self, options: dict[str, Any]) -> Any:
        """Build what every loop draws from (once per load process)."""
        return None

    async def begin(self, loop: Loop) -> None:
        """Before a loop's first op (e.g. open a session)."""

    async def end(self, loop: Loop) -> None:
        """After a loop's last op (e.g. close its session)."""

    async def op(self, loop: Loop) -> OpResult:
        raise NotImplementedError

    def throughput(self, s: Samples, duration_s: float) -> dict[str, Any]:
        return {self.throughput_key: round(s.ops / duration_s, 3), "total_ops": s.ops}

    def extra(self, s: Samples) -> dict[str, Any]:
        return {}

    def latency(self, s: Samples) -> dict[str, Any]:
        """The result's ``latency_ms`` block (its flat p50/p99... are what tables and sizing read)."""
        return summary(s.latencies_ms, s.errors)


def pool_breakdown(pool: list[tuple[str, list[Any]]], templates: dict[str, int], seed: int, avg: str) -> dict[str, Any]:
    """How a seeded pool of trajectories is made up, in the public suite's keys."""
    mean = round(sum(len(x) for _, x in pool) / len(pool), 2)
    return {
        "trajectory_pool_size": len(pool),
        "trajectory_breakdown": {"templates": templates, "seed": seed, avg: mean},
    }


async def step(loop: Loop, body: dict[str, Any]) -> tuple[int, Any]:
    """One step; inside a B9 rollout it carries the rollout's id (rollout-aware scheduling)."""
    if "rollout_id" in loop.state:
        body = {**body, "rollout_id": loop.state["rollout_id"]}
    return await loop.conn.request("POST", "/rollout/step", body)
