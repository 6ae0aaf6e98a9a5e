"""One browser action on a page (goto, click, fill, ...), and the click that knows it arrived.

Playwright calls under the action's time limit; what a timeout or an error means (the program's, or the
node's when it starved the page) is the runner's to say (``runner.py``).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page

from sandboxd.runners.browser import models as m
from sandboxd.runners.browser.config import BrowserRunnerConfig
from sandboxd.runners.browser.sites import Sites
from sandboxd.runners.starvation import CONTENDED_SHARE, decide

STARVED_CHECK_S = 2.0  # after a timeout under contention: how long to look for what the action waited for

# Counts the trusted clicks each document receives, under a name a page's own scripts cannot redefine
# (installed before them, not configurable); read back after a click to know it arrived.
CLICK_COUNTER = """(() => {
  let n = 0;
  const id = Math.random().toString(36).slice(2);
  addEventListener('click', (e) => { if (e.isTrusted) n++; }, true);
  Object.defineProperty(window, '__sandboxdClicks', { get: () => [id, n], configurable: false });
})();"""
READ_CLICKS = "window.__sandboxdClicks || null"


async def perform(
    page: Page, act: Any, site: str, timeout_ms: float, sites: Sites, cfg: BrowserRunnerConfig, stats: dict[str, int]
) -> str | None:
    """Do one action on the page within ``timeout_ms``; its value (text, a snapshot, an image), if it has one.
    Playwright's errors pass through: the runner says what they mean."""
    match act:
        case m.Goto():
            target = act.site or site
            if target not in sites.roots:
                raise ActionRefused(f"unknown site {target!r}; known: {sorted(sites.roots)}")
            await page.goto(sites.url(target, act.path), wait_until="domcontentloaded", timeout=timeout_ms)
        case m.Click():
            if not await click(page, act.selector, timeout_ms):
                stats["clicks_resent"] += 1
        case m.Fill():
            await page.fill(act.selector, act.text, timeout=timeout_ms)
        case m.Press():
            if act.selector:
                await page.press(act.selector, act.key, timeout=timeout_ms)
            else:
                await page.keyboard.press(act.key)
        case m.Scroll():
            await page.evaluate("([x, y]) => window.scrollBy(x, y)", [act.x, act.y])
        case m.SelectOption():
            await page.select_option(act.selector, act.value, timeout=timeout_ms)
        case m.Check():
            if act.action == "check":
                await page.check(act.selector, timeout=timeout_ms)
            else:
                await page.uncheck(act.selector, timeout=timeout_ms)
        case m.WaitFor():
            if act.selector:
                await page.wait_for_selector(act.selector, state=act.state, timeout=timeout_ms)
            else:
                await asyncio.sleep(min(act.ms or 0, timeout_ms) / 1000)
        case m.Text():
            return cut(cfg.max_text_bytes, await page.inner_text(act.selector or "body", timeout=timeout_ms))
        case m.AriaSnapshot():
            return cut(cfg.max_text_bytes, await page.locator(act.selector or "body").aria_snapshot(timeout=timeout_ms))
        case m.Screenshot():
            shot = await page.screenshot(
                type=act.format,
                quality=act.quality if act.format == "jpeg" else None,
                full_page=act.full_page,
                timeout=timeout_ms,
            )
            if len(shot) > cfg.max_screenshot_bytes:
                raise ActionRefused(
                    f"screenshot of {len(shot)} bytes exceeds max_screenshot_bytes {cfg.max_screenshot_bytes}"
                )
            return base64.b64encode(shot).decode() if act.return_image else None
        case m.History():
            if act.action == "back":
                await page.go_back(wait_until="domcontentloaded", timeout=timeout_ms)
            elif act.action == "forward":
                await page.go_forward(wait_until="domcontentloaded", timeout=timeout_ms)
            else:
                await page.reload(wait_until="domcontentloaded", timeout=timeout_ms)
    return None


def cut(max_bytes: int, text: str) -> str:
    """Text and snapshots at most ``max_bytes`` long, marked when cut."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode(errors="ignore") + "\n[truncated]"


def kept_s(elapsed_s: float, stalled: float) -> float:
    """The time an action was kept off the CPU, as a browser can read it: the machine's CPU stall over it
    (PSI, every task's, not the page's alone: ``starvation.CpuPressure``), counted only when the CPUs were
    contended for at least ``CONTENDED_SHARE`` of it (below that it reads other tasks' waits, not the page's).
    Not bounded by its group's quota as a jailed sandbox's is: every trajectory of the browser (other tenants'
    too) shares that one group, so a page kept off by another trajectory is kept off by another sandbox."""
    return stalled if elapsed_s > 0 and stalled >= CONTENDED_SHARE * elapsed_s else 0.0


async def starved_reason(page: Page, act: Any, limit_s: float, elapsed_s: float, stalled: float, cap_s: float) -> str:
    """Why a timed-out action was the node's doing, not the program's ("" when it was not): by the rule every
    kind shares (``starvation.decide``), its own time (its wall less the time it was kept off the CPU,
    ``kept_s``) had not reached its limit, and what it waited for is there now (no selector, or one that
    matches). Every session shares one browser, and another tenant's forks or trajectories can keep its
    renderers off the CPU past a 500 ms action limit. Such an action gets its time again, once (the runner's
    ``_act``); starved twice, its timeout is reported with this reason. A selector that matches nothing is
    the program's miss, however busy the node was."""
    if decide(limit_s, elapsed_s, kept_s(elapsed_s, stalled), cap_s).outcome == "timeout":
        return ""
    selector = getattr(act, "selector", None)
    if selector:
        try:
            found = await asyncio.wait_for(page.locator(selector).count(), STARVED_CHECK_S)
        except (PlaywrightError, TimeoutError):
            return ""
        if not found:
            return ""
    where = f", and {selector!r} is on the page" if selector else ""
    return f"the node's CPUs were contended for {stalled / elapsed_s:.0%} of it{where}"


async def click(page: Page, selector: str, timeout_ms: float) -> bool:
    """A click that reached the page (True: at once; False: when sent a second time), or an action error
    that says it did not.

    Playwright reports a click done once it dispatched the mouse events, whether or not the page got
    them: under load Chromium can drop them, and a trajectory then went on as if the button had been
    pressed (a session's "add to cart" that never reached the cart). Each page counts the trusted clicks
    it receives (``CLICK_COUNTER``, installed in every context before any page script); a click that
    neither raised the count nor navigated had no effect, so it is sent once more, then said. The count
    is read right before the click (a count kept from an earlier action would let a page that navigates
    itself by timer pass an undelivered click: found by a red team)."""
    if len(page.frames) > 1:  # a click in a frame is counted there, not here: trust Playwright's word
        await page.click(selector, timeout=timeout_ms)
        return True
    before = await _clicks(page)
    for attempt in (0, 1):
        await page.click(selector, timeout=timeout_ms)
        after = await _clicks(page)
        if after is None or before is None or after != before:
            return attempt == 0  # delivered: counted, or the document changed (a navigation the click started)
    raise ActionRefused(f"the click on {selector!r} was not delivered to the page (sent twice)")


async def _clicks(page: Page) -> tuple[str, int] | None:
    """(this document's id, trusted clicks it received); None while a navigation replaces it."""
    try:
        got = await page.evaluate(READ_CLICKS)
    except PlaywrightError:
        return None
    return (str(got[0]), int(got[1])) if isinstance(got, list) and len(got) == 2 else None


class ActionRefused(Exception):
    """An action the runner will not do (unknown site, oversized screenshot): the program's error."""


def short(message: str) -> str:
    first = message.strip().split("\n", 1)[0]
    return first[:500]
