"""Configuration of the tools runner (``SANDBOXD_TOOLS__*``)."""

from __future__ import annotations

from pydantic import Field

from sandboxd.runners.base import RunnerConfig


class ToolsRunnerConfig(RunnerConfig):
    """tau-bench-like retail tools (B3): a seeded database, a copy-on-write overlay per session."""

    slots_per_worker: int = Field(16, ge=1, description="Concurrent one-shot tool calls per worker.")
    max_sessions_per_worker: int = Field(
        4096,
        ge=1,
        description="Live tools sessions per worker; more is a 429. At the record and string caps a session "
        "holds under ~1 MiB in the worker at worst (a B3 trajectory, a few KiB).",
    )
    max_session_records: int = Field(
        200,
        ge=10,
        description="Records (copied users and orders, new orders, carts) one session may hold; a write past it "
        "is the agent's error. With max_string_chars it bounds a session's memory.",
    )
    max_string_chars: int = Field(512, ge=64, description="Longest string argument of a tool call.")
