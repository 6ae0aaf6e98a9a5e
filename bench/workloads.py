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


class Workload(Protocol):
    id: str
    name: str
    unit: str
    throughput_key: str

    def setup(self) -> Any: ...

    async def op(self, conn: Connection, rng: random.Random, state: Any) -> OpResult: ...

    def failed(self, why: str) -> OpResult: ...


class CodeExec:
    """B1: one self-contained program (solution + asserts) per op; exit 0 = pass."""

    id, name, unit, throughput_key = "B1", "codeexec", "exec", "executions_per_sec"
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


WORKLOADS: dict[str, Workload] = {"B1": CodeExec()}
