"""sandboxd one-shot vs sandboxd session vs ``prlimit python -c``, one run, same programs.

    .venv/bin/python -m bench.python_vs_baseline [--duration 10] [--concurrency 1,8,32] [--target URL]

Without --target it starts sandboxd on a free loopback port and stops it after.
Load comes from several client processes (one per vCPU, at least one per 8
loops), each with its own event loop; every loop holds one keep-alive
connection (bench/http.py, not httpx, which cost ~5 ms of client CPU per
request). Client CPU is reported, so a saturated client is visible. The baseline is what a plain worker does: one
``prlimit --cpu=10 --as=... python3.12 -c PROGRAM`` subprocess per request,
spawned straight from the client processes (no HTTP at all: it is favoured).
Figures are printed as a table; ratios are against the baseline at the same
concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass

from bench.corpus import b1
from bench.http import Connection
from sandboxd.localnode import local_node


@dataclass
class Level:
    mode: str
    concurrency: int
    ops: int
    failures: int
    seconds: float
    p50_ms: float
    p99_ms: float
    client_cpu_s: float

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0


def _pct(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return 0.0
    return sorted_ms[min(len(sorted_ms) - 1, int(q * len(sorted_ms)))]


def programs(exclude: frozenset[str]) -> list[str]:
    return [p.source for p in b1() if p.task_id not in exclude]


async def _client(
    mode: str,
    target: str,
    loops: int,
    duration_s: float,
    warmup_s: float,
    offset: int,
    python: str,
    exclude: frozenset[str],
) -> tuple[list[float], int, int]:
    corpus = programs(exclude)
    lat: list[float] = []
    fails = 0
    ops = 0
    start = time.monotonic()
    measure_from = start + warmup_s
    stop = measure_from + duration_s
    prlimit = shutil.which("prlimit")

    async def one_loop(i: int) -> None:
        nonlocal fails, ops
        http = Connection(target)
        sid = None
        if mode == "session":
            sid = (await http.request("POST", "/sessions", {"runner": "python"}))[1]["session_id"]
        k = offset + i * 7919
        while time.monotonic() < stop:
            code = corpus[k % len(corpus)]
            k += 1
            t = time.perf_counter()
            if mode == "baseline":
                argv = [python, "-c", code]
                if prlimit:
                    argv = [prlimit, "--cpu=10", f"--as={2 << 30}", *argv]
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
                )
                try:
                    ok = await asyncio.wait_for(proc.wait(), 10) == 0
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
                    ok = False
            else:
                body = {"runner": "python", "action": {"code": code}, "timeout_s": 10}
                if sid:
                    body["session_id"] = sid
                status, result = await http.request("POST", "/rollout/step", body)
                ok = status == 200 and result["ok"]
            now = time.monotonic()
            if now >= measure_from and now < stop:
                lat.append((time.perf_counter() - t) * 1000)
                ops += 1
                fails += not ok
        if sid:
            await http.request("DELETE", f"/sessions/{sid}")
        await http.close()

    await asyncio.gather(*(one_loop(i) for i in range(loops)))
    return lat, ops, fails


def _client_proc(args: tuple[str, str, int, float, float, int, str, frozenset[str]], q: mp.Queue) -> None:  # type: ignore[type-arg]
    t0 = time.process_time()
    lat, ops, fails = asyncio.run(_client(*args))
    q.put((lat, ops, fails, time.process_time() - t0))


def run_level(
    mode: str, target: str, c: int, duration_s: float, warmup_s: float, procs: int, python: str, exclude: frozenset[str]
) -> Level:
    if procs <= 0:
        # An asyncio client loop saturates long before the server does: keep
        # each process at <= 8 concurrent loops (and at least one per vCPU).
        procs = max(len(os.sched_getaffinity(0)), -(-c // 8))
    procs = max(1, min(procs, c))
    share = [c // procs + (1 if i < c % procs else 0) for i in range(procs)]
    q: mp.Queue = mp.get_context("spawn").Queue()  # type: ignore[type-arg]
    ctx = mp.get_context("spawn")
    ps = [
        ctx.Process(target=_client_proc, args=((mode, target, n, duration_s, warmup_s, i * 1000, python, exclude), q))
        for i, n in enumerate(share)
    ]
    for p in ps:
        p.start()
    lat: list[float] = []
    ops = fails = 0
    cpu = 0.0
    for _ in ps:
        lat_i, ops_i, fails_i, cpu_i = q.get()
        lat += lat_i
        ops += ops_i
        fails += fails_i
        cpu += cpu_i
    for p in ps:
        p.join()
    lat.sort()
    return Level(mode, c, ops, fails, duration_s, statistics.median(lat) if lat else 0.0, _pct(lat, 0.99), cpu)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="a running sandboxd; default: start one on loopback")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per level")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each level")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--modes", default="oneshot,session,baseline")
    ap.add_argument(
        "--client-procs",
        type=int,
        default=0,
        help="load-generator processes; 0 = one per vCPU, and at least one per 8 concurrent loops",
    )
    ap.add_argument(
        "--exclude",
        default="",
        help="comma-separated task ids to leave out, e.g. mbpp/123 (its asserts take ~7 s of CPU, more than the "
        "other 426 programs together, so at 2 vCPU it alone bounds every mode's throughput)",
    )
    args = ap.parse_args(argv)
    python = os.path.realpath(sys.executable)  # the real interpreter, never a pyenv shim
    stack = contextlib.ExitStack()
    # SANDBOXD_* of the caller configure the embedded node (e.g. slots per worker).
    target = args.target or stack.enter_context(local_node(inherit=True))
    exclude = frozenset(x for x in args.exclude.split(",") if x)
    corpus = programs(exclude)
    dropped = f", left out: {sorted(exclude)}" if exclude else ""
    print(
        f"corpus: {len(corpus)} programs (B1: HumanEval if installed + MBPP-sanitized{dropped}); {os.cpu_count()} vCPU"
    )
    print(f"baseline interpreter: {python}; {args.duration:.0f}s measured per level after {args.warmup:.0f}s warm-up")
    rows: list[Level] = []
    try:
        for c in [int(x) for x in args.concurrency.split(",")]:
            for mode in args.modes.split(","):
                lvl = run_level(mode, target, c, args.duration, args.warmup, args.client_procs, python, exclude)
                rows.append(lvl)
                print(
                    f"  c={c:<4} {mode:<9} {lvl.rate:8.1f} exec/s  p50 {lvl.p50_ms:7.1f} ms  p99 {lvl.p99_ms:7.1f} ms"
                    f"  failures {lvl.failures:<4} client cpu {lvl.client_cpu_s / args.duration:4.2f} cores",
                    flush=True,
                )
    finally:
        stack.close()
    print("\nratio to baseline (throughput, p99):")
    for c in sorted({r.concurrency for r in rows}):
        base = next((r for r in rows if r.concurrency == c and r.mode == "baseline"), None)
        for r in rows:
            if r.concurrency == c and r.mode != "baseline" and base and base.rate:
                print(
                    f"  c={c:<4} {r.mode:<9} {r.rate / base.rate:5.2f}x throughput,"
                    f" p99 {r.p99_ms:.1f} vs {base.p99_ms:.1f} ms"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
