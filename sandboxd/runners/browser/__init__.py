"""The browser runner kind: jailed headless Chromium through Playwright, for web agents (B4)."""

from __future__ import annotations

from sandboxd.runners.base import Capabilities, RunnerKind
from sandboxd.runners.browser.config import BrowserRunnerConfig
from sandboxd.runners.browser.models import BrowserObservation, BrowserSessionOptions, BrowserStep

KIND = RunnerKind(
    name="browser",
    title="Headless Chromium in nsjail through Playwright (B4)",
    config=BrowserRunnerConfig,
    action=BrowserStep,
    observation=BrowserObservation,
    runner="sandboxd.runners.browser.runner:BrowserRunner",
    capabilities=Capabilities(fork=True),
    tool="browser",
    session_options=BrowserSessionOptions,
)
