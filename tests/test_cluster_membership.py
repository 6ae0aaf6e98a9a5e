"""Nodes joining, restarting and colliding, with real nodes and a real redis-server, and a heartbeat slow
enough (3 s) that a node's view of its peers is seconds old: what a Kubernetes scale-up or pod restart
looks like to the nodes already there.

Found by tests nobody here wrote: a session on a node that had just joined answered 410 (final, for a
trainer) through the others until their next beat; two nodes started with one ``SANDBOXD_NODE_ID`` both
stayed ready and made each other's sessions unreachable in turn.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from sandboxd.localnode import LocalRedis, NodeProcess

pytestmark = [pytest.mark.node, pytest.mark.timeout(300)]

KEY = "key-membership-0123456789"
HEARTBEAT_S, TTL_S = 3.0, 9.0


def node(redis: LocalRedis, node_id: str, port: int = 0, heartbeat_s: float = HEARTBEAT_S) -> NodeProcess:
    return NodeProcess(
        {
            "SANDBOXD_NODE_ID": node_id,
            "SANDBOXD_REDIS_URL": redis.url,
            "SANDBOXD_REDIS_PREFIX": "t-membership",
            "SANDBOXD_HEARTBEAT_INTERVAL_S": str(heartbeat_s),
            "SANDBOXD_HEARTBEAT_TTL_S": str(3 * heartbeat_s),
            "SANDBOXD_WORKERS": "1",
            "SANDBOXD_RUNNERS": '["textgame", "tools"]',
            "SANDBOXD_API_KEYS": f'["{KEY}"]',
        },
        port=port,
    )


@pytest.fixture(scope="module")
def first(redis_server: LocalRedis) -> Iterator[NodeProcess]:
    n1 = node(redis_server, "m1")
    n1.wait_ready(120)
    yield n1
    n1.stop()


def client(n: NodeProcess) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=n.url, timeout=30, headers={"authorization": f"Bearer {KEY}"})


async def look(c: httpx.AsyncClient, sid: str) -> httpx.Response:
    return await c.post(
        "/rollout/step", json={"runner": "textgame", "session_id": sid, "action": {"op": "reset", "seed": 1}}
    )


async def wait_up(n: NodeProcess, timeout_s: float = 120) -> httpx.Response:
    """Until the node answers /readyz at all (ready or not)."""
    deadline = time.monotonic() + timeout_s
    async with client(n) as c:
        while True:
            try:
                r = await c.get("/readyz")
                if r.json().get("cluster"):
                    return r
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "node never answered"
            await asyncio.sleep(0.1)


async def test_a_session_on_a_node_that_just_joined_is_forwarded_at_once(redis_server: LocalRedis) -> None:
    # An old node that reads the registry once a minute: whoever joins after it is not in its peer table.
    old = node(redis_server, "j1", heartbeat_s=60.0)
    old.wait_ready(120)
    second = node(redis_server, "m2")
    try:
        second.wait_ready(120)
        async with client(old) as c1, client(second) as c2:
            assert "m2" not in (await c1.get("/readyz")).json()["cluster"]["peers"]
            sid = (await c2.post("/sessions", json={"runner": "textgame"})).json()["session_id"]
            r = await look(c1, sid)
            assert r.status_code == 200 and r.json()["ok"], r.text
            info = await c1.get(f"/sessions/{sid}")
            assert info.status_code == 200 and info.json()["node_id"] == "m2", info.text
            assert (await c1.delete(f"/sessions/{sid}")).status_code == 204
    finally:
        second.stop()
        old.stop()


async def test_a_node_restarted_elsewhere_is_found_and_answers_for_its_sessions(
    first: NodeProcess, redis_server: LocalRedis
) -> None:
    """A pod killed and started again under its id (a new incarnation, here at a new address) while the
    others still hold the old entry: its new sessions are forwarded to it, its predecessor's are 410, and
    it does not wait for the dead entry to expire before it serves."""
    old = node(redis_server, "m3")
    old.wait_ready(120)
    async with client(first) as c1:
        for _ in range(50):  # m1 has m3's entry (its old address) in its table
            if "m3" in (await c1.get("/readyz")).json()["cluster"]["peers"]:
                break
            await asyncio.sleep(0.2)
        async with client(old) as c3:
            before = (await c3.post("/sessions", json={"runner": "textgame"})).json()["session_id"]
        old.proc.send_signal(signal.SIGKILL)  # no goodbye: its entry stays until its TTL
        old.proc.wait()
        reborn = node(redis_server, "m3")
        try:
            t0 = time.monotonic()
            reborn.wait_ready(120)
            assert time.monotonic() - t0 < TTL_S, "it waited for its dead predecessor's entry to expire"
            async with client(reborn) as c3:
                sid = (await c3.post("/sessions", json={"runner": "textgame"})).json()["session_id"]
            r = await look(c1, sid)
            assert r.status_code == 200 and r.json()["ok"], r.text
            lost = await look(c1, before)
            assert lost.status_code == 410 and "restarted" in lost.json()["error"]["message"], lost.text
        finally:
            reborn.stop()


async def test_a_second_node_with_the_same_id_stays_out(first: NodeProcess, redis_server: LocalRedis) -> None:
    twin = node(redis_server, "m1")  # the same SANDBOXD_NODE_ID as `first`, which is alive
    try:
        ready = await wait_up(twin)
        assert ready.status_code == 503, ready.text
        held = ready.json()["cluster"]["node_id_held_by"]
        assert held["url"] == first.url, held
        async with client(first) as c1, client(twin) as ct:
            assert (await c1.get("/readyz")).status_code == 200  # the first one is untouched
            r = await ct.post("/sessions", json={"runner": "textgame"})
            assert r.status_code == 503 and r.json()["error"]["code"] == "node_id_conflict", r.text
            # The first node's sessions stay reachable everywhere, the twin included (it forwards them).
            sid = (await c1.post("/sessions", json={"runner": "textgame"})).json()["session_id"]
            for _ in range(3):  # across several beats of both: nothing flips
                assert (await look(ct, sid)).status_code == 200
                assert (await look(c1, sid)).status_code == 200
                await asyncio.sleep(HEARTBEAT_S / 2)
            assert (await ct.get("/readyz")).status_code == 503
            await c1.delete(f"/sessions/{sid}")
        first.stop()  # it leaves the registry: the twin may have the id now
        deadline = time.monotonic() + 2 * HEARTBEAT_S + 5
        async with client(twin) as ct:
            while (await ct.get("/readyz")).status_code != 200:
                assert time.monotonic() < deadline, "the twin never joined after the holder left"
                await asyncio.sleep(0.2)
            assert (await ct.post("/sessions", json={"runner": "textgame"})).status_code == 201
    finally:
        twin.stop()
