"""Forwarding a session's request to the node that owns it, over pooled keep-alive connections.

The transport is ``sandboxd.wire``'s lean HTTP/1.1 client, not httpx: on this
machine httpx added 3-4 ms to a forwarded step at p50 (bench/forwarding.py).

The owner authenticates the forwarded request itself, with the caller's own
``Authorization`` header: forwarding adds no trust between nodes and no shared
secret to configure, and a node can never act for a tenant whose key it was not
given. The header travels from the surface that authenticated the request to
the gateway in ``CALLER`` (a context variable: MCP tools and native routes reach
the gateway through different code, and neither should thread a credential
through every call). ``X-Sandboxd-Forwarded-By`` marks a forwarded request so
the owner never forwards it again (no loops whatever the registry says).
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass

from sandboxd.cluster.nodes import Peer
from sandboxd.wire import Connection

FORWARDED_BY = "x-sandboxd-forwarded-by"
FORWARD_TIMEOUT_S = 30.0  # a forwarded request's own budget beyond any step time (session info, close, selections)


@dataclass(frozen=True)
class Caller:
    authorization: str | None = None
    forwarded_by: str | None = None


NOBODY = Caller()  # frozen: a shared default cannot be changed through it
CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("sandboxd_caller", default=NOBODY)


class PeerDown(Exception):
    """The request never reached the peer (it cannot have run there): safe to decide what to answer."""


class PeerRefused(PeerDown):
    """The peer's address refused the connection: nothing listens there, the process is gone."""


class PeerFailed(Exception):
    """The request was sent but no answer came back: it may have run; the caller must not retry blindly."""


class Forwarder:
    """Pooled keep-alive connections per peer, at most ``max_per_peer`` requests in flight to each.

    The cap bounds what one tenant's burst through this node can open towards one owner (its own
    connections and the owner's); requests past it wait their turn within their own timeout.
    """

    def __init__(self, node_id: str, connect_timeout_s: float, max_per_peer: int) -> None:
        self.node_id = node_id
        self.connect_timeout_s = connect_timeout_s
        self.max_per_peer = max_per_peer
        self._idle: dict[str, list[Connection]] = {}
        self._gates: dict[str, asyncio.Semaphore] = {}

    async def send(self, peer: Peer, method: str, path: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        """The owner's status and body (as it sent them), within ``timeout_s`` in all."""
        headers = {FORWARDED_BY: self.node_id}
        auth = CALLER.get().authorization
        if auth:
            headers["authorization"] = auth
        gate = self._gates.setdefault(peer.url, asyncio.Semaphore(self.max_per_peer))
        try:
            async with asyncio.timeout(timeout_s):
                async with gate:
                    return await self._send(peer, method, path, body, headers)
        except TimeoutError:
            raise PeerFailed(f"no answer within {timeout_s:g} s") from None

    async def _send(
        self, peer: Peer, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        idle = self._idle.setdefault(peer.url, [])
        conn = idle.pop() if idle else Connection(peer.url)
        if not conn.connected:
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    await conn.connect()
            except ConnectionRefusedError as exc:
                await self._forget(peer.url)
                raise PeerRefused(f"connection refused: {exc}") from None
            except (OSError, TimeoutError) as exc:
                await self._forget(peer.url)
                raise PeerDown(f"{type(exc).__name__}: {exc}") from None
        try:
            status, data = await conn.request_raw(method, path, body, headers)
        except BaseException as exc:
            await conn.close()  # mid-request: the connection's state is unknown
            if isinstance(exc, ConnectionRefusedError):  # a pooled connection was dead, and so is the address
                await self._forget(peer.url)
                raise PeerRefused(f"connection refused: {exc}") from None
            if isinstance(exc, OSError | ValueError | asyncio.IncompleteReadError):
                await self._forget(peer.url)
                raise PeerFailed(f"{type(exc).__name__}: {exc}") from None
            raise
        if conn.connected and len(idle) < self.max_per_peer:
            idle.append(conn)
        else:
            await conn.close()
        return status, data

    async def _forget(self, url: str) -> None:
        """A peer that failed: its idle connections are suspect, and a restarted peer may have a new address."""
        for conn in self._idle.pop(url, []):
            await conn.close()

    async def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                await conn.close()
        self._idle.clear()
