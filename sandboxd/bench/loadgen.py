"""The closed-loop, time-driven, multi-process load generator (every workload, every comparison).

c loops each issue one operation, await it, repeat, until the deadline; a
sample counts when its operation ends inside the measure window (after the
warm-up). Loops are spread over several processes (one per vCPU, at least one
per 8 loops), each with its own event loop and one keep-alive connection per
loop, so that the client is never what is measured; every process reports its
CPU time so a saturated client shows in the results.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import time
from dataclasses import dataclass
from typing import Any

from sandboxd.bench.http import Connection
from sandboxd.bench.workloads import WORKLOADS, Loop, OpResult, Samples

MAX_ERROR_EXAMPLES = 3


@dataclass(frozen=True)
class Level:
    """One level's parameters, as each load process receives them."""

    workload: str
    target: str
    loops: int
    warmup_s: float
    duration_s: float
    seed: int
    options: dict[str, Any]


def _record(out: Samples, res: OpResult, ms: float) -> None:
    out.latencies_ms.append(ms)
    out.ops += 1
    out.units += res.units
    out.steps += res.steps
    out.reward += res.reward
    out.misses += res.misses
    if res.error:
        out.errors += 1
        who = res.blame or "unknown"
        out.errors_by_blame[who] = out.errors_by_blame.get(who, 0) + 1
        if len(out.error_examples) < MAX_ERROR_EXAMPLES:
            out.error_examples.append(res.error)
    if res.passed is not None:
        out.graded += 1
        out.passed += bool(res.passed)
    if res.channel:
        out.channels.setdefault(res.channel, []).append(ms)
    for channel, sub_ms in res.subs:
        out.channels.setdefault(channel, []).append(sub_ms)


async def _child_main(level: Level) -> Samples:
    wl = WORKLOADS[level.workload]
    shared = wl.setup(level.options)
    out = Samples()
    start = time.monotonic()
    measure_from, stop = start + level.warmup_s, start + level.warmup_s + level.duration_s

    async def run_loop(i: int) -> None:
        loop = Loop(Connection(level.target), random.Random(level.seed * 1009 + i), shared, level.options, i)
        try:
            await wl.begin(loop)
            while time.monotonic() < stop:
                t = time.perf_counter()
                try:
                    res = await wl.op(loop)
                except (OSError, ValueError, KeyError) as exc:
                    res = OpResult(error=f"{type(exc).__name__}: {exc}", units=0)
                    await loop.conn.close()
                end = time.monotonic()
                if measure_from <= end < stop:
                    _record(out, res, (time.perf_counter() - t) * 1000)
            await wl.end(loop)
        finally:
            await loop.conn.close()

    await asyncio.gather(*(run_loop(i) for i in range(level.loops)))
    return out


def _child(level: Level, q: mp.Queue) -> None:  # type: ignore[type-arg]
    t0 = time.process_time()
    try:
        out: Samples | str = asyncio.run(_child_main(level))
    except BaseException as exc:  # report, never hang the parent
        out = f"{type(exc).__name__}: {exc}"
    q.put((out, time.process_time() - t0))


def processes_for(concurrency: int, requested: int = 0) -> int:
    """One per vCPU, and at least one per 8 loops: one asyncio loop saturates long before the server."""
    if requested > 0:
        return max(1, min(requested, concurrency))
    return max(1, min(concurrency, max(len(os.sched_getaffinity(0)), -(-concurrency // 8))))


def run_level(
    workload: str,
    target: str,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    seed: int,
    procs: int = 0,
    options: dict[str, Any] | None = None,
) -> Samples:
    n = processes_for(concurrency, procs)
    share = [concurrency // n + (1 if i < concurrency % n else 0) for i in range(n)]
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    levels = [Level(workload, target, k, warmup_s, duration_s, seed + i, options or {}) for i, k in enumerate(share)]
    ps = [ctx.Process(target=_child, args=(lv, q)) for lv in levels]
    for p in ps:
        p.start()
    res = Samples(nprocs=n)
    fatal = None
    for _ in ps:
        out, cpu_s = q.get()
        res.client_cpu_s += cpu_s
        if isinstance(out, str):
            fatal = out
            continue
        res.latencies_ms += out.latencies_ms
        for ch, vals in out.channels.items():
            res.channels.setdefault(ch, []).extend(vals)
        res.ops += out.ops
        res.errors += out.errors
        res.passed += out.passed
        res.graded += out.graded
        res.units += out.units
        res.steps += out.steps
        res.reward += out.reward
        res.misses += out.misses
        res.error_examples += out.error_examples
        for who, n in out.errors_by_blame.items():
            res.errors_by_blame[who] = res.errors_by_blame.get(who, 0) + n
    for p in ps:
        p.join()
    if fatal is not None:
        raise RuntimeError(f"load generator process failed: {fatal}")
    return res
