"""A worker's own slots: one-shot steps take one, or wait in a bounded queue, or are refused.

Each worker admits its own one-shot steps: the front processes choose a worker from the load board
(``sandboxd/board.py``) and the worker decides. A step takes one of its kind's slots (the runner's warm
sandboxes) or waits in a queue served lowest priority value first: its arrival (FIFO), or its rollout's
start with ``scheduling=oldest_rollout`` (``rollouts.py``). A full queue is 429 at once with a
Retry-After from the recent step time, instead of a client timing out on its read; a step still waiting
at its deadline is 504. Both are the infrastructure's, never the program's. Every change is written to
the board so that the fronts see it.
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

from sandboxd.board import Board
from sandboxd.errors import DeadlineExceeded, Saturated, ShuttingDown


@dataclass
class _Kind:
    capacity: int
    queue_max: int
    free: int = 0
    waiters: list[tuple[float, int, asyncio.Future[None]]] = field(default_factory=list)  # a heap
    inflight: int = 0
    ewma_step_s: float = 0.05


class Admission:
    def __init__(self, worker: int, capacity: dict[str, int], queue_max: dict[str, int], board: Board | None) -> None:
        self.worker = worker
        self.board = board
        self.kinds = {k: _Kind(cap, queue_max.get(k, 0), free=cap) for k, cap in capacity.items()}
        self.closed = False
        self._seq = itertools.count()
        for kind in self.kinds:
            self._publish(kind)

    def _publish(self, kind: str) -> None:
        if self.board is not None:
            k = self.kinds[kind]
            self.board.set(self.worker, kind, k.free, len(k.waiters))

    def set_queue_max(self, shares: dict[str, int]) -> None:
        for kind, n in shares.items():
            if kind in self.kinds:
                self.kinds[kind].queue_max = n

    def queue_depth(self, kind: str) -> int:
        k = self.kinds.get(kind)
        return len(k.waiters) if k else 0

    def inflight(self, kind: str) -> int:
        k = self.kinds.get(kind)
        return k.inflight if k else 0

    def _retry_after_s(self, k: _Kind) -> float:
        return max(1.0, math.ceil(len(k.waiters) * k.ewma_step_s / max(k.capacity, 1)))

    @contextlib.asynccontextmanager
    async def slot(self, kind: str, deadline: float, priority: float | None = None) -> AsyncIterator[None]:
        """Hold one slot of ``kind`` for the block; a lower ``priority`` is served first when steps queue."""
        if self.closed:
            raise ShuttingDown("this node is shutting down")
        k = self.kinds.get(kind)
        if k is None:
            raise Saturated(f"worker {self.worker} does not serve runner {kind!r}", retry_after_s=1.0)
        if k.free > 0 and not k.waiters:
            k.free -= 1
        else:
            if len(k.waiters) >= k.queue_max:
                raise Saturated(
                    f"{kind}: all {k.capacity} slots of worker {self.worker} busy and {len(k.waiters)} steps "
                    "queued (queue_max)",
                    retry_after_s=self._retry_after_s(k),
                )
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(k.waiters, (time.monotonic() if priority is None else priority, next(self._seq), fut))
            self._publish(kind)
            wait_s = max(0.0, deadline - time.monotonic())
            try:
                await asyncio.wait_for(asyncio.shield(fut), wait_s)
            except TimeoutError:
                if fut.done() and not fut.cancelled():
                    self._release(kind)  # handed a slot at the last moment: give it on
                fut.cancel()
                self._prune(kind)
                raise DeadlineExceeded(
                    f"{kind}: waited {wait_s:.1f}s in the queue for a free slot (queue_timeout_s)"
                ) from None
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._release(kind)
                fut.cancel()
                self._prune(kind)
                raise
        k.inflight += 1
        self._publish(kind)
        start = time.monotonic()
        try:
            yield
        finally:
            k.inflight -= 1
            k.ewma_step_s = 0.9 * k.ewma_step_s + 0.1 * (time.monotonic() - start)
            self._release(kind)

    def _release(self, kind: str) -> None:
        """A slot comes free: the first live waiter takes it, or it goes back to the free count."""
        k = self.kinds[kind]
        while k.waiters:
            _, _, fut = heapq.heappop(k.waiters)
            if not fut.done():
                fut.set_result(None)
                self._publish(kind)
                return
        k.free = min(k.free + 1, k.capacity)
        self._publish(kind)

    def _prune(self, kind: str) -> None:
        k = self.kinds[kind]
        k.waiters = [w for w in k.waiters if not w[2].done()]
        heapq.heapify(k.waiters)
        self._publish(kind)

    def close(self) -> None:
        self.closed = True
        for kind, k in self.kinds.items():
            while k.waiters:
                fut = heapq.heappop(k.waiters)[2]
                if not fut.done():
                    fut.set_exception(ShuttingDown("this node is shutting down"))
                    fut.exception()
            self._publish(kind)
