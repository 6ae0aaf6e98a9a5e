"""Edge models of the tools runner: ``{"tool": name, "args": {...}}``."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field


class ToolAction(BaseModel):
    """One tool call; ``tool: "reset"`` restores the session's database to the seeded start."""

    model_config = ConfigDict(extra="forbid")

    tool: str = Field(..., min_length=1, max_length=64)
    args: dict[str, Any] = Field(default_factory=dict)

    describe_runner: ClassVar[str] = "runners.tools.tools:openai_tools"
