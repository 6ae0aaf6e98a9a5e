"""B3 on sandboxd vs a replica of the public suite's B3 worker, side by side: single calls and trajectories.

    .venv/bin/python -m sandboxd.bench.b3_vs_baseline [--concurrency 32] [--duration 15] [--rounds 3]

Starts, on loopback: a sandboxd node with the tools runner only (its defaults: one worker per vCPU, front
processes from the vCPU count) and the suite's worker replica (``baselines/b3_worker.py``: FastAPI with
sync handlers, ``uvicorn --workers`` one per vCPU, in memory, nothing isolated). The same load generator
drives both, alternating, ``--rounds`` times:

- ``call``: one light call (sandboxd: a one-shot ``get_product_details``; the suite: ``GET /product/{id}``);
- ``trajectory``: sandboxd's B3 (a tools session per trajectory, its own copy-on-write overlay, created and
  closed by the op: ~13.6 HTTP calls) against the suite's B3 (~11.7 calls as its default user, shared by
  every client).

Prints calls or trajectories/s, p50/p99 and the host's CPU seconds per op for each, and the medians of the
ratios (sandboxd / suite) per shape.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator

from sandboxd.bench.browser_vs_baseline import wait_ready_healthz
from sandboxd.bench.loadgen import run_level
from sandboxd.bench.resources import cpu_times
from sandboxd.bench.stats import percentile
from sandboxd.localnode import free_port, local_node

SHAPES = {"call": ("call", "call-baseline"), "trajectory": ("B3", "B3-baseline")}


@contextlib.contextmanager
def suite_worker(workers: int) -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "sandboxd.bench.baselines.b3_worker", "--port", str(port), "--workers", str(workers)]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_ready_healthz(url, proc):
            raise RuntimeError(f"the suite's B3 worker at {url} did not start")
        yield url
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(20)


def measure(label: str, workload: str, target: str, c: int, warmup: float, duration: float) -> tuple[float, float]:
    before = cpu_times()
    s = run_level(workload, target, c, warmup, duration, seed=0xB3 ^ c)
    used = cpu_times() - before  # whole host, warm-up and the load generator included: an upper bound per op
    lat = sorted(s.latencies_ms)
    rate = s.ops / duration
    p99 = percentile(lat, 99) if lat else 0.0
    print(
        f"  {label:<24} {rate:9.1f}/s  p50 {percentile(lat, 50) if lat else 0:7.2f} ms  p99 {p99:7.2f} ms  "
        f"errors {s.errors}  host cpu/op {used * 1000 / max(s.ops, 1):.3f} ms",
        flush=True,
    )
    return rate, p99


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", default="call,trajectory")
    args = ap.parse_args(argv)
    ncpu = len(os.sched_getaffinity(0))
    ratios: dict[str, list[tuple[float, float]]] = {}
    with local_node({"SANDBOXD_RUNNERS": '["tools"]'}) as node, suite_worker(ncpu) as suite:
        print(f"{ncpu} vCPU; sandboxd {node}; suite's worker {suite} ({ncpu} processes); c={args.concurrency}")
        for r in range(args.rounds):
            for shape in args.shapes.split(","):
                ours_wl, theirs_wl = SHAPES[shape]
                print(f"round {r + 1}, {shape}:")
                ours = measure(f"sandboxd {ours_wl}", ours_wl, node, args.concurrency, args.warmup, args.duration)
                theirs = measure(f"suite {theirs_wl}", theirs_wl, suite, args.concurrency, args.warmup, args.duration)
                ratios.setdefault(shape, []).append(
                    (ours[0] / theirs[0] if theirs[0] else float("nan"), ours[1] / theirs[1] if theirs[1] else 0.0)
                )
    print("\nmedian ratio sandboxd / suite's worker (throughput; p99, lower is better for sandboxd):")
    for shape, rs in ratios.items():
        print(
            f"  {shape:<11} {statistics.median(x for x, _ in rs):5.2f}x throughput   "
            f"{statistics.median(y for _, y in rs):5.2f}x p99   (rounds: {', '.join(f'{x:.2f}' for x, _ in rs)})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
