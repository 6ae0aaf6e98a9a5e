"""The closed-loop, time-driven, multi-process load generator (every workload, every comparison).

c loops each issue one operation, await it, repeat, until the deadline; a
sample counts when its operation ends inside the measure window (which opens
after the warm-up, once every loop has finished an op). Loops are spread over
several processes (one per vCPU, at least one per 8 loops), each with its own
event loop and one keep-alive connection per loop, so that the client is never
what is measured; every process reports its CPU time so a saturated client
shows in the results.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import os
import queue
import random
import time
from dataclasses import dataclass
from typing import Any

from sandboxd.bench.target import Target
from sandboxd.bench.workload import Loop, OpResult, Samples, TargetTally
from sandboxd.bench.workloads import WORKLOADS
from sandboxd.wire import Connection

MAX_ERROR_EXAMPLES = 3


@dataclass(frozen=True)
class Level:
    """One level's parameters, as each load process receives them."""

    workload: str
    target: Target  # the nodes (each loop keeps to one of them) and the key
    loops: int
    warmup_s: float
    duration_s: float
    seed: int
    options: dict[str, Any]
    t0: float  # monotonic time the level started (the same clock in every process of this machine)
    nprocs: int
    first_loop: int = 0  # this process's first loop, counted over every process (how loops spread over nodes)


class Window:
    """The measure window every load process of a level shares.

    All loops start at once, so their first ops run in lockstep; a window
    opened before each loop has finished one op counts only ops shorter than
    the warm-up (B9's rollouts last tens of seconds on a small machine, and
    only the short ones would be seen). It opens at the later of the warm-up
    and the moment every loop in every process has finished its first op
    (waiting at most ``MAX_WARMUP_S`` more), and lasts ``duration_s``: the
    same for all processes, so the load is c throughout it.
    """

    def __init__(self, ready: Any, opens: Any, level: Level) -> None:
        self._ready, self._opens, self._level = ready, opens, level

    def _open(self, now: float) -> None:
        with self._opens.get_lock():
            if self._opens.value == math.inf:
                self._opens.value = max(self._level.t0 + self._level.warmup_s, now)

    def process_ready(self, now: float) -> None:
        with self._ready.get_lock():
            self._ready.value += 1
            everyone = self._ready.value == self._level.nprocs
        if everyone:
            self._open(now)

    def cap(self) -> None:
        self._open(time.monotonic())

    @property
    def start(self) -> float:
        return float(self._opens.value)

    @property
    def stop(self) -> float:
        return self.start + self._level.duration_s


def _record(out: Samples, res: OpResult, ms: float, target: str) -> None:
    """One op ended in the window: completed (its latency and units count), or an error (a non-2xx answer or
    a transport failure: counted as such, never as an op done)."""
    tally = out.by_target.setdefault(target, TargetTally())
    if res.error:
        out.errors += 1
        tally.errors += 1
        who = res.blame or "unknown"
        out.errors_by_blame[who] = out.errors_by_blame.get(who, 0) + 1
        status = str(res.status) if res.status is not None else "transport"
        out.errors_by_status[status] = out.errors_by_status.get(status, 0) + 1
        if len(out.error_examples) < MAX_ERROR_EXAMPLES:
            out.error_examples.append(res.error)
        return
    out.latencies_ms.append(ms)
    out.ops += 1
    tally.ops += 1
    tally.latencies_ms.append(ms)
    out.units += res.units
    out.steps += res.steps
    out.reward += res.reward
    out.misses += res.misses
    if res.passed is not None:
        out.graded += 1
        out.passed += bool(res.passed)
    if res.channel:
        out.channels.setdefault(res.channel, []).append(ms)
    for channel, sub_ms in res.subs:
        out.channels.setdefault(channel, []).append(sub_ms)


async def _child_main(level: Level, window: Window) -> Samples:
    """This process's closed loops; an op counts when it ends inside the shared window."""
    wl = WORKLOADS[level.workload]
    shared = wl.setup(level.options)
    out = Samples()
    first_done = 0

    async def watch() -> None:
        """Cap the warm-up, and take this process's CPU over the window only (not spawn, setup, warm-up, tail)."""
        cap_at = level.t0 + level.warmup_s + MAX_WARMUP_S
        while window.start == math.inf:
            if time.monotonic() >= cap_at:
                window.cap()
            await asyncio.sleep(0.1)
        await asyncio.sleep(max(window.start - time.monotonic(), 0))
        cpu0 = time.process_time()
        await asyncio.sleep(max(window.stop - time.monotonic(), 0))
        out.client_cpu_s = time.process_time() - cpu0

    async def run_loop(i: int) -> None:
        nonlocal first_done
        url = level.target.url_of(level.first_loop + i)  # several nodes: each loop keeps to one, spread evenly
        conn = Connection(url, level.target.headers())
        loop = Loop(conn, random.Random(level.seed * 1009 + i), shared, level.options, i, target=url)
        try:
            await wl.begin(loop)
            first = True
            while time.monotonic() < window.stop:
                t = time.perf_counter()
                try:
                    res = await wl.op(loop)
                except (OSError, ValueError, KeyError) as exc:
                    res = OpResult(error=f"{type(exc).__name__}: {exc}", units=0, blame="transport")
                    await loop.conn.close()
                end = time.monotonic()
                if window.start <= end < window.stop:
                    _record(out, res, (time.perf_counter() - t) * 1000, url)
                if first:
                    first, first_done = False, first_done + 1
                    if first_done == level.loops:
                        window.process_ready(end)
            await wl.end(loop)
        finally:
            await loop.conn.close()

    watcher = asyncio.create_task(watch())
    await asyncio.gather(*(run_loop(i) for i in range(level.loops)))
    await watcher  # ends by the window's end, which the loops have just passed
    out.window = (window.start, window.stop)
    return out


def _child(level: Level, ready: Any, opens: Any, q: mp.Queue) -> None:  # type: ignore[type-arg]
    try:
        out: Samples | str = asyncio.run(_child_main(level, Window(ready, opens, level)))
    except BaseException as exc:  # report, never hang the parent
        out = f"{type(exc).__name__}: {exc}"
    q.put(out)


def processes_for(concurrency: int, requested: int = 0) -> int:
    """One per vCPU, and at least one per 8 loops: one asyncio loop saturates long before the server."""
    if requested > 0:
        return max(1, min(requested, concurrency))
    return max(1, min(concurrency, max(len(os.sched_getaffinity(0)), -(-concurrency // 8))))


MAX_WARMUP_S = 300.0  # past the asked warm-up, the longest wait for every loop's first op
CHILD_GRACE_S = 900.0  # past that, a child still finishing its last ops (a B9 rollout at c=1024 takes minutes)


def _next_result(q: Any, ps: list[Any], deadline: float) -> Any:
    """The next child's result; a child that died without one, or a level that overruns, is an error, not a hang."""
    while True:
        try:
            return q.get(timeout=1.0)
        except queue.Empty:
            dead = [p for p in ps if p.exitcode not in (None, 0)]
            if dead:
                for p in ps:
                    p.kill()
                code = dead[0].exitcode
                raise RuntimeError(f"load generator process exited with code {code} before reporting") from None
            if time.monotonic() > deadline:
                for p in ps:
                    p.kill()
                raise RuntimeError(f"load generator did not report within its window + {CHILD_GRACE_S:g} s") from None


def run_level(
    workload: str,
    target: str | Target,
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
    ready, opens = ctx.Value("i", 0), ctx.Value("d", math.inf)
    t0 = time.monotonic()
    where = Target.of(target)
    levels = [
        Level(workload, where, k, warmup_s, duration_s, seed + i, options or {}, t0, n, sum(share[:i]))
        for i, k in enumerate(share)
    ]
    ps = [ctx.Process(target=_child, args=(lv, ready, opens, q)) for lv in levels]
    for p in ps:
        p.start()
    res = Samples(nprocs=n)
    fatal = None
    deadline = time.monotonic() + warmup_s + MAX_WARMUP_S + duration_s + CHILD_GRACE_S
    for _ in ps:
        out = _next_result(q, ps, deadline)
        if isinstance(out, str):
            fatal = out
            continue
        res.latencies_ms += out.latencies_ms
        for ch, vals in out.channels.items():
            res.channels.setdefault(ch, []).extend(vals)
        res.ops += out.ops
        res.client_cpu_s += out.client_cpu_s
        res.window = out.window
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
        for status, n in out.errors_by_status.items():
            res.errors_by_status[status] = res.errors_by_status.get(status, 0) + n
        for url, tally in out.by_target.items():
            res.by_target.setdefault(url, TargetTally()).merge(tally)
    for p in ps:
        p.join(timeout=30)
        if p.exitcode is None:  # reported, then stuck on the way out: not worth a hang
            p.kill()
            p.join()
    if fatal is not None:
        raise RuntimeError(f"load generator process failed: {fatal}")
    return res
