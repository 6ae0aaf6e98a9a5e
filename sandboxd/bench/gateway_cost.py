"""CPU per step of a node's front processes, workers and sandboxes, per kind of light step.

    .venv/bin/python -m sandboxd.bench.gateway_cost [--concurrency 32] [--duration 10] [--target URL --pid PID]

Starts a node on loopback (or measures ``--target``, whose process tree is rooted at ``--pid``), drives
each probe closed-loop at the given concurrency with the multi-process load generator, and reads the CPU
seconds of the node's processes by role (``proctree.py``) at the start and end of the measure window.
Prints steps/s and CPU ms per step: front (what takes HTTP), node (node-wide state, when separate),
worker, sandbox. The front's share is the figure a regression shows in: it is what bounds how many
workers one front process can feed.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from typing import Any

import httpx

from sandboxd.bench.loadgen import run_level
from sandboxd.bench.proctree import ROLES, cpu_by_role
from sandboxd.localnode import local_node

SETTLE_S = 5.0
LOOKUP = {"runner": "tools", "action": {"tool": "get_product_details", "args": {"product_id": "P1001"}}}
RESET = {"runner": "textgame", "action": {"op": "reset", "seed": 1, "max_steps": 1000}}
# name: (step body, session kind or None, the step each loop's session starts with)
PROBES: dict[str, tuple[dict[str, Any], str | None, dict[str, Any] | None]] = {
    "tools one-shot": (LOOKUP, None, None),
    "tools session step": (LOOKUP, "tools", None),
    "textgame session step": ({"runner": "textgame", "action": {"op": "step", "command": "look"}}, "textgame", RESET),
    "python pass": ({"runner": "python", "action": {"code": "pass"}}, None, None),
}


def measure(target: str, root: int, probe: str, c: int, warmup_s: float, duration_s: float) -> dict[str, float]:
    body, session, first = PROBES[probe]
    marks: list[dict[str, float]] = []

    def sample_window() -> None:
        time.sleep(warmup_s)
        marks.append(cpu_by_role(root))
        time.sleep(duration_s)
        marks.append(cpu_by_role(root))

    options: dict[str, Any] = {"step": body, "session": session, "first": first}
    sampler = threading.Thread(target=sample_window, daemon=True)
    sampler.start()
    s = run_level("call", target, c, warmup_s, duration_s, seed=1, options=options)
    sampler.join()
    steps = max(s.ops, 1)
    out = {"steps_per_s": s.ops / duration_s, "errors": float(s.errors), "client_cpu_s": s.client_cpu_s}
    for role in ROLES:
        out[f"{role}_ms"] = (marks[1][role] - marks[0][role]) * 1000 / steps
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--probes", default=",".join(PROBES))
    ap.add_argument("--target", help="a running node; with --pid, the root of its process tree")
    ap.add_argument("--pid", type=int)
    args = ap.parse_args(argv)
    with contextlib.ExitStack() as stack:
        target = args.target or stack.enter_context(local_node({"SANDBOXD_RUNNERS": '["python", "tools", "textgame"]'}))
        root = args.pid or int(httpx.get(f"{target}/readyz", timeout=10).json()["pid"])
        time.sleep(SETTLE_S)  # a node just started is still warming (jails, pools): not a step's cost
        print(f"node {target} (pid {root}); c={args.concurrency}, {args.duration:g}s per probe; CPU ms per step:")
        print(f"  {'probe':<24} {'steps/s':>8} " + " ".join(f"{r:>8}" for r in ROLES) + f" {'errors':>7}")
        for probe in args.probes.split(","):
            m = measure(target, root, probe, args.concurrency, args.warmup, args.duration)
            cells = " ".join(f"{m[f'{r}_ms']:8.3f}" for r in ROLES)
            print(f"  {probe:<24} {m['steps_per_s']:8.0f} {cells} {m['errors']:7.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
