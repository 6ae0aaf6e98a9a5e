"""Tools runner: a tau-bench-like retail API, one copy-on-write overlay per session.

Tool calls are data, not code, so they run in the worker; a session's writes
live in its overlay only. A one-shot call (no session) runs against a fresh
overlay: reads work, writes are discarded with it.
"""

from __future__ import annotations

from typing import Any

from sandboxd.errors import UnknownSession
from sandboxd.runners.base import (
    ProgramFailure,
    RunnerContext,
    StepLimits,
    StepOutcome,
    refuse_at_session_cap,
    refuse_fork_at_cap,
)
from sandboxd.runners.tools import data
from sandboxd.runners.tools.config import ToolsRunnerConfig
from sandboxd.runners.tools.models import ToolAction, ToolObservation
from sandboxd.runners.tools.tools import Overlay, ToolError, call


class ToolsRunner:
    def __init__(self, cfg: ToolsRunnerConfig, ctx: RunnerContext) -> None:
        self.cfg = cfg
        self.db = data.build()
        self.sessions: dict[str, Overlay] = {}
        self.calls = 0

    def _overlay(self) -> Overlay:
        return Overlay(self.db, max_records=self.cfg.max_session_records, max_string_chars=self.cfg.max_string_chars)

    def capacity(self) -> int:
        return self.cfg.slots_per_worker

    async def start(self) -> None:
        return None

    async def step(self, action: ToolAction, session_id: str | None, limits: StepLimits) -> StepOutcome:
        if session_id is None:
            overlay = self._overlay()
        elif session_id in self.sessions:
            overlay = self.sessions[session_id]
        else:
            raise UnknownSession(f"no tools session {session_id}", session_id=session_id)
        self.calls += 1
        if action.tool == "reset":
            if session_id is not None:
                self.sessions[session_id] = self._overlay()
            return StepOutcome(ToolObservation(tool="reset", result="the database is back to its seeded state"))
        try:
            return StepOutcome(ToolObservation(tool=action.tool, result=call(overlay, action.tool, action.args)))
        except ToolError as exc:
            return StepOutcome(
                ToolObservation(tool=action.tool, error=str(exc)), failure=ProgramFailure("action_error", str(exc))
            )

    async def open_session(self, session_id: str, options: dict[str, Any]) -> None:
        if session_id not in self.sessions:
            refuse_at_session_cap("tools", len(self.sessions), self.cfg.max_sessions_per_worker, session_id)
            self.sessions[session_id] = self._overlay()

    async def fork_session(self, source_id: str, new_ids: list[str]) -> list[str]:
        """The session's overlay copied (its own records and counters); the seeded base stays shared."""
        source = self.sessions.get(source_id)
        if source is None:
            raise UnknownSession(f"no tools session {source_id}", session_id=source_id)
        refuse_fork_at_cap("tools", len(self.sessions), len(new_ids), self.cfg.max_sessions_per_worker, source_id)
        for sid in new_ids:
            self.sessions[sid] = source.copy()
        return []

    async def close_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    async def health(self) -> dict[str, Any]:
        return {"capacity": self.capacity(), "sessions": len(self.sessions), "calls": self.calls}

    async def close(self) -> None:
        self.sessions.clear()
