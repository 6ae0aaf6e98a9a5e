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
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import orjson
from pydantic import BaseModel
from redis.asyncio import Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from sandboxd.constants import LOST_SESSION_KEPT_S
from sandboxd.errors import BadRequest, DeadlineExceeded, SessionLost, StoreUnavailable, UnknownSession
from sandboxd.stores.idempotency import MemoryIdempotencyStore
from sandboxd.stores.sessions import MemorySessionStore, SessionRecord

log = logging.getLogger("sandboxd.stores.redis")
T = TypeVar("T")

IDEM_POLL_S = (0.005, 0.2)  # a waiter polls a running claim from 5 ms, backing off to 200 ms


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


class RedisSessionStore(MemorySessionStore):
    """The node's own table in memory, plus the shared directory entry of each of its sessions."""

    def __init__(self, redis: SharedRedis, node_id: str, incarnation: str) -> None:
        super().__init__()
        self.redis = redis
        self.node_id = node_id
        self.incarnation = incarnation

    def _entry(self, rec: SessionRecord) -> DirectoryEntry:
        return DirectoryEntry(self.node_id, self.incarnation, rec.tenant, rec.runner)

    @staticmethod
    def _expiry_ms(rec: SessionRecord) -> int:
        left = rec.ttl_s - (time.monotonic() - rec.created_mono)
        return max(1000, int((left + LOST_SESSION_KEPT_S) * 1000))  # lost sessions keep answering 410 a while

    async def put(self, rec: SessionRecord) -> None:
        """In the directory first: a session other nodes could not route is not created (503)."""
        key, value, px = self.redis.key("sess", rec.session_id), self._entry(rec).dumps(), self._expiry_ms(rec)
        await self.redis.call("record the session", lambda r: r.set(key, value, px=px))
        await super().put(rec)

    async def remove(self, session_id: str, why: str) -> SessionRecord | None:
        rec = await super().remove(session_id, why)
        if rec is not None and rec.lost is None:
            # A lost session's entry stays (others answer 410 from it); a closed one goes. If Redis is down
            # the entry expires with the session's TTL; meanwhile other nodes forward here and get our 404.
            try:
                await self.redis.call("forget the session", lambda r: r.delete(self.redis.key("sess", session_id)))
            except StoreUnavailable as exc:
                log.warning("%s", exc.message)
        return rec

    async def get(self, session_id: str, tenant: str) -> SessionRecord:
        try:
            return await super().get(session_id, tenant)
        except UnknownSession as unknown:
            if session_id in self._closed:
                raise
            try:
                entry = await self.lookup(session_id)
            except StoreUnavailable:
                raise unknown from None  # best effort: without the directory, unknown is all we can say
            mine_before = entry is not None and entry.node_id == self.node_id and entry.incarnation != self.incarnation
            if entry is not None and entry.tenant == tenant and mine_before:
                raise SessionLost(
                    f"session {session_id} was lost: node {entry.node_id} restarted since it was created, "
                    "and its sandboxes with it",
                    session_id=session_id,
                ) from None
            raise

    async def lookup(self, session_id: str) -> DirectoryEntry | None:
        """The directory's entry, or None for no such session; ``StoreUnavailable`` when Redis did not answer."""
        raw = await self.redis.call("look up the session", lambda r: r.get(self.redis.key("sess", session_id)))
        return DirectoryEntry.loads(raw)

    async def republish(self) -> int:
        """Write every live session's entry again (after Redis lost them: a restart without persistence)."""
        recs = [r for r in self._sessions.values() if r.lost is None]
        if not recs:
            return 0

        async def write(r: Redis) -> None:
            async with r.pipeline(transaction=False) as pipe:
                for rec in recs:
                    pipe.set(self.redis.key("sess", rec.session_id), self._entry(rec).dumps(), px=self._expiry_ms(rec))
                await pipe.execute()

        await self.redis.call("republish this node's sessions", write)
        return len(recs)


class RedisIdempotencyStore:
    """``run`` once per key across every node: a claim (SET NX) while it runs, then the stored result.

    A retry that lands on another node while the first is running waits for its result (polling the
    claim). A claim whose node died expires with ``claim_ttl_s`` (longer than any step may take), and
    a waiter then runs the request itself: a result that was never stored was never delivered either.
    Redis down: the node falls back to its own memory store (``fallback``) so one-shot steps keep
    working; retries on the same node still run once, retries on another node during the outage may not.
    """

    def __init__(
        self,
        redis: SharedRedis,
        node_id: str,
        ttl_s: float,
        claim_ttl_s: float,
        fallback: MemoryIdempotencyStore,
    ) -> None:
        self.redis = redis
        self.node_id = node_id
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.claim_ttl_ms = max(1000, int(claim_ttl_s * 1000))
        self.fallback = fallback
        self._hits = 0

    @property
    def hits(self) -> int:
        return self._hits + self.fallback.hits

    async def run(
        self,
        key: str,
        fp: str,
        fn: Callable[[], Awaitable[Any]],
        keep: Callable[[Any], bool],
        model: type[BaseModel],
    ) -> Any:
        rkey = self.redis.key("idem", key)
        claim = orjson.dumps({"state": "running", "fp": fp, "node": self.node_id})
        try:
            deadline = time.monotonic() + self.claim_ttl_ms / 1000
            pause = IDEM_POLL_S[0]
            while True:
                claimed = await self.redis.call(
                    "claim an idempotency key", lambda r: r.set(rkey, claim, nx=True, px=self.claim_ttl_ms)
                )
                if claimed:
                    break
                raw = await self.redis.call("read an idempotency key", lambda r: r.get(rkey))
                if raw is None:
                    continue  # the claim went (its run failed, or expired) between our two commands: try again
                seen = orjson.loads(raw)
                if seen.get("fp") != fp:
                    name = key.split(":", 2)[-1]  # the client's own key, after "<tenant>:<what>:"
                    raise BadRequest(f"idempotency_key {name!r} was already used for a different request")
                if seen.get("state") == "done":
                    self._hits += 1
                    return model.model_validate(seen["value"])
                if time.monotonic() > deadline:
                    raise DeadlineExceeded(
                        f"the request first sent with idempotency_key {key.split(':', 2)[-1]!r} is still running "
                        "after the longest a step may take; retry later"
                    )
                await asyncio.sleep(pause)
                pause = min(pause * 2, IDEM_POLL_S[1])
        except StoreUnavailable as exc:
            log.warning("%s; idempotency falls back to this node's memory until it answers", exc.message)
            return await self.fallback.run(key, fp, fn, keep, model)
        try:
            value = await fn()
        except BaseException:
            await self._release(rkey)
            raise
        if keep(value):
            done = orjson.dumps({"state": "done", "fp": fp, "value": value.model_dump(mode="json")})
            try:
                await self.redis.call("store an idempotent result", lambda r: r.set(rkey, done, px=self.ttl_ms))
            except StoreUnavailable as exc:
                log.warning("%s; a retry elsewhere will run again", exc.message)
        else:
            await self._release(rkey)
        return value

    async def _release(self, rkey: str) -> None:
        try:
            await self.redis.call("release an idempotency claim", lambda r: r.delete(rkey))
        except StoreUnavailable as exc:
            log.warning("%s; the claim expires by itself", exc.message)
