"""The front door, against a real node, as a hostile client would try it (found by a red team on the single
gateway): request bodies read and parsed before the key was checked, a trickled body holding a connection
past the per-chunk stall timeout, one client or one tenant filling the connection pool until every
request, probes included, got 503 (and a liveness probe restarted the pod), idle WebSockets held forever.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from sandboxd.localnode import NodeProcess, free_port

pytestmark = pytest.mark.timeout(180)
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


@pytest.mark.parametrize("path", ["/rollout/step", "/sessions", "/run_code", "/mcp", "/rollout/steps"])
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
