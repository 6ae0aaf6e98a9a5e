"""Soak: honest load with hostile steps mixed in, for a bounded time; resources must stay flat.

    .venv/bin/python -m sandboxd.bench.soak [--duration 600] [--report-every 30] [--target URL]

Without --target it starts a node on loopback (all kinds, 2 workers) and stops
it after. Honest loops run python one-shots and sessions, tools trajectories,
TPC-H queries, textgame episodes and session churn, and check every answer;
hostile loops send memory and fork bombs (python and SQL), SQL that ignores
its interrupt or spills without end, infinite loops, output floods,
programs that close stdout and sleep, SysV segments and /dev plants, and
malformed, oversized and unrepresentable requests, and check that each is
blamed on the program or the client, never on the infrastructure. A flood
loop, as another tenant (its own API key), opens python sessions until it is
refused, again and again: every refusal must be a 429 at a cap, and a session
the honest tenant holds must keep its state throughout. Every
``--report-every`` seconds it prints the node's RSS, open fds, processes,
cgroups and the disk use of its runtime directory (jail logs, spilled SQL);
at the end, the counts of honest steps that failed and hostile steps that
were mis-blamed (both must be 0), and the growth of each resource after the
warm-up. Exit status 1 when either count is not 0.

``--pressure`` is the neighbour-pressure soak: the node runs inside a pod-like cgroup this command makes
(``--pod-memory-mb``, ``--pod-pids``; as a pod's limits would be), the flooding tenant presses on them
(sessions filling memory until refused, threads spinning in them, sleeping one-shots holding slots) and
the honest tenant runs python one-shots and sessions well inside their own limits. An honest step may
come back refused or stopped by the infrastructure (429, ``node_pressure``: masked by a trainer, and
counted here as retried), never blamed on its program: the count of honest steps blamed on the program
and of hostile steps blamed on anyone but their program must both be 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from sandboxd.localnode import local_node
from sandboxd.runners.cgroups import CgroupRoot

HOSTILE_PROGRAMS: list[tuple[str, str, dict[str, Any]]] = [
    ("memory bomb", "b = []\nwhile True:\n    b.append(bytearray(16 << 20))", {}),
    ("fork bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", {}),
    ("infinite loop", "while True:\n    pass", {"timeout_s": 1}),
    ("output flood", "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", {}),
    ("closes stdout and sleeps", "import os, time\nos.close(1); os.close(2)\ntime.sleep(30)", {"timeout_s": 1}),
    ("SysV segment left behind", "import ctypes\nprint(ctypes.CDLL(None).shmget(0x50AC, 8 << 20, 0o1666))", {}),
    ("plants in /dev", "open('/dev/planted', 'w').write('x')", {}),
    (
        "threads keep burning",
        "import threading\nthreading.Thread(target=lambda: [0 for _ in iter(int, 1)]).start()",
        {},
    ),
]
# Statements that hurt the engine running them: its memory cgroup, its interrupt, its spill budget.
HOSTILE_SQL: list[tuple[str, str, float]] = [
    ("sql memory bomb", "SELECT len(range(1000000000))", 20.0),
    ("sql ignores interrupt", "SELECT levenshtein(repeat('a', 100000), repeat('b', 100000))", 0.5),
    ("sql spill bomb", "CREATE TEMP TABLE u AS SELECT md5(range::VARCHAR) AS b FROM range(60000000)", 60.0),
    ("sql host file", "SELECT * FROM read_text('/etc/hostname')", 5.0),
]

BAD_REQUESTS: list[tuple[str, bytes]] = [
    ("lone surrogate", b'{"runner": "python", "action": {"code": "print(1) # \\ud800"}}'),
    ("unknown runner", b'{"runner": "nope", "action": {}}'),
    ("malformed JSON", b'{"runner": "python", "action": '),
    ("huge integer", b'{"runner": "tools", "action": {"tool": "x", "args": {"n": 1' + b"0" * 40 + b"}}}"),
    ("impossible file name", b'{"runner": "python", "action": {"code": "1", "files": {"' + b"f" * 300 + b'": ""}}}'),
]


@dataclass
class Tally:
    honest: int = 0
    honest_failed: int = 0
    retried: int = 0  # honest steps the infrastructure refused or stopped (masked by a trainer, retried)
    hostile: int = 0
    misblamed: int = 0
    examples: list[str] = field(default_factory=list)

    def fail(self, what: str, why: str, honest: bool) -> None:
        if honest:
            self.honest_failed += 1
        else:
            self.misblamed += 1
        if len(self.examples) < 10:
            self.examples.append(f"{what}: {why}")


HONEST_KEY, FLOOD_KEY = "soak-honest-tenant-0123456789", "soak-flood-tenant-0123456789"
FLOOD_PAUSE_S = 5.0  # between floods: honest session creates get their turn
CREATE_RETRY_S = 30.0  # an honest client retries a 429 (a cap the flood holds) for this long


class Soak:
    def __init__(self, base: str, stop_at: float, honest_key: str = HONEST_KEY, flood_key: str = FLOOD_KEY) -> None:
        self.base = base
        self.stop_at = stop_at
        self.t = Tally()
        self.honest_key, self.flood_key = honest_key, flood_key

    def client(self, key: str | None = None) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {key or self.honest_key}"}
        return httpx.AsyncClient(base_url=self.base, timeout=120, headers=headers)

    async def create(self, c: httpx.AsyncClient, runner: str) -> httpx.Response:
        """An honest client's create: a 429 (a cap someone else holds for now) is retried after its Retry-After."""
        give_up = time.monotonic() + CREATE_RETRY_S
        while True:
            r = await c.post("/sessions", json={"runner": runner})
            if r.status_code != 429 or time.monotonic() > give_up:
                return r
            await asyncio.sleep(float(r.headers.get("retry-after", "1")))

    async def step(self, c: httpx.AsyncClient, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        r = await c.post("/rollout/step", json=body)
        data: dict[str, Any] = r.json()
        return r.status_code, data

    async def honest(self, what: str, ok: Awaitable[str | None]) -> None:
        self.t.honest += 1
        try:
            why = await ok
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        if why:
            self.t.fail(what, why, honest=True)

    async def python_oneshot(self, c: httpx.AsyncClient, rng: random.Random) -> str | None:
        n = rng.randrange(1000)
        status, r = await self.step(c, {"runner": "python", "action": {"code": f"print(sum(range({n})))"}})
        return None if status == 200 and r["observation"]["stdout"] == f"{sum(range(n))}\n" else f"{status} {r}"

    async def python_session(self, c: httpx.AsyncClient, rng: random.Random) -> str | None:
        r = await self.create(c, "python")
        if r.status_code != 201:
            return f"create {r.status_code} {r.text[:200]}"
        sid = r.json()["session_id"]
        try:
            v = rng.randrange(10**6)
            for code, want in ((f"x = {v}", ""), ("x += 1\nprint(x)", f"{v + 1}\n")):
                status, res = await self.step(c, {"runner": "python", "action": {"code": code}, "session_id": sid})
                if status != 200 or res["observation"]["stdout"] != want:
                    return f"{status} {res}"
        finally:
            await c.delete(f"/sessions/{sid}")
        return None

    async def tools(self, c: httpx.AsyncClient, rng: random.Random) -> str | None:
        r = await self.create(c, "tools")
        if r.status_code != 201:
            return f"create {r.status_code} {r.text[:200]}"
        sid = r.json()["session_id"]
        try:
            body = {"runner": "tools", "action": {"tool": "list_all_product_types", "args": {}}, "session_id": sid}
            status, res = await self.step(c, body)
            return None if status == 200 and res["ok"] else f"{status} {res}"
        finally:
            await c.delete(f"/sessions/{sid}")

    async def sql(self, c: httpx.AsyncClient, rng: random.Random) -> str | None:
        status, r = await self.step(c, {"runner": "sql", "action": {"tpch": rng.randint(1, 22)}, "timeout_s": 60})
        return None if status == 200 and r["ok"] else f"{status} {r.get('error')}"

    async def textgame(self, c: httpx.AsyncClient, rng: random.Random) -> str | None:
        action = {"op": "episodes", "seed": rng.randrange(2**30), "steps": 40, "batch": 10}
        status, r = await self.step(c, {"runner": "textgame", "action": action})
        return None if status == 200 and r["observation"]["episodes"] == 10 else f"{status} {r}"

    async def honest_loop(self, i: int) -> None:
        rng = random.Random(i)
        jobs: list[Callable[[httpx.AsyncClient, random.Random], Awaitable[str | None]]] = [
            self.python_oneshot,
            self.python_oneshot,
            self.python_session,
            self.tools,
            self.sql,
            self.textgame,
        ]
        async with self.client() as c:
            while time.monotonic() < self.stop_at:
                job = rng.choice(jobs)
                await self.honest(job.__name__, job(c, rng))

    async def hostile_loop(self, i: int) -> None:
        rng = random.Random(1000 + i)
        async with self.client() as c:
            while time.monotonic() < self.stop_at:
                self.t.hostile += 1
                roll = rng.random()
                if roll < 0.2:
                    await self.hostile_sql(c, rng)
                elif roll < 0.7:
                    name, code, extra = rng.choice(HOSTILE_PROGRAMS)
                    session = rng.random() < 0.3
                    sid = None
                    if session:
                        r = await c.post("/sessions", json={"runner": "python"})
                        sid = r.json()["session_id"] if r.status_code == 201 else None
                    body: dict[str, Any] = {"runner": "python", "action": {"code": code}, **extra}
                    if sid:
                        body["session_id"] = sid
                    status, res = await self.step(c, body)
                    blame = (res.get("error") or {}).get("blame")
                    if status != 200 or blame not in ("program", None):
                        self.t.fail(name, f"{status} {res.get('error')}", honest=False)
                    if sid:
                        await c.delete(f"/sessions/{sid}")
                else:
                    name, raw = rng.choice(BAD_REQUESTS)
                    r = await c.post("/rollout/step", content=raw, headers={"content-type": "application/json"})
                    if r.status_code >= 500 or r.json().get("error", {}).get("blame") != "client":
                        self.t.fail(name, f"{r.status_code} {r.text[:200]}", honest=False)

    async def flood_loop(self) -> None:
        """Another tenant opens python sessions until refused, again and again (the red team's flood that
        killed every session of a worker): each refusal must be a 429, the honest tenant's session intact."""
        async with self.client() as honest, self.client(self.flood_key) as flood:
            r = await self.create(honest, "python")
            if r.status_code != 201:
                self.t.fail("flood sentinel", f"create {r.status_code} {r.text[:200]}", honest=True)
                return
            sentinel = r.json()["session_id"]
            await self.step(honest, {"runner": "python", "session_id": sentinel, "action": {"code": "kept = 7"}})
            try:
                while time.monotonic() < self.stop_at:
                    self.t.hostile += 1
                    made: list[str] = []
                    while time.monotonic() < self.stop_at:
                        r = await flood.post("/sessions", json={"runner": "python"})
                        if r.status_code != 201:
                            if r.status_code != 429 or not r.headers.get("retry-after"):
                                self.t.fail("session flood", f"refused with {r.status_code} {r.text[:200]}", False)
                            break
                        made.append(r.json()["session_id"])
                    await self.honest("flood sentinel", self._sentinel(honest, sentinel))
                    for i in range(0, len(made), 64):
                        await asyncio.gather(*(flood.delete(f"/sessions/{sid}") for sid in made[i : i + 64]))
                    await asyncio.sleep(FLOOD_PAUSE_S)
            finally:
                await honest.delete(f"/sessions/{sentinel}")

    async def _sentinel(self, c: httpx.AsyncClient, sid: str) -> str | None:
        body = {"runner": "python", "session_id": sid, "action": {"code": "print(kept)"}}
        status, r = await self.step(c, body)
        return None if status == 200 and r["observation"]["stdout"] == "7\n" else f"{status} {r.get('error')}"

    # ------------------------------------------------------------------ neighbour pressure (--pressure)

    async def pressed(self, what: str, c: httpx.AsyncClient, body: dict[str, Any], want: str) -> None:
        """An honest step under pressure: its output, or the infrastructure's refusal; never its blame."""
        self.t.honest += 1
        try:
            status, r = await self.step(c, body)
        except httpx.HTTPError as exc:
            self.t.fail(what, f"{type(exc).__name__}: {exc}", honest=True)
            return
        blame = (r.get("error") or {}).get("blame")
        if blame == "infra":
            self.t.retried += 1
        elif status != 200 or blame is not None or (r.get("observation") or {}).get("stdout") != want:
            self.t.fail(what, f"{status} {r.get('error')}", honest=True)

    async def honest_pressed_loop(self, i: int) -> None:
        rng = random.Random(2000 + i)
        alloc = "x = bytearray({mb} << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\nprint(len(x) >> 20)"
        async with self.client() as c:
            while time.monotonic() < self.stop_at:
                mb = rng.choice((16, 64, 128))
                if rng.random() < 0.6:
                    body = {"runner": "python", "action": {"code": alloc.format(mb=mb)}, "timeout_s": 10}
                    await self.pressed("pressed one-shot", c, body, f"{mb}\n")
                    continue
                r = await c.post("/sessions", json={"runner": "python"})
                if r.status_code != 201:
                    self.t.retried += r.status_code in (429, 503)
                    if r.status_code not in (429, 503):
                        self.t.fail("pressed session create", f"{r.status_code} {r.text[:200]}", honest=True)
                    await asyncio.sleep(1)
                    continue
                sid = r.json()["session_id"]
                threads = (
                    "import threading\nts = [threading.Thread(target=sum, args=(range(200000),)) for _ in range(4)]\n"
                    "[t.start() for t in ts]; [t.join() for t in ts]\nprint(len(ts))"
                )
                for code, want in (
                    (alloc.format(mb=mb), f"{mb}\n"),
                    (threads, "4\n"),
                    ("print(len(x) >> 20)", f"{mb}\n"),
                ):
                    body = {"runner": "python", "action": {"code": code}, "session_id": sid, "timeout_s": 10}
                    await self.pressed("pressed session", c, body, want)
                await c.delete(f"/sessions/{sid}")

    async def pressure_loop(self, i: int) -> None:
        """The other tenant at the node's limits: sessions filling memory until refused, threads spinning in
        some, sleeping one-shots; every answer it gets must blame its own program or the infrastructure."""
        rng = random.Random(3000 + i)
        fill = "x = bytearray(150 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1"
        spin = "import threading\nthreading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()"
        async with self.client(self.flood_key) as c:
            while time.monotonic() < self.stop_at:
                self.t.hostile += 1
                held: list[str] = []
                for _ in range(40):
                    r = await c.post("/sessions", json={"runner": "python"})
                    if r.status_code != 201:
                        if r.status_code not in (429, 503):
                            self.t.fail("pressure create", f"{r.status_code} {r.text[:200]}", honest=False)
                        break
                    held.append(r.json()["session_id"])
                    code = fill + ("\n" + spin if rng.random() < 0.3 else "")
                    status, res = await self.step(
                        c, {"runner": "python", "action": {"code": code}, "session_id": held[-1]}
                    )
                    if status not in (200, 410, 429, 503) or (res.get("error") or {}).get("blame") == "client":
                        self.t.fail("pressure fill", f"{status} {res.get('error')}", honest=False)
                sleepers = [
                    self.step(
                        c, {"runner": "python", "action": {"code": "import time; time.sleep(3)"}, "timeout_s": 10}
                    )
                    for _ in range(6)
                ]
                await asyncio.gather(*sleepers, return_exceptions=True)
                await asyncio.gather(*(c.delete(f"/sessions/{sid}") for sid in held), return_exceptions=True)
                await asyncio.sleep(rng.uniform(0.5, 2.0))

    async def hostile_sql(self, c: httpx.AsyncClient, rng: random.Random) -> None:
        name, query, timeout_s = rng.choice(HOSTILE_SQL)
        sid = None
        if rng.random() < 0.5:
            r = await c.post("/sessions", json={"runner": "sql"})
            sid = r.json()["session_id"] if r.status_code == 201 else None
        body: dict[str, Any] = {"runner": "sql", "action": {"query": query}, "timeout_s": timeout_s}
        if sid:
            body["session_id"] = sid
        status, res = await self.step(c, body)
        if status != 200 or (res.get("error") or {}).get("blame") != "program":
            self.t.fail(name, f"{status} {res.get('error')}", honest=False)
        if sid:
            await c.delete(f"/sessions/{sid}")


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(p.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def sample(gateway_pid: int, marker: str) -> dict[str, float]:
    pids = _tree(gateway_pid)
    rss = fds = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1])
            fds += len(os.listdir(f"/proc/{pid}/fd"))
    cgroups = sum(1 for _ in Path("/sys/fs/cgroup/memory").glob(f"**/{marker}*/**/")) if marker else 0
    runtime = [p for p in Path(tempfile.gettempdir()).glob(f"sandboxd-{gateway_pid}-*") if p.is_dir()]
    tmp = sum(f.stat().st_size for d in runtime for f in d.rglob("*") if f.is_file() and not f.is_symlink())
    return {"rss_mb": rss / 1024, "fds": fds, "procs": len(pids), "cgroups": cgroups, "runtime_mb": tmp / 2**20}


async def run(
    base: str, duration_s: float, every_s: float, warmup_s: float, keys: tuple[str, str], pressure: bool = False
) -> int:
    async with httpx.AsyncClient(base_url=base, timeout=30) as c:
        ready = (await c.get("/readyz")).json()
    gateway_pid, marker = int(ready["pid"]), f"{ready['node_id']}-{ready['pid']}-w"
    soak = Soak(base, time.monotonic() + duration_s, *keys)
    if pressure:
        loops = [asyncio.create_task(soak.honest_pressed_loop(i)) for i in range(4)]
        loops += [asyncio.create_task(soak.pressure_loop(i)) for i in range(2)]
    else:
        loops = [asyncio.create_task(soak.honest_loop(i)) for i in range(6)]
        loops += [asyncio.create_task(soak.hostile_loop(i)) for i in range(2)]
        loops.append(asyncio.create_task(soak.flood_loop()))
    start = time.monotonic()
    rows: list[tuple[float, dict[str, float]]] = []
    head = f"{'t_s':>6} {'rss_mb':>8} {'fds':>6} {'procs':>6} {'cgroups':>8} {'run_mb':>8}"
    print(head + " honest(failed) hostile(misblamed)")
    while time.monotonic() < soak.stop_at:
        await asyncio.sleep(min(every_s, max(0.0, soak.stop_at - time.monotonic())))
        s = await asyncio.to_thread(sample, gateway_pid, marker)
        rows.append((time.monotonic() - start, s))
        t = soak.t
        print(
            f"{rows[-1][0]:6.0f} {s['rss_mb']:8.1f} {s['fds']:6.0f} {s['procs']:6.0f} {s['cgroups']:8.0f} "
            f"{s['runtime_mb']:8.1f} {t.honest}({t.honest_failed}) {t.hostile}({t.misblamed})",
            flush=True,
        )
    await asyncio.gather(*loops)
    await asyncio.sleep(2)  # let the last sandboxes be reaped
    final = await asyncio.to_thread(sample, gateway_pid, marker)
    after_warmup = next((s for at, s in rows if at >= warmup_s), rows[0][1] if rows else final)
    t = soak.t
    print(
        f"\nhonest steps: {t.honest}, failed: {t.honest_failed} (refused or stopped by the infrastructure, "
        f"retried: {t.retried}); hostile: {t.hostile}, mis-blamed: {t.misblamed}"
    )
    print("growth after warm-up: " + ", ".join(f"{k} {final[k] - after_warmup[k]:+.1f}" for k in final))
    for ex in t.examples:
        print("  " + ex)
    return 0 if t.honest_failed == 0 and t.misblamed == 0 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="a running node (loopback); default: start one")
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load (bounded)")
    ap.add_argument("--report-every", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=60.0, help="growth is measured from the first report after this")
    ap.add_argument(
        "--keys", default=f"{HONEST_KEY},{FLOOD_KEY}", help="with --target: the honest and the flooding tenant's keys"
    )
    ap.add_argument("--pressure", action="store_true", help="the neighbour-pressure soak (see above)")
    ap.add_argument("--pod-memory-mb", type=int, default=3072, help="--pressure: the pod's memory limit")
    ap.add_argument("--pod-pids", type=int, default=3000, help="--pressure: the pod's pids limit")
    args = ap.parse_args(argv)
    honest, flood = args.keys.split(",", 1)
    with contextlib.ExitStack() as stack:
        settings = {
            "SANDBOXD_WORKERS": "2",
            "SANDBOXD_SQL__SCALE_FACTOR": "0.01",
            "SANDBOXD_API_KEYS": f'["{honest}", "{flood}"]',
        }
        pod: tuple[str, ...] = ()
        if args.pressure and not args.target:
            settings["SANDBOXD_RUNNERS"] = '["python"]'
            group = CgroupRoot(f"soak-pod-{os.getpid()}").group
            stack.callback(group.remove)
            group.set_limits(args.pod_memory_mb << 20, args.pod_pids)
            pod = tuple(str(f) for f in group.procs_files)
        base = args.target or stack.enter_context(local_node(settings, cgroup=pod))
        return asyncio.run(
            run(base, args.duration, args.report_every, args.warmup, (honest, flood), pressure=args.pressure)
        )


if __name__ == "__main__":
    sys.exit(main())
