"""Copies of a browser session: its cookies and storage read through the browser, written into fresh contexts.

A page's live JavaScript heap (variables, timers, unsent form input, scroll position) and its history cannot
be copied between contexts; what can is read through the browser (CDP and Playwright's own world), never
through the page's JavaScript, and within a time limit.
"""

from __future__ import annotations

import asyncio
from typing import Any

from playwright.async_api import Browser
from playwright.async_api import Error as PlaywrightError

from sandboxd.errors import BadRequest, SessionLost
from sandboxd.runners.browser.actions import short
from sandboxd.runners.browser.sites import BLANK_PATH, Sites
from sandboxd.runners.browser.tabs import RESET_TIMEOUT_S, Tab

FORK_PARALLEL = 4  # copies of one fork made at once


async def capture(
    src: Tab, source_id: str, sites: Sites, browser: Browser | None, max_state_bytes: int
) -> tuple[Any, str, str | None, list[list[str]]]:
    """The source's cookies and storage, read through the browser (CDP), never through the page's own
    JavaScript (a page can redefine ``Object.entries`` or spin forever), and within a time limit."""
    async with src.lock:
        try:
            async with asyncio.timeout(RESET_TIMEOUT_S):
                cookies = await src.context.cookies()  # the browser's cookie store, not the page's
                url = src.page.url
                origin = sites.origin_of(url)
                # Playwright reads localStorage in its own isolated world (a page's redefinitions of
                # Object.entries and friends do not reach it); a page that spins is caught by the timeout.
                stored = await src.context.storage_state()
                origins = [
                    {"origin": o["origin"], "entries": [[i["name"], i["value"]] for i in o.get("localStorage", [])]}
                    for o in stored.get("origins", [])
                    if sites.origin_of(o["origin"]) is not None and o.get("localStorage")
                ]
                session_items: list[list[str]] = []
                if origin is not None:
                    got = await src.cdp.send(
                        "DOMStorage.getDOMStorageItems",
                        {"storageId": {"securityOrigin": origin, "isLocalStorage": False}},
                    )
                    session_items = got["entries"]
        except TimeoutError:
            raise BadRequest(
                f"session {source_id}'s page did not give up its storage within {RESET_TIMEOUT_S:g} s "
                "(a busy page cannot be copied now)"
            ) from None
        except PlaywrightError as exc:
            if src.crashed or src.browser is not browser:
                raise SessionLost(f"browser session {source_id} is gone: {short(exc.message)}") from exc
            raise BadRequest(f"session {source_id}'s storage could not be read: {short(exc.message)}") from exc
    size = sum(len(c.get("name", "")) + len(c.get("value", "")) for c in cookies)
    size += sum(len(k) + len(v) for o in origins for k, v in o["entries"])
    size += sum(len(k) + len(v) for k, v in session_items)
    if size > max_state_bytes:
        raise BadRequest(
            f"session {source_id} holds {size} bytes of cookies and storage; a fork copies at most "
            f"{max_state_bytes} (SANDBOXD_BROWSER__FORK_MAX_STATE_BYTES)"
        )
    return {"cookies": cookies, "origins": origins}, url, origin, session_items


async def restore(
    tab: Tab, site: str, state: Any, url: str, origin: str | None, session_items: list[list[str]]
) -> None:
    tab.site = site
    async with asyncio.timeout(RESET_TIMEOUT_S):
        if state["cookies"]:
            await tab.context.add_cookies(state["cookies"])
        # Written from our own blank page of each origin in the fresh context: no page of the tenant's
        # runs there, so nothing can interfere with the writes.
        for entry in state["origins"]:
            await tab.page.goto(entry["origin"] + BLANK_PATH, wait_until="commit")
            tab.origins.add(entry["origin"])
            await tab.page.evaluate(
                "items => { for (const [k, v] of items) localStorage.setItem(k, v) }", entry["entries"]
            )
        if origin is not None:
            await tab.page.goto(origin + BLANK_PATH, wait_until="commit")
            tab.origins.add(origin)
            await tab.page.evaluate(
                "items => { for (const [k, v] of items) sessionStorage.setItem(k, v) }", session_items
            )
            await tab.page.goto(url, wait_until="load")
        tab.title = None
