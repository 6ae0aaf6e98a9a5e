"""Sessions scoped to a trainer's run: labels, list/renew/close by label, status of many ids, and a trainer
that dies (SIGKILL) leaving nothing behind after one idle timeout. A real node, driven over HTTP and through
the package's own client."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from sandboxd.client import SandboxClient
from tests.conftest import own_cgroup, running_node

pytestmark = pytest.mark.node

KEY_A = "runs-key-a-0123456789"
KEY_B = "runs-key-b-0123456789"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    with running_node(
        runners='["textgame", "tools", "python"]',
        workers=2,
        tenant_max_sessions=600,
        reap_interval_s=0.5,
        api_keys=f'["{KEY_A}", "{KEY_B}"]',
    ) as base:
        yield base


def keyed(node: str, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=node, timeout=60, headers={"authorization": f"Bearer {key}"})


@pytest.fixture
async def a(node: str) -> AsyncIterator[httpx.AsyncClient]:
    async with keyed(node, KEY_A) as c:
        yield c


@pytest.fixture
async def b(node: str) -> AsyncIterator[httpx.AsyncClient]:
    async with keyed(node, KEY_B) as c:
        yield c


async def create(c: httpx.AsyncClient, runner: str = "textgame", **fields: object) -> str:
    r = await c.post("/sessions", json={"runner": runner, **fields})
    assert r.status_code == 201, r.text
    return str(r.json()["session_id"])


async def listed(c: httpx.AsyncClient, **labels: str) -> set[str]:
    r = await c.get("/sessions", params=[("label", f"{k}:{v}") for k, v in labels.items()])
    assert r.status_code == 200, r.text
    assert r.json()["unreached"] == []
    return {s["session_id"] for s in r.json()["sessions"]}


async def test_labels_select_a_run_and_only_the_callers_sessions(a: httpx.AsyncClient, b: httpx.AsyncClient) -> None:
    run = {"run_id": "grpo-17", "job": "math:v2"}  # a value may hold a colon
    mine = [await create(a, labels=run) for _ in range(6)]
    other_run = await create(a, labels={"run_id": "grpo-18"})
    theirs = await create(b, labels=run)  # another tenant, the same labels
    described = (await a.get(f"/sessions/{mine[0]}")).json()
    assert described["labels"] == run

    assert await listed(a, **run) == set(mine)
    assert await listed(a, run_id="grpo-17") == set(mine)
    assert await listed(b, run_id="grpo-17") == {theirs}
    tools = await create(a, "tools", labels=run)
    forked = (await a.post(f"/sessions/{tools}/fork", json={"n": 3})).json()["sessions"]
    assert all(f["labels"] == run for f in forked)  # copies keep their source's labels
    assert await listed(a, **run) == {*mine, tools, *(f["session_id"] for f in forked)}

    closed = await a.post("/sessions/close", json={"labels": {"run_id": "grpo-17"}})
    assert closed.status_code == 200 and closed.json() == {"count": 10, "unreached": []}, closed.text
    assert await listed(a, run_id="grpo-17") == set()
    states = (await a.post("/sessions/status", json={"session_ids": [mine[0], other_run, theirs, "s_nope.x"]})).json()
    assert states["sessions"][mine[0]]["state"] == "ended"
    assert "closed by label" in states["sessions"][mine[0]]["why"]
    assert states["sessions"][other_run]["state"] == "live"
    assert states["sessions"][other_run]["session"]["labels"] == {"run_id": "grpo-18"}
    assert states["sessions"][theirs] == {"state": "unknown"}  # another tenant's: unknown, as everywhere
    assert states["sessions"]["s_nope.x"] == {"state": "unknown"}
    # The other tenant's session with the same labels is untouched, and its step still runs.
    r = await b.post("/rollout/step", json={"runner": "textgame", "session_id": theirs, "action": {"op": "reset"}})
    assert r.status_code == 200 and r.json()["ok"], r.text
    assert (await b.post("/sessions/close", json={"labels": run})).json()["count"] == 1
    await a.delete(f"/sessions/{other_run}")


@pytest.mark.parametrize(
    ("method", "path", "payload", "names"),
    [
        ("POST", "/sessions", {"runner": "textgame", "labels": {"bad key": "x"}}, "label name"),
        ("POST", "/sessions", {"runner": "textgame", "labels": {"k": "\u0000"}}, "printable"),
        ("POST", "/sessions", {"runner": "textgame", "labels": {f"k{i}": "v" for i in range(17)}}, "at most 16"),
        ("POST", "/sessions/close", {"labels": {}}, "labels"),  # closing "everything" takes a label
        ("POST", "/sessions/keepalive", {"labels": {"run_id": "x"}, "idle_timeout_s": 0}, "idle_timeout_s"),
        ("POST", "/sessions/status", {"session_ids": []}, "session_ids"),
        ("GET", "/sessions?label=run_id", None, "name:value"),
        ("GET", "/sessions?label=run_id:a&label=run_id:b", None, "each name once"),
        ("POST", "/sessions/status", {"session_ids": ["s_x"] * 1001}, "session_ids"),
        ("GET", "/sessions", None, "label"),
    ],
)
async def test_bad_selections_are_named(
    a: httpx.AsyncClient, method: str, path: str, payload: object, names: str
) -> None:
    r = await a.request(method, path, json=payload)
    assert r.status_code in (400, 422), r.text
    error = r.json()["error"]
    assert error["blame"] == "client" and names in error["message"], error


async def test_renewal_keeps_a_run_alive_past_its_idle_timeout(a: httpx.AsyncClient) -> None:
    sids = [await create(a, labels={"run_id": "renewed"}, idle_timeout_s=2) for _ in range(5)]
    for _ in range(6):  # 3 s: past the idle timeout, renewed every half second
        await asyncio.sleep(0.5)
        r = await a.post("/sessions/keepalive", json={"labels": {"run_id": "renewed"}})
        assert r.json()["count"] == 5, r.text
    assert await listed(a, run_id="renewed") == set(sids)
    # A renewal may set a new idle timeout (at most the node's): the run then ends that long after it.
    r = await a.post("/sessions/keepalive", json={"labels": {"run_id": "renewed"}, "idle_timeout_s": 1})
    assert r.json()["count"] == 5
    deadline = time.monotonic() + 10
    while await listed(a, run_id="renewed") and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
    assert await listed(a, run_id="renewed") == set()


TRAINER = """
import asyncio, sys
from sandboxd.client import SandboxClient

async def main() -> None:
    async with SandboxClient(sys.argv[1], api_key=sys.argv[2]) as c:
        async with c.keepalive(idle_timeout_s=IDLE, run_id="doomed"):
            await asyncio.gather(*(
                c.create_session("textgame", labels={"run_id": "doomed"}, idle_timeout_s=IDLE) for _ in range(200)
            ))
            print("ready", flush=True)
            await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.timeout(120)
async def test_a_trainer_killed_leaves_nothing_behind_after_one_idle_timeout(node: str, a: httpx.AsyncClient) -> None:
    idle_s = 4.0
    bystander = await create(a, labels={"run_id": "alive"})  # same tenant, another run, default idle timeout
    trainer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(TRAINER).replace("IDLE", str(idle_s)), node, KEY_A],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert trainer.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(trainer.stdout.readline), 60)
        assert line.strip() == b"ready", line
        await asyncio.sleep(idle_s * 1.5)  # the trainer lives: its renewals keep all 200 past the idle timeout
        doomed = await listed(a, run_id="doomed")
        assert len(doomed) == 200
        trainer.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        while await listed(a, run_id="doomed"):
            assert time.monotonic() - killed_at < idle_s + 5, "a dead trainer's sessions outlived its idle timeout"
            await asyncio.sleep(0.25)
    finally:
        trainer.kill()
        trainer.wait()
        if trainer.stdout is not None:
            trainer.stdout.close()
    states = (await a.post("/sessions/status", json={"session_ids": [*doomed, bystander]})).json()["sessions"]
    assert all(states[sid]["state"] == "ended" and "idle" in states[sid]["why"] for sid in doomed)
    assert states[bystander]["state"] == "live"
    await a.delete(f"/sessions/{bystander}")


async def test_the_client_selects_renews_and_closes_a_run(node: str) -> None:
    async with SandboxClient(node, api_key=KEY_B) as c:
        sids = {(await c.create_session("tools", labels={"run_id": "sdk"}))["session_id"] for _ in range(3)}
        assert {s["session_id"] for s in await c.list_sessions(run_id="sdk")} == sids
        assert await c.renew(run_id="sdk") == 3
        status = await c.session_status([*sids, "s_unknown.n"])
        assert {status[s]["state"] for s in sids} == {"live"} and status["s_unknown.n"]["state"] == "unknown"
        assert await c.close_all(run_id="sdk") == 3
        assert await c.list_sessions(run_id="sdk") == []


async def test_a_step_in_a_session_closed_by_its_client_says_so(a: httpx.AsyncClient) -> None:
    """Closing a run mid-step (a trainer restarting) must not read as the program's kill (exit 137)."""
    sid = await create(a, "python", labels={"run_id": "mid-step"})
    step = asyncio.ensure_future(
        a.post(
            "/rollout/step",
            json={
                "runner": "python",
                "session_id": sid,
                "action": {"code": "import time; print('began'); time.sleep(5)"},
            },
        )
    )
    await asyncio.sleep(1.0)
    assert (await a.post("/sessions/close", json={"labels": {"run_id": "mid-step"}})).json()["count"] == 1
    r = await step
    assert r.status_code == 410, r.text
    error = r.json()["error"]
    assert (error["blame"], error["code"]) == ("client", "session_closed"), error
    assert "closed by its client" in error["message"]


def test_a_node_that_died_leaves_nothing_to_the_next_one_of_its_id() -> None:
    """A node killed with SIGKILL leaves its workers' cgroups and whatever still ran in them (charged to no
    budget, held by nobody); the next node of the same id removes both before its workers start."""
    from sandboxd.runners.cgroups import V1_CONTROLLERS, V1_OPTIONAL, detect_version

    if detect_version() != 1:
        pytest.skip("this machine's layout: cgroup v1 (sweep_dead_nodes reads v2's one tree the same way)")
    node_id = f"sweep{os.getpid()}"
    dead = int(Path("/proc/sys/kernel/pid_max").read_text()) + 17  # a pid no process can have
    ctrls = [*V1_CONTROLLERS, *(c for c in V1_OPTIONAL if Path("/sys/fs/cgroup", c).is_dir())]
    left = [own_cgroup(c) / f"{node_id}-{dead}-w0" / "slot0" for c in ctrls]
    kept = own_cgroup("memory") / f"other{os.getpid()}-{dead}-w0"  # not its id
    orphan = subprocess.Popen(["sleep", "300"])
    try:
        for d in [*left, kept]:
            d.mkdir(parents=True, exist_ok=True)
        for d in left:
            (d / "cgroup.procs").write_text(str(orphan.pid))
        with running_node(node_id=node_id, runners='["tools"]', workers=1) as base:
            assert httpx.get(f"{base}/readyz", timeout=10).json()["ready"]
            assert orphan.wait(timeout=10) == -signal.SIGKILL  # the dead node's sandbox: killed
            assert not any(d.parent.exists() for d in left), [d for d in left if d.parent.exists()]
            assert kept.exists()  # another node's groups are not this one's to sweep
    finally:
        orphan.kill()
        orphan.wait()
        for d in [*left, kept]:
            for p in (d, d.parent):
                if p.exists() and p != own_cgroup("memory"):
                    with contextlib.suppress(OSError):
                        p.rmdir()
