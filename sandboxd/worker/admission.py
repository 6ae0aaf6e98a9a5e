"""A worker's own slots: one-shot steps take one, or wait in a bounded queue, or are refused, fairly.

Each worker admits its own one-shot steps: the front processes choose a worker from the load board
(``sandboxd/board.py``) and the worker decides. A step takes one of its kind's slots (the runner's warm
sandboxes) or waits in a queue. A full queue is 429 at once with a Retry-After from the recent step time,
instead of a client timing out on its read; a step still waiting at its deadline is 504. Both are the
infrastructure's, never the program's. Every change is written to the board so that the fronts see it.

Fair share between tenants (API keys): a tenant's share of a kind is the slots times its weight over the
weights of the tenants with steps running or queued there (a tenant alone has them all).
- A freed slot goes to a waiter of the tenant furthest below its share (running / weight), then by
  priority: its arrival (FIFO), or its rollout's start with ``scheduling=oldest_rollout``.
- A full queue refuses the tenant furthest above its share: an arrival below the tenant holding the most
  (running + queued, per weight) takes the place of that tenant's newest waiter, which gets the 429.
- Slots are a CPU notion; programs that sleep hold them without using the CPU. A kind's runner may keep
  a few *burst* slots (``burst_capacity``): a step of a tenant below its share, finding no free slot,
  takes one at once instead of queueing behind the others' sleepers.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import math
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sandboxd.board import Board
from sandboxd.errors import DeadlineExceeded, Saturated, ShuttingDown


@dataclass
class _Waiter:
    priority: float
    seq: int
    tenant: str
    fut: asyncio.Future[bool]  # its result: whether the slot granted is a burst slot

    def __lt__(self, other: _Waiter) -> bool:
        return (self.priority, self.seq) < (other.priority, other.seq)


@dataclass
class _Kind:
    capacity: int
    queue_max: int
    burst: int = 0
    free: int = 0
    burst_used: int = 0
    waiters: dict[str, list[_Waiter]] = field(default_factory=dict)  # a heap per tenant
    queued: int = 0
    running: Counter[str] = field(default_factory=Counter)
    inflight: int = 0
    ewma_step_s: float = 0.05


class Admission:
    def __init__(
        self,
        worker: int,
        capacity: dict[str, int],
        queue_max: dict[str, int],
        board: Board | None,
        burst: dict[str, int] | None = None,
        weights: dict[str, float] | None = None,
    ) -> None:
        self.worker = worker
        self.board = board
        burst = burst or {}
        self.kinds = {k: _Kind(cap, queue_max.get(k, 0), burst.get(k, 0), free=cap) for k, cap in capacity.items()}
        self.weights = weights or {}
        self.closed = False
        self._seq = itertools.count()
        for kind in self.kinds:
            self._publish(kind)

    def add(self, kind: str, capacity: int, queue_max: int, burst: int = 0) -> None:
        """A kind admitted from now on (its runner has started: until then the board shows it no slot)."""
        self.kinds[kind] = _Kind(capacity, queue_max, burst, free=capacity)
        self._publish(kind)

    def _publish(self, kind: str) -> None:
        if self.board is not None:
            k = self.kinds[kind]
            self.board.set(self.worker, kind, k.free, k.queued)

    def set_queue_max(self, shares: dict[str, int]) -> None:
        for kind, n in shares.items():
            if kind in self.kinds:
                self.kinds[kind].queue_max = n

    def queue_depth(self, kind: str) -> int:
        k = self.kinds.get(kind)
        return k.queued if k else 0

    def inflight(self, kind: str) -> int:
        k = self.kinds.get(kind)
        return k.inflight if k else 0

    def _retry_after_s(self, k: _Kind) -> float:
        return max(1.0, math.ceil(k.queued * k.ewma_step_s / max(k.capacity, 1)))

    def _weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def _below_share(self, k: _Kind, tenant: str) -> bool:
        """Whether ``tenant`` runs fewer of the kind's slots than its weighted share among the active."""
        active = {t for t, n in k.running.items() if n > 0} | {t for t, q in k.waiters.items() if q} | {tenant}
        share = k.capacity * self._weight(tenant) / sum(self._weight(t) for t in active)
        return k.running[tenant] < share

    def _load(self, k: _Kind, tenant: str) -> float:
        return (k.running[tenant] + len(k.waiters.get(tenant, ()))) / self._weight(tenant)

    @contextlib.asynccontextmanager
    async def slot(
        self, kind: str, deadline: float, priority: float | None = None, tenant: str = ""
    ) -> AsyncIterator[None]:
        """Hold one slot of ``kind`` for the block; see the module's docstring for who gets what."""
        if self.closed:
            raise ShuttingDown("this node is shutting down")
        k = self.kinds.get(kind)
        if k is None:
            raise Saturated(f"worker {self.worker} does not serve runner {kind!r}", retry_after_s=1.0)
        if k.free > 0 and not k.queued:
            k.free -= 1
            burst = False
            k.running[tenant] += 1
        elif k.burst_used < k.burst and self._below_share(k, tenant):
            k.burst_used += 1
            burst = True
            k.running[tenant] += 1
        else:
            burst = await self._wait(k, kind, deadline, priority, tenant)  # counted running when handed
        k.inflight += 1
        self._publish(kind)
        start = time.monotonic()
        try:
            yield
        finally:
            k.inflight -= 1
            k.ewma_step_s = 0.9 * k.ewma_step_s + 0.1 * (time.monotonic() - start)
            self._release(kind, tenant, burst)

    def lender(self, kind: str, tenant: str) -> Lender:
        """What a step holding one of ``kind``'s slots may borrow more through (``runners.base.SlotLender``)."""
        return Lender(self, kind, tenant)

    def _borrow(self, kind: str, tenant: str) -> bool:
        """A free slot, never a burst one, only while nobody waits and ``tenant`` is below its fair share:
        a borrowed slot is never one another tenant's step could have had."""
        k = self.kinds.get(kind)
        if self.closed or k is None or k.free <= 0 or k.queued or not self._below_share(k, tenant):
            return False
        k.free -= 1
        k.running[tenant] += 1
        k.inflight += 1
        self._publish(kind)
        return True

    def _give_back(self, kind: str, tenant: str) -> None:
        self.kinds[kind].inflight -= 1
        self._release(kind, tenant, False)

    async def _wait(self, k: _Kind, kind: str, deadline: float, priority: float | None, tenant: str) -> bool:
        if k.queued >= k.queue_max:
            self._make_room(k, kind, tenant)
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(time.monotonic() if priority is None else priority, next(self._seq), tenant, fut)
        heapq.heappush(k.waiters.setdefault(tenant, []), waiter)
        k.queued += 1
        self._publish(kind)
        wait_s = max(0.0, deadline - time.monotonic())
        try:
            return await asyncio.wait_for(asyncio.shield(fut), wait_s)
        except TimeoutError:
            self._abandon(k, kind, waiter)
            raise DeadlineExceeded(
                f"{kind}: waited {wait_s:.1f}s in the queue for a free slot (queue_timeout_s)"
            ) from None
        except asyncio.CancelledError:
            self._abandon(k, kind, waiter)
            raise

    def _make_room(self, k: _Kind, kind: str, tenant: str) -> None:
        """A full queue: the newest waiter of the tenant furthest above its share gives way to ``tenant``,
        if that is not ``tenant`` itself; otherwise ``tenant`` is refused."""
        over = max((t for t, q in k.waiters.items() if q), key=lambda t: self._load(k, t), default=None)
        if over is None or over == tenant or self._load(k, over) <= self._load(k, tenant) + 1 / self._weight(tenant):
            raise Saturated(
                f"{kind}: all {k.capacity} slots of worker {self.worker} busy and {k.queued} steps queued (queue_max)",
                retry_after_s=self._retry_after_s(k),
            )
        heap = k.waiters[over]
        newest = max(heap, key=lambda w: (w.priority, w.seq))
        heap.remove(newest)
        heapq.heapify(heap)
        k.queued -= 1
        newest.fut.set_exception(
            Saturated(
                f"{kind}: the queue of worker {self.worker} is full and this tenant holds more than its share "
                "of it; a tenant below its share took this place",
                retry_after_s=self._retry_after_s(k),
            )
        )

    def _abandon(self, k: _Kind, kind: str, waiter: _Waiter) -> None:
        """A waiter that gave up (deadline, cancel): out of the queue, or the slot it was just handed given on."""
        fut = waiter.fut
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            self._release(kind, waiter.tenant, fut.result())  # handed a slot at the last moment: give it on
            return
        fut.cancel()
        heap = k.waiters.get(waiter.tenant)
        if heap and waiter in heap:
            heap.remove(waiter)
            heapq.heapify(heap)
            k.queued -= 1
        self._publish(kind)

    def _release(self, kind: str, tenant: str, burst: bool) -> None:
        """A slot comes free: hand out what is free to the waiters, fairest first."""
        k = self.kinds[kind]
        k.running[tenant] -= 1
        if k.running[tenant] <= 0:
            del k.running[tenant]
        if burst:
            k.burst_used -= 1
        else:
            k.free = min(k.free + 1, k.capacity)
        self._dispatch(k)
        self._publish(kind)

    def _dispatch(self, k: _Kind) -> None:
        while k.queued:
            tenants = [t for t, q in k.waiters.items() if q]
            tenant = min(tenants, key=lambda t: (k.running[t] / self._weight(t), k.waiters[t][0].priority))
            if k.free > 0:
                burst = False
            elif k.burst_used < k.burst and self._below_share(k, tenant):
                burst = True
            else:
                return
            waiter = heapq.heappop(k.waiters[tenant])
            if not k.waiters[tenant]:
                del k.waiters[tenant]
            k.queued -= 1
            if burst:
                k.burst_used += 1
            else:
                k.free -= 1
            k.running[tenant] += 1  # now, so that the next pick of this loop sees it
            waiter.fut.set_result(burst)

    def close(self) -> None:
        self.closed = True
        for kind, k in self.kinds.items():
            for heap in k.waiters.values():
                for waiter in heap:
                    if not waiter.fut.done():
                        waiter.fut.set_exception(ShuttingDown("this node is shutting down"))
                        waiter.fut.exception()
            k.waiters.clear()
            k.queued = 0
            self._publish(kind)


@dataclass
class Lender:
    admission: Admission
    kind: str
    tenant: str
    lent: int = 0

    def borrow(self) -> bool:
        if self.admission._borrow(self.kind, self.tenant):
            self.lent += 1
            return True
        return False

    def give_back(self) -> None:
        if self.lent > 0:
            self.lent -= 1
            self.admission._give_back(self.kind, self.tenant)
