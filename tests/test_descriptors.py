"""Descriptors: every process the node starts holds only what it needs, and a worker whose session ended mid-step
(its TTL, its client) idles afterwards.

On 921c1ca the pipes and sockets a worker received from its sandboxes were not close-on-exec, and uvloop's
spawn closes nothing: every jail and SQL engine started later held them (and the node's log, and copies of
the worker's stdio). A session that reached its TTL during a step had its descriptors closed while the
worker's loop still watched them: since another process kept the files open, the loop spun on EBADF, 22-83%
of a CPU for as long as the node lived. A race in the same path (``dictionary changed size during iteration``
in the cgroup's counter files) skipped the group's removal.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import node_tree, running_node

pytestmark = pytest.mark.node


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_node(
        runners='["python", "sql"]',
        workers=1,
        reap_interval_s=0.5,
        python__slots_per_worker=2,
        python__burst_slots_per_worker=0,
        sql__scale_factor=0.01,
        sql__data_dir=str(tmp_path_factory.mktemp("tpch")),
    ) as base:
        yield base


def processes(node: str, pattern: bytes) -> list[int]:
    """The node's processes whose command line holds ``pattern`` (never another test's node)."""
    out = []
    mine = node_tree(node)
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) in mine:
            try:
                if pattern in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
            except OSError:
                continue
    return out


def descriptors(pid: int) -> dict[int, tuple[str, bool]]:
    """fd -> (what it is, close-on-exec)."""
    out = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            flags = int(Path(f"/proc/{pid}/fdinfo/{name}").read_text().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError, ValueError):
            continue
        out[int(name)] = (target, bool(flags & 0o2000000))
    return out


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_spawned_processes_hold_only_what_they_need(node: str) -> None:
    async with httpx.AsyncClient(base_url=node, timeout=60) as c:
        sid = (await c.post("/sessions", json={"runner": "python"})).json()["session_id"]
        for _ in range(3):  # sandboxes' pipes and sockets are in the worker now
            assert (await c.post("/rollout/step", json={"runner": "python", "action": {"code": "print(1)"}})).json()[
                "ok"
            ]
        assert (await c.post("/rollout/step", json={"runner": "python", "session_id": sid,
                                                    "action": {"code": "x = 1"}})).json()["ok"]  # fmt: skip
        sql = (await c.post("/sessions", json={"runner": "sql"})).json()["session_id"]  # an engine started after them
        assert (await c.post("/rollout/step", json={"runner": "sql", "session_id": sql,
                                                    "action": {"query": "select 1"}})).json()["ok"]  # fmt: skip
        try:
            (worker,) = processes(node, b"sandboxd.worker")
            leaked = {fd: what for fd, (what, cloexec) in descriptors(worker).items() if fd > 2 and not cloexec}
            assert not leaked, f"the worker holds descriptors its children would inherit: {leaked}"
            jails = processes(node, b"nsjail\x00--config")
            assert jails, "no jail found"
            for pid in jails:  # a slot jail or a session jail: its control socket, /dev/null, its log; nsjail's own
                extra = {
                    fd: what
                    for fd, (what, _) in descriptors(pid).items()
                    if fd > 2
                    and not what.endswith(".log")
                    and not (what.startswith("/proc/") and what.endswith("/syscall"))
                }
                assert not extra, f"nsjail {pid} holds {extra}"
            engines = processes(node, b"sandboxd.runners.sql.engine")
            assert engines, "no SQL engine found"
            for pid in engines:  # the fork server and each engine: stdio, its one socket, the read-only database
                held = descriptors(pid)
                sockets = [fd for fd, (what, _) in held.items() if what.startswith("socket:")]
                pipes = [fd for fd, (what, _) in held.items() if what.startswith("pipe:") and fd > 2]
                files = [what for fd, (what, _) in held.items() if fd > 2 and what.startswith("/")]
                assert len(sockets) <= 1 and not pipes, f"SQL engine {pid} holds {held}"
                assert all(f.endswith(".duckdb") or f.startswith("/tmp/") for f in files), held
        finally:
            await c.delete(f"/sessions/{sid}")
            await c.delete(f"/sessions/{sql}")


async def test_a_worker_idles_after_a_session_ends_mid_step(node: str) -> None:
    """A python session reaches its TTL during a long cell while an SQL engine started after the cell holds
    whatever leaked: the step answers 410, and the worker idles afterwards (it spun on EBADF before)."""
    async with httpx.AsyncClient(base_url=node, timeout=60) as c:
        sid = (await c.post("/sessions", json={"runner": "python", "ttl_s": 2})).json()["session_id"]
        cell = {"code": "import time\ntime.sleep(15)"}
        long_step = {"runner": "python", "session_id": sid, "timeout_s": 20, "action": cell}
        step = asyncio.ensure_future(c.post("/rollout/step", json=long_step))
        await asyncio.sleep(0.5)
        sql = (await c.post("/sessions", json={"runner": "sql"})).json()["session_id"]
        r = await step
        assert r.status_code == 410 and r.json()["error"]["code"] == "session_expired", r.text
        await c.delete(f"/sessions/{sql}")
        (worker,) = processes(node, b"sandboxd.worker")
        await asyncio.sleep(1.0)
        before, t0 = cpu_s(worker), time.monotonic()
        await asyncio.sleep(4.0)
        share = (cpu_s(worker) - before) / (time.monotonic() - t0)
        assert share < 0.05, f"the idle worker used {share:.0%} of a CPU"
