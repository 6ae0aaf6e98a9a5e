"""One node, two front processes (``SANDBOXD_FRONTS=2``): any front takes any request, and what is node-wide
stays node-wide and exact (sessions, tenant quotas, idempotency, drain, readiness); a front that dies loses
only its own requests in flight.

The fronts accept from one listening socket, so which front a connection reaches is the kernel's choice:
each test opens connections until it holds one to each front (a front says which it is in /readyz).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from sandboxd.localnode import NodeProcess
from tests.conftest import NODE_START_S, SLOW_NODE_SETTINGS

pytestmark = [pytest.mark.node, pytest.mark.timeout(300)]
KEY = "fronts-key-0123456789abcdef"


@pytest.fixture(scope="module")
def node() -> Iterator[NodeProcess]:
    n = NodeProcess(
        {
            **SLOW_NODE_SETTINGS,
            "SANDBOXD_FRONTS": "2",
            "SANDBOXD_WORKERS": "2",
            "SANDBOXD_RUNNERS": '["python", "textgame"]',
            "SANDBOXD_API_KEYS": f'["{KEY}"]',
            "SANDBOXD_TENANT_MAX_SESSIONS": "6",
        }
    )
    n.wait_ready(NODE_START_S)
    yield n
    n.stop()


async def fronts(base: str, want: int = 2, tries: int = 200) -> list[httpx.AsyncClient]:
    """One client per front process, each on a single kept-alive connection to that front."""
    found: dict[int, httpx.AsyncClient] = {}
    spare: list[httpx.AsyncClient] = []
    for _ in range(tries):
        c = httpx.AsyncClient(
            base_url=base,
            timeout=60,
            headers={"authorization": f"Bearer {KEY}"},
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )
        index = (await c.get("/readyz")).json()["front"]["index"]
        if index in found:
            spare.append(c)
        else:
            found[index] = c
        if len(found) == want:
            break
    for c in spare:
        await c.aclose()
    assert len(found) == want, f"reached fronts {sorted(found)} only"
    return [found[i] for i in sorted(found)]


@pytest.fixture
async def pair(node: NodeProcess) -> AsyncIterator[list[httpx.AsyncClient]]:
    clients = await fronts(node.url)
    try:
        yield clients
    finally:
        for c in clients:
            await c.aclose()


async def py(c: httpx.AsyncClient, code: str, **extra: object) -> httpx.Response:
    return await c.post("/rollout/step", json={"runner": "python", "action": {"code": code}, **extra})


async def test_a_session_made_through_one_front_is_stepped_through_the_other(pair: list[httpx.AsyncClient]) -> None:
    a, b = pair
    sid = (await a.post("/sessions", json={"runner": "python"})).json()["session_id"]
    assert (await py(a, "x = 40", session_id=sid)).json()["ok"]
    r = await py(b, "x += 2\nprint(x)", session_id=sid)
    assert r.json()["observation"]["stdout"] == "42\n", r.text
    info = (await b.get(f"/sessions/{sid}")).json()
    assert info["steps"] == 2, info
    busy = asyncio.create_task(py(a, "import time; time.sleep(1)", session_id=sid))
    await asyncio.sleep(0.3)
    assert (await py(b, "print(1)", session_id=sid)).status_code == 409  # one step at a time, whichever front
    assert (await busy).json()["ok"]
    assert (await b.delete(f"/sessions/{sid}")).status_code == 204
    assert (await py(a, "print(x)", session_id=sid)).status_code == 404


async def test_the_tenants_quota_holds_across_both_fronts(pair: list[httpx.AsyncClient]) -> None:
    a, b = pair
    made = []
    for i in range(6):  # tenant_max_sessions 6, created alternately through each front
        r = await (a if i % 2 else b).post("/sessions", json={"runner": "textgame"})
        assert r.status_code == 201, r.text
        made.append(r.json()["session_id"])
    for c in (a, b):
        r = await c.post("/sessions", json={"runner": "textgame"})
        assert r.status_code == 429 and "tenant_max_sessions" in r.json()["error"]["message"], r.text
    await asyncio.gather(*(a.delete(f"/sessions/{sid}") for sid in made))
    assert (await b.post("/sessions", json={"runner": "textgame"})).status_code == 201


async def test_an_idempotent_retry_on_the_other_front_gets_the_first_result(pair: list[httpx.AsyncClient]) -> None:
    a, b = pair
    code = "import random, time\ntime.sleep(0.5)\nprint(random.random())"
    first, second = await asyncio.gather(
        py(a, code, idempotency_key="fronts-k1"), py(b, code, idempotency_key="fronts-k1")
    )
    assert first.json()["observation"]["stdout"] == second.json()["observation"]["stdout"], (first.text, second.text)
    later = await py(b, code, idempotency_key="fronts-k1")
    assert later.json()["observation"]["stdout"] == first.json()["observation"]["stdout"]
    r = await py(a, "print(2)", idempotency_key="fronts-k1")
    assert r.status_code == 422 and "different request" in r.json()["error"]["message"]
    created = [
        (await c.post("/sessions", json={"runner": "textgame", "idempotency_key": "fronts-s1"})).json()["session_id"]
        for c in (a, b)
    ]
    assert created[0] == created[1]
    assert (await a.delete(f"/sessions/{created[0]}")).status_code == 204


async def test_a_front_killed_under_load_loses_only_its_own_requests(node: NodeProcess) -> None:
    clients = await fronts(node.url)
    try:
        status = (await clients[0].get("/readyz")).json()
        victim_pid = status["front"]["pid"]
        victim, survivor = clients if status["front"]["index"] == 0 else clients[::-1]
        sid = (await survivor.post("/sessions", json={"runner": "python"})).json()["session_id"]
        assert (await py(survivor, "kept = 7", session_id=sid)).json()["ok"]
        slow = "import time; time.sleep(1.5); print('done')"
        on_victim = [asyncio.create_task(py(victim, slow))]  # its one connection, one request in flight
        on_survivor = [asyncio.create_task(py(survivor, slow)) for _ in range(2)]
        await asyncio.sleep(0.5)
        os.kill(victim_pid, signal.SIGKILL)
        lost = await asyncio.gather(*on_victim, return_exceptions=True)
        assert all(isinstance(r, httpx.HTTPError) for r in lost), lost  # its own requests, and only those
        for r in await asyncio.gather(*on_survivor):
            assert r.json()["observation"]["stdout"] == "done\n", r.text
        assert (await py(survivor, "print(kept)", session_id=sid)).json()["observation"]["stdout"] == "7\n"
        deadline = time.monotonic() + 60
        while True:  # the node starts it again; meanwhile and after, the node is ready
            ready = (await survivor.get("/readyz")).json()
            assert ready["ready"], ready
            if len(ready["fronts"]) == 2 and victim_pid not in ready["fronts"]:
                break
            assert time.monotonic() < deadline, ready
            await asyncio.sleep(0.2)
        await survivor.delete(f"/sessions/{sid}")
    finally:
        for c in clients:
            await c.aclose()
    for c in await fronts(node.url):  # both fronts serve again
        assert (await py(c, "print('back')")).json()["observation"]["stdout"] == "back\n"
        await c.aclose()


@pytest.mark.vm
async def test_drain_stops_new_work_on_both_fronts_and_sigterm_stops_the_node() -> None:
    n = NodeProcess(
        {
            **SLOW_NODE_SETTINGS,  # an emulated guest's longer start limits (tests/conftest.py)
            "SANDBOXD_FRONTS": "2",
            "SANDBOXD_WORKERS": "1",
            "SANDBOXD_RUNNERS": '["python"]',
            "SANDBOXD_SHUTDOWN_DRAIN_S": "3",
        }
    )
    try:
        n.wait_ready(NODE_START_S)
        a, b = await fronts(n.url)
        sid = (await a.post("/sessions", json={"runner": "python"})).json()["session_id"]
        slow = asyncio.create_task(py(b, "import time; time.sleep(1); print('finished')"))
        await asyncio.sleep(0.3)
        n.proc.send_signal(signal.SIGTERM)  # the node drains: both fronts refuse new work, the step finishes
        await asyncio.sleep(0.5)
        for c in (a, b):
            r = await py(c, "print(1)")
            assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
            assert (await c.get("/readyz")).status_code == 503
        assert (await py(a, "print('session goes on')", session_id=sid)).status_code == 200
        assert (await slow).json()["observation"]["stdout"] == "finished\n"
        assert n.proc.wait(60) == 0
        await a.aclose()
        await b.aclose()
    finally:
        n.stop()
