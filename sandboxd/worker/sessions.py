"""The sessions a worker holds: who owns each, when it expires, whether a step or a fork is running in it.

A session lives in one worker for its whole life (its state is that worker's sandbox), so the worker
keeps its record too: every front process sends the session's steps straight here (the id names the
worker) and the answer never waits on another process. The node process keeps only the ledger it needs
node-wide (which tenant holds how many sessions where) and learns from the worker when one ends.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

from sandboxd.constants import CLOSED_REASONS_KEPT, LOST_SESSION_KEPT_S
from sandboxd.errors import SandboxdError, SessionBusy, SessionLost, UnknownSession


@dataclass
class SessionRecord:
    session_id: str
    runner: str
    tenant: str
    node_id: str
    worker: int
    ttl_s: float
    idle_s: float
    labels: dict[str, str] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    created_mono: float = field(default_factory=time.monotonic)
    steps: int = 0
    lost: str | None = None
    busy: bool = False  # a step is running: a second one is a 409, not a queue
    step_key: str | None = None  # the running step's, as its caller named it: what an interrupt must name
    forking: int = 0  # copies being made: forks may overlap, steps may not
    # Ended during a step by its TTL (the reaper) or by its client (close, close by label): that step says so.
    ended_mid_step: SandboxdError | None = None

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
            "labels": self.labels,
        }

    def ends_in(self, timeout_s: float, max_ttl_s: float, max_idle_s: float) -> None:
        """End ``timeout_s`` from now (E2B's ``set_timeout``), within the node's TTL counted from creation; its
        idle timer restarts and stretches towards the same end, within the node's idle timeout."""
        now = time.monotonic()
        self.ttl_s = min(now - self.created_mono + timeout_s, max_ttl_s)
        self.last_used = now
        self.idle_s = max(self.idle_s, min(timeout_s, max_idle_s))

    def renew(self, idle_s: float | None, max_idle_s: float) -> None:
        """A keep-alive: the idle timer restarts, and ``idle_s`` (within the node's) becomes the idle timeout."""
        self.last_used = time.monotonic()
        if idle_s:
            self.idle_s = min(idle_s, max_idle_s)

    def has(self, labels: dict[str, str]) -> bool:
        return all(self.labels.get(k) == v for k, v in labels.items())


class SessionTable:
    def __init__(self) -> None:
        self.live: dict[str, SessionRecord] = {}
        # Recently ended: tenant, why, lost (410, not 404), so a late step's answer says what happened.
        self.closed: collections.OrderedDict[str, tuple[str, str, bool]] = collections.OrderedDict()

    def get(self, session_id: str, tenant: str) -> SessionRecord:
        """The tenant's live session, or the error that says why not (another tenant's is unknown: 404)."""
        rec = self.live.get(session_id)
        if rec is None or rec.tenant != tenant:
            owner, why, lost = self.closed.get(session_id, ("", "", False))
            if rec is None and owner == tenant and lost:
                raise SessionLost(f"session {session_id} was lost: {why}", session_id=session_id)
            suffix = f" (it ended: {why})" if rec is None and owner == tenant else ""
            raise UnknownSession(f"unknown session {session_id!r}{suffix}", session_id=session_id)
        if rec.lost:
            raise SessionLost(f"session {session_id} was lost: {rec.lost}", session_id=session_id, worker=rec.worker)
        return rec

    def owner(self, session_id: str, labels: dict[str, str], named: list[str]) -> str:
        """The tenant of the live session ``session_id`` if it carries ``labels`` (which must name something)
        and labels ``named``: a session its creator opened to whoever knows its id. Any other, live or not, is
        unknown, with the same words as another tenant's session."""
        rec = self.live.get(session_id)
        if not labels or rec is None or rec.lost or not rec.has(labels) or not all(n in rec.labels for n in named):
            raise UnknownSession(f"unknown session {session_id!r}", session_id=session_id)
        return rec.tenant

    def claim(self, session_id: str, tenant: str, runner: str | None = None) -> SessionRecord:
        """The session, marked busy for one step; 409 while a step or a fork runs in it."""
        rec = self.get(session_id, tenant)
        if rec.busy:
            raise SessionBusy(
                f"session {session_id} is running a step; send the next one when it has answered",
                session_id=session_id,
            )
        if rec.forking:
            raise SessionBusy(
                f"session {session_id} is being forked; step it when the fork has answered", session_id=session_id
            )
        rec.busy = True
        rec.last_used = time.monotonic()
        return rec

    def release(self, rec: SessionRecord, stepped: bool) -> None:
        rec.busy = False
        rec.step_key = None
        rec.last_used = time.monotonic()
        rec.steps += stepped

    def add(self, rec: SessionRecord) -> None:
        self.live[rec.session_id] = rec

    def mark_lost(self, rec: SessionRecord, why: str) -> None:
        if rec.lost is None:
            rec.lost = why

    def remove(self, session_id: str, why: str) -> SessionRecord | None:
        rec = self.live.pop(session_id, None)
        if rec is not None:
            self.closed[session_id] = (rec.tenant, rec.lost or why, rec.lost is not None)
            while len(self.closed) > CLOSED_REASONS_KEPT:
                self.closed.popitem(last=False)
        return rec

    def expired(self) -> list[tuple[SessionRecord, str]]:
        now = time.monotonic()
        out = []
        for rec in self.live.values():
            why = rec.expired(now)
            if why == "idle" and (rec.busy or rec.forking):
                continue  # a session running a step is not idle, however long the step (its TTL still holds)
            if why:
                out.append((rec, why))
            elif rec.lost and now - rec.last_used > LOST_SESSION_KEPT_S:
                out.append((rec, "lost"))
        return out

    def select(self, tenant: str, labels: dict[str, str]) -> list[SessionRecord]:
        """The tenant's live sessions carrying every one of ``labels`` (lost ones are not: they hold nothing)."""
        return [r for r in self.live.values() if r.tenant == tenant and r.lost is None and r.has(labels)]

    def state(self, session_id: str, tenant: str) -> dict[str, object]:
        """What ``POST /sessions/status`` says of one id: another tenant's session is unknown, as everywhere."""
        rec = self.live.get(session_id)
        if rec is not None and rec.tenant == tenant:
            if rec.lost:
                return {"state": "lost", "why": rec.lost}
            return {"state": "live", "session": rec.describe()}
        owner, why, lost = self.closed.get(session_id, ("", "", False))
        if owner == tenant:
            return {"state": "lost" if lost else "ended", "why": why}
        return {"state": "unknown"}

    def count(self, runner: str | None = None) -> int:
        return sum(1 for r in self.live.values() if r.lost is None and (runner is None or r.runner == runner))
