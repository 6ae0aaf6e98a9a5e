"""B8 ColdStart: a fresh isolated sandbox running a trivial program, N trials.

Trials, not a time window (as in the public suite): a semaphore keeps ``c`` in
flight; latency is the wall clock of one step to its result; throughput is
successes / wall. Run against a node with its warm pool (what users see) and,
when sandboxd is embedded, against a second node with ``warm_pool=false``,
where every step starts a whole jail, cgroup and executor (the raw cost).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from sandboxd.wire import Connection

TRIVIAL = "print(1)"


@dataclass
class Trials:
    latencies_ms: list[float] = field(default_factory=list)
    failures: int = 0
    wall_s: float = 0.0
    error_examples: list[str] = field(default_factory=list)


async def _run(target: str, trials: int, concurrency: int) -> Trials:
    out = Trials()
    pending = iter(range(trials))

    async def loop() -> None:
        conn = Connection(target)
        try:
            for _ in pending:
                t = time.perf_counter()
                try:
                    status, result = await conn.request(
                        "POST", "/rollout/step", {"runner": "python", "action": {"code": TRIVIAL}, "timeout_s": 30}
                    )
                    ok = status == 200 and result["ok"] and result["observation"]["stdout"] == "1\n"
                    why = None if ok else f"HTTP {status}: {(result or {}).get('error')}"
                except OSError as exc:
                    ok, why = False, repr(exc)
                    await conn.close()
                if ok:
                    out.latencies_ms.append((time.perf_counter() - t) * 1000)
                else:
                    out.failures += 1
                    if why and len(out.error_examples) < 3:
                        out.error_examples.append(why)
        finally:
            await conn.close()

    t0 = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(min(concurrency, trials))))
    out.wall_s = time.monotonic() - t0
    return out


def run_trials(target: str, trials: int, concurrency: int) -> Trials:
    return asyncio.run(_run(target, trials, concurrency))
