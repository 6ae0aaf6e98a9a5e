"""The node's worker processes: start, health-check and replace them (uvicorn's multiprocess supervisor is
the model).

Each worker listens on ``<runtime>/w<i>.sock``; the node and every front process connect there. A worker
whose process exits, or that stops answering pings, is killed and replaced by a new incarnation (a new
random name, carried in the ids of the sessions it makes); only the steps and sessions it held are lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandboxd import links
from sandboxd.config import NodeSettings
from sandboxd.constants import WORKER_RESTART_BACKOFF_S
from sandboxd.errors import SandboxdError, SandboxSetupError
from sandboxd.links import Channel
from sandboxd.metrics import MULTIPROC_ENV
from sandboxd.spawn import Child, spawn

log = logging.getLogger("sandboxd.workers")


def worker_socket(runtime_dir: str | Path, index: int) -> str:
    return str(Path(runtime_dir) / f"w{index}.sock")


class WorkerProc:
    """One worker process and the node's link to it."""

    def __init__(self, index: int, settings: NodeSettings, on_event: Callable[[int, dict[str, Any]], None]) -> None:
        self.index = index
        self.settings = settings
        self.on_event = on_event
        self.proc: Child | None = None
        self.link: Channel | None = None
        self.incarnation = ""
        self.capacity: dict[str, int] = {}
        self.health: dict[str, Any] = {}
        self.alive = False
        self.dead = asyncio.Event()
        self.path = worker_socket(settings.runtime_dir, index)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self, env: dict[str, str]) -> None:
        self.incarnation = secrets.token_hex(3)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.proc = spawn(
            [sys.executable, "-m", "sandboxd.worker", "--index", str(self.index), "--incarnation", self.incarnation],
            env=env,
        )
        deadline = time.monotonic() + self.settings.worker_start_timeout_s
        while True:  # it listens once its runners are warm
            if self.proc.returncode is not None:
                raise SandboxSetupError(f"worker {self.index} exited while starting (status {self.proc.returncode})")
            try:
                self.link = await links.connect(self.path, on_event=self._event, on_close=lambda _: self._mark_dead())
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    await self.kill()
                    raise SandboxSetupError(
                        f"worker {self.index} did not start in {self.settings.worker_start_timeout_s:g}s "
                        "(worker_start_timeout_s)"
                    ) from None
                await asyncio.sleep(0.02)
        hello, _ = await self.link.call("hello", {"role": "node"})
        self.capacity = dict(hello["capacity"])
        self.alive = True
        self.dead = asyncio.Event()
        with contextlib.suppress(SandboxdError, TimeoutError):
            self.health = await asyncio.wait_for(self.ping(), self.settings.worker_ping_timeout_s)

    def _event(self, header: dict[str, Any], body: bytes) -> None:
        self.on_event(self.index, header)

    def _mark_dead(self) -> None:
        if self.alive:
            self.alive = False
            self.dead.set()

    async def ping(self) -> dict[str, Any]:
        assert self.link is not None
        answer, _ = await self.link.call("ping")
        return answer

    async def kill(self) -> None:
        self._mark_dead()
        if self.link is not None:
            self.link.close()
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(Exception):
                await self.proc.wait()

    async def stop(self, grace_s: float) -> None:
        """Ask the worker to close its runners (jails, sessions), then make sure it is gone."""
        if self.proc is not None and self.proc.returncode is None:
            if self.link is not None and self.link.alive:
                self.link.event("shutdown")
            try:
                await asyncio.wait_for(self.proc.wait(), max(grace_s, 1.0))
            except TimeoutError:
                log.warning("worker %d did not stop in %.1fs; killing it", self.index, grace_s)
        await self.kill()


class Workers:
    """Starts the workers, pings them, and replaces any that die or hang."""

    def __init__(
        self,
        settings: NodeSettings,
        on_lost: Callable[[WorkerProc], None],
        on_ready: Callable[[WorkerProc], None],
        on_event: Callable[[int, dict[str, Any]], None],
    ) -> None:
        self.settings = settings
        self.procs = [WorkerProc(i, settings, on_event) for i in range(settings.worker_count())]
        self.on_lost = on_lost
        self.on_ready = on_ready
        self.restarts = 0
        self.stopping = False
        self._tasks: list[asyncio.Task[None]] = []

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SANDBOXD_WORKER_SETTINGS"] = self.settings.model_dump_json()
        env[MULTIPROC_ENV] = str(Path(self.settings.runtime_dir) / "metrics")
        return env

    async def start(self) -> None:
        await asyncio.gather(*(w.start(self.env()) for w in self.procs))
        for w in self.procs:
            self._tasks.append(asyncio.create_task(self._watch(w)))
            self._tasks.append(asyncio.create_task(self._ping(w)))

    async def _watch(self, w: WorkerProc) -> None:
        while not self.stopping:
            waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(w.dead.wait())]
            if w.proc is not None:
                waits.append(asyncio.ensure_future(w.proc.wait()))
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for fut in waits:
                fut.cancel()
            if self.stopping:
                return
            log.error("worker %d (pid %s) died; replacing it", w.index, w.pid)
            await w.kill()
            self.on_lost(w)
            for attempt, delay in enumerate(itertools.chain(WORKER_RESTART_BACKOFF_S, itertools.repeat(5.0))):
                if self.stopping:
                    return
                try:
                    await w.start(self.env())
                    self.restarts += 1
                    self.on_ready(w)
                    break
                except (SandboxSetupError, OSError) as exc:
                    log.error("worker %d restart %d failed: %s", w.index, attempt + 1, exc)
                    await asyncio.sleep(delay)

    def refresh(self, index: int) -> None:
        """Read a worker's health now (it said a kind has started: the node is ready sooner than its next ping)."""
        w = self.procs[index]

        async def ping() -> None:
            with contextlib.suppress(SandboxdError, TimeoutError):
                w.health = await asyncio.wait_for(w.ping(), self.settings.worker_ping_timeout_s)

        task = asyncio.get_running_loop().create_task(ping())
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    async def _ping(self, w: WorkerProc) -> None:
        while not self.stopping:
            await asyncio.sleep(self.settings.worker_ping_interval_s)
            if not w.alive:
                continue
            try:
                w.health = await asyncio.wait_for(w.ping(), self.settings.worker_ping_timeout_s)
            except TimeoutError:
                log.error(
                    "worker %d did not answer a ping in %.1fs; replacing it",
                    w.index,
                    self.settings.worker_ping_timeout_s,
                )
                await w.kill()
            except SandboxdError:
                pass

    async def stop(self) -> None:
        self.stopping = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(w.stop(self.settings.shutdown_grace_s) for w in self.procs))
