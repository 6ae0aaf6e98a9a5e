"""Closed-loop, time-driven, multi-process load generator.

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
from dataclasses import dataclass, field
from typing import Any

from bench.http import Connection
from bench.workloads import WORKLOADS


@dataclass
class LevelSamples:
    latencies_ms: list[float] = field(default_factory=list)
    channels: dict[str, list[float]] = field(default_factory=dict)
    ops: int = 0
    errors: int = 0
    passed: int = 0
    graded: int = 0
    units: int = 0
    steps: int = 0
    reward: float = 0.0
    client_cpu_s: float = 0.0
    nprocs: int = 0
    error_examples: list[str] = field(default_factory=list)


async def _child_main(
    workload: str, target: str, loops: int, warmup_s: float, duration_s: float, seed: int
) -> dict[str, Any]:
    wl = WORKLOADS[workload]
    state = wl.setup()
    out: dict[str, Any] = {
        "lat": [], "ch": {}, "ops": 0, "errors": 0, "passed": 0, "graded": 0, "examples": [],
        "units": 0, "steps": 0, "reward": 0.0,
    }  # fmt: skip
    start = time.monotonic()
    measure_from, stop = start + warmup_s, start + warmup_s + duration_s

    async def loop(i: int) -> None:
        conn = Connection(target)
        rng = random.Random(seed * 1009 + i)
        try:
            while time.monotonic() < stop:
                t = time.perf_counter()
                try:
                    res = await wl.op(conn, rng, state)
                except (OSError, ValueError, KeyError) as exc:
                    res = wl.failed(f"{type(exc).__name__}: {exc}")
                    await conn.close()
                end = time.monotonic()
                if measure_from <= end < stop:
                    ms = (time.perf_counter() - t) * 1000
                    out["lat"].append(ms)
                    out["ops"] += 1
                    out["units"] += res.units
                    out["steps"] += res.steps
                    out["reward"] += res.reward
                    if res.error:
                        out["errors"] += 1
                        if len(out["examples"]) < 3:
                            out["examples"].append(res.error)
                    if res.passed is not None:
                        out["graded"] += 1
                        out["passed"] += bool(res.passed)
                    if res.channel:
                        out["ch"].setdefault(res.channel, []).append(ms)
        finally:
            await conn.close()

    await asyncio.gather(*(loop(i) for i in range(loops)))
    return out


def _child(args: tuple[str, str, int, float, float, int], q: mp.Queue) -> None:  # type: ignore[type-arg]
    t0 = time.process_time()
    try:
        out = asyncio.run(_child_main(*args))
    except BaseException as exc:  # report, never hang the parent
        out = {"fatal": f"{type(exc).__name__}: {exc}"}
    out["cpu_s"] = time.process_time() - t0
    q.put(out)


def processes_for(concurrency: int, requested: int = 0) -> int:
    if requested > 0:
        return max(1, min(requested, concurrency))
    return max(1, min(concurrency, max(len(os.sched_getaffinity(0)), -(-concurrency // 8))))


def run_level(
    workload: str, target: str, concurrency: int, warmup_s: float, duration_s: float, seed: int, procs: int = 0
) -> LevelSamples:
    n = processes_for(concurrency, procs)
    share = [concurrency // n + (1 if i < concurrency % n else 0) for i in range(n)]
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    ps = [
        ctx.Process(target=_child, args=((workload, target, k, warmup_s, duration_s, seed + i), q))
        for i, k in enumerate(share)
    ]
    for p in ps:
        p.start()
    res = LevelSamples(nprocs=n)
    for _ in ps:
        out = q.get()
        if "fatal" in out:
            raise RuntimeError(f"load generator process failed: {out['fatal']}")
        res.latencies_ms += out["lat"]
        for ch, vals in out["ch"].items():
            res.channels.setdefault(ch, []).extend(vals)
        res.ops += out["ops"]
        res.errors += out["errors"]
        res.passed += out["passed"]
        res.graded += out["graded"]
        res.units += out["units"]
        res.steps += out["steps"]
        res.reward += out["reward"]
        res.client_cpu_s += out["cpu_s"]
        res.error_examples += out["examples"]
    for p in ps:
        p.join()
    return res
