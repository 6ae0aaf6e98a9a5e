"""The textgame runner kind: ALFWorld-like household worlds, state per session (B7)."""

from __future__ import annotations

from sandboxd.runners.base import Capabilities, RunnerKind
from sandboxd.runners.textgame.config import TextgameRunnerConfig
from sandboxd.runners.textgame.models import TextgameAction, TextgameObservation

KIND = RunnerKind(
    name="textgame",
    title="Text-game worlds (B7)",
    config=TextgameRunnerConfig,
    action=TextgameAction,
    observation=TextgameObservation,
    runner="sandboxd.runners.textgame.runner:TextgameRunner",
    capabilities=Capabilities(fork=True),
    tool="textgame",
)
