"""Text-game runner: per-session worlds in the worker's memory (pure data, no code runs).

Actions are commands, not programs, so no jail is needed; isolation between
sessions is that each holds its own ``World``. A bad command is part of the
game (it costs a step and says so in the observation), not an HTTP error.
"""

from __future__ import annotations

from typing import Any

from runners.base import StepLimits
from runners.textgame.models import Episodes, Reset, Step, TextgameAction
from runners.textgame.world import World, play_batch
from sandboxd.config import TextgameRunnerConfig
from sandboxd.errors import BadRequest, Saturated, UnknownSession


class TextgameRunner:
    kind = "textgame"

    def __init__(self, cfg: TextgameRunnerConfig) -> None:
        self.cfg = cfg
        self.sessions: dict[str, World | None] = {}
        self.steps = 0

    def capacity(self) -> int:
        return self.cfg.slots_per_worker

    async def start(self) -> None:
        return None

    async def step(self, action: dict[str, Any], session_id: str | None, limits: StepLimits) -> dict[str, Any]:
        act = TextgameAction.model_validate(action).root
        self.steps += 1
        if isinstance(act, Episodes):
            return play_batch(act.seed, act.steps, act.batch)
        if session_id is None:
            raise BadRequest(f"action.op {act.op!r} needs a session (POST /sessions with runner 'textgame')")
        if session_id not in self.sessions:
            raise UnknownSession(f"no textgame session {session_id}")
        if isinstance(act, Reset):
            world = World.new(act.seed, act.max_steps)
            self.sessions[session_id] = world
            return self._observe(world, world.render(), 0.0, valid=True)
        assert isinstance(act, Step)
        world = self.sessions[session_id]
        if world is None:
            return {"error": "no episode yet: send {'op': 'reset'} first", "done": True, "valid_actions": []}
        text, reward, _done, valid = world.step(act.command)
        return self._observe(world, text, reward, valid)

    @staticmethod
    def _observe(world: World, text: str, reward: float, valid: bool) -> dict[str, Any]:
        return {
            "text": text,
            "goal": world.goal.text(),
            "reward": round(reward, 4),
            "total_reward": round(world.reward, 4),
            "done": world.done,
            "won": world.won,
            "valid": valid,
            "steps": world.steps,
            "max_steps": world.max_steps,
            "valid_actions": [] if world.done else world.valid_actions(),
        }

    async def open_session(self, session_id: str, options: dict[str, Any]) -> dict[str, Any]:
        if len(self.sessions) >= self.cfg.max_sessions_per_worker:
            raise Saturated("textgame sessions at max_sessions_per_worker", retry_after_s=5.0)
        self.sessions.setdefault(session_id, None)
        return {"session_id": session_id}

    async def close_session(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)

    async def health(self) -> dict[str, Any]:
        return {"capacity": self.capacity(), "sessions": len(self.sessions), "steps": self.steps}

    async def close(self) -> None:
        self.sessions.clear()
