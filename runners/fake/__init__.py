"""A fake runner driven by a handler, for fast tests of gateway, scheduler and bench.

It never replaces a real runner's own tests. The default handler understands a
tiny action language so that HTTP tests can make steps slow, failing or crashing
on purpose: ``{"echo": x}``, ``{"sleep_s": t}``, ``{"crash_worker": true}``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from runners.base import StepLimits
from sandboxd.config import FakeRunnerConfig
from sandboxd.errors import UnknownSession

Handler = Callable[[dict[str, Any], dict[str, Any] | None, StepLimits], Awaitable[dict[str, Any]]]


class FakeAction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    echo: Any = Field(None, description="Returned as the observation's echo.")
    sleep_s: float = Field(0.0, ge=0, le=600, description="How long the step takes.")
    crash_worker: bool = Field(False, description="Kill the worker process mid-step (tests of supervision).")


async def default_handler(action: dict[str, Any], state: dict[str, Any] | None, limits: StepLimits) -> dict[str, Any]:
    act = FakeAction.model_validate(action)
    if act.crash_worker:
        os._exit(99)
    timed_out = act.sleep_s > limits.timeout_s
    await asyncio.sleep(min(act.sleep_s, limits.timeout_s))
    count = None
    if state is not None:
        state["steps"] = state.get("steps", 0) + 1
        count = state["steps"]
    return {"echo": act.echo, "timed_out": timed_out, "session_steps": count, "pid": os.getpid()}


class FakeRunner:
    kind = "fake"

    def __init__(self, cfg: FakeRunnerConfig, handler: Handler = default_handler) -> None:
        self.cfg = cfg
        self.handler = handler
        self.sessions: dict[str, dict[str, Any]] = {}
        self.steps = 0

    def capacity(self) -> int:
        return self.cfg.slots_per_worker

    async def start(self) -> None:
        return None

    async def step(self, action: dict[str, Any], session_id: str | None, limits: StepLimits) -> dict[str, Any]:
        state = None
        if session_id is not None:
            if session_id not in self.sessions:
                raise UnknownSession(f"no fake session {session_id}")
            state = self.sessions[session_id]
        self.steps += 1
        return await self.handler(action, state, limits)

    async def open_session(self, session_id: str, options: dict[str, Any]) -> dict[str, Any]:
        self.sessions.setdefault(session_id, {})
        return {"session_id": session_id}

    async def close_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    async def health(self) -> dict[str, Any]:
        return {"capacity": self.capacity(), "sessions": len(self.sessions), "steps": self.steps}

    async def close(self) -> None:
        self.sessions.clear()
