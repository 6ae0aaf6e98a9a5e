"""B4 on sandboxd (jailed Chromium) vs a replica of the public suite's B4 worker, one run, same trajectories.

    .venv/bin/python -m sandboxd.bench.browser_vs_baseline [--concurrency 1,4,8,16] [--duration 20]
        [--neighbour N] [--pod]

Starts, on loopback: a sandboxd node with the browser runner only (its
defaults: browsers per node from vCPUs and memory, ``slots_per_worker``
trajectories each, every trajectory in a fresh context, Chromium in nsjail);
the suite's worker replica (``baselines/b4_worker.py``: W = vCPUs/2 processes,
one Chromium each, 4 pooled contexts); and a static file server for the
replica's copy of the shop. Both are driven by the same load generator with
the same 80 seeded trajectories, levels alternating. Prints trajectories/s,
actions/s, p50/p99, selector miss rate, host CPU seconds per trajectory and
the ratio at each level.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from sandboxd.bench.loadgen import run_level
from sandboxd.bench.resources import cpu_times
from sandboxd.bench.stats import percentile
from sandboxd.localnode import free_port, local_node, wait_ready
from sandboxd.runners.browser.sites import BUNDLED
from sandboxd.runners.cgroups import CgroupRoot


@contextlib.contextmanager
def static_site(root: Path) -> Iterator[str]:
    """The shop on a plain static file server (the suite uses nginx)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


@contextlib.contextmanager
def burners(n: int) -> Iterator[None]:
    """``n`` processes spinning on the CPU."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@contextlib.contextmanager
def suite_workers(n: int, chromium: str) -> Iterator[list[str]]:
    procs, urls = [], []
    try:
        for _ in range(n):
            port = free_port()
            cmd = [
                sys.executable,
                "-m",
                "sandboxd.bench.baselines.b4_worker",
                "--port",
                str(port),
                "--chromium",
                chromium,
            ]
            procs.append(subprocess.Popen(cmd))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            if not wait_ready_healthz(url, proc):
                raise RuntimeError(f"the suite's worker at {url} did not start")
        yield urls
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(20)


def wait_ready_healthz(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return True
        time.sleep(0.2)
    return False


def measure(label: str, workload: str, target: str, c: int, args: argparse.Namespace, options: dict[str, str]) -> None:
    before = cpu_times()
    s = run_level(workload, target, c, args.warmup, args.duration, seed=0xB4 ^ c, options=options)
    used = cpu_times() - before  # whole host, warm-up included: an upper bound per trajectory
    lat = sorted(s.latencies_ms)
    total = s.ops or 1
    print(
        f"  c={c:<3} {label:<10} {s.ops / args.duration:6.2f} traj/s  {s.steps / args.duration:7.1f} actions/s  "
        f"p50 {percentile(lat, 50) if lat else 0:7.0f} ms  p99 {percentile(lat, 99) if lat else 0:7.0f} ms  "
        f"miss {s.misses / max(s.steps, 1):.3f}  errors {s.errors} (infra {s.errors_by_blame.get('infra', 0)})  "
        f"host cpu/traj {used / total:.2f} s",
        flush=True,
    )
    ROWS.append((label, c, s.ops / args.duration, percentile(lat, 99) if lat else 0.0))


ROWS: list[tuple[str, int, float, float]] = []


@contextlib.contextmanager
def pod_group() -> Iterator[tuple[str, ...]]:
    """A cgroup of the node's own, as its pod or systemd unit gives it (weight 100): its ``cgroup.procs`` files.
    Removed, with anything left in it, at the end."""
    root = CgroupRoot(f"bench-pod-{os.getpid()}")
    try:
        yield tuple(str(d / "cgroup.procs") for d in root.group.dirs.values())
    finally:
        root.group.remove()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument(
        "--suite-chromium",
        default="/usr/lib/chromium/chromium-headless-shell",
        help="the replica's browser: the headless shell, as the suite's Playwright image runs it (default), or "
        "/usr/lib/chromium/chromium (the full browser)",
    )
    ap.add_argument("--node-env", default="{}", help="JSON of more environment for the sandboxd node (SANDBOXD_...)")
    ap.add_argument(
        "--neighbour",
        type=int,
        default=0,
        help="CPU-burning processes beside both, for the whole run (another tenant's load on a shared machine)",
    )
    ap.add_argument(
        "--pod",
        action="store_true",
        help="the node in a cgroup of its own, as a pod or a systemd unit places it (default: the bench's own, "
        "beside the neighbour and the suite's workers)",
    )
    args = ap.parse_args(argv)
    ncpu = len(os.sched_getaffinity(0))
    with contextlib.ExitStack() as stack:
        if args.neighbour:
            stack.enter_context(burners(args.neighbour))
        cgroup = stack.enter_context(pod_group()) if args.pod else ()
        settings = {"SANDBOXD_RUNNERS": '["browser"]', **json.loads(args.node_env)}
        node = stack.enter_context(local_node(settings, cgroup=cgroup))
        wait_ready(node)
        site = stack.enter_context(static_site(BUNDLED["shop"]))
        workers = stack.enter_context(suite_workers(max(1, ncpu // 2), args.suite_chromium))
        print(
            f"{ncpu} vCPU; sandboxd {node}; suite worker(s) {workers} on {args.suite_chromium}; "
            f"{args.duration:.0f}s per level"
        )
        for c in [int(x) for x in args.concurrency.split(",")]:
            measure("sandboxd", "B4", node, c, args, {})
            measure("suite", "B4-baseline", workers[0], c, args, {"site_url": site})
        health = httpx.get(f"{node}/readyz", timeout=10).json()
        for w in health["workers"]:
            b = (w.get("health") or {}).get("runners", {}).get("browser")
            if b:
                keys = ("starved_retries", "starved_twice", "admitted_cuts", "admitted_limit", "browser_deaths")
                print("  sandboxd browser:", {k: b.get(k) for k in keys})
    print("\nratio sandboxd / suite worker (throughput, p99):")
    for c in sorted({c for _, c, _, _ in ROWS}):
        ours = next(r for r in ROWS if r[1] == c and r[0] == "sandboxd")
        base = next(r for r in ROWS if r[1] == c and r[0] == "suite")
        print(
            f"  c={c:<3} {ours[2] / base[2] if base[2] else float('nan'):5.2f}x  p99 {ours[3]:.0f} vs {base[3]:.0f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
