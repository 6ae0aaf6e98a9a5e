"""The session table: who owns each session, and when it expires.

The state itself (interpreter globals, files, a database connection) lives in
the owning worker; the table only routes (session -> node, worker, generation,
pinned for its life) and enforces TTL and idle timeouts. A session whose worker
was replaced is marked lost (410), so the trainer learns its state is gone
instead of getting a fresh, empty sandbox.

Session ids carry the owning node's id (``s_<random>.<node_id>``), so any node
can tell who owns a session without asking anyone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from sandboxd.constants import CLOSED_REASONS_KEPT, LOST_SESSION_KEPT_S
from sandboxd.errors import SessionLost, UnknownSession


@dataclass
class SessionRecord:
    session_id: str
    runner: str
    tenant: str
    node_id: str
    worker: int
    generation: int
    ttl_s: float
    idle_s: float
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    created_mono: float = field(default_factory=time.monotonic)
    steps: int = 0
    lost: str | None = None

    def expired(self, now_mono: float) -> str | None:
        if now_mono - self.created_mono >= self.ttl_s:
            return "ttl"
        if now_mono - self.last_used >= self.idle_s:
            return "idle"
        return None

    def describe(self) -> dict[str, object]:
        now = time.monotonic()
        return {
            "session_id": self.session_id,
            "runner": self.runner,
            "node_id": self.node_id,
            "worker": self.worker,
            "created_at": self.created,
            "expires_in_s": round(max(0.0, self.ttl_s - (now - self.created_mono)), 3),
            "idle_expires_in_s": round(max(0.0, self.idle_s - (now - self.last_used)), 3),
            "steps": self.steps,
        }


class SessionStore(Protocol):
    """The session table a gateway reads and writes; every method may do I/O."""

    async def put(self, rec: SessionRecord) -> None: ...

    async def get(self, session_id: str, tenant: str) -> SessionRecord:
        """The live record of ``tenant``'s session; ``UnknownSession`` (saying why it ended, if known; also for
        another tenant's session, which must look like no session at all) or ``SessionLost``."""
        ...

    async def touch(self, session_id: str, stepped: bool) -> None:
        """A step started (``stepped`` false) or finished (true): idle timer reset, step counted."""
        ...

    async def mark_lost(self, session_id: str, why: str) -> None: ...

    async def mark_worker_lost(self, worker: int, why: str) -> int:
        """Every session of ``worker`` on this node is lost; returns how many."""
        ...

    async def remove(self, session_id: str, why: str) -> SessionRecord | None: ...

    async def expired(self) -> list[tuple[SessionRecord, str]]:
        """Sessions past their TTL or idle timeout, and lost ones nobody asked about for a while."""
        ...

    async def count(self, runner: str | None = None, tenant: str | None = None) -> int:
        """Live sessions (lost ones hold nothing and count for no quota)."""
        ...

    async def per_worker(self, runner: str) -> dict[int, int]:
        """Live sessions of ``runner`` per worker of this node (placement of new sessions)."""
        ...


class MemorySessionStore:
    """The embedded default: a dict in the gateway process."""

    def __init__(self) -> None:
        self._sessions: dict[str, SessionRecord] = {}
        self._closed: dict[str, tuple[str, str, bool]] = {}  # recently ended: tenant, why, lost (410, not 404)

    async def put(self, rec: SessionRecord) -> None:
        self._sessions[rec.session_id] = rec

    async def get(self, session_id: str, tenant: str) -> SessionRecord:
        rec = self._sessions.get(session_id)
        if rec is None or rec.tenant != tenant:
            owner, why, lost = self._closed.get(session_id, ("", "", False))
            if rec is None and owner == tenant and lost:
                raise SessionLost(f"session {session_id} was lost: {why}", session_id=session_id)
            suffix = f" (it ended: {why})" if rec is None and owner == tenant else ""
            raise UnknownSession(f"unknown session {session_id!r}{suffix}", session_id=session_id)
        if rec.lost:
            raise SessionLost(f"session {session_id} was lost: {rec.lost}", session_id=session_id, worker=rec.worker)
        return rec

    async def touch(self, session_id: str, stepped: bool) -> None:
        rec = self._sessions.get(session_id)
        if rec is not None:
            rec.last_used = time.monotonic()
            rec.steps += stepped

    async def mark_lost(self, session_id: str, why: str) -> None:
        rec = self._sessions.get(session_id)
        if rec is not None and rec.lost is None:
            rec.lost = why

    async def mark_worker_lost(self, worker: int, why: str) -> int:
        n = 0
        for rec in self._sessions.values():
            if rec.worker == worker and rec.lost is None:
                rec.lost = why
                n += 1
        return n

    async def remove(self, session_id: str, why: str) -> SessionRecord | None:
        rec = self._sessions.pop(session_id, None)
        if rec is not None:
            self._closed[session_id] = (rec.tenant, rec.lost or why, rec.lost is not None)
            if len(self._closed) > CLOSED_REASONS_KEPT:
                for key in list(self._closed)[: CLOSED_REASONS_KEPT // 2]:
                    del self._closed[key]
        return rec

    async def expired(self) -> list[tuple[SessionRecord, str]]:
        now = time.monotonic()
        out = []
        for rec in self._sessions.values():
            why = rec.expired(now)
            if why:
                out.append((rec, why))
            elif rec.lost and now - rec.last_used > LOST_SESSION_KEPT_S:
                out.append((rec, "lost"))
        return out

    async def count(self, runner: str | None = None, tenant: str | None = None) -> int:
        return sum(
            1
            for r in self._sessions.values()
            if r.lost is None and (runner is None or r.runner == runner) and (tenant is None or r.tenant == tenant)
        )

    async def per_worker(self, runner: str) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self._sessions.values():
            if r.runner == runner:
                out[r.worker] = out.get(r.worker, 0) + 1
        return out
