"""The gateway's table of live sessions: who owns each, and when it expires.

The state itself (interpreter globals, files) lives in the owning worker; this
table only routes (session -> worker, pinned for its life) and enforces TTL and
idle timeouts. A session whose worker was replaced is marked lost (410), so the
trainer learns its state is gone instead of getting a fresh, empty sandbox.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from sandboxd.constants import SESSION_ID_BYTES
from sandboxd.errors import SessionLost, UnknownSession


@dataclass
class SessionRecord:
    session_id: str
    runner: str
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
            "worker": self.worker,
            "created_at": self.created,
            "expires_in_s": round(max(0.0, self.ttl_s - (now - self.created_mono)), 3),
            "idle_expires_in_s": round(max(0.0, self.idle_s - (now - self.last_used)), 3),
            "steps": self.steps,
        }


def new_session_id() -> str:
    return "s_" + secrets.token_urlsafe(SESSION_ID_BYTES)


class SessionTable:
    def __init__(self) -> None:
        self.sessions: dict[str, SessionRecord] = {}
        self.closed_reasons: dict[str, str] = {}  # recently ended, for a clearer 404

    def add(self, rec: SessionRecord) -> None:
        self.sessions[rec.session_id] = rec

    def get(self, session_id: str) -> SessionRecord:
        rec = self.sessions.get(session_id)
        if rec is None:
            why = self.closed_reasons.get(session_id)
            suffix = f" (it ended: {why})" if why else ""
            raise UnknownSession(f"unknown session {session_id!r}{suffix}")
        if rec.lost:
            raise SessionLost(f"session {session_id} was lost: {rec.lost}")
        return rec

    def remove(self, session_id: str, why: str) -> SessionRecord | None:
        rec = self.sessions.pop(session_id, None)
        if rec is not None:
            self.closed_reasons[session_id] = why
            if len(self.closed_reasons) > 10_000:
                for key in list(self.closed_reasons)[:5_000]:
                    del self.closed_reasons[key]
        return rec

    def mark_worker_lost(self, worker: int) -> int:
        n = 0
        for rec in self.sessions.values():
            if rec.worker == worker and rec.lost is None:
                rec.lost = f"worker {worker} died and its sandboxes with it"
                n += 1
        return n

    def expired(self) -> list[tuple[SessionRecord, str]]:
        now = time.monotonic()
        out = []
        for rec in self.sessions.values():
            why = rec.expired(now)
            if why:
                out.append((rec, why))
            elif rec.lost and now - rec.last_used > 60:
                out.append((rec, "lost"))
        return out

    def count(self, runner: str | None = None) -> int:
        return sum(1 for r in self.sessions.values() if runner is None or r.runner == runner)
