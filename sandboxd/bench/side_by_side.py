"""B1 or B8 for two source trees (or two configurations) at once: the A/B that drift cannot fake.

    .venv/bin/python -m sandboxd.bench.side_by_side /path/to/tree-A /path/to/tree-B [--workload B8] [--rounds 8]
        [--trials 300] [--duration 10] [--concurrency 1,4] [--env-a K=V ...] [--env-b K=V ...]

Both nodes are up for the whole run (each started with ``PYTHONPATH`` set to its tree, e.g. a
``git worktree`` of the base commit, and its own ``SANDBOXD_*`` settings from ``--env-a`` / ``--env-b``);
each round runs one measurement on one and then on the other, the order alternating between rounds, at
each concurrency. B8: ``--trials`` fresh sandboxes running ``print(1)``; B1: the load generator of
``sandboxd bench`` for ``--duration`` seconds (HumanEval + MBPP, pass rate checked). A VM's speed drifts
by 20-40% over minutes on shared hosts; numbers taken one after the other then say more about the host
than about the code, while a per-round ratio does not. Prints pooled p50/p99 and the median of the
per-round throughput ratios.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field

from sandboxd.bench.coldstart import run_trials
from sandboxd.bench.loadgen import run_level
from sandboxd.localnode import NodeProcess


@dataclass
class Side:
    latencies: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    failures: int = 0


def _measure(workload: str, url: str, c: int, args: argparse.Namespace, r: int) -> tuple[list[float], float, int]:
    """One round on one node: its latencies (ms), its throughput, its failures."""
    if workload == "B8":
        res = run_trials(url, args.trials, c, None)
        return res.latencies_ms, len(res.latencies_ms) / res.wall_s, 0
    options = {"exclude": sorted(x for x in args.exclude.split(",") if x)}
    s = run_level("B1", url, c, args.warmup, args.duration, seed=(0xB1 ^ c) + r, options=options)
    return s.latencies_ms, s.ops / args.duration, s.errors + (s.graded - s.passed)


def _settings(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key if key.startswith("SANDBOXD_") else f"SANDBOXD_{key.upper()}"] = value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tree_a")
    ap.add_argument("tree_b")
    ap.add_argument("--workload", choices=("B8", "B1"), default="B8")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--trials", type=int, default=300, help="B8: fresh sandboxes per round")
    ap.add_argument("--duration", type=float, default=10.0, help="B1: measured seconds per round")
    ap.add_argument("--warmup", type=float, default=2.0, help="B1: unmeasured seconds before each round")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--exclude", default="", help="B1: task ids to leave out, e.g. mbpp/123 (7 s of CPU alone)")
    ap.add_argument("--env-a", action="append", default=[], help="a SANDBOXD_ setting of node A (KEY=VALUE)")
    ap.add_argument("--env-b", action="append", default=[], help="a SANDBOXD_ setting of node B (KEY=VALUE)")
    args = ap.parse_args()
    trees = ["A", "B"]
    unit = "starts/s" if args.workload == "B8" else "exec/s"
    nodes = []
    try:
        for tree, extra in ((args.tree_a, args.env_a), (args.tree_b, args.env_b)):
            nodes.append(NodeProcess({"SANDBOXD_RUNNERS": '["python"]', **_settings(extra)}, cwd=tree))
        for node in nodes:
            node.wait_ready(300)
        print(f"A = {args.tree_a} {args.env_a}; B = {args.tree_b} {args.env_b}; {args.workload}")
        for c in (int(x) for x in args.concurrency.split(",")):
            sides = {t: Side() for t in trees}
            for r in range(args.rounds):
                order = list(zip(trees, nodes, strict=True))
                for tree, node in order[::-1] if r % 2 else order:
                    lat, rate, failed = _measure(args.workload, node.url, c, args, r)
                    sides[tree].latencies += lat
                    sides[tree].rates.append(rate)
                    sides[tree].failures += failed
            for tree in trees:
                lat = sorted(sides[tree].latencies)
                print(
                    f"c={c} {tree}: {unit} median {statistics.median(sides[tree].rates):.1f}, "
                    f"p50 {lat[len(lat) // 2]:.2f} ms, p99 {lat[int(len(lat) * 0.99)]:.2f} ms (n={len(lat)}, "
                    f"failures {sides[tree].failures})"
                )
            ratios = [b / a for a, b in zip(sides["A"].rates, sides["B"].rates, strict=True) if a]
            shown = ", ".join(f"{x:.2f}" for x in ratios)
            print(f"c={c} {unit} B/A per round: median {statistics.median(ratios):.3f} [{shown}]", flush=True)
    finally:
        for node in nodes:
            node.stop()


if __name__ == "__main__":
    main()
