"""The front door, against a real node, as a hostile client would try it (found by a red team on the single
gateway): request bodies read and parsed before the key was checked, a trickled body holding a connection
past the per-chunk stall timeout, one client or one tenant filling the connection pool until every
request, probes included, got 503 (and a liveness probe restarted the pod), idle WebSockets held forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandboxd.localnode import NodeProcess, free_port

pytestmark = [pytest.mark.node, pytest.mark.timeout(180)]
KEY, OTHER = "frontdoor-key-0123456789ab", "frontdoor-other-0123456789"


@pytest.fixture(scope="module")
def node() -> Iterator[NodeProcess]:
    n = NodeProcess(
        {
            "SANDBOXD_RUNNERS": '["textgame"]',
            "SANDBOXD_WORKERS": "1",
            "SANDBOXD_API_KEYS": f'["{KEY}", "{OTHER}"]',
            "SANDBOXD_BODY_TIMEOUT_S": "2",
            "SANDBOXD_MAX_CONNECTIONS": "20",
            "SANDBOXD_MAX_CONNECTIONS_PER_ADDRESS": "30",
            "SANDBOXD_MAX_CONNECTIONS_PER_TENANT": "4",
            "SANDBOXD_WS_IDLE_TIMEOUT_S": "1",
            "SANDBOXD_PROBE_PORT": str(free_port()),
        }
    )
    n.wait_ready(120)
    yield n
    n.stop()


def raw(node: NodeProcess, head: bytes, body: bytes = b"", wait_s: float = 5.0) -> tuple[bytes, float]:
    """Send a request's bytes on a fresh connection; what comes back (until the node closes), and how fast."""
    with socket.create_connection(("127.0.0.1", node.port), timeout=wait_s) as s:
        t0 = time.monotonic()
        # The node may answer and close before the body is all sent (that is what a refusal before reading
        # looks like): the answer is in the socket's receive buffer all the same.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(head + body)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out, time.monotonic() - t0


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1") else 0


# A path is decided as the app routes it: a fragment or a query that ends like a public path is not one.
ANONYMOUS_PATHS = ["/rollout/step", "/sessions", "/run_code", "/mcp", "/rollout/steps", "/envs/textgame/reset#/ws"]


@pytest.mark.parametrize("path", [*ANONYMOUS_PATHS, "/envs/textgame/reset?x=/ws", "/envs/textgame/rese%74#/health"])
def test_an_anonymous_body_is_never_read(node: NodeProcess, path: str) -> None:
    """63 MB announced, 1 MB sent: the answer is a 401 in the surface's shape, at once, and the connection ends."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {63 << 20}\r\n\r\n"
    answer, took = raw(node, head.encode(), b"[" * (1 << 20))
    assert status_of(answer) == 401 and took < 2.0, (answer[:300], took)
    assert b"www-authenticate" in answer.lower()
    body = answer.split(b"\r\n\r\n", 1)[1]
    assert b"API key" in body, body


def test_a_body_over_the_cap_is_refused_before_it_is_read(node: NodeProcess) -> None:
    head = (
        f"POST /rollout/step HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {1 << 40}\r\n\r\n"
    )
    answer, took = raw(node, head.encode())
    assert status_of(answer) == 413 and took < 2.0, answer[:300]


def test_a_trickled_body_gets_a_deadline_for_the_whole_body(node: NodeProcess) -> None:
    """One byte every half second beat a per-chunk stall timeout forever; the whole body has 2 s here."""
    body = json.dumps({"runner": "textgame", "action": {"op": "episodes", "seed": 1}}).encode()
    head = (
        f"POST /rollout/step HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
        s.sendall(head.encode())
        t0 = time.monotonic()
        answer = b""
        for byte in body:
            try:
                s.sendall(bytes([byte]))
            except OSError:
                break
            s.settimeout(0.5)
            try:
                answer += s.recv(65536)
            except TimeoutError:
                continue
            if answer:
                break
        took = time.monotonic() - t0
    assert status_of(answer) == 408 and 1.5 < took < 5, (answer[:200], took)
    assert b"request_timeout" in answer


async def test_one_tenant_cannot_take_every_connection(node: NodeProcess) -> None:
    socks = []
    try:
        clients = [
            httpx.AsyncClient(
                base_url=node.url, headers={"authorization": f"Bearer {KEY}"}, limits=httpx.Limits(max_connections=1)
            )
            for _ in range(5)
        ]
        answers = [await c.get("/runners") for c in clients]
        assert [a.status_code for a in answers[:4]] == [200] * 4
        assert answers[4].status_code == 429 and "max_connections_per_tenant" in answers[4].text, answers[4].text
        async with httpx.AsyncClient(base_url=node.url, headers={"authorization": f"Bearer {OTHER}"}) as other:
            assert (await other.get("/runners")).status_code == 200  # another tenant is served
        for c in clients:
            await c.aclose()
        # One address holding idle connections up to its cap: the next is refused at once, probes still answer.
        for _ in range(30):
            socks.append(socket.create_connection(("127.0.0.1", node.port)))
        answer, _ = raw(node, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status_of(answer) == 429 and b"max_connections_per_address" in answer, answer[:300]
        ready = httpx.get(f"http://127.0.0.1:{node.settings['SANDBOXD_PROBE_PORT']}/readyz", timeout=5)
        assert ready.status_code == 200 and ready.json()["ready"], ready.text  # the probes' own listener
        live = httpx.get(f"http://127.0.0.1:{node.settings['SANDBOXD_PROBE_PORT']}/healthz", timeout=5)
        assert live.status_code == 200
    finally:
        for s in socks:
            s.close()


async def test_probes_are_answered_at_the_connection_limit(node: NodeProcess) -> None:
    """max_connections reached (20 here, held idle by one address under its own cap of 30): work is refused
    (503, retry), the probes on the main port still answer (served before the limit applies)."""
    socks = [socket.create_connection(("127.0.0.1", node.port)) for _ in range(25)]
    try:
        async with httpx.AsyncClient(base_url=node.url, timeout=10, headers={"authorization": f"Bearer {KEY}"}) as c:
            assert (await c.get("/healthz")).status_code == 200
            assert (await c.get("/readyz")).status_code == 200
            step = {"runner": "textgame", "action": {"op": "episodes", "seed": 1}}
            r = await c.post("/rollout/step", json=step)
            assert r.status_code == 503 and r.headers.get("retry-after"), r.text
            assert r.json()["error"]["code"] == "at_capacity", r.text
            # Every surface refuses in its own shape (uvicorn's own refusal was plain text).
            r = await c.get("/runners")
            assert r.status_code == 503 and r.json()["error"]["code"] == "at_capacity", r.text
            # SandboxFusion's clients retry a 504 and nothing else (verl): the surface's own answer to a retry
            r = await c.post("/run_code", json={"code": "print(1)", "language": "python"})
            assert r.status_code == 504 and "max_connections" in r.json()["detail"], r.text
    finally:
        for s in socks:
            s.close()
    await asyncio.sleep(0.2)
    async with httpx.AsyncClient(base_url=node.url, timeout=10, headers={"authorization": f"Bearer {KEY}"}) as c:
        assert (await c.post("/rollout/step", json=step)).status_code == 200  # and served again once they go


async def test_an_idle_websocket_is_closed_and_its_session_with_it(node: NodeProcess) -> None:
    import websockets

    url = node.url.replace("http://", f"ws://key:{KEY}@") + "/envs/textgame/ws"
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
        assert json.loads(await ws.recv())["type"] == "observation"
        t0 = time.monotonic()
        frame = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert frame["type"] == "error" and "no message" in frame["data"]["message"], frame
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)
        assert time.monotonic() - t0 < 5
    async with httpx.AsyncClient(base_url=node.url, headers={"authorization": f"Bearer {KEY}"}) as c:
        metrics = (await c.get("/metrics")).text
    live = [ln for ln in metrics.splitlines() if ln.startswith('sandboxd_sessions{runner="textgame"}')]
    assert live and float(live[0].split()[-1]) == 0.0, live


@pytest.mark.parametrize(
    "head",
    [
        "GET /v1/ping HTTP/1.1",  # public, through the framework
        "GET /healthz HTTP/1.1",  # public, served by the front itself
        f"DELETE /sessions/s_x~0~0.n HTTP/1.1\r\nAuthorization: Bearer {KEY}",  # a hot route with a key
    ],
)
def test_a_body_that_never_comes_is_cut_whatever_the_method(node: NodeProcess, head: str) -> None:
    """A GET or DELETE announcing a body it never sends held its connection forever (the deadline was for
    POST/PUT/PATCH only): anonymous clients filled max_connections with them."""
    answer, took = raw(node, f"{head}\r\nHost: x\r\nContent-Length: 10\r\n\r\n".encode(), wait_s=10)
    # The connection ends at the deadline; a route that answered without reading the body has its answer.
    assert 1.5 < took < 6, (answer[:300], took)
    assert status_of(answer) == (200 if "/v1/ping" in head else 408), answer[:300]


def test_headers_are_bounded_in_size(node: NodeProcess) -> None:
    big = "x" * (100 << 10)
    for head in (
        f"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nHost: x\r\n" + "X-A: b\r\n" * 20_000 + "\r\n",
        f"GET /healthz?{big} HTTP/1.1\r\nHost: x\r\n\r\n",
    ):
        answer, _ = raw(node, head.encode())
        assert status_of(answer) == 431 and b"headers_too_large" in answer, answer[:300]
    answer, _ = raw(node, f"GET /v2/sandboxes HTTP/1.1\r\nHost: x\r\nX-Big: {big}\r\n\r\n".encode())
    assert status_of(answer) == 431 and b'{"code":431,' in answer, answer[:300]  # the E2B SDK's shape there


def test_malformed_requests_get_a_clear_400(node: NodeProcess) -> None:
    twice = f"GET /runners HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nAuthorization: Bearer {OTHER}\r\n\r\n"
    answer, _ = raw(node, twice.encode())
    assert status_of(answer) == 400 and b"more than one Authorization" in answer, answer[:300]
    hosts = "POST /execute HTTP/1.1\r\nHost: 49999-a-0-0-aaaaaaaa.d\r\nHost: 49999-b-0-0-bbbbbbbb.d\r\n\r\n"
    answer, _ = raw(node, hosts.encode())  # which one names the sandbox would differ between layers
    assert status_of(answer) == 400 and b'"more than one Host header"' in answer, answer[:300]


def test_a_refusal_waits_for_the_answer_before_it(node: NodeProcess) -> None:
    """Pipelined: a step, then a request with a wrong key. HTTP/1.1 answers in order; the 401 came first (and
    the step's answer was lost), so a client or a proxy pairing answers with requests blamed the step."""
    body = json.dumps({"runner": "textgame", "action": {"op": "episodes", "seed": 1}}).encode()
    step = (
        f"POST /rollout/step HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    for refused in (
        b"GET /runners HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n\r\n",
        b"POST /rollout/step HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
        + b"\r\nContent-Length: " + str(1 << 40).encode() + b"\r\n\r\n",
    ):  # fmt: skip
        answer, _ = raw(node, step + refused)
        statuses = [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]
        assert statuses[:1] == [200] and statuses[1:] in ([401], [413]), answer[:600]


def test_expect_100_continue_is_answered_on_the_hot_routes(node: NodeProcess) -> None:
    body = json.dumps({"runner": "textgame", "action": {"op": "episodes", "seed": 1}}).encode()
    head = (
        f"POST /rollout/step HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nExpect: 100-continue\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", node.port), timeout=5) as s:
        s.sendall(head.encode())
        assert s.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(body)
        answer = s.recv(65536)
    assert status_of(answer) == 200, answer[:300]


@pytest.mark.parametrize("sid", ["s_x~\u00b2~y", "s_x~\uff10~y", "s_x~99~y", "s_x~-1~y", "s_x~0~y~z"])
async def test_a_session_id_that_is_not_ours_is_404(node: NodeProcess, sid: str) -> None:
    """A superscript digit in the worker field was a 500 (str.isdigit() said yes, int() said no)."""
    headers = {"authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=node.url, timeout=10, headers=headers) as c:
        node_id = (await c.get("/readyz")).json()["node_id"]
        full = f"{sid}.{node_id}"
        assert (await c.get(f"/sessions/{full}")).status_code == 404
        assert (await c.delete(f"/sessions/{full}")).status_code == 404
        step = {"runner": "textgame", "session_id": full, "action": {"op": "step", "command": "look"}}
        r = await c.post("/rollout/step", json=step)
        assert r.status_code == 404 and r.json()["error"]["blame"] == "client", r.text
        r = await c.post("/rollout/steps", json={"steps": [step]})
        assert r.json()["results"][0]["error"]["code"] == "unknown_session", r.text


async def test_websockets_count_while_open_and_only_then(node: NodeProcess) -> None:
    """A WebSocket's close never reached the connection counts: ~30 handshakes from one address (anonymous
    ones too) locked that address out of the node. And WebSockets were not counted for their tenant: one
    tenant could hold every connection with them."""
    import websockets

    anonymous = node.url.replace("http://", "ws://") + "/envs/textgame/ws"
    for _ in range(40):  # more than the address's cap (30), one after another
        async with websockets.connect(anonymous) as ws:
            with contextlib.suppress(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)  # refused in the route (no key): a frame, then the close
    keyed = node.url.replace("http://", f"ws://key:{KEY}@") + "/envs/textgame/ws"
    async with contextlib.AsyncExitStack() as held:
        for _ in range(4):  # the tenant's cap
            await held.enter_async_context(websockets.connect(keyed))
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(keyed)
        assert refused.value.response.status_code == 429
        async with httpx.AsyncClient(base_url=node.url, headers={"authorization": f"Bearer {OTHER}"}) as other:
            assert (await other.get("/runners")).status_code == 200  # another tenant is served
    await asyncio.sleep(0.3)
    async with websockets.connect(keyed) as ws:  # closed ones count no more
        await ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
        assert json.loads(await ws.recv())["type"] == "observation"
    async with httpx.AsyncClient(base_url=node.url, headers={"authorization": f"Bearer {KEY}"}) as c:
        assert (await c.get("/runners")).status_code == 200  # the address is not locked out either


def _listening_inode(port: int) -> str:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                return f[9]
    raise AssertionError(f"nothing listens on {port}")


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def test_only_the_fronts_hold_the_nodes_port(node: NodeProcess) -> None:
    """Workers inherited the listening socket, and their jails' supervisors and SQL engines from them: a
    process running tenants' code could accept other tenants' requests (and read their keys)."""
    status = httpx.get(f"{node.url}/readyz", timeout=10).json()
    inode = f"socket:[{_listening_inode(node.port)}]"
    holders = []
    for pid in _tree(int(status["pid"])):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == inode for fd in Path(f"/proc/{pid}/fd").iterdir()):
                holders.append(pid)
    assert sorted(holders) == sorted({int(status["pid"]), *status["fronts"]}), (holders, status)


def test_a_tenants_connections_are_capped_node_wide_and_never_count_against_its_address() -> None:
    """Two front processes: a tenant's authenticated connections count once on the whole node (921c1ca: per
    front, K times the cap), and never against the address they come from (921c1ca: one key's 1,024 idle
    connections refused every other tenant behind the same ingress or NAT); connections that have not
    authenticated are what the address cap counts."""
    n = NodeProcess(
        {
            "SANDBOXD_RUNNERS": '["textgame"]',
            "SANDBOXD_WORKERS": "1",
            "SANDBOXD_FRONTS": "2",
            "SANDBOXD_API_KEYS": f'["{KEY}", "{OTHER}"]',
            "SANDBOXD_MAX_CONNECTIONS_PER_ADDRESS": "6",
            "SANDBOXD_MAX_CONNECTIONS_PER_TENANT": "8",
        }
    )
    held: list[socket.socket] = []
    try:
        n.wait_ready(120)

        def authenticated(path: str) -> bytes:
            s = socket.create_connection(("127.0.0.1", n.port), timeout=5)
            held.append(s)
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
            out = b""
            while b"\r\n\r\n" not in out:
                out += s.recv(65536)
            return out

        # More than the address cap: they are the tenant's, a public path's with its key too (a SandboxFusion
        # client's kept-alive pings held the address's count and refused every other tenant behind it).
        paths = ["/v1/ping" if i % 2 else "/runners" for i in range(12)]
        answers = [authenticated(path) for path in paths]
        ok = [status_of(a) for a in answers].count(200)
        refused = [(path, a) for path, a in zip(paths, answers, strict=True) if status_of(a) != 200]
        assert ok == 8 and len(refused) == 4, [status_of(a) for a in answers]  # 8 on the node, both fronts
        assert all(b"max_connections_per_tenant" in a for _, a in refused)
        # each in its surface's shape: sandboxd's 429, SandboxFusion's 504 (the one status its clients retry)
        assert all(status_of(a) == (504 if path == "/v1/ping" else 429) for path, a in refused), refused
        # The other tenant, from the same address, is served while the first holds all it may.
        other = httpx.get(f"{n.url}/runners", headers={"authorization": f"Bearer {OTHER}"}, timeout=10)
        assert other.status_code == 200, other.text
        # Connections that never authenticate: the address's cap (per front; two fronts here), refused at once.
        idle = [socket.create_connection(("127.0.0.1", n.port), timeout=2) for _ in range(14)]
        held += idle
        answered = []
        for s in idle:
            try:
                answered.append(status_of(s.recv(65536)))
            except TimeoutError:
                answered.append(0)  # held open, waiting for its request
        assert answered.count(429) >= 2 and answered.count(0) <= 12, answered
    finally:
        for s in held:
            s.close()
        n.stop()
