"""A fake runner kind driven by a handler, for fast tests of the fronts, the workers and bench.

It is registered from ``tests/`` only, through the same entry-point seam a
third-party kind would use (``conftest.py`` writes the distribution metadata),
so production never serves it. It never replaces a real runner's own tests.
The default handler understands a tiny action language so that HTTP tests can
make steps slow, failing or crashing on purpose: ``{"echo": x}``,
``{"sleep_s": t}``, ``{"fail": true}``, ``{"crash_worker": true}``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandboxd.errors import UnknownSession
from sandboxd.runners.base import (
    ProgramFailure,
    RunnerConfig,
    RunnerContext,
    RunnerKind,
    StepLimits,
    StepOutcome,
    refuse_at_session_cap,
)


class FakeRunnerConfig(RunnerConfig):
    """In-process runner for tests of the gateway and bench, never for real work."""

    slots_per_worker: int = Field(8, ge=1, description="Concurrent fake steps per worker.")
    max_sessions_per_worker: int = Field(10_000, ge=1, description="Live fake sessions per worker; more is a 429.")


class FakeAction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    echo: Any = Field(None, description="Returned as the observation's echo.")
    sleep_s: float = Field(0.0, ge=0, le=600, description="How long the step takes.")
    fail: bool = Field(False, description="The program's own failure (blame program).")
    crash_worker: bool = Field(False, description="Kill the worker process mid-step (tests of supervision).")
    set: dict[str, Any] | None = Field(None, description="Sessions: store these keys in the session's state.")
    get: str | None = Field(None, description="Sessions: return this key of the session's state.")


class FakeObservation(BaseModel):
    echo: Any = None
    timed_out: bool = False
    session_steps: int | None = None
    value: Any = None
    pid: int


Handler = Callable[[FakeAction, dict[str, Any] | None, StepLimits], Awaitable[StepOutcome]]


async def default_handler(act: FakeAction, state: dict[str, Any] | None, limits: StepLimits) -> StepOutcome:
    if act.crash_worker:
        os._exit(99)
    timed_out = act.sleep_s > limits.timeout_s
    await asyncio.sleep(min(act.sleep_s, limits.timeout_s))
    count = value = None
    if state is not None:
        state["steps"] = state.get("steps", 0) + 1
        count = state["steps"]
        state.update(act.set or {})
        value = state.get(act.get) if act.get else None
    obs = FakeObservation(echo=act.echo, timed_out=timed_out, session_steps=count, value=value, pid=os.getpid())
    if timed_out:
        return StepOutcome(obs, failure=ProgramFailure("program_timeout", "the fake step ran past its time limit"))
    if act.fail:
        return StepOutcome(obs, failure=ProgramFailure("program_exit", "the fake program failed on purpose"))
    return StepOutcome(obs)


class FakeRunner:
    def __init__(self, cfg: FakeRunnerConfig, ctx: RunnerContext, handler: Handler = default_handler) -> None:
        self.cfg = cfg
        self.handler = handler
        self.sessions: dict[str, dict[str, Any]] = {}
        self.steps = 0

    def capacity(self) -> int:
        return self.cfg.slots_per_worker

    async def start(self) -> None:
        return None

    async def step(self, action: FakeAction, session_id: str | None, limits: StepLimits) -> StepOutcome:
        state = None
        if session_id is not None:
            if session_id not in self.sessions:
                raise UnknownSession(f"no fake session {session_id}", session_id=session_id)
            state = self.sessions[session_id]
        self.steps += 1
        return await self.handler(action, state, limits)

    async def open_session(self, session_id: str, options: dict[str, Any]) -> None:
        if session_id not in self.sessions:
            refuse_at_session_cap("fake", len(self.sessions), self.cfg.max_sessions_per_worker, session_id, 2.0)
            self.sessions[session_id] = {}

    async def close_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    async def health(self) -> dict[str, Any]:
        return {"capacity": self.capacity(), "sessions": len(self.sessions), "steps": self.steps}

    async def close(self) -> None:
        self.sessions.clear()


KIND = RunnerKind(
    name="fake",
    title="Test-only fake runner (registered from tests/)",
    config=FakeRunnerConfig,
    action=FakeAction,
    observation=FakeObservation,
    runner="tests.fake_runner:FakeRunner",
    default_enabled=False,
)
