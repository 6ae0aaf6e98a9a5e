"""An E2B sandbox's data plane in a cluster: the SDK sends every sandbox's calls to one ``E2B_SANDBOX_URL``,
so a node that does not own the sandbox passes the request, as it came, to the node that does, and streams
the answer back (a command's output arrives as it is printed; a background command's first event at once).

The owner checks the sandbox's token itself (every node derives it from the same keys), and never forwards
again (``X-Sandboxd-Forwarded-By``). The control plane needs none of this: its calls go through the gateway,
which forwards session requests by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandboxd.api.e2b.names import known_nodes, session_of
from sandboxd.api.e2b.paths import is_data_plane
from sandboxd.api.surface import until_disconnected
from sandboxd.cluster.forward import FORWARDED_BY
from sandboxd.front.gateway import Gateway
from sandboxd.front.surfaces import DropConnection
from sandboxd.ids import owner_of

# The request headers that mean something to the owner; nothing else crosses (no hop-by-hop headers).
PASSED = (
    b"content-type",
    b"content-encoding",
    b"accept-encoding",
    b"x-access-token",
    b"e2b-traffic-access-token",
    b"e2b-sandbox-id",
    b"e2b-sandbox-port",
    b"authorization",
    b"x-api-key",
    b"connect-protocol-version",
    b"connect-timeout-ms",
    b"connect-content-encoding",
    b"connect-accept-encoding",
    b"keepalive-ping-interval",
)
RETURNED = {
    "content-type",
    "grpc-status",
    "grpc-message",
}  # answer headers passed back (Connect's trailers ride in the body)
CONNECT_TIMEOUT_S = 5.0


class E2bForwarding:
    """ASGI middleware: data-plane requests of sandboxes other nodes own go there."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway
        self.client: httpx.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.gateway.cluster is None or not is_data_plane(scope["path"].encode()):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        sandbox_id = headers.get(b"e2b-sandbox-id", b"").decode("latin-1")
        session_id = session_of(sandbox_id, known_nodes(self.gateway))
        owner = owner_of(session_id) if session_id else None
        cluster = self.gateway.cluster
        if not sandbox_id or owner in (None, cluster.node_id):
            return await self.app(scope, receive, send)
        if FORWARDED_BY.encode() in headers:  # a peer sends only what this node owns: a forged or stale hop
            # (no node is named: a caller without credentials gets this far, and node ids are the operator's)
            return await _answer(send, 502, b"The sandbox was not found on this node")
        peer = cluster.registry.peers.get(owner) or cluster.registry.known.get(owner)
        if peer is None:
            return await _answer(send, 502, b"The sandbox was not found: its node is gone")
        await self._forward(scope, receive, send, peer.url, headers)

    async def _forward(self, scope: Scope, receive: Receive, send: Send, url: str, headers: dict[bytes, bytes]) -> None:
        body = bytearray()
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if self.client is None:
            self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S))
        passed = {k.decode(): v.decode("latin-1") for k, v in headers.items() if k in PASSED}
        passed.setdefault("accept-encoding", "identity")  # not httpx's own default: the client decodes, not us
        passed[FORWARDED_BY] = self.gateway.node_id
        query = scope.get("query_string", b"").decode("latin-1")
        target = f"{url.rstrip('/')}{scope['path']}" + (f"?{query}" if query else "")
        request = self.client.build_request(scope["method"], target, headers=passed, content=bytes(body))
        sending = asyncio.ensure_future(self.client.send(request, stream=True))
        gone = asyncio.ensure_future(until_disconnected(receive))
        try:
            await asyncio.wait({sending, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not sending.done():
            # The client left (its run_code timed out): the owner's connection closes too, and the owner
            # interrupts the cell as it does for a client of its own.
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await sending
            return
        try:
            response = sending.result()
        except httpx.HTTPError as exc:
            return await _answer(send, 502, f"sandbox is not running: its node did not answer ({exc})".encode())
        try:
            answer_headers: list[Any] = [
                (k.encode(), v.encode()) for k, v in response.headers.items() if k.lower() in RETURNED
            ]
            await send({"type": "http.response.start", "status": response.status_code, "headers": answer_headers})
            try:
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.HTTPError:
                raise DropConnection from None  # the owner dropped it (the sandbox ended): so does this node
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()


async def _answer(send: Send, status: int, text: bytes) -> None:
    """E2B's error shape (a Connect client reads the status alone)."""
    body = orjson.dumps({"code": status, "message": text.decode()})
    start: Message = {
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json")],
    }
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})
