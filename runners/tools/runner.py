"""Tools runner: a tau-bench-like retail API, one copy-on-write overlay per session.

Tool calls are data, not code, so they run in the worker; a session's writes
live in its overlay only. A one-shot call (no session) runs against a fresh
overlay: reads work, writes are discarded with it.
"""

from __future__ import annotations

from typing import Any

from runners.base import StepLimits
from runners.tools import data
from runners.tools.models import ToolAction
from runners.tools.tools import Overlay, ToolError, call
from sandboxd.config import ToolsRunnerConfig
from sandboxd.errors import Saturated, UnknownSession


class ToolsRunner:
    kind = "tools"

    def __init__(self, cfg: ToolsRunnerConfig) -> None:
        self.cfg = cfg
        self.db = data.build()
        self.sessions: dict[str, Overlay] = {}
        self.calls = 0

    def capacity(self) -> int:
        return self.cfg.slots_per_worker

    async def start(self) -> None:
        return None

    async def step(self, action: dict[str, Any], session_id: str | None, limits: StepLimits) -> dict[str, Any]:
        act = ToolAction.model_validate(action)
        if session_id is None:
            overlay = Overlay(self.db)
        elif session_id in self.sessions:
            overlay = self.sessions[session_id]
        else:
            raise UnknownSession(f"no tools session {session_id}")
        self.calls += 1
        if act.tool == "reset":
            if session_id is not None:
                self.sessions[session_id] = Overlay(self.db)
            return {"tool": "reset", "result": "the database is back to its seeded state", "error": None}
        try:
            return {"tool": act.tool, "result": call(overlay, act.tool, act.args), "error": None}
        except ToolError as exc:
            return {"tool": act.tool, "result": None, "error": str(exc)}

    async def open_session(self, session_id: str, options: dict[str, Any]) -> dict[str, Any]:
        if session_id not in self.sessions and len(self.sessions) >= self.cfg.max_sessions_per_worker:
            raise Saturated("tools sessions at max_sessions_per_worker", retry_after_s=5.0)
        self.sessions.setdefault(session_id, Overlay(self.db))
        return {"session_id": session_id}

    async def close_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    async def health(self) -> dict[str, Any]:
        return {"capacity": self.capacity(), "sessions": len(self.sessions), "calls": self.calls}

    async def close(self) -> None:
        self.sessions.clear()
