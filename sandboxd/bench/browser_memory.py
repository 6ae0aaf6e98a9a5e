"""What a browser session costs in memory: the browser's cgroup before and after N sessions on a shop page.

    .venv/bin/python -m sandboxd.bench.browser_memory [--sessions 12] [--variant NAME=JSON ...]

Per variant (a node of its own, browser runner only, its defaults plus the
variant's SANDBOXD_ settings; default: one variant with the defaults): the
browser's memory with its warm contexts idle, then N sessions opened one after
the other, each adding an item to the cart and showing the cart, and the
memory again; prints the idle figure and the cost per session. This is what
``CONTEXT_RESERVE_MB`` and ``max_sessions_per_worker`` are set from.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import httpx

from sandboxd.localnode import local_node, wait_ready
from sandboxd.runners.cgroups import detect_version

SESSION_ACTIONS = [
    {"action": "goto", "path": "/"},
    {"action": "click", "selector": "button.add-to-cart[data-id='3']"},
    {"action": "goto", "path": "/cart.html"},
]


def browser_memory(node_pid: int, mount: Path = Path("/sys/fs/cgroup")) -> int:
    """Bytes charged now to the browsers' groups of the node whose process is ``node_pid``."""
    if detect_version(mount) == 1:
        files = (mount / "memory").glob(f"**/*-{node_pid}-w*-browser/chromium/memory.usage_in_bytes")
    else:
        files = mount.glob(f"**/*-{node_pid}-w*-browser/chromium/memory.current")
    return sum(int(f.read_text()) for f in files)


async def measure(base: str, node_pid: int, n: int) -> tuple[int, int]:
    async with httpx.AsyncClient(base_url=base, timeout=60) as h:
        await asyncio.sleep(3)  # the warm pool settles
        idle = browser_memory(node_pid)
        sids = []
        for _ in range(n):
            r = await h.post("/sessions", json={"runner": "browser"})
            r.raise_for_status()
            sid = r.json()["session_id"]
            sids.append(sid)
            step = {"runner": "browser", "session_id": sid, "action": {"actions": SESSION_ACTIONS}}
            (await h.post("/rollout/step", json=step)).raise_for_status()
        await asyncio.sleep(2)
        held = browser_memory(node_pid)
        for sid in sids:
            await h.delete(f"/sessions/{sid}")
    return idle, (held - idle) // n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--variant", action="append", default=[], help="NAME=JSON of SANDBOXD_ settings")
    args = ap.parse_args(argv)
    variants = dict(v.partition("=")[::2] for v in args.variant) or {"defaults": "{}"}
    for name, settings in variants.items():
        env = {"SANDBOXD_RUNNERS": '["browser"]', "SANDBOXD_LOG_LEVEL": "warning", **json.loads(settings)}
        with local_node(env) as base:
            wait_ready(base)
            pid = int(httpx.get(f"{base}/readyz", timeout=10).json()["pid"])
            idle, per = asyncio.run(measure(base, pid, args.sessions))
        print(f"{name}: idle browser {idle / 2**20:.0f} MiB; {args.sessions} sessions: {per / 2**20:.1f} MiB each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
