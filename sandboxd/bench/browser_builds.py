"""B4 on nodes that differ only in browser settings (build, switches), side by side in one run.

    .venv/bin/python -m sandboxd.bench.browser_builds --variant full='{}' \\
        --variant shell='{"SANDBOXD_BROWSER__CHROMIUM_PATH": "/usr/lib/chromium/chromium-headless-shell"}' \\
        [--concurrency 8,16] [--rounds 3] [--duration 15]

Every variant is a node of its own (browser runner only, its defaults plus the
variant's settings), all started before the first level; per round and level
the variants take turns (the order rotates each round), so drift on this shared
machine falls on all of them alike. Per variant and level: trajectories/s,
p50/p99, selector-miss rate, and Chromium's CPU seconds per trajectory (its
cgroups' ``cpuacct``, i.e. browser, renderers, GPU and utility processes, warm-up
excluded), medians over the rounds; then each variant against the first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from sandboxd.bench.loadgen import run_level
from sandboxd.bench.stats import percentile
from sandboxd.localnode import local_node, wait_ready
from sandboxd.runners.cgroups import detect_version


@dataclass
class Figures:
    rate: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    miss: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def browser_cpu_s(node_pid: int, mount: Path = Path("/sys/fs/cgroup")) -> float:
    """CPU seconds used so far by every browser cgroup of the node whose process is ``node_pid``."""
    total = 0.0
    if detect_version(mount) == 1:
        for f in (mount / "cpuacct").glob(f"**/*-{node_pid}-w*-browser/cpuacct.usage"):
            total += int(f.read_text()) / 1e9
    else:
        for f in mount.glob(f"**/*-{node_pid}-w*-browser/cpu.stat"):
            usage = next(line for line in f.read_text().splitlines() if line.startswith("usage_usec"))
            total += int(usage.split()[1]) / 1e6
    return total


def node_pid(base: str) -> int:
    return int(httpx.get(f"{base}/readyz", timeout=10).json()["pid"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, help="NAME=JSON of SANDBOXD_ settings")
    ap.add_argument("--concurrency", default="8,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--warmup", type=float, default=4.0)
    args = ap.parse_args(argv)
    variants: dict[str, dict[str, str]] = {}
    for spec in args.variant:
        name, _, settings = spec.partition("=")
        variants[name] = {"SANDBOXD_RUNNERS": '["browser"]', "SANDBOXD_LOG_LEVEL": "warning", **json.loads(settings)}
    levels = [int(x) for x in args.concurrency.split(",")]
    figures = {(v, c): Figures() for v in variants for c in levels}
    with contextlib.ExitStack() as stack:
        bases = {v: stack.enter_context(local_node(env)) for v, env in variants.items()}
        pids = {}
        for v, base in bases.items():
            wait_ready(base)
            pids[v] = node_pid(base)
        print(f"variants: {', '.join(f'{v} at {b}' for v, b in bases.items())}", flush=True)
        names = list(variants)
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for c in levels:
                for v in order:
                    # CPU counted over the measured window only: sampled when the warm-up ends.
                    start = time.monotonic()
                    cpu0 = browser_cpu_s(pids[v])
                    s = run_level("B4", bases[v], c, args.warmup, args.duration, seed=0xB4 ^ c ^ r)
                    cpu = browser_cpu_s(pids[v]) - cpu0
                    wall = time.monotonic() - start
                    lat = sorted(s.latencies_ms)
                    f = figures[(v, c)]
                    f.rate.append(s.ops / args.duration)
                    f.p50.append(percentile(lat, 50) if lat else 0.0)
                    f.p99.append(percentile(lat, 99) if lat else 0.0)
                    f.miss.append(s.misses / max(s.steps, 1))
                    # The warm-up's trajectories used CPU too: spread over all finished in the whole window.
                    f.cpu.append(cpu / max(1, s.ops * wall / args.duration))
                    print(
                        f"round {r + 1} c={c:<3} {v:<12} {f.rate[-1]:6.2f} traj/s  p50 {f.p50[-1]:7.0f} ms  "
                        f"p99 {f.p99[-1]:7.0f} ms  miss {f.miss[-1]:.3f}  errors {s.errors}  "
                        f"chromium cpu/traj {f.cpu[-1]:.3f} s",
                        flush=True,
                    )
    med = statistics.median
    first = names[0]
    print(f"\nmedians over {args.rounds} rounds ({args.duration:.0f} s per level), and against {first}:")
    for c in levels:
        ref = figures[(first, c)]
        for v in names:
            f = figures[(v, c)]
            rate, p99, cpu = med(f.rate), med(f.p99), med(f.cpu)
            print(
                f"  c={c:<3} {v:<12} {rate:6.2f} traj/s ({rate / med(ref.rate):4.2f}x)  p50 {med(f.p50):6.0f} ms  "
                f"p99 {p99:6.0f} ms ({p99 / max(med(ref.p99), 1e-9):4.2f}x)  miss {med(f.miss):.3f}  "
                f"chromium cpu/traj {cpu:.3f} s ({cpu / max(med(ref.cpu), 1e-9):4.2f}x)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
