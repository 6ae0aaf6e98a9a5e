"""A browser context with its one page: what a session or a one-shot trajectory drives."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from playwright.async_api import Browser, BrowserContext, CDPSession, Page

RESET_TIMEOUT_S = 5.0  # a context that cannot be reset (or copied, or restored) in this long is thrown away


@dataclass
class Tab:
    """A context with its one page: what a session or a one-shot trajectory drives."""

    context: BrowserContext
    page: Page
    browser: Browser
    cdp: CDPSession
    crashed: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    site: str = "shop"
    uses: int = 0
    title: str | None = None
    origins: set[str] = field(default_factory=set)  # site origins this page has shown (reset clears each)
