"""B4's selector misses, trajectory by trajectory, on two nodes: a change to the browser must not move them.

    .venv/bin/python -m sandboxd.bench.browser_misses --variant a='{...}' --variant b='{...}'

Runs the 80 seeded B4 trajectories (``build_pool(42)``) one at a time, each on
both nodes in turn (one at a time: misses judged without contention, where they
are the template's by design), and prints each node's failed actions and every
trajectory whose failed actions differ. To compare two source trees, run this
from a directory with no ``sandboxd`` in it and give each variant its
``PYTHONPATH`` (``python -m`` puts the working directory first).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from typing import Any

import httpx

from sandboxd.bench.browser_trajectories import build_pool
from sandboxd.localnode import local_node, wait_ready

Outcome = tuple[str, list[int], int]  # template, indexes of failed actions, actions run


async def replay(bases: dict[str, str], pool: list[tuple[str, list[Any]]]) -> dict[str, list[Outcome]]:
    out: dict[str, list[Outcome]] = {name: [] for name in bases}
    async with httpx.AsyncClient(timeout=120) as h:
        for template, actions in pool:
            for name, base in bases.items():
                body = {"runner": "browser", "action": {"actions": actions}, "timeout_s": 120}
                r = await h.post(f"{base}/rollout/step", json=body)
                results = r.json()["observation"]["results"]
                out[name].append((template, [i for i, a in enumerate(results) if not a["ok"]], len(results)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", action="append", required=True, help="NAME=JSON of environment (two of them)")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args(argv)
    variants = dict(v.partition("=")[::2] for v in args.variant)
    if len(variants) != 2:
        ap.error("give exactly two variants")
    pool = build_pool(args.seed)
    with contextlib.ExitStack() as stack:
        bases = {}
        for name, settings in variants.items():
            env = {"SANDBOXD_RUNNERS": '["browser"]', "SANDBOXD_LOG_LEVEL": "warning", **json.loads(settings)}
            bases[name] = stack.enter_context(local_node(env))
            wait_ready(bases[name])
        out = asyncio.run(replay(bases, pool))
    a, b = list(out)
    for name in (a, b):
        failed = sum(len(f) for _, f, _ in out[name])
        actions = sum(n for _, _, n in out[name])
        print(f"{name}: {failed} failed of {actions} actions ({failed / max(actions, 1):.3f})")
    differ = [i for i in range(len(pool)) if out[a][i][1] != out[b][i][1]]
    print(f"trajectories whose failed actions differ: {len(differ)} of {len(pool)}")
    for i in differ:
        print(f"  #{i} {out[a][i][0]}: {a} {out[a][i][1]}  {b} {out[b][i][1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
