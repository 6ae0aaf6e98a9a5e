"""Edge models of the tools runner: ``{"tool": name, "args": {...}}`` and what a call returns."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ToolAction(BaseModel):
    """One tool call; ``tool: "reset"`` restores the session's database to the seeded start."""

    model_config = ConfigDict(extra="forbid")

    tool: str = Field(..., min_length=1, max_length=64)
    args: dict[str, Any] = Field(default_factory=dict)


class ToolObservation(BaseModel):
    """The tool's result, or its error (a tool error is an observation for the agent, not an HTTP error)."""

    tool: str
    result: Any = None
    error: str | None = None
