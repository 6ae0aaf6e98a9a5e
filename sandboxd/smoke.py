"""A short, real check of a running node: a few programs, a session, a little load.

Used by ``sandboxd demo`` (the README's main command) and ``sandboxd smoke``.
It prints what happened; it is not a benchmark (see bench/ for figures).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

from sandboxd.client import SandboxClient

PROGRAMS: list[tuple[str, str, dict[str, Any]]] = [
    ("passing asserts", "def add(a, b):\n    return a + b\nassert add(2, 3) == 5\nprint('ok')", {}),
    ("failing assert", "assert 1 + 1 == 3, 'math is broken'", {}),
    (
        "stdin + files",
        "import sys\nprint(sys.stdin.read().upper(), open('data.txt').read())",
        {"stdin": "hello", "files": {"data.txt": "from a file"}},
    ),
    ("infinite loop (1 s limit)", "while True:\n    pass", {"timeout_s": 1}),
    ("network is cut off", "import socket\nsocket.create_connection(('127.0.0.1', 8080), timeout=1)", {}),
    ("numpy + sympy", "import numpy, sympy\nprint(numpy.arange(10).sum(), sympy.factor('x**2 - 1'))", {}),
]


# One real step per other kind the node serves, and what to print of its observation.
KIND_DEMOS: dict[str, tuple[str, dict[str, Any], str]] = {
    "code": (
        "C++: compile and run",
        {
            "language": "cpp",
            "code": "#include <iostream>\nint main(){int a,b; std::cin>>a>>b; std::cout<<a+b;}",
            "stdin": "20 22",
        },
        "stdout",
    ),
    "tools": ("retail API: find a user", {"tool": "find_user_id_by_email", "args": {"email": "nobody@x.io"}}, "error"),
    "sql": ("TPC-H Q6 on DuckDB", {"tpch": 6}, "rows"),
    "textgame": ("10 text-game episodes", {"op": "episodes", "seed": 1, "steps": 40, "batch": 10}, "total_reward"),
    "browser": (
        "jailed Chromium: shop",
        {"actions": [{"action": "goto", "path": "/"}, {"action": "text", "selector": "#page-info"}]},
        "url",
    ),
}


def _line(name: str, r: dict[str, Any]) -> str:
    obs = r.get("observation") or {}
    err = r.get("error") or {}
    what = f"exit={obs.get('exit_code')} killed_by={obs.get('killed_by')}" if obs else f"{err.get('code')}"
    out = (obs.get("stdout") or "").strip().replace("\n", " ")[:60]
    blame = err.get("blame", "-")
    return f"  {name:<28} ok={r.get('ok')!s:<5} {what:<28} blame={blame:<8} {r.get('latency_ms', 0):7.1f} ms  {out}"


async def run_smoke(base_url: str, load_s: float = 5.0, concurrency: int = 8, timeout_s: float | None = None) -> bool:
    """``timeout_s``: every step's limit, where the smoke gives none of its own (a slow machine: an emulated
    guest runs 6-30 times slower than the host)."""
    healthy = True
    limit = {"timeout_s": timeout_s} if timeout_s else {}
    async with SandboxClient(base_url) as c:
        print(f"sandboxd at {base_url}: real programs, one-shot (each in a fresh nsjail sandbox)")
        for name, code, extra in PROGRAMS:
            r = await c.run_python(code, **{**limit, **extra})
            print(_line(name, r))
            if "status" not in r or r["status"] != 200:
                healthy = False
        print("a session (state persists between steps):")
        async with c.session() as s:
            for code in ("counter = 41", "counter += 1\nprint('counter =', counter)"):
                r = await s.run_python(code, **limit)
                print(_line(code.splitlines()[0], r))
                healthy = healthy and r.get("ok") is True
        kinds = (await c.http.get("/runners")).json().get("runners", [])
        others = [k for k in KIND_DEMOS if k in kinds]
        if others:
            print("other runner kinds on this node:")
        for kind in others:
            name, action, key = KIND_DEMOS[kind]
            r = await c.step(kind, action, timeout_s=timeout_s or 30)
            shown = str((r.get("observation") or {}).get(key))[:60]
            err = (r.get("error") or {}).get("blame", "-")
            took = r.get("latency_ms", 0)
            print(f"  {name:<28} status={r.get('status')} blame={err:<8} {took:7.1f} ms  {key}={shown}")
            healthy = healthy and r.get("status") == 200 and err in ("-", "program")
        if load_s > 0:
            lat: list[float] = []
            failures = 0
            stop = time.monotonic() + load_s

            async def loop() -> None:
                nonlocal failures
                while time.monotonic() < stop:
                    t = time.perf_counter()
                    r = await c.run_python("print(sum(i * i for i in range(1000)))")
                    lat.append((time.perf_counter() - t) * 1000)
                    failures += not r.get("ok")

            t0 = time.monotonic()
            await asyncio.gather(*(loop() for _ in range(concurrency)))
            wall = time.monotonic() - t0
            lat.sort()
            p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else 0.0
            print(
                f"load: {len(lat)} one-shot executions in {wall:.1f}s at concurrency {concurrency}: "
                f"{len(lat) / wall:.0f} exec/s, p50 {statistics.median(lat) if lat else 0:.1f} ms, "
                f"p99 {p99:.1f} ms, failures {failures}"
            )
            healthy = healthy and failures == 0
    print(
        "smoke: " + ("all as expected" if healthy else "SOMETHING WENT WRONG"),
        file=sys.stderr if not healthy else sys.stdout,
    )
    return healthy
