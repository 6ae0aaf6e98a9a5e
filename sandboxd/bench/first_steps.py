"""A node's first numpy steps: how fast the first one-shots that import preloads are on a node that has just
reported ready (a training run's first steps, every scale-up), and how long the node took to be ready.

    .venv/bin/python -m sandboxd.bench.first_steps [--tree PATH] [--steps 20] [--concurrency 1,4]

Each concurrency level starts a fresh node (default settings, the tree on ``PYTHONPATH`` when given: a
``git worktree`` of another commit) and sends ``--steps`` one-shots ``import numpy, pandas, sympy`` the
moment /readyz answers 200, ``--concurrency`` at a time. Prints the time to ready, p50 and max.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from sandboxd.localnode import NodeProcess

CODE = "import numpy, pandas, sympy\nprint(int(numpy.arange(4).sum()))"


async def _first(url: str, steps: int, concurrency: int) -> list[float]:
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:

        async def one() -> None:
            t0 = time.monotonic()
            r = await c.post("/rollout/step", json={"runner": "python", "action": {"code": CODE}})
            if not r.json().get("ok"):
                raise RuntimeError(f"a first step failed: {r.text[:300]}")
            latencies.append((time.monotonic() - t0) * 1000)

        for _ in range(steps // concurrency):
            await asyncio.gather(*(one() for _ in range(concurrency)))
    return latencies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", help="the source tree the node runs (PYTHONPATH); default: this one")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--concurrency", default="1,4")
    args = ap.parse_args()
    for c in (int(x) for x in args.concurrency.split(",")):
        t0 = time.monotonic()
        node = NodeProcess({"SANDBOXD_RUNNERS": '["python"]'}, cwd=args.tree)
        try:
            node.wait_ready(300)
            ready_s = time.monotonic() - t0
            lat = sorted(asyncio.run(_first(node.url, args.steps, c)))
        finally:
            node.stop()
        print(
            f"c={c} ready after {ready_s:.1f} s; first {len(lat)} numpy/pandas/sympy one-shots: "
            f"p50 {statistics.median(lat):.0f} ms, max {lat[-1]:.0f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
