"""B9 with FIFO and with rollout-aware scheduling, alternating on this machine, one run.

    .venv/bin/python -m sandboxd.bench.rollout_scheduling [--concurrency 32] [--duration 60] [--rounds 2]

Starts a node (every B9 kind) with ``SANDBOXD_SCHEDULING=fifo``, runs B9 at
the given concurrency (choose one that saturates the node: steps queue), stops
it, does the same with ``oldest_rollout``, and repeats for ``--rounds``.
Prints, per policy and round: rollouts/s, rollout p50/p99, each task's p99
inside the mix, and the medians over the rounds with the change. Synchronous
RL waits for the slowest rollout of a batch, so rollout p99 is what the policy
is for; throughput must not drop.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from sandboxd.bench.loadgen import run_level
from sandboxd.bench.run import SCALE_FACTOR
from sandboxd.bench.workloads import WORKLOADS
from sandboxd.localnode import local_node

POLICIES = ("fifo", "oldest_rollout")


def one(policy: str, c: int, warmup: float, duration: float) -> dict[str, Any]:
    b9 = WORKLOADS["B9"]
    env = {
        "SANDBOXD_RUNNERS": json.dumps(list(b9.runners)),
        "SANDBOXD_SQL__SCALE_FACTOR": SCALE_FACTOR["quick"],
        "SANDBOXD_SCHEDULING": policy,
    }
    with local_node(env) as base:
        s = run_level("B9", base, c, warmup, duration, seed=b9.seed_base ^ c)
    lat = b9.latency(s)
    return {
        "rollouts_per_s": s.ops / duration,
        "p50": lat["rollout"]["p50"],
        "p99": lat["rollout"]["p99"],
        "errors": s.errors,
        "task_p99": {t: v.get("p99") for t, v in lat["per_task"].items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    rows: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES}
    print(f"B9 c={args.concurrency}, {args.duration:g}s per run, policies alternating, {args.rounds} rounds")
    for r in range(args.rounds):
        for policy in POLICIES if r % 2 == 0 else reversed(POLICIES):
            t = time.monotonic()
            res = one(policy, args.concurrency, args.warmup, args.duration)
            rows[policy].append(res)
            tasks = "  ".join(f"{k} {v:.0f}" for k, v in res["task_p99"].items() if v is not None)
            print(
                f"  round {r + 1} {policy:<15} {res['rollouts_per_s']:6.3f} rollouts/s  p50 {res['p50']:8.0f} ms  "
                f"p99 {res['p99']:8.0f} ms  errors {res['errors']}  task p99: {tasks}  ({time.monotonic() - t:.0f}s)",
                flush=True,
            )
    med = {p: {k: statistics.median(x[k] for x in rows[p]) for k in ("rollouts_per_s", "p50", "p99")} for p in POLICIES}
    f, o = med["fifo"], med["oldest_rollout"]
    print("\nmedians over rounds:")
    for p in POLICIES:
        print(
            f"  {p:<15} {med[p]['rollouts_per_s']:.3f} rollouts/s  "
            f"p50 {med[p]['p50']:.0f} ms  p99 {med[p]['p99']:.0f} ms"
        )
    print(
        f"oldest_rollout vs fifo: throughput {o['rollouts_per_s'] / f['rollouts_per_s'] - 1:+.1%}, "
        f"rollout p99 {o['p99'] / f['p99'] - 1:+.1%}, p50 {o['p50'] / f['p50'] - 1:+.1%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
