"""Retries with the same ``idempotency_key`` get the first answer, not a second run.

A key maps to the fingerprint of the request that first used it and to its
outcome. A retry while the first is still running waits for it; a retry after
it finished gets the stored response. Infrastructure failures are not stored
(a retry should run again: that is what retrying is for); a key reused with a
different request is the client's error (422).

``IdempotencyStore`` is what the gateway needs; ``MemoryIdempotencyStore`` is
the embedded default (one process). A store shared by many nodes implements
the same ``run`` with a claim (SET NX) and a stored result (``stores/redis.py``);
``model`` is how it reads a stored result back.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from pydantic import BaseModel

from sandboxd.errors import BadRequest


def fingerprint(payload: Any) -> str:
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()


class IdempotencyStore(Protocol):
    @property
    def hits(self) -> int:
        """Requests answered from the store (a metric)."""
        ...

    async def run(
        self,
        key: str,
        fp: str,
        fn: Callable[[], Awaitable[Any]],
        keep: Callable[[Any], bool],
        model: type[BaseModel],
    ) -> Any:
        """``fn()`` once per ``key``: a concurrent or later call with the same fingerprint gets its value."""
        ...


class MemoryIdempotencyStore:
    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.done: collections.OrderedDict[str, tuple[float, str, Any]] = collections.OrderedDict()
        self.running: dict[str, tuple[str, asyncio.Future[Any]]] = {}
        self.hits = 0

    def _evict(self) -> None:
        now = time.monotonic()
        while self.done:
            _key, (at, _, _) = next(iter(self.done.items()))
            if now - at < self.ttl_s and len(self.done) <= self.max_entries:
                break
            self.done.popitem(last=False)

    async def run(
        self,
        key: str,
        fp: str,
        fn: Callable[[], Awaitable[Any]],
        keep: Callable[[Any], bool],
        model: type[BaseModel] | None = None,
    ) -> Any:
        self._evict()
        if key in self.done:
            _, seen_fp, value = self.done[key]
            if seen_fp != fp:
                raise BadRequest(f"idempotency_key {key!r} was already used for a different request")
            self.hits += 1
            return value
        if key in self.running:
            seen_fp, first = self.running[key]
            if seen_fp != fp:
                raise BadRequest(f"idempotency_key {key!r} is in use by a different request")
            self.hits += 1
            return await asyncio.shield(first)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.running[key] = (fp, fut)
        try:
            value = await fn()
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: waiters re-raise it; no "never retrieved" warning
            raise
        finally:
            self.running.pop(key, None)
        fut.set_result(value)
        if keep(value) and self.max_entries > 0:
            self.done[key] = (time.monotonic(), fp, value)
        return value
