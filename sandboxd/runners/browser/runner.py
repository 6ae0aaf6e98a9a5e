"""The browser runner: one jailed Chromium per instance, a context per session or trajectory.

Launch at start (Playwright driver ~0.45 s, Chromium ~0.25 s, both off the
request path). A one-shot step takes a context from a small pool and, after
its trajectory, the context is fully reset before anyone else gets it:
cookies, local and session storage, IndexedDB and caches of every site, the
navigation history, extra pages, ``window.name``. (A fresh context per
trajectory costs ~1 s of CPU more, measured: a new renderer each time; reset
costs tens of ms.) A context is recycled after ``reuse_contexts`` trajectories
or when anything about it looks wrong. A session owns one context and one page
for its life.

Faults stay where they start: a renderer that crashes or hangs costs its own
context (the step is the program's failure; a session ends); a context that
opens too many pages has the extras closed; a whole browser that dies fails
its in-flight steps as infra, loses its sessions (410) and is relaunched.
Playwright's exceptions are translated here and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from playwright.async_api import Browser, Page, Playwright, async_playwright
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeout

from sandboxd.errors import BadRequest, NodePressure, SandboxSetupError, Saturated, SessionLost, UnknownSession
from sandboxd.runners.base import (
    ProgramFailure,
    RunnerContext,
    StepLimits,
    StepOutcome,
    refuse_at_session_cap,
    refuse_fork_at_cap,
)
from sandboxd.runners.browser import models as m
from sandboxd.runners.browser.actions import CLICK_COUNTER, ActionRefused, perform, short, starved_reason
from sandboxd.runners.browser.config import BrowserRunnerConfig
from sandboxd.runners.browser.forks import FORK_PARALLEL, capture, restore
from sandboxd.runners.browser.gate import Gate
from sandboxd.runners.browser.jail import chromium_args, renderers_first_for_oom, write_launcher
from sandboxd.runners.browser.sites import BLANK_PATH, HEAD_LIMIT, Sites, browser_netns, listen_in_netns
from sandboxd.runners.browser.tabs import RESET_TIMEOUT_S, Tab
from sandboxd.runners.cgroups import CgroupGroup, CgroupRoot
from sandboxd.runners.starvation import CpuPressure, wall_cap_s

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0
TITLE_TIMEOUT_S = 0.5  # a hung page has no title worth waiting for
ANSWER_PROBE_S = 0.5  # a one-shot's page that does not evaluate ``1`` this fast is hung: thrown away, not reset
EXTRA_PAGE_ROUNDS = 4  # rounds of closing a context's extra pages before the context is thrown away instead
GATE_WAIT_S = 30.0  # a session's trajectory waits this long at most for the gate (a one-shot: its queue deadline)
# What a session's context and renderer may take in the browser's group: measured 15 MiB on a shop page with
# the headless shell (55 MiB with the full browser), reserved at 3x for heavier pages.
CONTEXT_RESERVE_MB = 48
MEMORY_ADMIT_FRACTION = 0.9  # new sessions must leave this much of the browser's cap unused
# What a page can write and read back: cleared between trajectories. Not "all": that also drops the
# shader and code caches, which hold nothing of a page's and cost the next trajectory ~0.3 s of CPU.
PAGE_STORAGE = (
    "cookies,file_systems,indexeddb,local_storage,websql,service_workers,cache_storage,"
    "shared_storage,storage_buckets,interest_groups"
)
NAVIGATING = (m.Goto, m.Click, m.Press, m.History, m.Fill, m.Check, m.SelectOption, m.WaitFor)


class BrowserRunner:
    def __init__(self, cfg: BrowserRunnerConfig, ctx: RunnerContext) -> None:
        self.cfg = cfg
        self.name = ctx.name
        self.density = ctx.density
        self.dir = ctx.runtime_dir / ctx.name
        self.sites = Sites.configured(cfg.sites)
        # Every origin a page of ours can store into (sites are fixed at start): what a reset clears.
        self.site_origins = frozenset(
            origin for site in self.sites.roots if (origin := self.sites.origin_of(self.sites.url(site, "/")))
        )
        self.pw: Playwright | None = None
        self.browser: Browser | None = None
        self.cgroup: CgroupGroup | None = None
        self.root: CgroupRoot | None = None
        self.launcher: Path | None = None
        self.warm: asyncio.Queue[Tab] = asyncio.Queue()
        self.gate = Gate(cfg.slots_per_worker)  # trajectories at once: fewer while their actions are starved
        self.sessions: dict[str, Tab] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.closing = False
        self._pending = 0  # sessions being opened or copied: counted against the cap before they exist
        self._relaunch: asyncio.Task[None] | None = None
        self.site_server: asyncio.Server | None = None
        self.stats = {
            "launches": 0,
            "contexts": 0,
            "crashes": 0,
            "browser_deaths": 0,
            "pages_closed": 0,
            "clicks_resent": 0,
            "starved_twice": 0,
            "starved_retries": 0,
        }
        self.pressure = CpuPressure()

    def capacity(self) -> int:
        return self.cfg.slots_per_worker

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.root = CgroupRoot(self.name, Path(self.cfg.cgroup_mount))
        self.cgroup = self.root.slot("chromium")
        self.cgroup.set_limits(self.cfg.memory_mb << 20, self.cfg.pids_max)
        self.cgroup.set_cpu(self.cfg.cpu_cores)
        self.root.group.set_weight(self.cfg.cpu_weight)  # the browser's root: a sibling of the worker's others
        self.launcher = write_launcher(self.cfg, self.dir, self.cgroup.procs_files)
        self.pw = await async_playwright().start()
        await self._launch()

    async def _launch(self) -> None:
        assert self.pw is not None and self.launcher is not None
        try:
            browser = await self.pw.chromium.launch(
                executable_path=str(self.launcher),
                headless=True,
                chromium_sandbox=False,  # the jail is the sandbox; Chromium's own needs user namespaces inside it
                args=chromium_args(self.cfg),
                timeout=self.cfg.launch_timeout_s * 1000,
            )
        except PlaywrightError as exc:
            raise SandboxSetupError(f"browser {self.name} did not start: {exc.message[:500]}") from exc
        try:
            await self._serve_sites()
        except OSError as exc:
            with contextlib.suppress(PlaywrightError, TimeoutError):
                await asyncio.wait_for(browser.close(), CLOSE_TIMEOUT_S)
            raise SandboxSetupError(f"browser {self.name}: cannot serve its sites in its jail: {exc}") from exc
        self.browser = browser
        self.stats["launches"] += 1
        if self.cgroup is not None:
            self.stats["oom_preferred"] = renderers_first_for_oom(self.cgroup.procs_files)
        browser.on("disconnected", lambda b: self._on_disconnected(b))
        for _ in range(self.cfg.warm_contexts):
            self._spawn(self._refill())

    async def _serve_sites(self) -> None:
        """(Re)open the site server inside the new browser's network namespace."""
        assert self.cgroup is not None
        self._stop_sites()
        netns = browser_netns(self.cgroup.procs_files[0])
        try:
            sock = listen_in_netns(netns)
        finally:
            os.close(netns)
        self.site_server = await asyncio.start_server(self.sites.serve, sock=sock, limit=HEAD_LIMIT)

    def _stop_sites(self) -> None:
        if self.site_server is not None:
            self.site_server.close()
            self.site_server = None

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _on_disconnected(self, browser: Browser) -> None:
        if browser is not self.browser:
            return
        self.browser = None
        self._stop_sites()
        if self.closing:
            return
        self.stats["browser_deaths"] += 1
        log.error("browser %s died; its sessions are lost; relaunching", self.name)
        while not self.warm.empty():
            self.warm.get_nowait()
        if self._relaunch is None or self._relaunch.done():
            self._relaunch = asyncio.ensure_future(self._relaunch_loop())

    async def _relaunch_loop(self) -> None:
        for delay in (0.0, 0.5, 1.0, 2.0, 5.0, 5.0, 5.0):
            await asyncio.sleep(delay)
            if self.closing:
                return
            try:
                await self._launch()
                return
            except SandboxSetupError as exc:
                log.error("%s", exc)

    async def _new_tab(self, site: str = "shop") -> Tab:
        browser = self.browser
        if browser is None:
            raise SandboxSetupError(f"browser {self.name} is restarting")
        try:
            context = await browser.new_context(
                viewport={"width": self.cfg.viewport_width, "height": self.cfg.viewport_height},
                service_workers="block",
                accept_downloads=False,
            )
            await context.add_init_script(CLICK_COUNTER)
            page = await context.new_page()
            cdp = await context.new_cdp_session(page)
        except PlaywrightError as exc:
            raise SandboxSetupError(f"browser {self.name}: cannot open a context: {exc.message[:300]}") from exc
        tab = Tab(context, page, browser, cdp, site=site)
        page.on("crash", lambda _: self._crashed(tab))
        page.on("framenavigated", lambda frame: self._visited(tab, frame.url))
        context.on("page", lambda p: self._limit_pages(tab, p))
        self.stats["contexts"] += 1
        return tab

    def _visited(self, tab: Tab, url: str) -> None:
        origin = self.sites.origin_of(url)
        if origin is not None:
            tab.origins.add(origin)

    def _crashed(self, tab: Tab) -> None:
        tab.crashed = True
        self.stats["crashes"] += 1

    def _limit_pages(self, tab: Tab, page: Page) -> None:
        """window.open storms: a context keeps at most max_pages_per_context pages."""
        if len(tab.context.pages) > self.cfg.max_pages_per_context:
            self.stats["pages_closed"] += 1
            self._spawn(page.close())

    async def _refill(self) -> None:
        with contextlib.suppress(SandboxSetupError):
            self.warm.put_nowait(await self._new_tab())

    async def _take_tab(self) -> Tab:
        """A clean context: a reset one from the pool, or a new one."""
        while not self.warm.empty():
            tab = self.warm.get_nowait()
            if tab.browser is self.browser and not tab.crashed:
                try:
                    await tab.cdp.send("Page.setWebLifecycleState", {"state": "active"})
                    return tab
                except PlaywrightError:
                    pass
            self._spawn(self._dispose(tab))
        return await self._new_tab()

    async def _give_back(self, tab: Tab) -> None:
        """Reset a one-shot's context for the next trajectory, or throw it away and make a fresh one."""
        tab.uses += 1
        if (
            tab.uses < self.cfg.reuse_contexts
            and not tab.crashed
            and tab.browser is self.browser
            and self.warm.qsize() < self.cfg.slots_per_worker + self.cfg.warm_contexts
            and await self._answers(tab)
        ):
            try:
                await asyncio.wait_for(self._reset(tab), RESET_TIMEOUT_S)
                # an idle page still renders frames: frozen, it costs nothing until it is taken again
                await tab.cdp.send("Page.setWebLifecycleState", {"state": "frozen"})
                self.warm.put_nowait(tab)
                return
            except (PlaywrightError, TimeoutError) as exc:
                log.info("browser %s: a context failed its reset (%s); replacing it", self.name, exc)
        await self._dispose(tab)
        if self.warm.qsize() < self.cfg.warm_contexts:
            await self._refill()

    async def _answers(self, tab: Tab) -> bool:
        """Whether the page's main thread answers at once. A page left in an endless loop burns a core until its
        renderer goes: resetting it (navigating away) waited RESET_TIMEOUT_S while the neighbours' actions were
        starved; it is thrown away at once instead."""
        try:
            await asyncio.wait_for(tab.page.evaluate("1"), ANSWER_PROBE_S)
        except (PlaywrightError, TimeoutError):
            return False
        return True

    async def _reset(self, tab: Tab) -> None:
        """Leave nothing of one trajectory for the next: storage of every site, cookies, history, pages.

        The trajectory's page is navigated away first, so none of its scripts run while storage is cleared
        (a red team wrote sessionStorage from a ``pagehide`` handler, and opened a popup, after a clear made
        while the page was still there); pages it opened are closed until none is left, or the context goes."""
        await self._close_extras(tab)
        # sessionStorage lives in the tab, per origin, and can only be cleared from a page of that origin
        for origin in sorted(tab.origins):
            await tab.page.goto(origin + BLANK_PATH, wait_until="commit")
            await tab.page.evaluate("sessionStorage.clear()")
        await tab.page.goto("about:blank", wait_until="commit")
        await self._close_extras(tab)
        # Every other kind of storage, of every site: a popup (or a frame) can store into an origin the main
        # page never showed (found by the red team: a one-shot's popup planted localStorage that the next
        # session, and fork copies, read).
        for origin in sorted(self.site_origins | tab.origins):
            await tab.cdp.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": PAGE_STORAGE})
        tab.origins.clear()
        await tab.page.evaluate("window.name = ''")
        await tab.context.clear_cookies()
        await tab.cdp.send("Page.resetNavigationHistory")
        if len(tab.context.pages) > 1:  # opened while the rest was cleared: this context is not clean
            raise PlaywrightError("a page was opened during the reset")
        tab.title = None

    async def _close_extras(self, tab: Tab) -> None:
        """Close every page but the tab's own; a popup can open another while it closes, so a few rounds."""
        for _ in range(EXTRA_PAGE_ROUNDS):
            extras = [p for p in tab.context.pages if p is not tab.page]
            if not extras:
                return
            for extra in extras:
                await extra.close()
        raise PlaywrightError("pages kept opening more pages during the reset")

    async def _dispose(self, tab: Tab) -> None:
        with contextlib.suppress(PlaywrightError, TimeoutError):
            await asyncio.wait_for(tab.context.close(), CLOSE_TIMEOUT_S)

    async def close(self) -> None:
        self.closing = True
        for tab in list(self.sessions.values()):
            await self._dispose(tab)
        self.sessions.clear()
        for task in list(self.tasks):
            task.cancel()
        if self.browser is not None:
            with contextlib.suppress(PlaywrightError, TimeoutError):
                await asyncio.wait_for(self.browser.close(), CLOSE_TIMEOUT_S)
        if self.pw is not None:
            with contextlib.suppress(Exception):
                await self.pw.stop()
        self._stop_sites()
        if self.root is not None:
            await asyncio.to_thread(self.root.group.remove)  # kills whatever of the browser is left

    async def health(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity(),
            "free_slots": self.gate.free(),
            "admitted_limit": self.gate.limit,
            "admitted_cuts": self.gate.cuts,
            "sessions": len(self.sessions),
            "warm_contexts": self.warm.qsize(),
            "ready": self.browser is not None,
            "requests_served": self.sites.served,
            "requests_blocked": self.sites.blocked,
            **self.stats,
        }

    # ------------------------------------------------------------------ steps

    async def step(self, action: m.BrowserStep, session_id: str | None, limits: StepLimits) -> StepOutcome:
        if session_id is not None:
            tab = self.sessions.get(session_id)
            if tab is None:
                raise UnknownSession(f"no browser session {session_id}", session_id=session_id)
            if tab.browser is not self.browser or not tab.browser.is_connected():
                self.sessions.pop(session_id, None)
                raise SessionLost(f"session {session_id}: its browser died", session_id=session_id)
            async with tab.lock, self.gate.enter(self._admit_by(limits)) as generation:
                outcome = await self._run(tab, action, limits, tab.site, generation)
            if not outcome.session_alive:
                await self.close_session(session_id)
            return outcome
        if action.site not in self.sites.roots:
            raise BadRequest(f"action.site: unknown site {action.site!r}; known: {sorted(self.sites.roots)}")
        async with self.gate.enter(self._admit_by(limits)) as generation:
            tab = await self._take_tab()
            try:
                return await self._run(tab, action, limits, action.site, generation)
            finally:
                self._spawn(self._give_back(tab))

    @staticmethod
    def _admit_by(limits: StepLimits) -> float:
        """How long a trajectory may wait for the gate: its queue deadline (a one-shot's), or ``GATE_WAIT_S``."""
        return limits.admit_by if limits.admit_by is not None else time.monotonic() + GATE_WAIT_S

    async def _run(self, tab: Tab, step: m.BrowserStep, limits: StepLimits, site: str, generation: int) -> StepOutcome:
        t0 = time.monotonic()
        deadline = t0 + limits.timeout_s
        results: list[m.ActionResult] = []
        timed_out = False
        starved_twice = ""
        calm = True

        def starved() -> None:
            nonlocal calm
            calm = False
            self.gate.starved(generation)

        for act in step.actions:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            result, starved_twice = await self._act(tab, act, site, left, starved)
            results.append(result)
            if starved_twice or tab.crashed or (step.stop_on_error and not result.ok):
                break
            if not tab.browser.is_connected():
                raise SandboxSetupError(f"browser {self.name} died during the step")
        if calm:
            self.gate.calm()
        failed = sum(not r.ok for r in results)
        obs = m.BrowserObservation(
            results=results,
            actions_done=len(results) - failed,
            actions_failed=failed,
            url=tab.page.url,
            title=tab.title,
            page_crashed=tab.crashed,
            wall_ms=round((time.monotonic() - t0) * 1000, 3),
        )
        if starved_twice:
            # Honest blame: the node kept this action from its time twice; the program did nothing wrong.
            pressure = NodePressure(
                f"action {len(results) - 1} ({results[-1].action}) timed out twice while {starved_twice}; the "
                "observation is what the trajectory did until then",
                retry_after_s=1.0,
            )
            return StepOutcome(obs, session_alive=not tab.crashed, infra=pressure)
        if tab.crashed:
            failure: ProgramFailure | None = ProgramFailure("program_killed", "the page crashed (renderer died)")
        elif timed_out:
            failure = ProgramFailure("program_timeout", f"the step ran past its {limits.timeout_s:g}s limit")
        elif failed:
            failure = ProgramFailure("action_error", f"{failed} of {len(results)} actions failed")
        else:
            failure = None
        return StepOutcome(
            obs, failure=failure, session_alive=not tab.crashed, killed_by="crash" if tab.crashed else None
        )

    async def _act(
        self, tab: Tab, act: Any, site: str, left_s: float, on_starved: Callable[[], None]
    ) -> tuple[m.ActionResult, str]:
        """One action's result, and why the node starved it twice ("" when it did not)."""
        page = tab.page
        is_goto = isinstance(act, m.Goto | m.History)
        default_ms = self.cfg.goto_timeout_ms if is_goto else self.cfg.action_timeout_ms
        if isinstance(act, m.WaitFor) and not act.selector and act.ms:
            default_ms = max(default_ms, act.ms)  # a plain wait lasts what it asks (a red team found it cut at 0.5 s)
        timeout_ms = min(act.timeout_ms or default_ms, max(1.0, left_s * 1000))
        t = time.monotonic()
        value: str | None = None
        error: str | None = None
        retried = False
        starved = starved_twice = ""
        while True:
            attempt_t, stalled0 = time.monotonic(), self.pressure.stalled_s()
            try:
                value = await asyncio.wait_for(
                    perform(page, act, site, timeout_ms, self.sites, self.cfg, self.stats), timeout_ms / 1000 + 1.0
                )
                error = None
                break
            except PlaywrightTimeout:
                error = f"timed out after {timeout_ms:g} ms" + (
                    f" waiting for {act.selector!r}" if getattr(act, "selector", None) else ""
                )
            except TimeoutError:
                error = f"timed out after {timeout_ms:g} ms (the page did not answer)"
            except PlaywrightError as exc:
                error = short(exc.message)
                if retried and "interrupted by another navigation" in exc.message:
                    # The starved first attempt's navigation landed as the second began: still the node's doing.
                    self.stats["starved_twice"] += 1
                    starved_twice = starved
                break
            except ActionRefused as exc:
                error = str(exc)
                break
            limit_s, elapsed = timeout_ms / 1000, time.monotonic() - attempt_t
            stalled = self.pressure.stalled_s() - stalled0
            cap = wall_cap_s(limit_s, self.density.cores_at_once())
            starved = await starved_reason(page, act, limit_s, elapsed, stalled, cap)
            if not starved:
                break
            on_starved()  # the browser admits fewer trajectories from now on (gate.py)
            if retried or left_s - (time.monotonic() - t) < timeout_ms / 1000:
                # Starved twice: the node's failure, not the action's (the step is a 503 node_pressure).
                self.stats["starved_twice"] += 1
                error = f"{error}; {starved}"
                starved_twice = starved
                break
            retried = True  # its time, given back once: the same action again
            self.stats["starved_retries"] += 1
            if isinstance(act, m.Goto | m.History):
                # The timed-out navigation is still loading: left alone, it interrupts the one sent again (an
                # error that looked like the program's).
                with contextlib.suppress(PlaywrightError):
                    await tab.cdp.send("Page.stopLoading")
        if not tab.crashed and (tab.title is None or isinstance(act, NAVIGATING)):
            tab.title = None  # only actions that can change the document ask for the title again
            with contextlib.suppress(PlaywrightError, TimeoutError):
                # Playwright reads it in its own world: a page's redefinition of document.title cannot answer
                tab.title = await asyncio.wait_for(page.title(), TITLE_TIMEOUT_S)
        result = m.ActionResult(
            action=act.action,
            ok=error is None,
            error=error,
            elapsed_ms=round((time.monotonic() - t) * 1000, 3),
            url=page.url,
            title=tab.title,
            value=value,
        )
        return result, starved_twice

    # ------------------------------------------------------------------ sessions

    async def open_session(self, session_id: str, options: dict[str, Any]) -> None:
        if session_id in self.sessions:
            return
        opts = m.BrowserSessionOptions.model_validate(options)
        if opts.site not in self.sites.roots:
            raise BadRequest(f"options.site: unknown site {opts.site!r}; known: {sorted(self.sites.roots)}")
        # Counted before the first await: concurrent opens and forks must not all pass the same check.
        refuse_at_session_cap("browser", self._held(), self.cfg.max_sessions_per_worker, session_id)
        self._refuse_without_room(1, session_id)
        self._pending += 1
        try:
            tab = await self._take_tab()
        finally:
            self._pending -= 1
        tab.site = opts.site
        self.sessions[session_id] = tab

    async def fork_session(self, source_id: str, new_ids: list[str]) -> list[str]:
        """Each copy: a fresh context with the source's cookies, every site origin's localStorage and the
        current origin's sessionStorage, then the source's URL loaded again. A page's live JavaScript heap
        (variables, timers, unsent form input, scroll position) and its history cannot be copied between
        contexts: the response says so."""
        src = self.sessions.get(source_id)
        if src is None:
            raise UnknownSession(f"no browser session {source_id}", session_id=source_id)
        refuse_fork_at_cap("browser", self._held(), len(new_ids), self.cfg.max_sessions_per_worker, source_id)
        self._refuse_without_room(len(new_ids), source_id)
        self._pending += len(new_ids)
        try:
            return await self._fork(src, source_id, new_ids)
        finally:
            self._pending -= len(new_ids)

    def _held(self) -> int:
        return len(self.sessions) + self._pending

    def _refuse_without_room(self, n: int, session_id: str) -> None:
        """Every session shares one browser and its memory cap: at the cap the OOM killer takes the whole
        browser and every session in it. So ``n`` more contexts are refused (429, retry) while the browser
        has not room for them on top of what it holds now and what is being opened."""
        if self.cgroup is None:
            return
        used, limit = self.cgroup.memory()
        if not limit:
            return
        want = (n + self._pending) * (CONTEXT_RESERVE_MB << 20)
        if used + want > limit * MEMORY_ADMIT_FRACTION:
            raise Saturated(
                f"browser: {used >> 20} MiB of its {limit >> 20} MiB in use; {n} more session(s) would not fit "
                "without risking every session of this browser; retry later",
                retry_after_s=5.0,
                session_id=session_id,
            )

    async def _fork(self, src: Tab, source_id: str, new_ids: list[str]) -> list[str]:
        state, url, origin, session_items = await capture(
            src, source_id, self.sites, self.browser, self.cfg.fork_max_state_bytes
        )
        made: list[Tab] = []
        gate = asyncio.Semaphore(FORK_PARALLEL)

        async def copy_one() -> Tab:
            async with gate:
                tab = await self._take_tab()
                made.append(tab)
                await restore(tab, src.site, state, url, origin, session_items)
                return tab

        try:
            # A few at a time: a copy mostly waits on its loads, but every load is work for the same Chromium.
            results = await asyncio.gather(*(copy_one() for _ in new_ids), return_exceptions=True)
        except BaseException:
            for tab in made:
                await self._dispose(tab)
            raise
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:  # all or none: every copy made is thrown away
            for tab in made:
                await self._dispose(tab)
            first = failed[0]
            if self.browser is None or src.browser is not self.browser:
                raise SandboxSetupError(f"browser {self.name} died while copies were made") from first
            if isinstance(first, PlaywrightError | TimeoutError):
                # The browser is fine: what failed is loading the source's own pages with its own state
                # (a page that hangs, cookies too big to send): the tenant's, as the source would see it.
                message = first.message if isinstance(first, PlaywrightError) else f"over {RESET_TIMEOUT_S:g} s"
                raise BadRequest(f"a copy of session {source_id} could not load its state: {short(message)}") from first
            raise first
        copies = [r for r in results if isinstance(r, Tab)]
        for sid, tab in zip(new_ids, copies, strict=True):
            self.sessions[sid] = tab
        return [
            f"each copy loaded {url} again with the source's cookies, localStorage and sessionStorage; the "
            "page's live JavaScript state (variables, timers, unsent form input, scroll position) and its "
            "history were not copied"
        ]

    async def close_session(self, session_id: str) -> None:
        tab = self.sessions.pop(session_id, None)
        if tab is not None:
            await self._dispose(tab)
