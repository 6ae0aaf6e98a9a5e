"""A replica of the public suite's B4 worker, as the suite describes it (the baseline of ``browser_vs_baseline``).

One Chromium per process (Playwright's launch with the suite's flags, no jail),
a pool of MAX_CONTEXTS contexts created at start (an asyncio.Queue is pool and
semaphore), each request runs its steps in one pooled context with 500 ms per
action and 10 s per goto, then resets it with clear_cookies + about:blank
(localStorage is kept, as in the suite). ``POST /task {target_url, steps}``
answers ``{wall_ms, steps_done, steps_failed, actions}``.

    python -m sandboxd.bench.baselines.b4_worker --port 8004 --contexts 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException
from playwright.async_api import BrowserContext, Page, async_playwright

FLAGS = [
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--disable-features=IsolateOrigins,site-per-process",
    "--disable-software-rasterizer",
]
ACTION_TIMEOUT_MS = 500
GOTO_TIMEOUT_MS = 10_000


def create_app(contexts: int, chromium: str) -> FastAPI:
    pool: asyncio.Queue[tuple[BrowserContext, Page]] = asyncio.Queue()
    state: dict[str, Any] = {}

    async def new_slot() -> tuple[BrowserContext, Page]:
        ctx = await state["browser"].new_context(viewport={"width": 1280, "height": 800})
        return ctx, await ctx.new_page()

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        pw = await async_playwright().start()
        state["browser"] = await pw.chromium.launch(executable_path=chromium, headless=True, args=FLAGS)
        for _slot in range(contexts):
            pool.put_nowait(await new_slot())
        yield
        await state["browser"].close()
        await pw.stop()

    app = FastAPI(lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "pool_idle": pool.qsize(), "pool_max": contexts, "pid": os.getpid()}

    @app.post("/task")
    async def task(body: dict[str, Any]) -> dict[str, Any]:
        t0 = time.monotonic()
        ctx, page = await pool.get()
        done = failed = 0
        try:
            for s in body["steps"]:
                action, args = s["action"], s.get("args") or {}
                try:
                    if action == "goto":
                        await page.goto(body["target_url"] + args["path"], wait_until="domcontentloaded",
                                        timeout=GOTO_TIMEOUT_MS)  # fmt: skip
                    elif action == "click":
                        await page.click(args["selector"], timeout=ACTION_TIMEOUT_MS)
                    elif action == "type":
                        await page.fill(args["selector"], args["text"], timeout=ACTION_TIMEOUT_MS)
                    elif action == "scroll":
                        await page.evaluate("y => window.scrollBy(0, y)", args.get("y", 0))
                    elif action == "screenshot":
                        await page.screenshot()
                    else:
                        raise HTTPException(400, f"unknown action {action}")
                    done += 1
                except HTTPException:
                    raise
                except Exception:
                    failed += 1
        finally:
            try:
                await ctx.clear_cookies()
                await page.goto("about:blank", wait_until="domcontentloaded")
                pool.put_nowait((ctx, page))
            except Exception:
                with contextlib.suppress(Exception):
                    await ctx.close()
                with contextlib.suppress(Exception):
                    pool.put_nowait(await new_slot())
        return {"wall_ms": (time.monotonic() - t0) * 1000, "steps_done": done, "steps_failed": failed,
                "actions": done + failed}  # fmt: skip

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=8004)
    ap.add_argument("--contexts", type=int, default=4)
    # What the suite's image runs: Playwright's own headless shell (``headless=True`` picks it); Debian's is
    # the same build of the same Chromium, and the full browser can be given for comparison.
    ap.add_argument("--chromium", default="/usr/lib/chromium/chromium-headless-shell")
    args = ap.parse_args()
    uvicorn.run(create_app(args.contexts, args.chromium), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
