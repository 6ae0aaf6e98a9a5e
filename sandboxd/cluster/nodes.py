"""The node registry: which nodes are alive, where to reach them, and since when they run.

Each node renews ``P:node:<id>`` (its URL and *incarnation*, a random id per
start) every ``heartbeat_interval_s`` with an expiry of ``heartbeat_ttl_s``, and
reads every other node's entry in the same beat. A node whose entry expired is
gone, and its sessions with it. The incarnation tells a node restarted under the
same id (a StatefulSet pod) from the one that issued a session.

A beat that finds its own entry missing (first start, an expiry while cut off,
or a Redis that restarted empty) re-publishes the node's sessions: the
directory heals itself without anyone's help once Redis answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import orjson

from sandboxd.errors import StoreUnavailable

if TYPE_CHECKING:  # a front with no shared store never imports the client (a tenth of its start's CPU)
    from redis.asyncio import Redis

    from sandboxd.stores.redis import SharedRedis

log = logging.getLogger("sandboxd.cluster")


# Renew a node's entry only if it is absent or ours: "joined" (absent before: publish our sessions),
# "renewed", or {"held", entry} when another incarnation holds the id (nothing is written).
RENEW = """
local cur = redis.call('GET', KEYS[1])
local state = 'joined'
if cur then
  local ok, entry = pcall(cjson.decode, cur)
  if ok and type(entry) == 'table' then
    if entry['incarnation'] ~= ARGV[2] then
      return {'held', cur}
    end
    state = 'renewed'
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('SADD', KEYS[2], ARGV[4])
return state
"""


# Replace the entry only if it is still the one we found (ARGV[1]): a predecessor that is gone.
TAKE_OVER = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[4])
redis.call('SADD', KEYS[2], ARGV[5])
return 1
"""
PROBE_TIMEOUT_S = 0.5


@dataclass(frozen=True)
class Peer:
    node_id: str
    url: str
    incarnation: str

    @classmethod
    def parse(cls, node_id: str, raw: bytes | str) -> Peer:
        """A registry entry (``NodeRegistry._entry``) as the peer it names."""
        data = orjson.loads(raw)
        return cls(node_id, str(data["url"]), str(data["incarnation"]))


class NodeRegistry:
    def __init__(
        self,
        redis: SharedRedis,
        me: Peer,
        interval_s: float,
        ttl_s: float,
        on_rejoin: Callable[[], Awaitable[None]],
    ) -> None:
        self.redis = redis
        self.me = me
        self.interval_s = interval_s
        self.ttl_ms = int(ttl_s * 1000)
        self.ttl_s = ttl_s
        self.on_rejoin = on_rejoin
        self.peers: dict[str, Peer] = {}
        self.known: dict[str, Peer] = {}  # the last entry of every node seen alive, kept after it expires
        self.seen: dict[str, float] = {}  # node id -> when a beat last found it alive (monotonic)
        self.fresh_at = 0.0  # when the registry was last read whole
        self.held_by: Peer | None = None  # another live incarnation holds our node id: we stay out
        self.healthy = False
        self._task: asyncio.Task[None] | None = None

    def _entry(self) -> bytes:
        return orjson.dumps({"url": self.me.url, "incarnation": self.me.incarnation, "at": time.time()})

    async def beat(self) -> None:
        """Renew our entry (re-publishing our sessions if it had gone) and read everyone's.

        Only our own entry is ever written: one held by another incarnation of our id is a live node
        (two nodes started with one ``SANDBOXD_NODE_ID``, or our predecessor's entry not yet expired),
        and overwriting it would make each node's sessions unreachable through the others in turn. Then
        this node stays out (``held_by``: not ready, no sessions of its own) until that entry expires.
        """
        key, nodes = self.redis.key("node", self.me.node_id), self.redis.key("nodes")
        args = (self._entry(), self.me.incarnation, self.ttl_ms, self.me.node_id)
        answer = await self.redis.call("renew this node's heartbeat", lambda r: r.eval(RENEW, 2, key, nodes, *args))
        state, before = (answer[0], answer[1]) if isinstance(answer, list) and len(answer) == 2 else (answer, b"")
        state = state.decode() if isinstance(state, bytes) else str(state)
        if state == "held":
            holder = Peer.parse(self.me.node_id, before)
            if await self._predecessor(holder):
                # Our own earlier incarnation (killed without leaving): nothing listens where it was, or we
                # listen there now (a StatefulSet pod keeps its address). Its sessions went with it.
                taken = await self.redis.call(
                    "take over this node's id", lambda r: r.eval(TAKE_OVER, 2, key, nodes, before, *args)
                )
                if taken:
                    log.warning(
                        "node %s: took over its id from incarnation %s at %s (gone)",
                        self.me.node_id,
                        holder.incarnation,
                        holder.url,
                    )
                    self.held_by = None
                    await self.on_rejoin()
                    await self.read()
                    return
            if self.held_by != holder:
                log.error(
                    "node id %r is held by another live node (incarnation %s at %s): this node (incarnation %s "
                    "at %s) stays out of the service, not ready, until that node's entry expires; give each "
                    "node its own SANDBOXD_NODE_ID",
                    self.me.node_id,
                    holder.incarnation,
                    holder.url,
                    self.me.incarnation,
                    self.me.url,
                )
            self.held_by = holder
        else:
            if self.held_by is not None:
                log.warning("node id %r is free again: this node joins the service", self.me.node_id)
            self.held_by = None
            if state == "joined":
                await self.on_rejoin()
        await self.read()

    async def _predecessor(self, holder: Peer) -> bool:
        """True when the incarnation holding our id is surely gone: it was at our own address, or nothing
        accepts a connection at its address. A live duplicate (another process with our id) answers."""
        if holder.url == self.me.url:
            return True
        parts = urlsplit(holder.url)
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                _, writer = await asyncio.open_connection(parts.hostname or "127.0.0.1", parts.port or 80)
        except ConnectionRefusedError:
            return True
        except (OSError, TimeoutError):
            return False  # unreachable is not gone: it may be cut off while it lives
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return False

    async def read(self) -> None:
        nodes_key = self.redis.key("nodes")

        async def fetch(r: Redis) -> dict[str, bytes | str | None]:
            ids = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in await r.smembers(nodes_key))
            values = await r.mget([self.redis.key("node", i) for i in ids]) if ids else []
            return dict(zip(ids, values, strict=True))

        entries = await self.redis.call("read the node registry", fetch)
        now = time.monotonic()
        peers = {}
        for node_id, raw in entries.items():
            if raw is None:
                continue
            peers[node_id] = self.known[node_id] = Peer.parse(node_id, raw)
            self.seen[node_id] = now
        gone = [n for n, at in self.seen.items() if n not in peers and now - at > 10 * self.ttl_s]
        if gone:  # long dead: stop listing them (their sessions' directory entries answer for them)
            await self.redis.call("prune the node registry", lambda r: r.srem(nodes_key, *gone))
            for n in gone:
                self.seen.pop(n, None)
                self.known.pop(n, None)
        self.peers = peers
        self.fresh_at = now

    async def lookup(self, node_id: str) -> Peer | None:
        """Ask Redis now (not the last beat's copy): is ``node_id`` alive, and as which incarnation?"""
        raw = await self.redis.call("look up a node", lambda r: r.get(self.redis.key("node", node_id)))
        if raw is None:
            self.peers.pop(node_id, None)
            return None
        peer = self.peers[node_id] = self.known[node_id] = Peer.parse(node_id, raw)
        self.seen[node_id] = time.monotonic()
        return peer

    def recently_seen(self, node_id: str) -> bool:
        """Alive at a beat less than one TTL ago: its absence now may be Redis restarting, not its death."""
        at = self.seen.get(node_id)
        return at is not None and time.monotonic() - at < self.ttl_s

    async def start(self) -> None:
        try:
            await self.beat()
            self.healthy = True
        except StoreUnavailable:
            log.error("the shared store does not answer (%s); the node joins when it does", self.redis.last_error)
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.beat()
            except StoreUnavailable:
                if self.healthy:
                    log.error(
                        "the shared store does not answer (%s); session operations that need it answer 503 "
                        "until it is back",
                        self.redis.last_error,
                    )
                self.healthy = False
                continue
            except Exception:  # a malformed entry must not stop the heartbeat: the node would look dead
                log.exception("heartbeat failed")
                continue
            if not self.healthy:
                log.warning("the shared store (Redis at %s) answers again", self.redis.where)
            self.healthy = True

    async def leave(self) -> None:
        """Stop beating and delete our entry: the others answer 410 for our sessions at once, not after a TTL."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        key = self.redis.key("node", self.me.node_id)

        async def delete_if_mine(r: Redis) -> None:
            raw = await r.get(key)
            if raw is not None and orjson.loads(raw).get("incarnation") == self.me.incarnation:
                await r.delete(key)

        with contextlib.suppress(StoreUnavailable):
            await self.redis.call("leave the node registry", delete_if_mine)
