"""Retries with the same ``idempotency_key`` get the first answer, not a second run.

A key maps to the fingerprint of the request that first used it and to its answer (the status and the
bytes the client got). A retry while the first is still running waits for it; a retry after it finished
gets the stored answer. Infrastructure failures are not stored (a retry should run again: that is what
retrying is for); a key reused with a different request is the client's error (422).

One algorithm over a small key-value protocol (``KV``): a claim (set if absent, with an expiry longer
than any step may take), then the stored answer, or the claim's release. The node process keeps the
keys in memory for its front processes (``MemoryKV``, reached over the node's link); with Redis the
nodes of a service share them (``stores/redis.py``), and the node's memory is the fallback while Redis
does not answer. A claim whose holder died expires, and a waiter then runs the request itself: an
answer that was never stored was never delivered either.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from sandboxd.errors import BadRequest, DeadlineExceeded, StoreUnavailable

log = logging.getLogger("sandboxd.idempotency")
POLL_S = (0.005, 0.2)  # a waiter polls a running claim from 5 ms, backing off to 200 ms


def fingerprint(payload: Any) -> str:
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True)
class Stored:
    """An answer as the client got it."""

    status: int
    body: bytes
    retry_after_s: float | None = None

    def dumps(self) -> dict[str, Any]:
        return {"status": self.status, "body": self.body.decode(), "retry": self.retry_after_s}

    @classmethod
    def loads(cls, data: dict[str, Any]) -> Stored:
        return cls(int(data["status"]), str(data["body"]).encode(), data.get("retry"))


class KV(Protocol):
    async def claim(self, key: str, value: bytes, ttl_ms: int) -> bool:
        """Set ``key`` if it is absent; True when this call set it."""
        ...

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes, ttl_ms: int) -> None: ...

    async def delete(self, key: str) -> None: ...


class MemoryKV:
    """The node process's keys, with their expiries; at most ``max_entries`` (the oldest go first)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.data: collections.OrderedDict[str, tuple[float, bytes]] = collections.OrderedDict()

    def _live(self, key: str) -> bytes | None:
        item = self.data.get(key)
        if item is None:
            return None
        if item[0] < time.monotonic():
            del self.data[key]
            return None
        return item[1]

    def _set(self, key: str, value: bytes, ttl_ms: int) -> None:
        self.data[key] = (time.monotonic() + ttl_ms / 1000, value)
        self.data.move_to_end(key)
        while len(self.data) > max(self.max_entries, 1):
            self.data.popitem(last=False)

    async def claim(self, key: str, value: bytes, ttl_ms: int) -> bool:
        if self._live(key) is not None:
            return False
        self._set(key, value, ttl_ms)
        return True

    async def get(self, key: str) -> bytes | None:
        return self._live(key)

    async def put(self, key: str, value: bytes, ttl_ms: int) -> None:
        if self.max_entries > 0:
            self._set(key, value, ttl_ms)
        else:
            self.data.pop(key, None)

    async def delete(self, key: str) -> None:
        self.data.pop(key, None)


class Idempotency:
    """``run`` once per key, whichever front process (or node, with Redis) the retries reach."""

    def __init__(
        self, kv: KV, owner: str, ttl_s: float, claim_ttl_s: float, fallback: Idempotency | None = None
    ) -> None:
        self.kv = kv
        self.owner = owner
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.claim_ttl_ms = max(1000, int(claim_ttl_s * 1000))
        self.fallback = fallback
        self.hits = 0

    async def run(
        self, key: str, fp: str, fn: Callable[[], Awaitable[Stored]], keep: Callable[[Stored], bool]
    ) -> Stored:
        claim = orjson.dumps({"state": "running", "fp": fp, "owner": self.owner})
        try:
            deadline = time.monotonic() + self.claim_ttl_ms / 1000
            pause = POLL_S[0]
            while True:
                if await self.kv.claim(key, claim, self.claim_ttl_ms):
                    break
                raw = await self.kv.get(key)
                if raw is None:
                    continue  # the claim went (its run failed, or expired) between our two calls: try again
                seen = orjson.loads(raw)
                if seen.get("fp") != fp:
                    name = key.split(":", 2)[-1]  # the client's own key, after "<tenant>:<what>:"
                    raise BadRequest(f"idempotency_key {name!r} was already used for a different request")
                if seen.get("state") == "done":
                    self.hits += 1
                    return Stored.loads(seen["value"])
                if time.monotonic() > deadline:
                    raise DeadlineExceeded(
                        f"the request first sent with idempotency_key {key.split(':', 2)[-1]!r} is still running "
                        "after the longest a step may take; retry later"
                    )
                await asyncio.sleep(pause)
                pause = min(pause * 2, POLL_S[1])
        except StoreUnavailable as exc:
            if self.fallback is None:
                raise
            log.warning("%s; idempotency falls back to this node's memory until it answers", exc.message)
            return await self.fallback.run(key, fp, fn, keep)
        try:
            value = await fn()
        except BaseException:
            await self._release(key)
            raise
        if keep(value):
            done = orjson.dumps({"state": "done", "fp": fp, "value": value.dumps()})
            try:
                await self.kv.put(key, done, self.ttl_ms)
            except StoreUnavailable as exc:
                log.warning("%s; a retry elsewhere will run again", exc.message)
        else:
            await self._release(key)
        return value

    async def _release(self, key: str) -> None:
        try:
            await self.kv.delete(key)
        except StoreUnavailable as exc:
            log.warning("%s; the claim expires by itself", exc.message)
