"""Many nodes, one service (``SANDBOXD_REDIS_URL`` set): the node process's part and the front processes'.

Any node takes any request. One-shot steps run where they land (Redis only for an ``idempotency_key``). A
session's id names its owner (``s_<random>~<worker>~<incarnation>.<node_id>``), so a node needs Redis only
to know whether that owner is alive and where it is: then the request is forwarded to it (``forward.py``),
and its answer, whatever it is, is the answer. If the owner is gone, the directory says whether the
session existed for this tenant (410 ``session_lost``) or not (404).

The node process heart-beats the registry and writes its sessions' directory entries (``NodeCluster``);
each front process reads the registry and forwards (``ClusterView``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import orjson

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

log = logging.getLogger("sandboxd.cluster")


class NodeCluster:
    """The node process's part: its registry entry (heartbeat, incarnation) and its sessions' directory."""

    def __init__(
        self, settings: NodeSettings, incarnation: str, live: Callable[[], list[tuple[str, str, str, float]]]
    ) -> None:
        from sandboxd.stores.redis import SessionDirectory, SharedRedis  # only a cluster's (nodes.py)

        self.node_id = settings.node_id
        self.incarnation = incarnation
        self.redis = SharedRedis(settings.redis_url, settings.redis_prefix, settings.redis_timeout_s)
        self.directory = SessionDirectory(self.redis, self.node_id, incarnation)
        self.me = Peer(self.node_id, settings.advertised_url(), incarnation)
        self.live = live
        self.registry = NodeRegistry(
            self.redis, self.me, settings.heartbeat_interval_s, settings.heartbeat_ttl_s, self._rejoined
        )

    async def _rejoined(self) -> None:
        n = await self.directory.republish(self.live())
        log.info(
            "node %s (incarnation %s) registered at %s; %d sessions published", self.node_id, self.incarnation,
            self.me.url, n,
        )  # fmt: skip

    async def start(self) -> None:
        await self.registry.start()

    async def stop(self) -> None:
        await self.registry.leave()
        await self.redis.close()

    def refuse_if_out(self) -> None:
        """A node kept out of the service (its id held by a live node) makes no sessions: nobody could route
        to them."""
        if (holder := self.registry.held_by) is not None:
            raise NodeIdConflict(
                f"this node's id {self.node_id!r} is held by another live node ({holder.url}); it makes no "
                "sessions until that node leaves: create the session on another node"
            )


class ClusterView:
    """A front process's part: where the other nodes are, forwarding to them, and the shared idempotency keys.

    It reads the registry as often as the node beats (it never writes it), and takes this node as kept out
    of the service while the registry's entry for its id names another incarnation."""

    def __init__(self, settings: NodeSettings, incarnation: str) -> None:
        from sandboxd.stores.redis import RedisKV, SessionDirectory, SharedRedis  # only a cluster's (nodes.py)

        self.node_id = settings.node_id
        self.incarnation = incarnation
        self.redis = SharedRedis(settings.redis_url, settings.redis_prefix, settings.redis_timeout_s)
        self.directory = SessionDirectory(self.redis, self.node_id, incarnation)
        self.me = Peer(self.node_id, settings.advertised_url(), incarnation)
        self.registry = NodeRegistry(
            self.redis, self.me, settings.heartbeat_interval_s, settings.heartbeat_ttl_s, _nothing
        )
        self.kv = RedisKV(self.redis)
        self.forwarder = Forwarder(self.node_id, settings.forward_connect_timeout_s, max_per_peer=256)
        self.interval_s = settings.heartbeat_interval_s
        self._task: asyncio.Task[None] | None = None

    @property
    def held_by(self) -> Peer | None:
        holder = self.registry.peers.get(self.node_id)
        return holder if holder is not None and holder.incarnation != self.incarnation else None

    async def start(self) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.registry.read()
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.registry.read()
                self.registry.healthy = True
            except StoreUnavailable:
                self.registry.healthy = False
            except Exception:  # a malformed entry must not stop the reading
                log.exception("reading the node registry failed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.forwarder.close()
        await self.redis.close()

    def owns(self, session_id: str) -> bool:
        """Ours to serve here. While another live node holds our id, sessions named by it are that node's."""
        return owner_of(session_id) in (None, self.node_id) and self.held_by is None

    async def _gone(self, session_id: str, tenant: str, owner: str, process_gone: bool = False) -> SandboxdError:
        """What to answer for a session whose owner is not there: lost, unknown, or ask again.

        ``process_gone``: its address refused the connection, so whatever held the session is gone.
        """
        try:
            entry = await self.directory.lookup(session_id)
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
        self, session_id: str, tenant: str, method: str, path: str, body: bytes = b"", timeout_s: float = 30.0
    ) -> tuple[int, bytes]:
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


def raise_for(status: int, data: bytes) -> None:
    """A forwarded request's error answer, as the error the owner raised (same class, status, blame)."""
    if status >= 400:
        try:
            error = orjson.loads(data).get("error") if data else None
        except (orjson.JSONDecodeError, AttributeError):
            error = None
        if not isinstance(error, dict):
            raise NodeUnreachable(f"the owning node answered {status} without an error body")
        raise from_dict(error)


async def _nothing() -> None:
    return None
