"""The workload registry: what ``sandboxd bench`` and the baseline comparisons replay.

A workload names itself (id, name, title, unit, throughput key, seeds as the
public suite does, so results compare with its tables), generates its
operations (``setup``: the corpus or trajectory pool, built once per load
process) and checks each one (``op`` grades the result: ``passed``). One op is
one unit of the workload (a program, a trajectory, a query, a batch of
episodes). ``listed`` workloads are what ``sandboxd bench`` offers; the others
exist for comparisons (``bench/python_vs_baseline.py``) and share the same
load generator (``loadgen.py``).

Adding a workload is a class here and one line in ``WORKLOADS``.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from sandboxd.bench.http import Connection
from sandboxd.bench.stats import summary


@dataclass(frozen=True)
class OpResult:
    error: str | None = None  # client or infrastructure failure (non-2xx, not a program's failure)
    passed: bool | None = None  # graded outcome where the workload defines one
    channel: str | None = None  # per-task / per-query latency channel
    units: int = 1  # sub-units done by the op (B7: episodes), for throughput
    steps: int = 0  # B3: tool calls, B4: actions, B7: game steps
    reward: float = 0.0  # B7: reward collected
    misses: int = 0  # B4: actions that failed (selector misses, by design of the suite's templates)


@dataclass
class Loop:
    """One closed loop of the load generator: its connection, its RNG, what ``setup`` built, its own state."""

    conn: Connection
    rng: random.Random
    shared: Any
    options: dict[str, Any]
    index: int
    state: dict[str, Any] = field(default_factory=dict)


@dataclass
class Samples:
    """What one level collected, merged over the load processes."""

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
    error_examples: list[str] = field(default_factory=list)

    @property
    def pass_rate(self) -> float | None:
        return round(self.passed / self.graded, 4) if self.graded else None


def http_error(status: int, body: Any, what: str = "") -> str:
    err = (body or {}).get("error") or {} if isinstance(body, dict) else {}
    return f"HTTP {status}{what} {err.get('code')}: {err.get('message')}"


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


def pool_breakdown(pool: list[tuple[str, list[Any]]], templates: dict[str, int], seed: int, avg: str) -> dict[str, Any]:
    """How a seeded pool of trajectories is made up, in the public suite's keys."""
    mean = round(sum(len(x) for _, x in pool) / len(pool), 2)
    return {
        "trajectory_pool_size": len(pool),
        "trajectory_breakdown": {"templates": templates, "seed": seed, avg: mean},
    }


async def step(loop: Loop, body: dict[str, Any]) -> tuple[int, Any]:
    return await loop.conn.request("POST", "/rollout/step", body)


class CodeExec(Workload):
    """B1: one self-contained program (solution + asserts) per op; exit 0 = pass."""

    id, name, title, unit = "B1", "codeexec", "CodeExec", "exec"
    rate_unit = "exec/s"
    runners = ("python",)
    throughput_key, seed_base = "executions_per_sec", 0xB1
    timeout_s = 10

    def setup(self, options: dict[str, Any]) -> list[str]:
        from sandboxd.bench.corpus import b1

        exclude = set(options.get("exclude", ()))
        programs = [p.source for p in b1() if p.task_id not in exclude]
        random.Random(42).shuffle(programs)
        return programs

    async def op(self, loop: Loop) -> OpResult:
        code = loop.shared[loop.rng.randrange(len(loop.shared))]
        body: dict[str, Any] = {"runner": "python", "action": {"code": code}, "timeout_s": self.timeout_s}
        if "session_id" in loop.state:
            body["session_id"] = loop.state["session_id"]
        status, result = await step(loop, body)
        if status != 200:
            return OpResult(error=http_error(status, result))
        return OpResult(passed=bool(result["ok"]))

    def extra(self, s: Samples) -> dict[str, Any]:
        from sandboxd.bench.corpus import humaneval, mbpp

        he, mb = len(humaneval()), len(mbpp())
        return {
            "corpus_size": he + mb,
            "corpus_breakdown": {"humaneval": he, "mbpp_sanitized": mb, "fallback": 0},
            "snippet_timeout_sec": self.timeout_s,
            "pass_rate": s.pass_rate,
            "graded": s.graded,
            "corpus_shuffle_seed": 42,
        }


class CodeExecSession(CodeExec):
    """B1's programs, each loop running them one after another in its own Python session."""

    id, name, title = "B1-session", "codeexec_session", "CodeExec in a session"
    listed = False

    async def begin(self, loop: Loop) -> None:
        status, info = await loop.conn.request("POST", "/sessions", {"runner": "python"})
        if status != 201:
            raise ConnectionError(http_error(status, info, " creating a session"))
        loop.state["session_id"] = info["session_id"]

    async def end(self, loop: Loop) -> None:
        if "session_id" in loop.state:
            await loop.conn.request("DELETE", f"/sessions/{loop.state['session_id']}")


class CodeExecBaseline(CodeExec):
    """B1's programs as a plain worker runs them: ``prlimit --cpu --as python -c`` per op, no HTTP."""

    id, name, title = "B1-baseline", "codeexec_prlimit", "CodeExec via prlimit python -c"
    listed = False

    async def op(self, loop: Loop) -> OpResult:
        code = loop.shared[loop.rng.randrange(len(loop.shared))]
        argv = [loop.options["python"], "-c", code]
        prlimit = shutil.which("prlimit")
        if prlimit:
            argv = [prlimit, "--cpu=10", f"--as={2 << 30}", *argv]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        try:
            ok = await asyncio.wait_for(proc.wait(), self.timeout_s) == 0
        except TimeoutError:
            proc.kill()
            await proc.wait()
            ok = False
        return OpResult(passed=ok)


class ToolCall(Workload):
    """B3: one op = one whole trajectory (~11.6 calls) in a fresh tools session, created and closed by the op."""

    id, name, title, unit = "B3", "toolcall", "ToolCall", "trajectory"
    rate_unit = "traj/s"
    runners = ("tools",)
    throughput_key, seed_base = "trajectories_per_sec", 0xB3

    def setup(self, options: dict[str, Any]) -> list[tuple[str, list[tuple[str, dict[str, Any]]]]]:
        from sandboxd.bench.trajectories import build_pool

        return build_pool(42)

    async def op(self, loop: Loop) -> OpResult:
        name, steps = loop.shared[loop.rng.randrange(len(loop.shared))]
        status, info = await loop.conn.request("POST", "/sessions", {"runner": "tools"})
        if status != 201:
            return OpResult(error=http_error(status, info, " creating a session"), channel=name)
        sid = info["session_id"]
        ok = True
        try:
            for tool, args in steps:
                body = {"runner": "tools", "action": {"tool": tool, "args": args}, "session_id": sid}
                status, result = await step(loop, body)
                if status != 200:
                    return OpResult(error=http_error(status, result), channel=name)
                ok = ok and result["observation"]["error"] is None
        finally:
            await loop.conn.request("DELETE", f"/sessions/{sid}")
        return OpResult(passed=ok, channel=name, steps=len(steps))

    def throughput(self, s: Samples, duration_s: float) -> dict[str, Any]:
        return {
            self.throughput_key: round(s.ops / duration_s, 3),
            "tool_calls_per_sec": round(s.steps / duration_s, 1),
            "total_trajectories": s.ops,
            "total_tool_calls": s.steps,
        }

    def extra(self, s: Samples) -> dict[str, Any]:
        from sandboxd.bench.trajectories import TEMPLATES

        return {
            **pool_breakdown(self.setup({}), TEMPLATES, 42, "avg_steps"),
            "avg_steps_per_trajectory": round(s.steps / s.ops, 2) if s.ops else None,
            "pass_rate": s.pass_rate,
            "per_template_latency_ms": {k: summary(v) for k, v in sorted(s.channels.items())},
            "note": "each op also creates and closes its session (2 of its HTTP calls)",
        }


class SQLExec(Workload):
    """B5: one TPC-H query (Q1-Q22, uniformly drawn) per op on the node's shared data; per-query channels."""

    id, name, title, unit = "B5", "sqlexec", "SQLExec", "query"
    rate_unit = "queries/s"
    runners = ("sql",)
    throughput_key, seed_base = "queries_per_sec", 0xB5

    async def op(self, loop: Loop) -> OpResult:
        n = loop.rng.randint(1, 22)
        status, result = await step(loop, {"runner": "sql", "action": {"tpch": n}, "timeout_s": 60})
        channel = f"Q{n:02d}"
        if status != 200:
            return OpResult(error=http_error(status, result), channel=channel)
        return OpResult(passed=bool(result["ok"]), channel=channel)

    def throughput(self, s: Samples, duration_s: float) -> dict[str, Any]:
        return {self.throughput_key: round(s.ops / duration_s, 3), "total_queries": s.ops}

    def extra(self, s: Samples) -> dict[str, Any]:
        return {
            "queries": 22,
            "pass_rate": s.pass_rate,
            "per_query_latency_ms": {k: summary(v) for k, v in sorted(s.channels.items())},
            "scale_factor_note": "the node's SANDBOXD_SQL__SCALE_FACTOR; embedded: smoke 0.01, quick 0.1, full 1",
        }


class TextGame(Workload):
    """B7: one op = a batch of 10 episodes of 30-50 steps, played server-side by the scripted agent."""

    id, name, title, unit = "B7", "textgame", "Sim-TextGame", "episode"
    rate_unit = "episodes/s"
    runners = ("textgame",)
    throughput_key, seed_base = "episodes_per_sec", 0xB7
    batch = 10

    async def op(self, loop: Loop) -> OpResult:
        steps = loop.rng.randint(30, 50)
        action = {"op": "episodes", "seed": loop.rng.randrange(2**30), "steps": steps, "batch": self.batch}
        status, result = await step(loop, {"runner": "textgame", "action": action})
        if status != 200:
            return OpResult(error=http_error(status, result), units=0)
        obs = result["observation"]
        return OpResult(units=obs["episodes"], steps=obs["steps_done"], reward=obs["total_reward"])

    def throughput(self, s: Samples, duration_s: float) -> dict[str, Any]:
        return {
            self.throughput_key: round(s.units / duration_s, 3),
            "steps_per_sec": round(s.steps / duration_s, 1),
            "requests_per_sec": round(s.ops / duration_s, 3),
            "total_episodes": s.units,
            "total_steps": s.steps,
        }

    def extra(self, s: Samples) -> dict[str, Any]:
        return {
            "episode_steps_range": [30, 50],
            "episodes_per_request": self.batch,
            "avg_steps_per_episode": round(s.steps / s.units, 2) if s.units else None,
            "avg_reward_per_episode": round(s.reward / s.units, 4) if s.units else None,
            "world_rooms": 8,
            "world_items": 30,
            "goal_templates": 6,
        }


class Browser(Workload):
    """B4: one op = one whole trajectory of browser actions in a fresh context (a one-shot step)."""

    id, name, title, unit = "B4", "browser", "Browser", "trajectory"
    rate_unit = "traj/s"
    throughput_key, seed_base = "trajectories_per_sec", 0xB4
    runners: ClassVar[tuple[str, ...]] = ("browser",)
    min_duration_s = 12.0
    seed = 42

    def setup(self, options: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
        from sandboxd.bench.browser_trajectories import build_pool

        return build_pool(int(options.get("b4_seed", self.seed)))

    async def op(self, loop: Loop) -> OpResult:
        name, actions = loop.shared[loop.rng.randrange(len(loop.shared))]
        status, result = await step(loop, {"runner": "browser", "action": {"actions": actions}, "timeout_s": 120})
        if status != 200:
            return OpResult(error=http_error(status, result), channel=name)
        obs = result["observation"]
        return OpResult(channel=name, steps=len(obs["results"]), misses=obs["actions_failed"])

    def throughput(self, s: Samples, duration_s: float) -> dict[str, Any]:
        return {
            self.throughput_key: round(s.ops / duration_s, 3),
            "actions_per_sec": round(s.steps / duration_s, 2),
            "total_trajectories": s.ops,
            "total_actions": s.steps,
        }

    def extra(self, s: Samples) -> dict[str, Any]:
        from sandboxd.bench.browser_trajectories import TEMPLATES

        return {
            **pool_breakdown(self.setup({}), TEMPLATES, self.seed, "avg_actions"),
            "selector_miss_rate": round(s.misses / s.steps, 4) if s.steps else None,
            "steps_done_total": s.steps - s.misses,
            "steps_failed_total": s.misses,
            "per_template_latency_ms": {k: summary(v) for k, v in sorted(s.channels.items())},
            "note": "warm-up ops are not counted (the public suite counts them); each trajectory runs in a "
            "fresh browser context (the suite reuses pooled contexts and keeps their localStorage)",
        }


class BrowserBaseline(Browser):
    """B4's trajectories against a replica of the public suite's worker (``baselines/b4_worker.py``).

    Same pool, same RNG draws, the suite's request shape and its client habit: a new connection
    per request (``Connection: close``). ``options["site_url"]`` is the static server of the shop.
    """

    id, name, title = "B4-baseline", "browser_suite_worker", "Browser via the suite's worker"
    listed = False
    runners = ()

    async def op(self, loop: Loop) -> OpResult:
        name, actions = loop.shared[loop.rng.randrange(len(loop.shared))]
        steps = [{"action": a["action"], "args": {k: v for k, v in a.items() if k != "action"}} for a in actions]
        try:
            status, result = await loop.conn.request(
                "POST", "/task", {"target_url": loop.options["site_url"], "steps": steps}
            )
        finally:
            await loop.conn.close()
        if status != 200:
            return OpResult(error=f"HTTP {status}: {str(result)[:200]}", channel=name)
        return OpResult(channel=name, steps=result["actions"], misses=result["steps_failed"])


class ColdStart(Workload):
    """B8: a fresh isolated sandbox running ``print(1)``; N trials, not a time window (``coldstart.py``)."""

    id, name, title, unit = "B8", "coldstart", "ColdStart", "start"
    rate_unit = "starts/s"
    runners = ("python",)
    throughput_key, seed_base = "container_starts_per_sec", 0xB8
    mode = "trials"


WORKLOADS: dict[str, Workload] = {
    w.id: w
    for w in (
        CodeExec(),
        ToolCall(),
        Browser(),
        BrowserBaseline(),
        SQLExec(),
        TextGame(),
        ColdStart(),
        CodeExecSession(),
        CodeExecBaseline(),
    )
}


def listed() -> list[str]:
    """The ids ``sandboxd bench`` offers, in registry order."""
    return [k for k, w in WORKLOADS.items() if w.listed]


def real_python() -> str:
    """The interpreter running this process, resolved past any pyenv shim (~100 ms per start)."""
    import sys

    return os.path.realpath(sys.executable)
