"""The stores the nodes of one service share, in Redis: the session directory and idempotency records.

Keys, all under ``redis_prefix`` (``P``)::

    P:sess:<session id>   owner node, its incarnation, tenant, runner (JSON); expires after the session's TTL
    P:idem:<key>          an idempotency claim (running, fingerprint, node) or its stored result
    P:node:<node id>      a node's registry entry (sandboxd/cluster/nodes.py)

A session's live state (worker, generation, timers) stays in the owning node's
memory: only the owner steps it, so only the owner needs it, and a step never
waits on Redis. The directory is what the *other* nodes need: that a session
existed and whose it was, so that when its node dies they answer 410
``session_lost`` (the state is gone; the trainer must not treat it as a 404 of
its own making), and so that a node restarted under the same id can tell its
predecessor's sessions (lost) from ids it never issued (unknown).

Every command is bounded by ``redis_timeout_s`` and fails as ``StoreUnavailable``
(503): an operation that needs Redis is refused, never hung.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import orjson
from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from sandboxd.constants import LOST_SESSION_KEPT_S
from sandboxd.errors import StoreUnavailable

log = logging.getLogger("sandboxd.stores.redis")
T = TypeVar("T")


class SharedRedis:
    """One connection pool, and the one place a Redis failure becomes ``StoreUnavailable``."""

    def __init__(self, url: str, prefix: str, timeout_s: float) -> None:
        self.prefix = prefix
        self.timeout_s = timeout_s
        parts = urlsplit(url)
        self.where = parts.hostname or parts.path or "?"  # never the password
        if parts.port:
            self.where += f":{parts.port}"
        self.client: Redis = Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),  # our callers decide about retries; a hidden one doubles the wait
            health_check_interval=0,
            decode_responses=False,
        )
        self.last_error = ""

    def key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    async def call(self, what: str, fn: Callable[[Redis], Awaitable[T]]) -> T:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await fn(self.client)
        except (RedisError, OSError, TimeoutError) as exc:
            self.last_error = f"Redis at {self.where}: {str(exc) or type(exc).__name__}"
            log.debug("failed to %s: %s", what, self.last_error)
            # The client learns what failed, not where the store lives (the node's log says).
            raise StoreUnavailable(f"the shared store did not answer (to {what})") from None

    async def close(self) -> None:
        await self.client.aclose()


@dataclass(frozen=True)
class DirectoryEntry:
    node_id: str
    incarnation: str
    tenant: str
    runner: str

    def dumps(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def loads(cls, raw: bytes | str | None) -> DirectoryEntry | None:
        if raw is None:
            return None
        try:
            return cls(**orjson.loads(raw))
        except (orjson.JSONDecodeError, TypeError):
            return None  # another version's record: treat as absent rather than fail the request


class SessionDirectory:
    """The shared directory entry of each of this node's sessions (the node process writes them; every
    front process of every node reads them to tell a lost session from an unknown one)."""

    def __init__(self, redis: SharedRedis, node_id: str, incarnation: str) -> None:
        self.redis = redis
        self.node_id = node_id
        self.incarnation = incarnation

    def entry(self, tenant: str, runner: str) -> DirectoryEntry:
        return DirectoryEntry(self.node_id, self.incarnation, tenant, runner)

    @staticmethod
    def _expiry_ms(left_s: float) -> int:
        return max(1000, int((left_s + LOST_SESSION_KEPT_S) * 1000))  # lost sessions keep answering 410 a while

    async def put(self, session_id: str, tenant: str, runner: str, ttl_s: float) -> None:
        """In the directory first: a session other nodes could not route is not created (503)."""
        key, value = self.redis.key("sess", session_id), self.entry(tenant, runner).dumps()
        await self.redis.call("record the session", lambda r: r.set(key, value, px=self._expiry_ms(ttl_s)))

    async def delete(self, session_id: str) -> None:
        """A closed session's entry goes (a lost one's stays: others answer 410 from it). If Redis is down the
        entry expires with the session's TTL; meanwhile other nodes forward here and get our 404."""
        try:
            await self.redis.call("forget the session", lambda r: r.delete(self.redis.key("sess", session_id)))
        except StoreUnavailable as exc:
            log.warning("%s", exc.message)

    async def lookup(self, session_id: str) -> DirectoryEntry | None:
        """The directory's entry, or None for no such session; ``StoreUnavailable`` when Redis did not answer."""
        raw = await self.redis.call("look up the session", lambda r: r.get(self.redis.key("sess", session_id)))
        return DirectoryEntry.loads(raw)

    async def republish(self, sessions: list[tuple[str, str, str, float]]) -> int:
        """Write every live session's entry again (after Redis lost them: a restart without persistence);
        ``sessions`` are (id, tenant, runner, seconds left)."""
        if not sessions:
            return 0

        async def write(r: Redis) -> None:
            async with r.pipeline(transaction=False) as pipe:
                for sid, tenant, runner, left in sessions:
                    pipe.set(self.redis.key("sess", sid), self.entry(tenant, runner).dumps(), px=self._expiry_ms(left))
                await pipe.execute()

        await self.redis.call("republish this node's sessions", write)
        return len(sessions)


class RedisKV:
    """Idempotency keys in Redis, shared by every node of the service (``stores/idempotency.py``)."""

    def __init__(self, redis: SharedRedis) -> None:
        self.redis = redis

    async def claim(self, key: str, value: bytes, ttl_ms: int) -> bool:
        k = self.redis.key("idem", key)
        return bool(await self.redis.call("claim an idempotency key", lambda r: r.set(k, value, nx=True, px=ttl_ms)))

    async def get(self, key: str) -> bytes | None:
        k = self.redis.key("idem", key)
        raw = await self.redis.call("read an idempotency key", lambda r: r.get(k))
        return raw if raw is None or isinstance(raw, bytes) else str(raw).encode()

    async def put(self, key: str, value: bytes, ttl_ms: int) -> None:
        k = self.redis.key("idem", key)
        await self.redis.call("store an idempotent result", lambda r: r.set(k, value, px=ttl_ms))

    async def delete(self, key: str) -> None:
        k = self.redis.key("idem", key)
        await self.redis.call("release an idempotency claim", lambda r: r.delete(k))
