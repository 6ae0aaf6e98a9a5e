"""The one small protocol every runner kind implements, and the registry of kinds.

A runner lives inside a worker process. The gateway never imports a runner's
heavy dependencies (nsjail, Playwright, DuckDB): it imports only the kind's
``models`` module, named here by an import string, to validate actions at the
edge. The runner itself is imported lazily in the worker, only when enabled.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel


@dataclass(frozen=True)
class StepLimits:
    """Per-step limits after the gateway clamped them to the node's maxima."""

    timeout_s: float
    memory_mb: int | None = None
    max_output_bytes: int | None = None


class Runner(Protocol):
    """What a worker needs of a runner kind. All methods are coroutines."""

    kind: str

    def capacity(self) -> int:
        """Concurrent one-shot steps this runner can take in this worker."""
        ...

    async def start(self) -> None:
        """Warm the pools; return when the runner can take steps."""
        ...

    async def step(self, action: dict[str, Any], session_id: str | None, limits: StepLimits) -> dict[str, Any]:
        """Run one action; return the observation (a JSON-able dict)."""
        ...

    async def open_session(self, session_id: str, options: dict[str, Any]) -> dict[str, Any]:
        """Create the per-session state; return its description."""
        ...

    async def close_session(self, session_id: str) -> None:
        """Free the session's state; unknown ids are ignored (idempotent)."""
        ...

    async def health(self) -> dict[str, Any]:
        """Pool occupancy and counters, for /readyz and metrics."""
        ...

    async def close(self) -> None:
        """Stop everything this runner started; nothing may be left running."""
        ...


@dataclass(frozen=True)
class RunnerEntry:
    models: str  # "module:ActionModel" (light: pydantic only)
    runner: str  # "module:RunnerClass" (heavy: imported in the worker only)


REGISTRY: dict[str, RunnerEntry] = {
    "python": RunnerEntry("runners.python.models:PythonAction", "runners.python.runner:PythonRunner"),
    "fake": RunnerEntry("runners.fake:FakeAction", "runners.fake:FakeRunner"),
    "sql": RunnerEntry("runners.sql.models:SQLAction", "runners.sql.runner:SQLRunner"),
    "tools": RunnerEntry("runners.tools.models:ToolAction", "runners.tools.runner:ToolsRunner"),
    "textgame": RunnerEntry("runners.textgame.models:TextgameAction", "runners.textgame.runner:TextgameRunner"),
}


def import_string(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def action_model(kind: str) -> type[BaseModel]:
    model: type[BaseModel] = import_string(REGISTRY[kind].models)
    return model


def runner_class(kind: str) -> Any:
    return import_string(REGISTRY[kind].runner)
