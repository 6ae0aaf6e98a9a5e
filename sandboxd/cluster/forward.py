"""Forwarding a session's request to the node that owns it, over pooled keep-alive connections.

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

import contextvars
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from sandboxd.cluster.nodes import Peer

FORWARDED_BY = "x-sandboxd-forwarded-by"


@dataclass(frozen=True)
class Caller:
    authorization: str | None = None
    forwarded_by: str | None = None


NOBODY = Caller()  # frozen: a shared default cannot be changed through it
CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("sandboxd_caller", default=NOBODY)


class PeerDown(Exception):
    """The request never reached the peer (it cannot have run there): safe to decide what to answer."""


class PeerFailed(Exception):
    """The request was sent but no answer came back: it may have run; the caller must not retry blindly."""


class Forwarder:
    def __init__(self, node_id: str, connect_timeout_s: float, read_timeout_s: float, max_connections: int) -> None:
        self.node_id = node_id
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s, pool=connect_timeout_s),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            follow_redirects=False,
            trust_env=False,  # a proxy from the environment must never sit between two nodes
        )

    async def send(self, peer: Peer, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """The owner's status and JSON body (None for 204)."""
        headers = {FORWARDED_BY: self.node_id, "content-type": "application/json"}
        auth = CALLER.get().authorization
        if auth:
            headers["authorization"] = auth
        content = orjson.dumps(body) if body is not None else None
        try:
            resp = await self.http.request(method, peer.url + path, content=content, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise PeerDown(f"{type(exc).__name__}: {exc}") from None
        except httpx.HTTPError as exc:
            raise PeerFailed(f"{type(exc).__name__}: {exc}") from None
        if resp.status_code == 204:
            return 204, None
        try:
            return resp.status_code, orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            raise PeerFailed(f"answered {resp.status_code} with a body that is not JSON") from None

    async def close(self) -> None:
        await self.http.aclose()
