"""Edge models of the text-game runner."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel


class Reset(BaseModel):
    """Start a new episode in this session (the same seed replays the same episode)."""

    model_config = ConfigDict(extra="forbid")
    op: Literal["reset"]
    seed: int = Field(0, ge=0, le=2**31 - 1)
    max_steps: int = Field(50, ge=1, le=1000)


class Step(BaseModel):
    """One command in this session's episode, e.g. 'go kitchen', 'take apple', 'put apple on table'."""

    model_config = ConfigDict(extra="forbid")
    op: Literal["step"]
    command: str = Field(..., min_length=1, max_length=200)


class Episodes(BaseModel):
    """B7's unit: a batch of episodes played by the built-in scripted agent (no session needed)."""

    model_config = ConfigDict(extra="forbid")
    op: Literal["episodes"]
    seed: int = Field(0, ge=0, le=2**31 - 1)
    steps: int = Field(40, ge=1, le=200)
    batch: int = Field(10, ge=1, le=200)


class TextgameAction(RootModel[Reset | Step | Episodes]):
    root: Reset | Step | Episodes = Field(..., discriminator="op")


class GameView(BaseModel):
    """What the player sees after ``reset`` or ``step``."""

    text: str = ""
    goal: str = ""
    reward: float = 0.0
    total_reward: float = 0.0
    done: bool = False
    won: bool = False
    valid: bool = True
    steps: int = 0
    max_steps: int = 0
    valid_actions: list[str] = Field(default_factory=list)
    error: str | None = None


class EpisodeBatch(BaseModel):
    """The result of ``episodes``: a batch played by the scripted agent."""

    episodes: int
    steps_done: int
    total_reward: float
    goals_met: int
    rooms_visited: int
    final_inventory: list[str]


class TextgameObservation(RootModel[GameView | EpisodeBatch]):
    root: GameView | EpisodeBatch
