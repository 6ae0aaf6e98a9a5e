"""What ``import numpy, pandas, sympy`` costs an execution: sandboxd's one-shot vs a fresh interpreter.

    .venv/bin/python -m sandboxd.bench.imports [--rounds 40] [--target URL] [--code '...']

The fresh interpreter is what most sandboxes pay per execution (a container or a ``python -c`` per
request): ``python -I -c`` with the environment's package tree on its path, spawned straight from this
process (no HTTP, no jail: it is favoured). sandboxd runs the same program as a one-shot step of the
node's default environment, whose template has those modules imported already. Rounds alternate A and
B at concurrency 1 (the machine's drift hits both alike); printed: p50 and p90 of each, executions/s
(1 / mean latency) and their ratio, and the kernel's CPU time per execution of each.
Without --target a node is started on a free loopback port (one slot, so its template serves every
round after the first few) and stopped after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import httpx

from sandboxd.localnode import local_node
from sandboxd.runners.python.config import PythonRunnerConfig
from sandboxd.runners.python.environments import available

DEFAULT_CODE = "import numpy, pandas, sympy\nprint(1)"


def _fresh(python: str, site: str, code: str) -> tuple[float, float]:
    """One fresh interpreter running ``code``: wall ms and its CPU ms (from the kernel's rusage)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        [python, "-I", "-c", f"import sys; sys.path.append({site!r})\n{code}"],
        check=True,
        stdout=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1", "MPLBACKEND": "Agg"},
    )
    wall = (time.perf_counter() - t0) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000
    return wall, cpu


def _step(client: httpx.Client, code: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    r = client.post("/rollout/step", json={"runner": "python", "action": {"code": code}, "timeout_s": 30})
    wall = (time.perf_counter() - t0) * 1000
    body = r.json()
    if not body.get("ok"):
        raise SystemExit(f"the step failed: {json.dumps(body)[:400]}")
    return wall, float(body["observation"].get("cpu_ms") or 0.0)


def _summary(name: str, walls: list[float], cpus: list[float]) -> dict[str, float]:
    q = statistics.quantiles(walls, n=10)
    row = {
        "p50_ms": statistics.median(walls),
        "p90_ms": q[8],
        "per_s": 1000 / statistics.fmean(walls),
        "cpu_ms": statistics.median(cpus),
    }
    print(
        f"{name:<22} p50 {row['p50_ms']:8.1f} ms   p90 {row['p90_ms']:8.1f} ms   "
        f"{row['per_s']:7.1f} exec/s   cpu {row['cpu_ms']:7.1f} ms/exec"
    )
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="a running sandboxd; default: start one on loopback")
    ap.add_argument("--rounds", type=int, default=40, help="measured rounds (one execution of each per round)")
    ap.add_argument("--warmup", type=int, default=5, help="unmeasured rounds first (the template starts)")
    ap.add_argument("--code", default=DEFAULT_CODE)
    args = ap.parse_args(argv)
    cfg = PythonRunnerConfig()
    env = available(cfg.environments_dir).get(cfg.default_environment)
    if env is None:
        raise SystemExit(f"no {cfg.default_environment!r} environment under {cfg.environments_dir}: sandboxd env build")
    python = os.path.realpath(sys.executable)
    node = (
        contextlib.nullcontext(args.target)
        if args.target
        else local_node(
            {
                "SANDBOXD_RUNNERS": '["python"]',
                "SANDBOXD_WORKERS": "1",
                "SANDBOXD_PYTHON__SLOTS_PER_WORKER": "1",
                "SANDBOXD_PYTHON__BURST_SLOTS_PER_WORKER": "0",
            }
        )
    )
    fresh: tuple[list[float], list[float]] = ([], [])
    ours: tuple[list[float], list[float]] = ([], [])
    with node as base, httpx.Client(base_url=base, timeout=60) as client:
        for _ in range(args.warmup):
            _step(client, args.code)
        for i in range(args.rounds):
            order = ("ours", "fresh") if i % 2 == 0 else ("fresh", "ours")
            for which in order:
                wall, cpu = _step(client, args.code) if which == "ours" else _fresh(python, env.site, args.code)
                into = ours if which == "ours" else fresh
                into[0].append(wall)
                into[1].append(cpu)
    print(f"{args.code!r}, concurrency 1, {args.rounds} rounds alternating")
    a = _summary("sandboxd one-shot", *ours)
    b = _summary("fresh interpreter", *fresh)
    print(
        f"executions/s: sandboxd {a['per_s'] / b['per_s']:.1f}x a fresh interpreter; "
        f"CPU per execution {b['cpu_ms'] / max(a['cpu_ms'], 0.001):.1f}x less"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
