"""B8 ColdStart: a fresh isolated sandbox running a trivial program, N trials.

Trials, not a time window (as in the public suite): a semaphore keeps ``c`` in
flight; latency is the wall clock of one step to its result; throughput is
successes / wall. Run against a node with its warm pool (what users see) and,
when sandboxd is embedded, against a second node with ``warm_pool=false``,
where every step starts a whole jail, cgroup and executor (the raw cost).

With an image (``sandboxd bench B8 --image NAME``) each trial is what the public suite's ``docker run``
measures: a fresh sandbox whose root is the image (its layers under a writable layer of its own), running
``echo 1`` with the image's shell, through the ``container`` kind.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from sandboxd.bench.target import Target
from sandboxd.wire import Connection

TRIVIAL = "print(1)"
# Published start-up figures of the peers (ms, a sandbox from a template or image to its first command), as
# their start-up boards and documentation give them; shown beside ours, never measured here.
PEER_STARTS_MS = {
    "E2B (template)": 370.0,
    "Daytona": 140.0,
    "Northflank": 100.0,
    "CubeSandbox (from a snapshot)": 70.0,
}


def step_body(image: str | None) -> dict[str, Any]:
    if image is None:
        return {"runner": "python", "action": {"code": TRIVIAL}, "timeout_s": 30}
    return {"runner": "container", "action": {"image": image, "cmd": "echo 1"}, "timeout_s": 30}


@dataclass
class Trials:
    latencies_ms: list[float] = field(default_factory=list)
    failures: int = 0
    wall_s: float = 0.0
    error_examples: list[str] = field(default_factory=list)
    errors_by_status: dict[str, int] = field(default_factory=dict)  # "401", "transport", "wrong output", ...

    def fail(self, kind: str, why: str) -> None:
        self.failures += 1
        self.errors_by_status[kind] = self.errors_by_status.get(kind, 0) + 1
        if len(self.error_examples) < 3:
            self.error_examples.append(why)


async def _run(target: Target, trials: int, concurrency: int, image: str | None) -> Trials:
    out = Trials()
    body = step_body(image)
    pending = iter(range(trials))

    async def loop(i: int) -> None:
        conn = Connection(target.url_of(i), target.headers())
        try:
            for _ in pending:
                t = time.perf_counter()
                try:
                    status, result = await conn.request("POST", "/rollout/step", body)
                except OSError as exc:
                    out.fail("transport", repr(exc))
                    await conn.close()
                    continue
                if status != 200:
                    out.fail(str(status), f"HTTP {status}: {(result or {}).get('error')}")
                elif not (result["ok"] and result["observation"]["stdout"] == "1\n"):
                    out.fail("wrong output", f"HTTP {status}: {result.get('error') or result.get('observation')}")
                else:
                    out.latencies_ms.append((time.perf_counter() - t) * 1000)
        finally:
            await conn.close()

    t0 = time.monotonic()
    await asyncio.gather(*(loop(i) for i in range(min(concurrency, trials))))
    out.wall_s = time.monotonic() - t0
    return out


def run_trials(target: str | Target, trials: int, concurrency: int, image: str | None = None) -> Trials:
    return asyncio.run(_run(Target.of(target), trials, concurrency, image))
