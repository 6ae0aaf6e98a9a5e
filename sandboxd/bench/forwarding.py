"""What many nodes cost and buy on one machine, measured side by side in one run.

    .venv/bin/python -m sandboxd.bench.forwarding [--steps 400] [--duration 20] [--concurrency 16]

1. Forwarding: two nodes sharing a redis-server on loopback; one session on node
   A, stepped alternately through A (its owner) and through B (which forwards
   to A), one step at a time, so the difference of the two latency
   distributions is the hop: B's routing, the keep-alive request to A, and the
   answer relayed back. For a textgame session (sub-ms steps: the hop is
   most of it) and a python session (a jailed cell).
2. Scale-out on one machine: one-shot B1 throughput of one node with W
   workers against two nodes (Redis, W/2 workers each) under the same load,
   the loops spread over both nodes: what a second gateway process buys when
   the machine's CPUs are shared anyway.

Needs ``redis-server`` on the PATH (scripts/setup.sh installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

from sandboxd.bench.loadgen import run_level
from sandboxd.bench.stats import percentile
from sandboxd.bench.workload import Samples
from sandboxd.localnode import LocalRedis, NodeProcess
from sandboxd.wire import Connection


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    with LocalRedis.running() as server:
        yield server.url


@contextlib.contextmanager
def nodes(count: int, workers: int, redis_url: str | None) -> Iterator[list[str]]:
    started = []
    try:
        for i in range(count):
            env = {
                "SANDBOXD_NODE_ID": f"bench{i}",
                "SANDBOXD_WORKERS": str(workers),
                "SANDBOXD_RUNNERS": '["python", "textgame"]',
                "SANDBOXD_LOG_LEVEL": "warning",
            }
            if redis_url:
                env["SANDBOXD_REDIS_URL"] = redis_url
            started.append(NodeProcess(env))
        for n in started:
            n.wait_ready()
        if redis_url:  # every node sees the others before anything is measured
            time.sleep(2.5)
        yield [n.url for n in started]
    finally:
        for n in started:
            n.stop()


@dataclass(frozen=True)
class HopRow:
    runner: str
    via: str
    n: int
    p50_ms: float
    p99_ms: float


ACTIONS: dict[str, tuple[dict[str, object], dict[str, object]]] = {
    "textgame": ({}, {"op": "reset", "seed": 1}),
    "python": ({}, {"code": "x = x + 1 if 'x' in globals() else 0"}),
}


async def hop(owner: str, other: str, runner: str, steps: int) -> list[HopRow]:
    a, b = Connection(owner), Connection(other)
    options, action = ACTIONS[runner]
    status, info = await a.request("POST", "/sessions", {"runner": runner, "options": options})
    if status != 201:
        raise SystemExit(f"session create failed: {status} {info}")
    sid = info["session_id"]
    times: dict[str, list[float]] = {"owner": [], "forwarded": []}
    body = {"runner": runner, "session_id": sid, "action": action}
    try:
        for i in range(steps + 20):
            pair = [("owner", a), ("forwarded", b)]
            for via, conn in pair if i % 2 else reversed(pair):  # alternate the order: no drift favours one
                t = time.perf_counter()
                status, res = await conn.request("POST", "/rollout/step", body)
                dt = (time.perf_counter() - t) * 1000
                if status != 200 or (res.get("error") and res["error"]["blame"] != "program"):
                    raise SystemExit(f"step via {via} failed: {status} {res}")
                if i >= 20:  # the first ones warm connections and pools
                    times[via].append(dt)
    finally:
        await a.request("DELETE", f"/sessions/{sid}")
        await a.close()
        await b.close()
    rows = []
    for via, xs in times.items():
        xs.sort()
        rows.append(HopRow(runner, via, len(xs), percentile(xs, 50), percentile(xs, 99)))
    return rows


def window_s(s: Samples) -> float:
    return (s.window[1] - s.window[0]) if s.window else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=400, help="session steps per path and runner")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of one-shot load per configuration")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2, help="workers of the single node (each of two gets half)")
    args = ap.parse_args()

    print("# forwarding: a session step through its owner vs through another node (one at a time, alternating)")
    with redis_server() as redis_url, nodes(2, 1, redis_url) as (owner, other):
        rows = []
        for runner in ("textgame", "python"):
            rows += asyncio.run(hop(owner, other, runner, args.steps))
    print(f"{'runner':9} {'via':10} {'steps':>5} {'p50 ms':>8} {'p99 ms':>8}")
    for r in rows:
        print(f"{r.runner:9} {r.via:10} {r.n:5d} {r.p50_ms:8.3f} {r.p99_ms:8.3f}")
    for runner in ("textgame", "python"):
        own, fwd = (next(r for r in rows if r.runner == runner and r.via == v) for v in ("owner", "forwarded"))
        print(f"{runner}: forwarding adds p50 {fwd.p50_ms - own.p50_ms:+.3f} ms, p99 {fwd.p99_ms - own.p99_ms:+.3f} ms")

    print(
        f"\n# one-shot B1, c={args.concurrency}: one node x {args.workers} workers vs two nodes x "
        f"{args.workers // 2 or 1} (Redis), same load, {args.duration:g} s each"
    )
    results = {}
    with nodes(1, args.workers, None) as urls:
        results["1 node"] = run_level("B1", urls[0], args.concurrency, args.warmup, args.duration, seed=0xF0)
    with redis_server() as redis_url, nodes(2, max(1, args.workers // 2), redis_url) as urls:
        results["2 nodes"] = run_level("B1", ",".join(urls), args.concurrency, args.warmup, args.duration, seed=0xF0)
    print(f"{'config':8} {'exec/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'client cores':>12}")
    for name, s in results.items():
        lat = sorted(s.latencies_ms)
        rate = len(lat) / window_s(s) if window_s(s) else 0.0
        print(
            f"{name:8} {rate:8.1f} {percentile(lat, 50):8.1f} {percentile(lat, 99):8.1f} {s.errors:6d} "
            f"{s.client_cpu_s / window_s(s) if window_s(s) else 0:12.2f}"
        )
    one, two = (len(results[k].latencies_ms) / window_s(results[k]) for k in ("1 node", "2 nodes"))
    print(f"two nodes / one node throughput: x{two / one:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
