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

from sandboxd.cluster.forward import Forwarder, PeerDown, PeerFailed, PeerRefused
from sandboxd.cluster.nodes import NodeRegistry, Peer
from sandboxd.config import NodeSettings
from sandboxd.errors import (
    NodeIdConflict,
    NodeUnreachable,
    SandboxdError,
    SessionLost,
    StoreUnavailable,
    UnknownSession,
    from_dict,
)
from sandboxd.ids import owner_of
from sandboxd.stores.idempotency import MemoryIdempotencyStore
from sandboxd.stores.redis import RedisIdempotencyStore, RedisSessionStore, SharedRedis

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
        self.forwarder = Forwarder(self.node_id, settings.forward_connect_timeout_s, max_per_peer=256)

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
        """Ours to serve here. While another live node holds our id, sessions named by it are that node's."""
        return owner_of(session_id) in (None, self.node_id) and self.registry.held_by is None

    def refuse_if_out(self) -> None:
        """A node kept out of the service (its id held by a live node) makes no sessions: nobody could route
        to them."""
        if (holder := self.registry.held_by) is not None:
            raise NodeIdConflict(
                f"this node's id {self.node_id!r} is held by another live node ({holder.url}); it makes no "
                "sessions until that node leaves: create the session on another node"
            )

    async def _gone(self, session_id: str, tenant: str, owner: str, process_gone: bool = False) -> SandboxdError:
        """What to answer for a session whose owner is not there: lost, unknown, or ask again.

        ``process_gone``: its address refused the connection, so whatever held the session is gone.
        """
        try:
            entry = await self.sessions.lookup(session_id)
        except StoreUnavailable as exc:
            if not process_gone:
                return exc
            entry = None
        lost = SessionLost(
            f"session {session_id} was lost: its node {owner} is gone, and its sandboxes with it",
            session_id=session_id,
        )
        if entry is not None and entry.tenant == tenant:
            return lost
        if entry is None and self.registry.recently_seen(owner):
            # Alive one beat ago and nothing in the directory: the store restarted empty (the owner
            # re-publishes at its next beat) or was unreadable. Not a 404 the client would believe.
            if process_gone:
                return lost
            return StoreUnavailable(
                f"node {owner} is re-registering with the shared store; retry", session_id=session_id
            )
        return UnknownSession(f"unknown session {session_id!r}", session_id=session_id)

    async def forward(
        self, session_id: str, tenant: str, method: str, path: str, body: Any = None, timeout_s: float = 30.0
    ) -> tuple[int, Any]:
        """Send a session request to its owner; its status and body. Errors of the hop itself are raised.

        A node is lost when it cannot be reached, not merely when its heartbeat is late: an owner whose
        entry expired (its event loop stalled past the TTL, or Redis restarted) is still tried at its last
        known address, and its answer is the answer. An owner this node has not seen yet (it joined since
        our last beat) or that no longer answers where we knew it (it restarted elsewhere as a new
        incarnation) is looked up in the registry and tried there: the owner itself says whether the
        session is one of its own. Only a refused connection to the registered address (nothing listens:
        the process that held the session is gone) or an unreachable node no longer registered is a 410.
        """
        owner = owner_of(session_id)
        assert owner is not None
        peer = self.registry.peers.get(owner) or self.registry.known.get(owner)
        if peer is None:
            peer = await self._registered(owner, session_id)
            if peer is None:
                raise await self._gone(session_id, tenant, owner)
        tried: set[Peer] = set()
        while True:
            tried.add(peer)
            try:
                return await self.forwarder.send(peer, method, path, body, timeout_s)
            except PeerDown as exc:
                try:
                    registered = await self.registry.lookup(owner)
                except StoreUnavailable:
                    registered = peer  # cannot tell: do not call it lost
                if registered is not None and registered not in tried:
                    peer = registered  # the owner registered anew (restarted, moved): ask it there
                    continue
                if isinstance(exc, PeerRefused):
                    raise await self._gone(session_id, tenant, owner, process_gone=True) from None
                if registered is None:
                    raise await self._gone(session_id, tenant, owner) from None
                raise NodeUnreachable(
                    f"node {owner} owns session {session_id} and did not answer: {exc}", session_id=session_id
                ) from None
            except PeerFailed as exc:
                raise NodeUnreachable(
                    f"node {owner} owns session {session_id} and failed to answer the forwarded request: {exc}",
                    session_id=session_id,
                ) from None

    async def _registered(self, owner: str, session_id: str) -> Peer | None:
        """The registry's entry for ``owner`` now (not the last beat's copy); 503 when it cannot be read."""
        try:
            return await self.registry.lookup(owner)
        except StoreUnavailable:
            raise StoreUnavailable(
                f"cannot tell where session {session_id} lives: the shared store does not answer",
                session_id=session_id,
            ) from None


def raise_for(status: int, data: Any) -> None:
    """A forwarded request's error answer, as the error the owner raised (same class, status, blame)."""
    if status >= 400:
        error = data.get("error") if isinstance(data, dict) else None
        if not isinstance(error, dict):
            raise NodeUnreachable(f"the owning node answered {status} without an error body")
        raise from_dict(error)
