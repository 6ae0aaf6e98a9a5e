"""B8 (a fresh sandbox running ``print(1)``) for two source trees at once: the A/B that drift cannot fake.

    .venv/bin/python -m sandboxd.bench.side_by_side /path/to/tree-A /path/to/tree-B [--rounds 8] [--trials 300]

Both nodes are up for the whole run (each started with ``PYTHONPATH`` set to its tree, e.g. a
``git worktree`` of the base commit); each round runs ``--trials`` trials on one and then on the other,
the order alternating between rounds, at each concurrency. A VM's speed drifts by 20-40% over minutes
on shared hosts; numbers taken one after the other then say more about the host than about the code,
while a per-round ratio does not. Prints pooled p50/p99 and the median of the per-round starts/s ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics

from sandboxd.bench.coldstart import _run
from sandboxd.localnode import NodeProcess


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree_a")
    ap.add_argument("tree_b")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--concurrency", default="1,4")
    args = ap.parse_args()
    trees = [args.tree_a, args.tree_b]
    nodes = []
    saved = os.environ.get("PYTHONPATH")
    try:
        for tree in trees:
            os.environ["PYTHONPATH"] = tree
            nodes.append(NodeProcess({"SANDBOXD_RUNNERS": '["python"]'}))
        for node in nodes:
            node.wait_ready(120)
        for c in (int(x) for x in args.concurrency.split(",")):
            latencies: dict[str, list[float]] = {t: [] for t in trees}
            rates: dict[str, list[float]] = {t: [] for t in trees}
            for r in range(args.rounds):
                order = list(zip(trees, nodes, strict=True))
                for tree, node in order[::-1] if r % 2 else order:
                    res = asyncio.run(_run(node.url, args.trials, c))
                    latencies[tree] += res.latencies_ms
                    rates[tree].append(len(res.latencies_ms) / res.wall_s)
            for tree in trees:
                lat = sorted(latencies[tree])
                print(
                    f"c={c} {tree}: starts/s median {statistics.median(rates[tree]):.1f}, "
                    f"p50 {lat[len(lat) // 2]:.2f} ms, p99 {lat[int(len(lat) * 0.99)]:.2f} ms (n={len(lat)})"
                )
            ratios = [b / a for a, b in zip(rates[trees[0]], rates[trees[1]], strict=True)]
            shown = ", ".join(f"{x:.2f}" for x in ratios)
            print(f"c={c} starts/s B/A per round: median {statistics.median(ratios):.3f} [{shown}]")
    finally:
        for node in nodes:
            node.stop()
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


if __name__ == "__main__":
    main()
