"""Workload operations the load generator replays (one op = one unit of the workload).

Each workload names its unit and primary throughput key as in the public
suite, so results compare with its tables. B3-B7 and B9 plug in here as their
runners land.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Protocol

from bench.http import Connection


@dataclass(frozen=True)
class OpResult:
    error: str | None = None  # client or infrastructure failure (non-2xx, not a program's failure)
    passed: bool | None = None  # graded outcome where the workload defines one
    channel: str | None = None  # per-task / per-query latency channel
    units: int = 1  # sub-units done by the op (B7: episodes), for throughput
    steps: int = 0  # B7: game steps done
    reward: float = 0.0  # B7: reward collected


class Workload(Protocol):
    id: str
    name: str
    unit: str
    throughput_key: str
    seed_base: int

    def setup(self) -> Any: ...

    async def op(self, conn: Connection, rng: random.Random, state: Any) -> OpResult: ...

    def failed(self, why: str) -> OpResult: ...

    def throughput(self, s: Any, duration_s: float) -> dict[str, Any]: ...

    def extra(self, s: Any) -> dict[str, Any]: ...


class CodeExec:
    """B1: one self-contained program (solution + asserts) per op; exit 0 = pass."""

    id, name, unit, throughput_key, seed_base = "B1", "codeexec", "exec", "executions_per_sec", 0xB1
    timeout_s = 10

    def setup(self) -> list[str]:
        from bench.corpus import b1

        programs = [p.source for p in b1()]
        random.Random(42).shuffle(programs)
        return programs

    async def op(self, conn: Connection, rng: random.Random, state: list[str]) -> OpResult:
        code = state[rng.randrange(len(state))]
        body = {"runner": "python", "action": {"code": code}, "timeout_s": self.timeout_s}
        status, result = await conn.request("POST", "/rollout/step", body)
        if status != 200:
            err = (result or {}).get("error") or {}
            return OpResult(error=f"HTTP {status} {err.get('code')}: {err.get('message')}")
        return OpResult(passed=bool(result["ok"]))

    def failed(self, why: str) -> OpResult:
        return OpResult(error=why)

    def throughput(self, s: Any, duration_s: float) -> dict[str, Any]:
        return {self.throughput_key: round(s.ops / duration_s, 3), "total_ops": s.ops}

    def extra(self, s: Any) -> dict[str, Any]:
        from bench.corpus import humaneval, mbpp

        he, mb = len(humaneval()), len(mbpp())
        return {
            "corpus_size": he + mb,
            "corpus_breakdown": {"humaneval": he, "mbpp_sanitized": mb, "fallback": 0},
            "snippet_timeout_sec": self.timeout_s,
            "pass_rate": round(s.passed / s.graded, 4) if s.graded else None,
            "graded": s.graded,
            "corpus_shuffle_seed": 42,
        }


class TextGame:
    """B7: one op = a batch of 10 episodes of 30-50 steps, played server-side by the scripted agent."""

    id, name, unit, throughput_key, seed_base = "B7", "textgame", "episode", "episodes_per_sec", 0xB7
    batch = 10

    def setup(self) -> None:
        return None

    async def op(self, conn: Connection, rng: random.Random, state: None) -> OpResult:
        steps = rng.randint(30, 50)
        action = {"op": "episodes", "seed": rng.randrange(2**30), "steps": steps, "batch": self.batch}
        status, result = await conn.request("POST", "/rollout/step", {"runner": "textgame", "action": action})
        if status != 200:
            err = (result or {}).get("error") or {}
            return OpResult(error=f"HTTP {status} {err.get('code')}: {err.get('message')}")
        obs = result["observation"]
        return OpResult(units=obs["episodes"], steps=obs["steps_done"], reward=obs["total_reward"])

    def failed(self, why: str) -> OpResult:
        return OpResult(error=why, units=0)

    def throughput(self, s: Any, duration_s: float) -> dict[str, Any]:
        return {
            self.throughput_key: round(s.units / duration_s, 3),
            "steps_per_sec": round(s.steps / duration_s, 1),
            "requests_per_sec": round(s.ops / duration_s, 3),
            "total_episodes": s.units,
            "total_steps": s.steps,
        }

    def extra(self, s: Any) -> dict[str, Any]:
        return {
            "episode_steps_range": [30, 50],
            "episodes_per_request": self.batch,
            "avg_steps_per_episode": round(s.steps / s.units, 2) if s.units else None,
            "avg_reward_per_episode": round(s.reward / s.units, 4) if s.units else None,
            "world_rooms": 8,
            "world_items": 30,
            "goal_templates": 6,
        }


class ToolCall:
    """B3: one op = one whole trajectory (~11.6 calls) in a fresh tools session, created and closed by the op."""

    id, name, unit, throughput_key, seed_base = "B3", "toolcall", "trajectory", "trajectories_per_sec", 0xB3

    def setup(self) -> list[tuple[str, list[tuple[str, dict[str, Any]]]]]:
        from bench.trajectories import build_pool

        return build_pool(42)

    async def op(self, conn: Connection, rng: random.Random, state: Any) -> OpResult:
        name, steps = state[rng.randrange(len(state))]
        status, info = await conn.request("POST", "/sessions", {"runner": "tools"})
        if status != 201:
            return OpResult(error=f"HTTP {status} creating a session: {(info or {}).get('error')}", channel=name)
        sid = info["session_id"]
        ok = True
        try:
            for tool, args in steps:
                body = {"runner": "tools", "action": {"tool": tool, "args": args}, "session_id": sid}
                status, result = await conn.request("POST", "/rollout/step", body)
                if status != 200:
                    err = (result or {}).get("error") or {}
                    return OpResult(error=f"HTTP {status} {err.get('code')}: {err.get('message')}", channel=name)
                ok = ok and result["observation"]["error"] is None
        finally:
            await conn.request("DELETE", f"/sessions/{sid}")
        return OpResult(passed=ok, channel=name, steps=len(steps))

    def failed(self, why: str) -> OpResult:
        return OpResult(error=why)

    def throughput(self, s: Any, duration_s: float) -> dict[str, Any]:
        return {
            self.throughput_key: round(s.ops / duration_s, 3),
            "tool_calls_per_sec": round(s.steps / duration_s, 1),
            "total_trajectories": s.ops,
            "total_tool_calls": s.steps,
        }

    def extra(self, s: Any) -> dict[str, Any]:
        from bench.stats import summary
        from bench.trajectories import TEMPLATES

        pool = self.setup()
        return {
            "trajectory_pool_size": len(pool),
            "trajectory_breakdown": {
                "templates": TEMPLATES,
                "seed": 42,
                "avg_steps": round(sum(len(x) for _, x in pool) / len(pool), 2),
            },
            "avg_steps_per_trajectory": round(s.steps / s.ops, 2) if s.ops else None,
            "pass_rate": round(s.passed / s.graded, 4) if s.graded else None,
            "per_template_latency_ms": {k: summary(v) for k, v in sorted(s.channels.items())},
            "note": "each op also creates and closes its session (2 of its HTTP calls)",
        }


class SQLExec:
    """B5: one TPC-H query (Q1-Q22, uniformly drawn) per op on the node's shared data; per-query channels."""

    id, name, unit, throughput_key, seed_base = "B5", "sqlexec", "query", "queries_per_sec", 0xB5

    def setup(self) -> None:
        return None

    async def op(self, conn: Connection, rng: random.Random, state: None) -> OpResult:
        n = rng.randint(1, 22)
        status, result = await conn.request(
            "POST", "/rollout/step", {"runner": "sql", "action": {"tpch": n}, "timeout_s": 60}
        )
        channel = f"Q{n:02d}"
        if status != 200:
            err = (result or {}).get("error") or {}
            return OpResult(error=f"HTTP {status} {err.get('code')}: {err.get('message')}", channel=channel)
        return OpResult(passed=bool(result["ok"]), channel=channel)

    def failed(self, why: str) -> OpResult:
        return OpResult(error=why)

    def throughput(self, s: Any, duration_s: float) -> dict[str, Any]:
        return {self.throughput_key: round(s.ops / duration_s, 3), "total_queries": s.ops}

    def extra(self, s: Any) -> dict[str, Any]:
        from bench.stats import summary

        return {
            "queries": 22,
            "pass_rate": round(s.passed / s.graded, 4) if s.graded else None,
            "per_query_latency_ms": {k: summary(v) for k, v in sorted(s.channels.items())},
            "scale_factor_note": "the node's SANDBOXD_SQL__SCALE_FACTOR; embedded: smoke 0.01, quick 0.1, full 1",
        }


WORKLOADS: dict[str, Workload] = {"B1": CodeExec(), "B3": ToolCall(), "B5": SQLExec(), "B7": TextGame()}
