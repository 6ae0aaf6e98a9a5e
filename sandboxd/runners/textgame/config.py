"""Configuration of the text-game runner (``SANDBOXD_TEXTGAME__*``)."""

from __future__ import annotations

from pydantic import Field

from sandboxd.runners.base import RunnerConfig


class TextgameRunnerConfig(RunnerConfig):
    """Text-game worlds (B7): pure data in the worker, one world per session."""

    slots_per_worker: int = Field(
        8, ge=1, description="Concurrent one-shot textgame steps (episode batches) per worker."
    )
    max_sessions_per_worker: int = Field(10_000, ge=1, description="Live textgame sessions per worker; more is a 429.")
