"""Many nodes, one service: the gateway's view of the other nodes (``SANDBOXD_REDIS_URL`` set).

Any node takes any request. One-shot steps run where they land (they never
touch Redis). A session's id names its owner (``s_<random>.<node_id>``), so a
node needs Redis only to know whether that owner is alive and where it is:
then the request is forwarded to it (``forward.py``), and its answer, whatever
it is, is the answer. If the owner is gone, the directory says whether the
session existed for this tenant (410 ``session_lost``) or not (404).
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from sandboxd.cluster.forward import Forwarder, PeerDown, PeerFailed
from sandboxd.cluster.nodes import NodeRegistry, Peer
from sandboxd.config import NodeSettings
from sandboxd.errors import NodeUnreachable, SandboxdError, SessionLost, StoreUnavailable, UnknownSession, from_dict
from sandboxd.stores.idempotency import MemoryIdempotencyStore
from sandboxd.stores.redis import DirectoryEntry, RedisIdempotencyStore, RedisSessionStore, SharedRedis
from sandboxd.stores.sessions import owner_of

log = logging.getLogger("sandboxd.cluster")


class Cluster:
    def __init__(self, settings: NodeSettings) -> None:
        self.node_id = settings.node_id
        self.incarnation = secrets.token_hex(8)
        self.redis = SharedRedis(settings.redis_url, settings.redis_prefix, settings.redis_timeout_s)
        self.sessions = RedisSessionStore(self.redis, self.node_id, self.incarnation)
        step_budget_s = settings.max_timeout_s + settings.queue_timeout_s + 60.0
        self.idempotency = RedisIdempotencyStore(
            self.redis,
            self.node_id,
            settings.idempotency_ttl_s,
            claim_ttl_s=step_budget_s,
            fallback=MemoryIdempotencyStore(settings.idempotency_ttl_s, settings.idempotency_max_entries),
        )
        self.me = Peer(self.node_id, settings.advertised_url(), self.incarnation)
        self.registry = NodeRegistry(
            self.redis, self.me, settings.heartbeat_interval_s, settings.heartbeat_ttl_s, self._rejoined
        )
        self.forwarder = Forwarder(self.node_id, settings.forward_connect_timeout_s, step_budget_s, max_idle=256)
        self.forwarded = 0

    async def _rejoined(self) -> None:
        n = await self.sessions.republish()
        log.info(
            "node %s (incarnation %s) registered at %s; %d sessions published",
            self.node_id,
            self.incarnation,
            self.me.url,
            n,
        )

    async def start(self) -> None:
        await self.registry.start()

    async def stop(self) -> None:
        await self.registry.leave()
        await self.forwarder.close()
        await self.redis.close()

    def owns(self, session_id: str) -> bool:
        return owner_of(session_id) in (None, self.node_id)

    async def _gone(self, session_id: str, tenant: str, owner: str) -> SandboxdError:
        """What to answer for a session whose owner is not registered: lost, unknown, or ask again."""
        try:
            raw = await self.redis.call("look up the session", lambda r: r.get(self.redis.key("sess", session_id)))
        except StoreUnavailable as exc:
            return exc
        entry = DirectoryEntry.loads(raw)
        if entry is not None and entry.tenant == tenant:
            return SessionLost(
                f"session {session_id} was lost: its node {owner} stopped (no heartbeat), and its sandboxes with it",
                session_id=session_id,
            )
        if entry is None and self.registry.recently_seen(owner):
            # Alive one beat ago and nothing in the directory: Redis restarted empty and the owner has not
            # re-published yet (it does at its next beat). Not a 404 the client would believe.
            return StoreUnavailable(
                f"node {owner} is re-registering after the shared store restarted; retry", session_id=session_id
            )
        return UnknownSession(f"unknown session {session_id!r}", session_id=session_id)

    async def route(self, session_id: str, tenant: str) -> Peer:
        """The live owner of ``session_id``; or the error its state calls for."""
        owner = owner_of(session_id)
        assert owner is not None and owner != self.node_id
        peer = self.registry.peers.get(owner)
        if peer is None:
            if not self.registry.healthy:
                raise StoreUnavailable(
                    f"cannot tell where session {session_id} lives: the shared store (Redis at "
                    f"{self.redis.where}) does not answer",
                    session_id=session_id,
                )
            raise await self._gone(session_id, tenant, owner)
        return peer

    async def forward(self, session_id: str, tenant: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Send a session request to its owner; its status and body. Errors of the hop itself are raised."""
        peer = await self.route(session_id, tenant)
        try:
            status, data = await self.forwarder.send(peer, method, path, body)
        except PeerDown as exc:
            # Never reached it: ask Redis now whether it is still registered (the last beat may be stale).
            try:
                now = await self.registry.lookup(peer.node_id)
            except StoreUnavailable as store:
                raise NodeUnreachable(
                    f"node {peer.node_id} owns session {session_id} and did not answer ({exc}); "
                    f"and the shared store cannot say whether it is alive: {store.message}",
                    session_id=session_id,
                ) from None
            if now is None:
                raise await self._gone(session_id, tenant, peer.node_id) from None
            raise NodeUnreachable(
                f"node {peer.node_id} owns session {session_id} and is registered, but did not answer: {exc}",
                session_id=session_id,
            ) from None
        except PeerFailed as exc:
            raise NodeUnreachable(
                f"node {peer.node_id} owns session {session_id} and failed to answer the forwarded request: {exc}",
                session_id=session_id,
            ) from None
        self.forwarded += 1
        return status, data


def raise_for(status: int, data: Any) -> None:
    """A forwarded request's error answer, as the error the owner raised (same class, status, blame)."""
    if status >= 400:
        error = data.get("error") if isinstance(data, dict) else None
        if not isinstance(error, dict):
            raise NodeUnreachable(f"the owning node answered {status} without an error body")
        raise from_dict(error)
