"""Three real nodes sharing a real redis-server on loopback: one service.

A session created on one node is stepped through the others (forwarded to its
owner, state intact, the caller authenticated by the owner); idempotent retries
run once whichever node they land on; Redis going away costs one-shots nothing
and session creation a clear 503, and the nodes recover by themselves; a node
killed without warning has its sessions answer 410 on every other node within
its heartbeat TTL, and nothing hangs meanwhile.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from sandboxd.api.e2b.names import node_tag
from sandboxd.localnode import LocalRedis, NodeProcess

pytestmark = [pytest.mark.node, pytest.mark.timeout(300)]

KEY_A = "key-a-0123456789abcdef"
KEY_B = "key-b-0123456789abcdef"
KEY_E2B = "e2b_" + "c3" * 20  # the form the E2B SDK checks
HEARTBEAT_S, TTL_S = 0.5, 2.0


@pytest.fixture(scope="module")
def nodes(redis_server: LocalRedis) -> Iterator[list[NodeProcess]]:
    started = []
    try:
        for i in (1, 2, 3):
            node = NodeProcess(
                {
                    "SANDBOXD_NODE_ID": f"n{i}",
                    "SANDBOXD_REDIS_URL": redis_server.url,
                    "SANDBOXD_REDIS_PREFIX": "t-cluster",
                    "SANDBOXD_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
                    "SANDBOXD_HEARTBEAT_TTL_S": str(TTL_S),
                    "SANDBOXD_WORKERS": "1",
                    "SANDBOXD_RUNNERS": '["python", "textgame"]',
                    "SANDBOXD_API_KEYS": f'["{KEY_A}", "{KEY_B}", "{KEY_E2B}"]',
                    "SANDBOXD_REDIS_TIMEOUT_S": "0.5",
                },
            )
            started.append(node)
        for node in started:
            node.wait_ready(120)
        yield started
    finally:
        for node in started:
            node.stop()


def client(node: NodeProcess, key: str = KEY_A) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=node.url, timeout=30, headers={"authorization": f"Bearer {key}"})


async def py(c: httpx.AsyncClient, code: str, session_id: str | None = None, **extra: object) -> httpx.Response:
    body: dict[str, object] = {"runner": "python", "action": {"code": code}, **extra}
    if session_id:
        body["session_id"] = session_id
    return await c.post("/rollout/step", json=body)


async def until_peers(nodes: list[NodeProcess], want: int, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = []
        for n in nodes:
            async with client(n) as c:
                seen.append(len((await c.get("/readyz")).json()["cluster"]["peers"]))
        if all(s >= want for s in seen):
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"nodes never saw {want} peers: {seen}")


async def test_session_stepped_through_every_node(nodes: list[NodeProcess]) -> None:
    n1, n2, n3 = nodes
    await until_peers(nodes, 3)
    async with client(n1) as c1, client(n2) as c2, client(n3) as c3, client(n2, KEY_B) as other:
        r = await c1.post("/sessions", json={"runner": "python"})
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        assert sid.endswith(".n1")
        assert (await py(c1, "import os\nx = 40\nopen('f.txt', 'w').write('kept')", sid)).json()["ok"]
        r = await py(c2, "x += 1\nprint(x, os.getpid() > 0)", sid)
        assert r.status_code == 200 and r.json()["observation"]["stdout"] == "41 True\n", r.text
        r = await py(c3, "x += 1\nprint(x, open('f.txt').read())", sid)
        assert r.json()["observation"]["stdout"] == "42 kept\n", r.text
        assert r.json()["session_id"] == sid
        info = await c3.get(f"/sessions/{sid}")
        assert info.status_code == 200 and info.json()["node_id"] == "n1" and info.json()["steps"] == 3, info.text

        # The owner authenticates the forwarded request: another tenant's key sees no session, from any node.
        r = await py(other, "print(x)", sid)
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_session", r.text
        assert (await other.get(f"/sessions/{sid}")).status_code == 404
        assert (await other.delete(f"/sessions/{sid}")).status_code == 404
        async with httpx.AsyncClient(base_url=n2.url, timeout=30) as anonymous:
            assert (await py(anonymous, "print(1)", sid)).status_code == 401

        # The owner's own errors come back as they were (a busy session is the owner's 409, blamed on the client).
        slow = asyncio.create_task(py(c2, "import time; time.sleep(1.5)", sid))
        await asyncio.sleep(0.5)
        busy = await py(c3, "print(1)", sid)
        assert busy.status_code == 409 and busy.json()["error"]["blame"] == "client", busy.text
        assert (await slow).json()["ok"]

        # A client claiming to be a node gets no forward, and no false "lost" either.
        r = await c2.post(
            "/rollout/step",
            json={"runner": "python", "session_id": sid, "action": {"code": "print(1)"}},
            headers={"x-sandboxd-forwarded-by": "n1"},
        )
        assert r.status_code == 404, r.text

        # Ids that name no live node, or this node, or garbage: 404, never a forward or a 5xx.
        for bogus in ("s_nothing.n9", "s_nothing.n1", "s_x%2F..%2Fhealthz.n1", "nope"):
            r = await py(c2, "print(1)", bogus)
            assert r.status_code == 404, (bogus, r.text)

        # What the client sent is judged where it arrived: JSON the node cannot carry on is a 422, not a 500,
        # and in a batch it costs nothing to the other steps.
        raw = b'{"runner": "python", "session_id": "SID", "action": {"code": "\\ud800"}}'.replace(b"SID", sid.encode())
        r = await c2.post("/rollout/step", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422 and r.json()["error"]["blame"] == "client", r.text
        batch = {
            "steps": [
                {"runner": "python", "session_id": sid, "action": {"code": "print(x)"}},
                {"runner": "python", "session_id": sid, "action": {"code": "1", "n": 2**70}},
            ]
        }
        r = await c3.post("/rollout/steps", json=batch)
        assert r.status_code == 200, r.text
        got = r.json()["results"]
        assert got[0]["observation"]["stdout"] == "42\n" and got[1]["status"] == 422, got

        # Closed through a third node; every node then says it is gone.
        assert (await c3.delete(f"/sessions/{sid}")).status_code == 204
        for c in (c1, c2, c3):
            r = await py(c, "print(x)", sid)
            assert r.status_code == 404, r.text


async def test_idempotent_retries_across_nodes_run_once(nodes: list[NodeProcess]) -> None:
    code = "import random, time\ntime.sleep(0.8)\nprint(random.random())"
    async with client(nodes[0]) as c1, client(nodes[1]) as c2, client(nodes[2]) as c3:
        # Concurrent: the first claims the key, the others wait for its result on their own nodes.
        first = await asyncio.gather(*(py(c, code, idempotency_key="k-concurrent") for c in (c1, c2, c3)))
        outs = {r.json()["observation"]["stdout"] for r in first}
        assert all(r.status_code == 200 for r in first) and len(outs) == 1, [r.text for r in first]
        # Later, elsewhere: the stored result.
        again = await py(c3, code, idempotency_key="k-concurrent")
        assert again.json()["observation"]["stdout"] in outs
        # The same key for another request is the client's error, on any node.
        r = await py(c2, "print(2)", idempotency_key="k-concurrent")
        assert r.status_code == 422 and "different request" in r.json()["error"]["message"], r.text
        # Another tenant's key of the same name is another key.
        async with client(nodes[1], KEY_B) as b:
            assert (await py(b, "print('b')", idempotency_key="k-concurrent")).json()["observation"]["stdout"] == "b\n"
        # Session creation too: one session, whichever node the retry reaches.
        made = [await c.post("/sessions", json={"runner": "textgame", "idempotency_key": "mk-1"}) for c in (c1, c2, c3)]
        assert {m.json()["session_id"] for m in made} == {made[0].json()["session_id"]}, [m.text for m in made]
        sid = made[0].json()["session_id"]
        assert (await c2.delete(f"/sessions/{sid}")).status_code == 204


async def test_fork_through_another_node(nodes: list[NodeProcess]) -> None:
    n1, n2, _ = nodes
    async with client(n1) as c1, client(n2) as c2, client(n2, KEY_B) as other:
        sid = (await c1.post("/sessions", json={"runner": "textgame"})).json()["session_id"]
        await c2.post(
            "/rollout/step", json={"runner": "textgame", "session_id": sid, "action": {"op": "reset", "seed": 5}}
        )
        r = await c2.post(f"/sessions/{sid}/fork", json={"n": 3})
        assert r.status_code == 201, r.text
        copies = [s["session_id"] for s in r.json()["sessions"]]
        assert all(c.endswith(".n1") for c in copies)  # copies live with their source's state, on its node
        look = {"runner": "textgame", "action": {"op": "step", "command": "look"}}
        seen = [(await c2.post("/rollout/step", json={**look, "session_id": c})).json()["observation"] for c in copies]
        assert all(o == seen[0] for o in seen) and seen[0]["steps"] == 1
        assert (await other.post(f"/sessions/{sid}/fork", json={"n": 1})).status_code == 404
        py_sid = (await c1.post("/sessions", json={"runner": "python"})).json()["session_id"]
        await c1.post("/rollout/step", json={"runner": "python", "session_id": py_sid, "action": {"code": "x = 7"}})
        r = await c2.post(f"/sessions/{py_sid}/fork", json={"n": 1})
        assert r.status_code == 201, r.text  # forwarded to the source's node, where its interpreter is
        py_copy = r.json()["sessions"][0]["session_id"]
        got = await c2.post(
            "/rollout/step", json={"runner": "python", "session_id": py_copy, "action": {"code": "print(x)"}}
        )
        assert py_copy.endswith(".n1") and got.json()["observation"]["stdout"] == "7\n", got.text
        r = await c2.post(f"/sessions/{py_sid}/fork", json={"n": 1})  # its refusal comes back through n2
        assert r.status_code == 422 and "forks once" in r.json()["error"]["message"], r.text
        for x in [sid, py_sid, py_copy, *copies]:
            assert (await c2.delete(f"/sessions/{x}")).status_code == 204


async def test_a_run_is_listed_and_closed_across_nodes(nodes: list[NodeProcess]) -> None:
    """Labels select a run's sessions wherever they live: any node asks the others once (a forwarded call is
    not passed on), status of many ids goes to each owner once, another tenant's are never touched."""
    await until_peers(nodes, 3)
    run = {"run_id": "cluster-run"}
    sids = []
    for n in nodes[:2]:
        async with client(n) as c:
            for _ in range(2):
                r = await c.post("/sessions", json={"runner": "textgame", "labels": run})
                assert r.status_code == 201, r.text
                sids.append(r.json()["session_id"])
    async with client(nodes[0], KEY_B) as other:
        theirs = (await other.post("/sessions", json={"runner": "textgame", "labels": run})).json()["session_id"]
    async with client(nodes[2]) as c:
        listed = (await c.get("/sessions", params={"label": "run_id:cluster-run"})).json()
        assert {s["session_id"] for s in listed["sessions"]} == set(sids) and listed["unreached"] == [], listed
        states = (await c.post("/sessions/status", json={"session_ids": [*sids, theirs]})).json()["sessions"]
        assert [states[s]["state"] for s in sids] == ["live"] * 4 and states[theirs]["state"] == "unknown"
        closed = (await c.post("/sessions/close", json={"labels": run})).json()
        assert closed == {"count": 4, "unreached": []}, closed
        assert (await c.get("/sessions", params={"label": "run_id:cluster-run"})).json()["sessions"] == []
    async with client(nodes[0], KEY_B) as other:
        assert (await other.get(f"/sessions/{theirs}")).status_code == 200
        await other.delete(f"/sessions/{theirs}")


def test_an_e2b_sandbox_is_served_through_any_node(nodes: list[NodeProcess], monkeypatch: pytest.MonkeyPatch) -> None:
    """The E2B SDK sends every sandbox's calls to one URL: a node that does not own the sandbox passes them to
    the one that does, streams included (a command's output as printed, a background command's start at once)."""
    from e2b import CommandExitException
    from e2b_code_interpreter import Sandbox
    from e2b_code_interpreter import TimeoutException as CodeTimeout

    monkeypatch.setenv("E2B_API_KEY", KEY_E2B)
    monkeypatch.setenv("E2B_API_URL", nodes[0].url)
    monkeypatch.setenv("E2B_SANDBOX_URL", nodes[1].url)
    sbx = Sandbox.create(metadata={"run_id": "cluster-e2b"})
    # made by the first node (its id names n1, by a hash: one DNS label), its data plane reached through the second
    assert sbx.sandbox_id.endswith("-" + node_tag("n1"))
    try:
        sbx.run_code("x = 20")
        assert sbx.run_code("x * 2").text == "40"
        # a cell whose client stops waiting is interrupted on the owner, through the node in between
        with pytest.raises(CodeTimeout):
            sbx.run_code("import time\nwhile True: time.sleep(0.05)", timeout=1)
        t0 = time.monotonic()
        assert sbx.run_code("x").text == "20" and time.monotonic() - t0 < 10
        seen: list[float] = []
        done = sbx.commands.run(
            "for i in 1 2 3; do echo $i; sleep 0.3; done", on_stdout=lambda s: seen.append(time.monotonic())
        )
        assert done.stdout == "1\n2\n3\n" and seen[-1] - seen[0] > 0.4
        sbx.files.write("/home/user/f.bin", bytes(range(256)) * 4096)
        assert bytes(sbx.files.read("/home/user/f.bin", format="bytes")) == bytes(range(256)) * 4096
        # a hop only a peer makes: forged, it is refused, never answered as this node's own (it was a 500)
        forged = httpx.post(
            f"{nodes[1].url}/filesystem.Filesystem/ListDir",
            json={"path": "/home/user"},
            headers={
                "E2b-Sandbox-Id": sbx.sandbox_id,
                "X-Access-Token": sbx._envd_access_token or "",
                "X-Sandboxd-Forwarded-By": "n3",
                "Connect-Protocol-Version": "1",
            },
        )
        assert forged.status_code == 502 and forged.json()["code"] == 502, forged.text
        server = sbx.commands.run("exec sleep 300", background=True)
        assert server.kill()
        with pytest.raises(CommandExitException):
            server.wait()
        # killed through a third node during a cell run through the second: the owner drops the connection,
        # and so does the node in between (the SDK's "killed" is a dropped connection)
        monkeypatch.setenv("E2B_API_URL", nodes[2].url)
        killer = threading.Timer(1.5, Sandbox.kill, args=(sbx.sandbox_id,))
        killer.start()
        with pytest.raises(CodeTimeout, match="killed while the request was in progress"):
            sbx.run_code("import time; time.sleep(300)", timeout=300)
        killer.join()
    finally:
        Sandbox.kill(sbx.sandbox_id)  # whatever happened above
    assert not sbx.is_running()


async def test_redis_down_one_shots_run_sessions_503_then_recover(
    nodes: list[NodeProcess], redis_server: LocalRedis
) -> None:
    n1, n2, n3 = nodes
    await until_peers(nodes, 3)
    async with client(n1) as c1, client(n2) as c2, client(n3) as c3:
        sid = (await c1.post("/sessions", json={"runner": "python"})).json()["session_id"]
        assert (await py(c1, "state = 'before the outage'", sid)).json()["ok"]
        redis_server.kill()
        try:
            for c in (c1, c2, c3):
                r = await py(c, "print(6 * 7)")
                assert r.status_code == 200 and r.json()["observation"]["stdout"] == "42\n", r.text
                # An idempotent one-shot still runs (on this node's memory until Redis is back).
                r = await py(c, "print('idem')", idempotency_key="during-outage")
                assert r.status_code == 200 and r.json()["ok"], r.text
                t0 = time.monotonic()
                r = await c.post("/sessions", json={"runner": "python"})
                assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable", r.text
                assert r.headers.get("retry-after") and time.monotonic() - t0 < 3
            # The session's owner still serves it; a node that cannot consult the registry says so in time.
            assert (await py(c1, "print(state)", sid)).json()["observation"]["stdout"] == "before the outage\n"
            await asyncio.sleep(TTL_S + 2 * HEARTBEAT_S)  # every node has failed a beat by now
            for c in (c2, c3):
                t0 = time.monotonic()
                r = await py(c, "print(state)", sid)
                assert time.monotonic() - t0 < 5
                assert r.status_code in (200, 503), r.text  # forwarded from the last registry, or a clear 503
                if r.status_code == 503:
                    assert r.json()["error"]["blame"] == "infra"
            ready = (await c2.get("/readyz")).json()
            assert ready["cluster"]["store"] == "unavailable" and ready["ready"], ready
        finally:
            redis_server.start()  # empty: the nodes re-register and re-publish their sessions themselves
        deadline = time.monotonic() + 15
        while True:
            r = await py(c3, "print(state)", sid)
            healthy = (await c2.get("/readyz")).json()["cluster"]["store"] == "ok"
            if (
                r.status_code == 200
                and healthy
                and (await c2.post("/sessions", json={"runner": "textgame"})).status_code == 201
            ):
                break
            assert time.monotonic() < deadline, r.text
            await asyncio.sleep(0.3)
        assert r.json()["observation"]["stdout"] == "before the outage\n"
        await c1.delete(f"/sessions/{sid}")


def steps_ok(metrics: str) -> float:
    line = next(
        ln
        for ln in metrics.splitlines()
        if ln.startswith('sandboxd_step_latency_seconds_count{outcome="ok",runner="python"}')
    )
    return float(line.split()[-1])


async def test_client_spreads_one_shots_and_skips_a_dead_node(nodes: list[NodeProcess]) -> None:
    from sandboxd.client import SandboxClient
    from sandboxd.localnode import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    before = []
    for n in nodes:
        async with httpx.AsyncClient(base_url=n.url) as c:
            before.append(steps_ok((await c.get("/metrics")).text))
    async with SandboxClient([dead, *(n.url for n in nodes)], timeout_s=30, api_key=KEY_A) as sc:
        results = await asyncio.gather(*(sc.run_python(f"print({i})") for i in range(12)))
        assert [r["observation"]["stdout"] for r in results] == [f"{i}\n" for i in range(12)]
        async with sc.session("python") as s:  # created on some node; its steps go straight there
            await s.run_python("v = 7")
            assert (await s.run_python("print(v)"))["observation"]["stdout"] == "7\n"
    for n, b in zip(nodes, before, strict=True):
        async with httpx.AsyncClient(base_url=n.url) as c:
            assert steps_ok((await c.get("/metrics")).text) - b >= 3, n.url  # every live node took its share


async def test_killed_node_sessions_answer_410_everywhere(nodes: list[NodeProcess]) -> None:
    n1, n2, n3 = nodes
    await until_peers(nodes, 3)
    async with client(n1) as c1, client(n2) as c2, client(n3) as c3:
        sid = (await c1.post("/sessions", json={"runner": "python"})).json()["session_id"]
        assert (await py(c2, "y = 1", sid)).json()["ok"]
        # An owner whose heartbeat lapsed but whose process is there (its loop stalled, or stopped) is not
        # lost: a forward waits for it and gets its answer.
        n1.proc.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(TTL_S + 2 * HEARTBEAT_S)
            pending = asyncio.create_task(py(c3, "print(y)", sid))
            await asyncio.sleep(1.0)
        finally:
            n1.proc.send_signal(signal.SIGCONT)
        r = await pending
        assert r.status_code == 200 and r.json()["observation"]["stdout"] == "1\n", r.text
        await until_peers(nodes, 3)
        n1.proc.kill()  # no goodbye: the heartbeat runs out
        n1.proc.wait()
        killed = time.monotonic()
        seen: set[int] = set()
        for c in (c2, c3):
            while True:
                t0 = time.monotonic()
                r = await py(c, "print(y)", sid)
                assert time.monotonic() - t0 < 5, "a step for a dead node's session hung"
                seen.add(r.status_code)
                if r.status_code == 410:
                    assert r.json()["error"]["code"] == "session_lost" and r.json()["error"]["blame"] == "infra"
                    assert "n1" in r.json()["error"]["message"]
                    break
                assert r.status_code == 502 and r.json()["error"]["code"] == "node_unreachable", r.text
                assert time.monotonic() - killed < TTL_S + 2 * HEARTBEAT_S + 1.0, "still not lost after the TTL"
                await asyncio.sleep(0.1)
        assert time.monotonic() - killed < TTL_S + 2 * HEARTBEAT_S + 1.0
        assert (await c3.get(f"/sessions/{sid}")).status_code == 410
        # The same node id back, as a new incarnation (a StatefulSet pod restarted): its predecessor's
        # sessions are lost, not unknown, on every node including itself.
        reborn = NodeProcess(
            {**n1.settings, "SANDBOXD_LOG_LEVEL": "warning"}  # same id, same Redis, a new port and incarnation
        )
        try:
            reborn.wait_ready(120)
            await until_peers([reborn, n2, n3], 3)
            for base in (reborn.url, n2.url):
                async with httpx.AsyncClient(
                    base_url=base, timeout=30, headers={"authorization": f"Bearer {KEY_A}"}
                ) as c:
                    r = await py(c, "print(y)", sid)
                    assert r.status_code == 410 and "restarted" in r.json()["error"]["message"], r.text
        finally:
            reborn.stop()
        # One-shots and the surviving nodes' own sessions are untouched.
        assert (await py(c2, "print(1)")).json()["ok"]
        sid2 = (await c3.post("/sessions", json={"runner": "python"})).json()["session_id"]
        assert (await py(c2, "z = 5", sid2)).json()["ok"]
        assert (await py(c3, "print(z)", sid2)).json()["observation"]["stdout"] == "5\n"


async def test_stopped_node_sessions_are_lost_at_once(nodes: list[NodeProcess]) -> None:
    _, n2, n3 = nodes
    async with client(n3) as c3, client(n2) as c2:
        sid = (await c3.post("/sessions", json={"runner": "python"})).json()["session_id"]
        assert (await py(c2, "q = 1", sid)).json()["ok"]
        n3.stop()  # SIGTERM: it leaves the registry before it goes
        r = await py(c2, "print(q)", sid)
        assert r.status_code == 410 and r.json()["error"]["code"] == "session_lost", r.text
