"""Admission and placement of one-shot steps onto worker slots.

Each worker advertises a capacity per runner kind (its warm slots). A step takes
a slot on the worker with the most free slots of its kind; when none is free it
waits in a bounded queue, served lowest priority value first: the arrival time
(FIFO) unless the gateway gives a step its rollout's start (see rollouts.py).
A full queue answers at once with 429 and a Retry-After estimated from the
recent step time, instead of letting clients time out on reads; a step that
waits past its queue deadline fails with 504. Both are the infrastructure's failures, never the program's.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sandboxd.errors import DeadlineExceeded, Saturated, ShuttingDown
from sandboxd.supervisor import WorkerHandle


@dataclass
class _Kind:
    free: dict[int, int] = field(default_factory=dict)  # worker index -> free slots
    waiters: list[tuple[float, int, asyncio.Future[int]]] = field(default_factory=list)  # a heap
    inflight: int = 0
    ewma_step_s: float = 0.05


class Scheduler:
    def __init__(self, workers: list[WorkerHandle], queue_max: int, queue_timeout_s: float) -> None:
        self.workers = workers
        self.queue_max = queue_max
        self.queue_timeout_s = queue_timeout_s
        self.kinds: dict[str, _Kind] = {}
        self.closed = False
        self._seq = itertools.count()  # ties in priority keep arrival order
        for w in workers:
            self.add_worker(w)

    def add_worker(self, w: WorkerHandle) -> None:
        """(Re)register a worker's slots, e.g. after the supervisor replaced it."""
        for kind, cap in w.capacity.items():
            k = self.kinds.setdefault(kind, _Kind())
            k.free[w.index] = cap
            for _ in range(cap):
                self._hand_over(kind)

    def remove_worker(self, index: int) -> None:
        for k in self.kinds.values():
            k.free[index] = 0

    def queue_depth(self, kind: str) -> int:
        k = self.kinds.get(kind)
        return len(k.waiters) if k else 0

    def inflight(self, kind: str) -> int:
        k = self.kinds.get(kind)
        return k.inflight if k else 0

    def capacity(self, kind: str) -> int:
        return sum(w.capacity.get(kind, 0) for w in self.workers if w.alive)

    def _retry_after_s(self, kind: str) -> float:
        k = self.kinds[kind]
        cap = max(self.capacity(kind), 1)
        return max(1.0, math.ceil(len(k.waiters) * k.ewma_step_s / cap))

    def _take(self, kind: str) -> int | None:
        k = self.kinds[kind]
        best, best_free = None, 0
        for idx, free in k.free.items():
            if free > best_free and self.workers[idx].alive:
                best, best_free = idx, free
        if best is None:
            return None
        k.free[best] -= 1
        return best

    def _hand_over(self, kind: str) -> None:
        k = self.kinds[kind]
        while k.waiters:
            fut = k.waiters[0][2]
            if fut.done():
                heapq.heappop(k.waiters)
                continue
            idx = self._take(kind)
            if idx is None:
                return
            heapq.heappop(k.waiters)
            fut.set_result(idx)
            return

    @contextlib.asynccontextmanager
    async def slot(
        self, kind: str, deadline: float | None = None, priority: float | None = None
    ) -> AsyncIterator[WorkerHandle]:
        """Hold one slot of ``kind`` for the duration of the block; a lower ``priority`` is served first
        when steps queue (default: now, i.e. FIFO)."""
        if self.closed:
            raise ShuttingDown("this node is shutting down")
        k = self.kinds.get(kind)
        if k is None:
            raise Saturated(f"no worker serves runner {kind!r} right now", retry_after_s=1.0)
        idx = self._take(kind) if not k.waiters else None
        if idx is None:
            if len(k.waiters) >= self.queue_max:
                raise Saturated(
                    f"{kind}: all {self.capacity(kind)} slots busy and {len(k.waiters)} steps queued (queue_max)",
                    retry_after_s=self._retry_after_s(kind),
                )
            fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            rank = time.monotonic() if priority is None else priority
            heapq.heappush(k.waiters, (rank, next(self._seq), fut))
            wait_s = self.queue_timeout_s if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                idx = await asyncio.wait_for(asyncio.shield(fut), wait_s)
            except TimeoutError:
                if fut.done() and not fut.cancelled():
                    self._release(kind, fut.result())
                fut.cancel()
                raise DeadlineExceeded(
                    f"{kind}: waited {wait_s:.1f}s in the queue for a free slot (queue_timeout_s)"
                ) from None
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._release(kind, fut.result())
                fut.cancel()
                raise
        worker = self.workers[idx]
        generation = worker.generation
        k.inflight += 1
        start = time.monotonic()
        try:
            yield worker
        finally:
            k.inflight -= 1
            k.ewma_step_s = 0.9 * k.ewma_step_s + 0.1 * (time.monotonic() - start)
            if worker.generation == generation and worker.alive:
                self._release(kind, idx)

    def _release(self, kind: str, idx: int) -> None:
        k = self.kinds[kind]
        k.free[idx] = min(k.free.get(idx, 0) + 1, self.workers[idx].capacity.get(kind, 0))
        self._hand_over(kind)

    def close(self) -> None:
        self.closed = True
        for k in self.kinds.values():
            while k.waiters:
                fut = heapq.heappop(k.waiters)[2]
                if not fut.done():
                    fut.set_exception(ShuttingDown("this node is shutting down"))
