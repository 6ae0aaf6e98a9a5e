"""sandboxd one-shot vs session vs SandboxFusion's /run_code vs ``prlimit python -c``, one run, same programs.

    .venv/bin/python -m sandboxd.bench.python_vs_baseline [--duration 10] [--concurrency 1,8,32] [--target URL]

Without --target it starts sandboxd on a free loopback port and stops it after.
The three modes are workloads of the registry (``B1``, ``B1-session``,
``B1-baseline``) driven by the same load generator as ``sandboxd bench``:
several client processes, each with its own event loop, one keep-alive
connection per loop, client CPU reported so a saturated client is visible. The
baseline is what a plain worker does: one ``prlimit --cpu=10 --as=...
python3.12 -c PROGRAM`` subprocess per request, spawned straight from the
client processes (no HTTP at all: it is favoured). Figures are printed as a
table; ratios are against the baseline at the same concurrency.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import dataclass

from sandboxd.bench.loadgen import run_level
from sandboxd.bench.stats import percentile
from sandboxd.bench.workloads import WORKLOADS, real_python
from sandboxd.localnode import local_node

MODES = {"oneshot": "B1", "session": "B1-session", "fusion": "B1-fusion", "baseline": "B1-baseline"}


@dataclass(frozen=True)
class Row:
    mode: str
    concurrency: int
    rate: float
    failures: int
    p50_ms: float
    p99_ms: float
    client_cores: float


def measure(
    mode: str, target: str, c: int, duration_s: float, warmup_s: float, procs: int, options: dict[str, object]
) -> Row:
    s = run_level(MODES[mode], target, c, warmup_s, duration_s, seed=0xB1 ^ c, procs=procs, options=options)
    lat = sorted(s.latencies_ms)
    p50 = percentile(lat, 50) if lat else 0.0
    p99 = percentile(lat, 99) if lat else 0.0
    failures = s.errors + (s.graded - s.passed)
    return Row(mode, c, s.ops / duration_s, failures, p50, p99, s.client_cpu_s / duration_s)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="a running sandboxd; default: start one on loopback")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per level")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each level")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {list(MODES)}")
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
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown modes {unknown}; known: {list(MODES)}")
    exclude = sorted(x for x in args.exclude.split(",") if x)
    options: dict[str, object] = {"exclude": exclude, "python": real_python()}
    corpus = WORKLOADS["B1"].setup(options)
    stack = contextlib.ExitStack()
    # SANDBOXD_* of the caller configure the embedded node (e.g. slots per worker).
    target = args.target or stack.enter_context(local_node(inherit=True))
    dropped = f", left out: {exclude}" if exclude else ""
    print(f"corpus: {len(corpus)} programs (B1: HumanEval + MBPP-sanitized{dropped}); {os.cpu_count()} vCPU")
    print(
        f"baseline interpreter: {options['python']}; {args.duration:.0f}s measured per level after {args.warmup:.0f}s"
    )
    rows: list[Row] = []
    try:
        for c in [int(x) for x in args.concurrency.split(",")]:
            for mode in modes:
                row = measure(mode, target, c, args.duration, args.warmup, args.client_procs, options)
                rows.append(row)
                print(
                    f"  c={c:<4} {mode:<9} {row.rate:8.1f} exec/s  p50 {row.p50_ms:7.1f} ms  p99 {row.p99_ms:7.1f} ms"
                    f"  failures {row.failures:<4} client cpu {row.client_cores:4.2f} cores",
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
