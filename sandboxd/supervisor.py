"""The gateway's side of the workers: spawn, talk to, health-check and replace them.

A ``WorkerHandle`` is one worker process and its socket; calls are multiplexed
by id. The ``Supervisor`` owns their lifecycle (uvicorn's multiprocess
supervisor is the model): a worker whose socket closes or that stops answering
pings is killed and replaced, and only the steps and sessions it held fail.
Each replacement bumps the slot's ``generation``, which is how sessions learn
that their sandbox went with the old process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

from sandboxd import ipc
from sandboxd.config import NodeSettings
from sandboxd.constants import WORKER_RESTART_BACKOFF_S, WORKER_START_TIMEOUT_S
from sandboxd.errors import SandboxdError, SandboxSetupError, ShuttingDown, WorkerDied, from_dict

log = logging.getLogger("sandboxd.workers")


class WorkerHandle:
    def __init__(self, index: int, settings: NodeSettings) -> None:
        self.index = index
        self.settings = settings
        self.generation = 0
        self.proc: asyncio.subprocess.Process | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.ids = itertools.count(1)
        self.capacity: dict[str, int] = {}
        self.alive = False
        self.stopping = False  # set by stop(): steps cut off now failed because the node is draining
        self.dead = asyncio.Event()
        self.health: dict[str, Any] = {}
        self._reader_task: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    async def start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ)
        env["SANDBOXD_WORKER_SETTINGS"] = self.settings.model_dump_json()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sandboxd.workerproc",
            "--index",
            str(self.index),
            "--fd",
            str(theirs.fileno()),
            pass_fds=(theirs.fileno(),),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
        )
        theirs.close()
        reader, self.writer = await asyncio.open_unix_connection(sock=ours, limit=512 << 20)
        try:
            hello = await asyncio.wait_for(ipc.read(reader), WORKER_START_TIMEOUT_S)
        except TimeoutError:
            hello = None
        if not hello or not hello.get("ok"):
            await self.kill()
            why = hello.get("error") if hello else "no answer"
            raise SandboxSetupError(f"worker {self.index} failed to start: {why}", worker=self.index)
        self.capacity = dict(hello["capacity"])
        self.generation += 1
        self.alive = True
        self.dead = asyncio.Event()
        self._reader_task = asyncio.create_task(self._read_loop(reader))

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        while True:
            msg = await ipc.read(reader)
            if msg is None:
                break
            fut = self.pending.pop(msg.get("id", -1), None)
            if fut is None or fut.done():
                continue
            if msg.get("ok"):
                fut.set_result(msg.get("result"))
            else:
                fut.set_exception(from_dict(msg.get("error") or {}))
        self._mark_dead("its channel closed")

    def _mark_dead(self, why: str) -> None:
        if not self.alive:
            return
        self.alive = False
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                err: SandboxdError = (
                    ShuttingDown(f"the node shut down before this step finished ({why})", worker=self.index)
                    if self.stopping
                    else WorkerDied(f"worker {self.index} (pid {self.pid}) died mid-step: {why}", worker=self.index)
                )
                fut.set_exception(err)
        self.dead.set()

    async def call(self, op: str, **fields: Any) -> Any:
        if not self.alive or self.writer is None:
            raise WorkerDied(f"worker {self.index} is not running", worker=self.index)
        msg_id = next(self.ids)
        frame = ipc.pack({"id": msg_id, "op": op, **fields})  # before registering: a bad message leaks nothing
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[msg_id] = fut
        try:
            self.writer.write(frame)
        except (ConnectionError, RuntimeError) as exc:
            self.pending.pop(msg_id, None)
            raise WorkerDied(f"worker {self.index}: {exc}", worker=self.index) from exc
        try:
            return await fut
        finally:
            self.pending.pop(msg_id, None)

    async def kill(self) -> None:
        self._mark_dead("killed by the supervisor")
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.close()
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(Exception):
                await self.proc.wait()

    async def stop(self, grace_s: float) -> None:
        """Ask the worker to close its runners (jails, sessions), then make sure it is gone."""
        self.stopping = True
        if self.alive and self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.write(ipc.pack({"op": "shutdown"}))
                await self.writer.drain()
        if self.proc is not None and self.proc.returncode is None:
            try:
                await asyncio.wait_for(self.proc.wait(), max(grace_s, 1.0))
            except TimeoutError:
                log.warning("worker %d did not stop in %.1fs; killing it", self.index, grace_s)
        await self.kill()


class Supervisor:
    """Starts the workers, pings them, and replaces any that die or hang."""

    def __init__(self, settings: NodeSettings, on_lost: Callable[[int], None]) -> None:
        self.settings = settings
        self.workers = [WorkerHandle(i, settings) for i in range(settings.worker_count())]
        self.on_lost = on_lost
        self._tasks: list[asyncio.Task[None]] = []
        self.stopping = False
        self.on_ready: Callable[[WorkerHandle], None] = lambda w: None

    async def start(self) -> None:
        await asyncio.gather(*(w.start() for w in self.workers))
        for w in self.workers:
            self._tasks.append(asyncio.create_task(self._watch(w)))
            self._tasks.append(asyncio.create_task(self._ping(w)))

    async def _watch(self, w: WorkerHandle) -> None:
        while not self.stopping:
            await w.dead.wait()
            if self.stopping:
                return
            log.error("worker %d (pid %s) died; replacing it", w.index, w.pid)
            self.on_lost(w.index)
            await w.kill()
            for attempt, delay in enumerate(itertools.chain(WORKER_RESTART_BACKOFF_S, itertools.repeat(5.0))):
                if self.stopping:
                    return
                try:
                    await w.start()
                    self.on_ready(w)
                    break
                except SandboxSetupError as exc:
                    log.error("worker %d restart %d failed: %s", w.index, attempt + 1, exc)
                    await asyncio.sleep(delay)

    async def _ping(self, w: WorkerHandle) -> None:
        while not self.stopping:
            await asyncio.sleep(self.settings.worker_ping_interval_s)
            if not w.alive:
                continue
            try:
                w.health = await asyncio.wait_for(w.call("ping"), self.settings.worker_ping_timeout_s)
            except TimeoutError:
                log.error(
                    "worker %d did not answer a ping in %.1fs; replacing it",
                    w.index,
                    self.settings.worker_ping_timeout_s,
                )
                await w.kill()
            except WorkerDied:
                pass

    async def stop(self) -> None:
        self.stopping = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(w.stop(self.settings.shutdown_grace_s) for w in self.workers))
