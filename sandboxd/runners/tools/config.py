"""Configuration of the tools runner (``SANDBOXD_TOOLS__*``)."""

from __future__ import annotations

from pydantic import Field

from sandboxd.runners.base import RunnerConfig


class ToolsRunnerConfig(RunnerConfig):
    """tau-bench-like retail tools (B3): a seeded database, a copy-on-write overlay per session."""

    slots_per_worker: int = Field(16, ge=1, description="Concurrent one-shot tool calls per worker.")
    max_sessions_per_worker: int = Field(10_000, ge=1, description="Live tools sessions per worker; more is a 429.")
