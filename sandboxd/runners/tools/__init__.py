"""The tools runner kind: a tau-bench-like retail API with a copy-on-write overlay per session (B3)."""

from __future__ import annotations

from typing import Any

from sandboxd.runners.base import Capabilities, RunnerKind
from sandboxd.runners.tools.config import ToolsRunnerConfig
from sandboxd.runners.tools.models import ToolAction, ToolObservation


def describe(_config: Any) -> dict[str, Any]:
    from sandboxd.runners.tools.tools import openai_tools

    return {"tools": openai_tools()}


KIND = RunnerKind(
    name="tools",
    title="tau-bench-like retail tool API (B3)",
    config=ToolsRunnerConfig,
    action=ToolAction,
    observation=ToolObservation,
    runner="sandboxd.runners.tools.runner:ToolsRunner",
    capabilities=Capabilities(fork=True),
    describe=describe,
)
