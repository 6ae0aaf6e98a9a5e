"""Where one operation's CPU goes, by process: a node's (or a baseline worker's) processes, classed, per op.

    .venv/bin/python -m sandboxd.bench.cpu_breakdown B1 [--concurrency 8] [--duration 10] [--baseline]
        [--target URL] [--exclude mbpp/123]

Drives the workload closed-loop with the load generator of ``sandboxd bench`` and reads every process's CPU
(``/proc/<pid>/stat``: its own time, and separately the time of the children it reaped) at the open and the
close of the measure window. A process is classed by its command line: the node's fronts, node process and
workers; a jail's nsjail, zygote and, from the zygote's reaped children, its executors (each execution's own
process); DuckDB engines; Chromium's browser, renderer and helper (GPU, utility, zygote) processes and
Playwright's driver; the load generator; anything else. Printed: CPU ms per op of each class, and the
host's busy CPU per op (which catches what no class names: the kernel's own threads).

``--baseline`` measures the public suite's worker instead (a replica, ``baselines/``): B1's ``prlimit
python -c`` per program (its interpreters are the load generator's children), B3's and the light call's
FastAPI worker, B4's Playwright worker. Used for ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from sandboxd.bench.loadgen import run_level
from sandboxd.bench.resources import cpu_times
from sandboxd.bench.stats import percentile
from sandboxd.localnode import local_node

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
SUITE_CHROMIUM = "/usr/lib/chromium/chromium-headless-shell"  # the headless shell, as the suite's image runs it
LOOKUP = {"runner": "tools", "action": {"tool": "get_product_details", "args": {"product_id": "P1001"}}}
# workload -> (load generator workload, options, kinds an embedded node enables, the baseline's workload)
WORKLOADS: dict[str, tuple[str, dict[str, object], str, str | None]] = {
    "B1": ("B1", {}, '["python"]', "B1-baseline"),
    "pass": ("call", {"step": {"runner": "python", "action": {"code": "pass"}}}, '["python"]', None),
    "call": ("call", {"step": LOOKUP}, '["tools"]', "call-baseline"),
    "B3": ("B3", {}, '["tools"]', "B3-baseline"),
    "B4": ("B4", {}, '["browser"]', "B4-baseline"),
    "B5": ("B5", {}, '["sql"]', None),
    "B7": ("B7", {}, '["textgame"]', None),
}


def classify(cmdline: str, comm: str) -> str:
    if "sandboxd.front" in cmdline:
        return "front"
    if "sandboxd.worker" in cmdline:
        return "worker"
    if "sandboxd serve" in cmdline or "sandboxd.node" in cmdline:
        return "node"
    if "jailside/zygote.py" in cmdline:
        return "zygote"
    if comm == "nsjail":
        return "nsjail"
    if "sql" in cmdline and "engine" in cmdline:
        return "sql engine"
    if "headless_shell" in cmdline or "chrom" in comm:
        if "--type=renderer" in cmdline:
            return "chromium renderer"
        if "--type=" in cmdline:
            return "chromium helpers"
        return "chromium browser"
    if "playwright" in cmdline and ("node" in comm or "driver" in cmdline):
        return "playwright driver"
    if "multiprocessing" in cmdline or "spawn_main" in cmdline:
        return "load generator"
    if comm == "prlimit" or (comm.startswith("python") and cmdline.split(" ", 2)[1:2] == ["-c"]):
        return "baseline interpreters"  # B1's baseline: ``prlimit ... python -c PROGRAM`` per program
    if "b3_worker" in cmdline or "b4_worker" in cmdline or "uvicorn" in cmdline:
        return "baseline worker"
    return "other"


def snapshot() -> dict[int, tuple[str, float, float]]:
    """pid -> (class, own CPU s, CPU s of the children it reaped). A process with no class of its own takes
    its nearest classed ancestor's (a baseline worker's uvicorn children start as multiprocessing's spawn)."""
    raw: dict[int, tuple[str | None, int, float, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            head, _, rest = (entry / "stat").read_text().rpartition(")")
            comm = head.split("(", 1)[1]
            f = rest.split()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            own, reaped = (int(f[11]) + int(f[12])) * TICK_S, (int(f[13]) + int(f[14])) * TICK_S
            raw[int(entry.name)] = (classify(cmd, comm), int(f[1]), own, reaped)
    out = {}
    for pid, (cls, ppid, own, reaped) in raw.items():
        seen = 0
        while cls in (None, "load generator", "other") and ppid in raw and seen < 64:
            parent_cls = raw[ppid][0]
            if parent_cls not in (None, "load generator", "other"):
                cls = parent_cls
                break
            ppid, seen = raw[ppid][1], seen + 1
        out[pid] = (cls or "other", own, reaped)
    return out


REAPED_AS = {"zygote": "executors", "load generator": "baseline interpreters", "worker": "worker children"}


def per_class(a: dict[int, tuple[str, float, float]], b: dict[int, tuple[str, float, float]]) -> dict[str, float]:
    """CPU seconds per class between two snapshots (processes that ended in between are counted by the
    parents that reaped them, under ``REAPED_AS``)."""
    out: dict[str, float] = defaultdict(float)
    for pid, (cls, own, reaped) in b.items():
        own0, reaped0 = (a[pid][1], a[pid][2]) if pid in a else (0.0, 0.0)
        out[cls] += own - own0
        out[REAPED_AS.get(cls, cls + " children")] += reaped - reaped0
    return {k: v for k, v in out.items() if v > 0.0005}


@contextlib.contextmanager
def baseline_target(workload: str) -> Iterator[tuple[str, dict[str, object]]]:
    """The suite's worker replica for ``workload`` (B1's baseline needs none: the load generator runs it)."""
    if workload == "B1":
        from sandboxd.bench.workloads import real_python

        yield "http://127.0.0.1:9", {"python": real_python()}
    elif workload in ("call", "B3"):
        from sandboxd.bench.b3_vs_baseline import suite_worker

        with suite_worker(os.cpu_count() or 1) as url:
            yield url, {}
    elif workload == "B4":
        from sandboxd.bench.browser_vs_baseline import static_site, suite_workers
        from sandboxd.runners.browser.sites import BUNDLED

        ncpu = len(os.sched_getaffinity(0))
        with static_site(BUNDLED["shop"]) as site, suite_workers(max(1, ncpu // 2), SUITE_CHROMIUM) as urls:
            yield urls[0], {"site_url": site}
    else:
        raise SystemExit(f"no baseline for {workload}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=list(WORKLOADS))
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--baseline", action="store_true", help="the public suite's worker (a replica) instead")
    ap.add_argument("--target", help="a running node on this machine; default: start one")
    ap.add_argument("--exclude", default="", help="B1 task ids to leave out, e.g. mbpp/123")
    args = ap.parse_args(argv)
    name, options, runners, base_wl = WORKLOADS[args.workload]
    options = {**options, "exclude": sorted(x for x in args.exclude.split(",") if x)}
    with contextlib.ExitStack() as stack:
        if args.baseline:
            if base_wl is None:
                ap.error(f"{args.workload} has no baseline worker")
            target, extra = stack.enter_context(baseline_target(args.workload))
            name, options = base_wl, {**options, **extra}
        else:
            target = args.target or stack.enter_context(local_node({"SANDBOXD_RUNNERS": runners}))
            time.sleep(5)  # a node just started is still warming its pools
        marks: list[tuple[dict[int, tuple[str, float, float]], float]] = []

        def sample() -> None:
            time.sleep(args.warmup + 1)
            marks.append((snapshot(), cpu_times()))
            time.sleep(max(args.duration - 2, 1))
            marks.append((snapshot(), cpu_times()))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        s = run_level(
            name, target, args.concurrency, args.warmup, args.duration, seed=0xCB ^ args.concurrency, options=options
        )
        sampler.join()
    seconds = max(args.duration - 2, 1)
    ops = s.ops * seconds / args.duration  # the ops of the sampled part of the window
    if not ops or len(marks) < 2:
        print("no op completed", file=sys.stderr)
        return 1
    classes = per_class(marks[0][0], marks[1][0])
    lat = sorted(s.latencies_ms)
    who = "the suite's worker (replica)" if args.baseline else "sandboxd"
    print(
        f"{args.workload} on {who}, c={args.concurrency}: {s.ops / args.duration:.1f} ops/s, p50 "
        f"{percentile(lat, 50):.1f} ms, p99 {percentile(lat, 99):.1f} ms, errors {s.errors}; CPU ms per op:"
    )
    for cls, secs in sorted(classes.items(), key=lambda kv: -kv[1]):
        print(f"  {cls:<24} {secs * 1000 / ops:9.3f}")
    named = sum(classes.values())
    host = marks[1][1] - marks[0][1]
    print(f"  {'(all classes)':<24} {named * 1000 / ops:9.3f}")
    print(f"  {'(host busy)':<24} {host * 1000 / ops:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
