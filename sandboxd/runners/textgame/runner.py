"""Text-game runner: per-session worlds in the worker's memory (pure data, no code runs).

Actions are commands, not programs, so no jail is needed; isolation between
sessions is that each holds its own ``World``. A bad command is part of the
game (it costs a step and says so in the observation), not an HTTP error.
"""

from __future__ import annotations

import copy
from typing import Any

from sandboxd.errors import BadRequest, UnknownSession
from sandboxd.runners.base import (
    ProgramFailure,
    RunnerContext,
    StepLimits,
    StepOutcome,
    refuse_at_session_cap,
    refuse_fork_at_cap,
)
from sandboxd.runners.textgame.config import TextgameRunnerConfig
from sandboxd.runners.textgame.models import (
    EpisodeBatch,
    Episodes,
    GameView,
    Reset,
    Step,
    TextgameAction,
    TextgameObservation,
)
from sandboxd.runners.textgame.world import World, play_batch


class TextgameRunner:
    def __init__(self, cfg: TextgameRunnerConfig, ctx: RunnerContext) -> None:
        self.cfg = cfg
        self.sessions: dict[str, World | None] = {}
        self.steps = 0

    def capacity(self) -> int:
        return self.cfg.slots_per_worker

    async def start(self) -> None:
        return None

    async def step(self, action: TextgameAction, session_id: str | None, limits: StepLimits) -> StepOutcome:
        act = action.root
        self.steps += 1
        if isinstance(act, Episodes):
            batch = EpisodeBatch.model_validate(play_batch(act.seed, act.steps, act.batch))
            return StepOutcome(TextgameObservation(batch))
        if session_id is None:
            raise BadRequest(f"action.op {act.op!r} needs a session (POST /sessions with runner 'textgame')")
        if session_id not in self.sessions:
            raise UnknownSession(f"no textgame session {session_id}", session_id=session_id)
        if isinstance(act, Reset):
            world = World.new(act.seed, act.max_steps)
            self.sessions[session_id] = world
            return self._observe(world, world.render(), 0.0, valid=True)
        assert isinstance(act, Step)
        current = self.sessions[session_id]
        if current is None:
            why = "no episode yet: send {'op': 'reset'} first"
            view = GameView(error=why, done=True)
            return StepOutcome(TextgameObservation(view), failure=ProgramFailure("action_error", why))
        text, reward, _done, valid = current.step(act.command)
        return self._observe(current, text, reward, valid)

    @staticmethod
    def _observe(world: World, text: str, reward: float, valid: bool) -> StepOutcome:
        view = GameView(
            text=text,
            goal=world.goal.text(),
            reward=round(reward, 4),
            total_reward=round(world.reward, 4),
            done=world.done,
            won=world.won,
            valid=valid,
            steps=world.steps,
            max_steps=world.max_steps,
            valid_actions=[] if world.done else world.valid_actions(),
        )
        return StepOutcome(TextgameObservation(view))

    async def open_session(self, session_id: str, options: dict[str, Any]) -> None:
        if session_id not in self.sessions:
            refuse_at_session_cap("textgame", len(self.sessions), self.cfg.max_sessions_per_worker, session_id)
            self.sessions[session_id] = None

    async def fork_session(self, source_id: str, new_ids: list[str]) -> list[str]:
        """The world and its RNG, deep-copied: each copy plays on from the same state and draws the same
        numbers the source would, until their commands differ."""
        if source_id not in self.sessions:
            raise UnknownSession(f"no textgame session {source_id}", session_id=source_id)
        refuse_fork_at_cap("textgame", len(self.sessions), len(new_ids), self.cfg.max_sessions_per_worker, source_id)
        world = self.sessions[source_id]
        for sid in new_ids:
            self.sessions[sid] = copy.deepcopy(world)
        return []

    async def close_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    async def health(self) -> dict[str, Any]:
        return {"capacity": self.capacity(), "sessions": len(self.sessions), "steps": self.steps}

    async def close(self) -> None:
        self.sessions.clear()
