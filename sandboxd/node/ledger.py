"""The node's session ledger: which tenant holds how many sessions, and where, node-wide and exact.

Sessions live in the workers (their state and their records); what must be decided for the node as a
whole lives here, in the one node process: a tenant's quota (``tenant_max_sessions``) and where a new
session goes (the hosting worker with the fewest sessions of its kind). Every new session is made
through the ledger; every end reaches it from the worker that held it (``ended`` events) or from the
worker's death. Sessions being opened or copied count too: a storm of concurrent creates all saw the
ledger before any was recorded.

The ledger also keeps the node's budget: the memory and pids its sandboxes may take at their limits
(``Reservation``), times ``overcommit``. The warm pools are charged once, at start; each session (open,
opening or copied) is charged its kind's ``session_reservation`` while it lives. A session that would
pass the budget is a 429 (infra): refused at the door rather than killed later by a limit above its own
(the pod's), where the kill would land on whoever allocates next.

Fair share of sessions: sessions cannot be taken back, so a tenant alone may hold a kind's whole
capacity; but once another tenant is refused for capacity (the budget, a worker's cap), and it holds
less than its weighted share of the kind (``tenant_weights``), a tenant at or above its own share gets
no new session of that kind until the starved one is served or stops asking (``STARVED_S`` after its
last refusal): the capacity the first frees goes to the second.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from sandboxd.errors import Saturated
from sandboxd.runners.base import Reservation


@dataclass(frozen=True)
class Entry:
    tenant: str
    runner: str
    worker: int
    incarnation: str


@dataclass(frozen=True)
class Budget:
    """What the node's sandboxes may reserve (already times overcommit), and what its pools hold."""

    limit: Reservation
    pools: Reservation
    per_session: dict[str, Reservation]  # by runner kind


STARVED_S = 30.0  # a tenant refused for capacity counts as waiting this long after its last refusal


class Ledger:
    def __init__(
        self,
        tenant_max_sessions: int,
        budget: Budget | None = None,
        caps: dict[str, int] | None = None,
        weights: dict[str, float] | None = None,
    ) -> None:
        self.cap = tenant_max_sessions
        self.budget = budget
        self.caps = caps or {}  # sessions of each kind the node's workers hold at most
        self.weights = weights or {}
        self.by_tenant_runner: Counter[tuple[str, str]] = Counter()
        self.starved: dict[tuple[str, str], float] = {}  # (tenant, runner) -> when it was last refused
        self.sessions: dict[str, Entry] = {}
        self.by_tenant: Counter[str] = Counter()
        self.by_worker: Counter[tuple[str, int]] = Counter()
        self.opening_by_tenant: Counter[str] = Counter()
        self.opening_by_worker: Counter[tuple[str, int]] = Counter()

    def check_room(self, tenant: str, n: int) -> None:
        """``n`` more sessions fit the tenant's quota, or a 429."""
        held = self.by_tenant[tenant] + self.opening_by_tenant[tenant]
        if held + n > self.cap:
            more = "another" if n == 1 else f"{n} more"
            raise Saturated(
                f"this tenant holds {held} sessions; {more} would pass tenant_max_sessions {self.cap}; "
                "close some first",
                retry_after_s=5.0,
            )

    def reserved(self) -> Reservation:
        """The pools and every session, open or opening, at their limits."""
        if self.budget is None:
            return Reservation()
        total = self.budget.pools
        for (runner, _), n in (self.by_worker + self.opening_by_worker).items():
            total = total + self.budget.per_session.get(runner, Reservation()).times(n)
        return total

    def check_budget(self, runner: str, n: int) -> None:
        """``n`` more sessions of ``runner`` fit the node's budget, or a 429 saying which resource is short."""
        if self.budget is None:
            return
        each = self.budget.per_session.get(runner, Reservation())
        if each == Reservation():
            return
        want, have, limit = each.times(n), self.reserved(), self.budget.limit
        for name, need, held, cap, unit in (
            ("memory", want.memory_bytes, have.memory_bytes, limit.memory_bytes, 1 << 20),
            ("pids", want.pids, have.pids, limit.pids, 1),
        ):
            if need and held + need > cap:
                scale = " MiB" if unit > 1 else ""
                raise Saturated(
                    f"this node's sandboxes hold {held // unit}{scale} of {name} at their limits, of a budget of "
                    f"{cap // unit}{scale} (memory/pids budget x overcommit); {n} more {runner} session(s) "
                    f"would need {need // unit}{scale}: retry later or on another node",
                    retry_after_s=5.0,
                )

    def capacity(self, runner: str) -> int:
        """Sessions of ``runner`` the node can hold: its workers' caps, or fewer when the budget says so."""
        cap = self.caps.get(runner, 1 << 30)
        if self.budget is None:
            return cap
        each = self.budget.per_session.get(runner, Reservation())
        room = (
            self.budget.limit.memory_bytes - self.budget.pools.memory_bytes,
            self.budget.limit.pids - self.budget.pools.pids,
        )
        fits = [r // n for r, n in zip(room, (each.memory_bytes, each.pids), strict=True) if n > 0]
        return max(0, min([cap, *fits]))

    def _weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def check_share(self, tenant: str, runner: str) -> None:
        """A 429 for a tenant at or above its share of ``runner`` while a tenant below its own is refused."""
        now = time.monotonic()
        for key, at in list(self.starved.items()):
            if now - at > STARVED_S:
                del self.starved[key]
        waiting = [t for (t, r) in self.starved if r == runner and t != tenant]
        if not waiting:
            return
        active = {t for (t, r), n in self.by_tenant_runner.items() if r == runner and n > 0}
        tenants = active | set(waiting) | {tenant}
        total = sum(self._weight(t) for t in tenants)
        capacity = self.capacity(runner)

        def share(t: str) -> float:
            return capacity * self._weight(t) / total

        below = [t for t in waiting if self.by_tenant_runner[(t, runner)] < share(t)]
        held = self.by_tenant_runner[(tenant, runner)]
        if below and held >= share(tenant):
            raise Saturated(
                f"{runner}: the node's {capacity} sessions are taken and a tenant below its share is waiting; "
                f"this tenant holds {held}, its share is {share(tenant):.0f}: close some, or retry later",
                retry_after_s=5.0,
            )

    def note_refused(self, tenant: str, runner: str) -> None:
        """``tenant`` was refused a session of ``runner`` for lack of capacity: it waits for its share."""
        self.starved[(tenant, runner)] = time.monotonic()

    def note_served(self, tenant: str, runner: str) -> None:
        self.starved.pop((tenant, runner), None)

    def place(self, runner: str, workers: list[int]) -> int:
        """The hosting worker with the fewest sessions of ``runner`` (and opens in flight)."""
        return min(workers, key=lambda w: self.by_worker[(runner, w)] + self.opening_by_worker[(runner, w)])

    @contextlib.contextmanager
    def opening(self, tenant: str, runner: str, worker: int, n: int) -> Iterator[None]:
        self.opening_by_worker[(runner, worker)] += n
        self.opening_by_tenant[tenant] += n
        try:
            yield
        finally:
            self.opening_by_worker[(runner, worker)] -= n
            self.opening_by_tenant[tenant] -= n
            if not self.opening_by_tenant[tenant]:  # tenants come and go: keep no zero entries
                del self.opening_by_tenant[tenant]

    def add(self, session_id: str, entry: Entry) -> None:
        if session_id in self.sessions:
            return
        self.sessions[session_id] = entry
        self.by_tenant[entry.tenant] += 1
        self.by_tenant_runner[(entry.tenant, entry.runner)] += 1
        self.by_worker[(entry.runner, entry.worker)] += 1

    def remove(self, session_id: str) -> Entry | None:
        entry = self.sessions.pop(session_id, None)
        if entry is not None:
            self.by_tenant[entry.tenant] -= 1
            if not self.by_tenant[entry.tenant]:
                del self.by_tenant[entry.tenant]
            self.by_tenant_runner[(entry.tenant, entry.runner)] -= 1
            if not self.by_tenant_runner[(entry.tenant, entry.runner)]:
                del self.by_tenant_runner[(entry.tenant, entry.runner)]
            self.by_worker[(entry.runner, entry.worker)] -= 1
        return entry

    def worker_lost(self, worker: int) -> list[str]:
        """Every session of ``worker`` goes with it (they hold nothing now); their ids."""
        gone = [sid for sid, e in self.sessions.items() if e.worker == worker]
        for sid in gone:
            self.remove(sid)
        return gone

    def count(self) -> int:
        return len(self.sessions)
