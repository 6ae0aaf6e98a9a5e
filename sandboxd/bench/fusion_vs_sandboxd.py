"""sandboxd against a SandboxFusion server, side by side, over SandboxFusion's own contract (``POST /run_code``).

    .venv/bin/python -m sandboxd.bench.fusion_vs_sandboxd --fusion http://127.0.0.1:8090 [--fusion-pid PID]
        [--target URL --pid PID] [--workloads B1,cpp,cpp-fresh] [--concurrency 1,4,16] [--duration 10]
        [--rounds 2] [--exclude mbpp/123]

Most verl and SkyRL users run SandboxFusion's own server; ``/run_code`` speaks its contract, so the same
requests go to both: B1's programs (python one-shots: HumanEval + MBPP with their asserts), and a C++ case set
(``cpp_cases.py``: a solution graded on one of its tests per request, as a trainer sends them, ``cpp``; and
with every source new, so every request compiles, ``cpp-fresh``). Each level runs on one server and then on
the other, the order alternating between rounds, with the same load generator as ``sandboxd bench``. For each
side: requests/s, p50/p99, pass rate, failures, and the CPU of that server's process tree per request (every
process below ``--fusion-pid`` / the node's pid: the server, and the interpreters and compilers it starts)
over the measure window. Without ``--target`` a sandboxd node (python and code, its defaults) is started on
a free loopback port. ``--fusion-pid`` is found from the listening port when the server runs here.

Nothing here is tuned to either server: the point is an honest ratio. Say in the figures how the SandboxFusion
server was run (its isolation setting above all: its default, ``none``, runs each program as a plain
subprocess of the server).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from sandboxd.bench.loadgen import run_level
from sandboxd.bench.resources import Sampler
from sandboxd.bench.stats import percentile
from sandboxd.localnode import local_node

# name: (workload id, options, the shortest window that holds enough of its requests)
MODES: dict[str, tuple[str, dict[str, object], float]] = {
    "B1": ("B1-fusion", {}, 0.0),
    "cpp": ("cpp-fusion", {}, 0.0),
    "cpp-fresh": ("cpp-fusion", {"fresh": True}, 40.0),  # a bits/stdc++.h compile takes 1-3 s of CPU
}
SIDES = ("sandboxd", "fusion")


@dataclass
class Tally:
    rates: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    graded: int = 0
    passed: int = 0
    errors: int = 0

    def line(self) -> str:
        lat = sorted(self.latencies)
        p50 = percentile(lat, 50) if lat else float("nan")
        p99 = percentile(lat, 99) if lat else float("nan")
        rate = statistics.median(self.rates) if self.rates else 0.0
        cpu = f"{statistics.median(self.cpu_ms):7.2f}" if self.cpu_ms else "    n/a"
        passed = f"{self.passed / self.graded:6.1%}" if self.graded else "   n/a"
        return (
            f"{rate:8.1f} req/s  p50 {p50:7.1f}  p99 {p99:7.1f} ms  pass {passed}  errors {self.errors:<4}"
            f" cpu {cpu} ms/req"
        )


def listening_pid(url: str) -> int | None:
    """The pid of the process listening on ``url``'s TCP port on this machine (the root of its tree)."""
    port = urlsplit(url).port
    if port is None:
        return None
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                    inodes.add(cols[9])
    owners = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    owners.add(int(proc.name))
    if not owners:
        return None
    # Several processes share a listening socket (uvicorn --workers): their common ancestor among them.
    return min(owners)


def prime(url: str) -> None:
    """Every solution of the C++ set sent once: a trainer grades a solution on test after test, so a server
    that keeps compiled programs pays one compile per solution, not per test (one without pays every time)."""
    from sandboxd.bench.cpp_cases import cases

    with httpx.Client(base_url=url, timeout=120) as client:
        for case in {c.problem: c for c in cases()}.values():
            body = {"code": case.source, "language": "cpp", "stdin": case.stdin, "compile_timeout": 60}
            client.post("/run_code", json=body).raise_for_status()


def measure(url: str, pid: int | None, mode: str, c: int, args: argparse.Namespace, r: int, into: Tally) -> None:
    workload, options, min_s = MODES[mode]
    duration = max(args.duration, min_s)
    opts = {**options, "exclude": args.exclude}
    with Sampler(period_s=0.25, node_pid=pid) as sampler:
        s = run_level(workload, url, c, args.warmup, duration, seed=(0xF5 ^ c) + r, options=opts)
    into.rates.append(s.ops / duration)
    into.latencies += s.latencies_ms
    into.graded += s.graded
    into.passed += s.passed
    into.errors += s.errors
    used = sampler.cpu_by_role(s.window)
    if used is not None and s.ops:
        cpu, seconds = used
        into.cpu_ms.append(sum(cpu.values()) * 1000 / (s.ops * seconds / duration))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fusion", required=True, help="base URL of a SandboxFusion server (or anything speaking it)")
    ap.add_argument("--fusion-pid", type=int, help="root of its process tree (default: the port's listener here)")
    ap.add_argument("--target", help="a running sandboxd; default: start one on loopback")
    ap.add_argument("--pid", type=int, help="with --target: the root of its process tree")
    ap.add_argument("--workloads", default=",".join(MODES), help=f"comma-separated, of {list(MODES)}")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per level and side")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=2, help="each level this many times per side, alternating")
    ap.add_argument("--exclude", default="", help="B1 task ids to leave out, comma-separated (e.g. mbpp/123)")
    args = ap.parse_args(argv)
    args.exclude = sorted(x for x in args.exclude.split(",") if x)
    modes = [m for m in args.workloads.split(",") if m]
    if unknown := [m for m in modes if m not in MODES]:
        ap.error(f"unknown workloads {unknown}; known: {list(MODES)}")
    fusion_pid = args.fusion_pid or listening_pid(args.fusion)
    with contextlib.ExitStack() as stack:
        target = args.target or stack.enter_context(local_node({"SANDBOXD_RUNNERS": '["python", "code"]'}))
        pid = args.pid if args.target else int(httpx.get(f"{target}/readyz", timeout=10).json()["pid"])
        urls = {"sandboxd": (target, pid), "fusion": (args.fusion, fusion_pid)}
        print(
            f"sandboxd {target} (tree of pid {pid}) vs SandboxFusion {args.fusion} (tree of pid {fusion_pid});"
            f" {os.cpu_count()} vCPU; {args.duration:g} s per level and side, {args.rounds} rounds alternating",
            flush=True,
        )
        for mode in modes:
            if mode == "cpp":
                for side in SIDES:
                    prime(urls[side][0])
            for c in (int(x) for x in args.concurrency.split(",")):
                tallies = {side: Tally() for side in SIDES}
                for r in range(args.rounds):
                    for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                        measure(*urls[side], mode, c, args, r, tallies[side])
                ours, theirs = tallies["sandboxd"], tallies["fusion"]
                print(f"{mode} c={c}", flush=True)
                for side in SIDES:
                    print(f"  {side:<9} {tallies[side].line()}", flush=True)
                if ours.rates and theirs.rates and statistics.median(theirs.rates) > 0:
                    ratio = statistics.median(ours.rates) / statistics.median(theirs.rates)
                    p99 = (
                        percentile(sorted(ours.latencies), 99) / percentile(sorted(theirs.latencies), 99)
                        if ours.latencies and theirs.latencies
                        else float("nan")
                    )
                    cpu = (
                        statistics.median(ours.cpu_ms) / statistics.median(theirs.cpu_ms)
                        if ours.cpu_ms and theirs.cpu_ms
                        else float("nan")
                    )
                    print(f"  sandboxd/fusion: {ratio:.2f}x req/s, p99 {p99:.2f}x, CPU per request {cpu:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
