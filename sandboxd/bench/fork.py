"""Fork a prepared session into a GRPO group vs build the group from nothing, side by side in one run.

    .venv/bin/python -m sandboxd.bench.fork [--rounds 5] [--groups 8,64]

For each kind, a session is prepared with the kind's setup steps; then, per
round and group size G: **fork** (one ``POST /sessions/{id}/fork {"n": G}``,
timed until the G copies exist) against **replay** (G sessions created and the
same setup steps replayed in each, all G concurrently, timed until the last is
done). Both sides close their G sessions before the next round. p50 and p99
of the wall time per group, and the ratio of the medians.

python's setup holds ~50 MB of state (a loaded data set). A python session
forks once (its copies and its own continuation are confined by Landlock,
docs/api.md), so each python fork round prepares a fresh source first,
outside the timing, and closes it with its copies.

Starts its own node on loopback; the lean client (``sandboxd.wire``), one
connection per concurrent session, so client overhead does not favour fork.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from typing import Any

from sandboxd.bench.stats import percentile
from sandboxd.localnode import local_node
from sandboxd.wire import Connection

SETUP: dict[str, list[dict[str, Any]]] = {
    "tools": [
        {"tool": "find_user_id_by_email", "args": {"email": "EMAIL"}},
        {"tool": "get_user_details", "args": {"user_id": "USER"}},
        {"tool": "add_to_cart", "args": {"user_id": "USER", "item_id": "ITEM", "quantity": 2}},
        {"tool": "view_cart", "args": {"user_id": "USER"}},
    ],
    "textgame": [{"op": "reset", "seed": 7}] + [{"op": "step", "command": "look"}] * 8,
    "browser": [
        {
            "actions": [
                {"action": "goto", "path": "/"},
                {"action": "click", "selector": "button.add-to-cart[data-id='7']"},
                {"action": "click", "selector": "button.add-to-cart[data-id='3']"},
                {"action": "goto", "path": "/product.html?id=5"},
                {"action": "goto", "path": "/cart.html"},
                {"action": "text", "selector": "#cart-rows"},
            ]
        }
    ],
    # ~50 MB of Python objects: a data set parsed into tuples, as a setup cell would load one.
    "python": [{"code": "data = [(i, str(i) * 3, i * 0.5) for i in range(450_000)]\nprint(len(data))"}],
}


@dataclass(frozen=True)
class Row:
    runner: str
    group: int
    mode: str
    p50_s: float
    p99_s: float
    rounds: int


async def call(conn: Connection, method: str, path: str, body: Any = None) -> Any:
    status, data = await conn.request(method, path, body)
    if status >= 400 or (isinstance(data, dict) and data.get("error") and data["error"]["blame"] != "program"):
        raise SystemExit(f"{method} {path}: {status} {data}")
    return data


async def prepared(base: str, runner: str, setup: list[dict[str, Any]]) -> str:
    conn = Connection(base)
    sid: str = (await call(conn, "POST", "/sessions", {"runner": runner}))["session_id"]
    for action in setup:
        await call(conn, "POST", "/rollout/step", {"runner": runner, "session_id": sid, "action": action})
    await conn.close()
    return sid


async def close_all(base: str, ids: list[str]) -> None:
    """Sixteen connections, each deleting its share one after the other (a connection takes one request at a time)."""

    async def share(k: int) -> None:
        conn = Connection(base)
        for sid in ids[k::16]:
            await conn.request("DELETE", f"/sessions/{sid}")
        await conn.close()

    await asyncio.gather(*(share(k) for k in range(min(16, len(ids)))))


async def fork_once(base: str, source: str, n: int) -> tuple[float, list[str]]:
    conn = Connection(base)
    t = time.perf_counter()
    answer = await call(conn, "POST", f"/sessions/{source}/fork", {"n": n})
    elapsed = time.perf_counter() - t
    await conn.close()
    return elapsed, [s["session_id"] for s in answer["sessions"]]


async def replay_once(base: str, runner: str, setup: list[dict[str, Any]], n: int) -> tuple[float, list[str]]:
    conns = [Connection(base) for _ in range(n)]
    ids: list[str] = []

    async def one(conn: Connection) -> None:
        sid = (await call(conn, "POST", "/sessions", {"runner": runner}))["session_id"]
        ids.append(sid)
        for action in setup:
            await call(conn, "POST", "/rollout/step", {"runner": runner, "session_id": sid, "action": action})

    t = time.perf_counter()
    await asyncio.gather(*(one(c) for c in conns))
    elapsed = time.perf_counter() - t
    for c in conns:
        await c.close()
    return elapsed, ids


def fill_tools(setup: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from sandboxd.runners.tools.data import build

    db = build()
    user = next(iter(db.users.values()))
    item = next(v for p in db.products.values() for v in p["variants"].values() if v["available"])
    subst = {"EMAIL": user["email"], "USER": user["user_id"], "ITEM": item["item_id"]}
    return [{"tool": a["tool"], "args": {k: subst.get(v, v) for k, v in a["args"].items()}} for a in setup]


async def measure(base: str, runner: str, groups: list[int], rounds: int) -> list[Row]:
    setup = fill_tools(SETUP[runner]) if runner == "tools" else SETUP[runner]
    rows = []
    once = runner == "python"  # forks once: a fresh source per round, prepared outside the timing
    source = None if once else await prepared(base, runner, setup)
    for n in groups:
        times: dict[str, list[float]] = {"fork": [], "replay": []}
        for r in range(rounds):
            order = ["fork", "replay"] if r % 2 == 0 else ["replay", "fork"]
            for mode in order:
                if mode == "fork":
                    src = await prepared(base, runner, setup) if once else source
                    assert src is not None
                    elapsed, ids = await fork_once(base, src, n)
                    if once:
                        ids.append(src)
                else:
                    elapsed, ids = await replay_once(base, runner, setup, n)
                times[mode].append(elapsed)
                await close_all(base, ids)
        for mode, xs in times.items():
            if xs:
                xs.sort()
                rows.append(Row(runner, n, mode, percentile(xs, 50), percentile(xs, 99), len(xs)))
    if source is not None:
        await close_all(base, [source])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--groups", default="8,64", help="group sizes (the browser's stop at its session cap)")
    ap.add_argument("--runners", default="tools,textgame,browser,python")
    args = ap.parse_args()
    groups = [int(g) for g in args.groups.split(",")]
    runners = args.runners.split(",")
    settings = {
        "SANDBOXD_RUNNERS": '["tools", "textgame", "browser", "python"]',
        "SANDBOXD_WORKERS": "2",
        "SANDBOXD_TENANT_MAX_SESSIONS": "512",
        "SANDBOXD_BROWSER__MAX_SESSIONS_PER_WORKER": "20",
        "SANDBOXD_LOG_LEVEL": "warning",
    }
    rows: list[Row] = []
    with local_node(settings) as base:
        for runner in runners:
            sizes = [g for g in groups if runner != "browser" or g < 20]
            rows += asyncio.run(measure(base, runner, sizes, args.rounds))
    print(f"{'runner':9} {'G':>3} {'mode':7} {'p50 ms':>9} {'p99 ms':>9} {'rounds':>6}")
    for r in rows:
        print(f"{r.runner:9} {r.group:3d} {r.mode:7} {r.p50_s * 1000:9.1f} {r.p99_s * 1000:9.1f} {r.rounds:6d}")
    for runner in runners:
        for n in groups:
            f = next((r for r in rows if (r.runner, r.group, r.mode) == (runner, n, "fork")), None)
            p = next((r for r in rows if (r.runner, r.group, r.mode) == (runner, n, "replay")), None)
            if f and p:
                print(f"{runner} G={n}: fork is x{p.p50_s / f.p50_s:.1f} faster than replay at p50")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
