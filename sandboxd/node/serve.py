"""``sandboxd serve``: one node on this machine, the node process and its front processes.

This process binds the node's port once and is the node process (``core.py``); it starts K front
processes that all accept from that one listening socket, and replaces any that dies (its own in-flight
requests are lost, nothing else: sessions live in the workers, quotas and keys here). Also
``python -m sandboxd.node``: the node process alone, for front processes someone else runs (gunicorn's
workers, or an app on its own that started it).

Shutdown, from the first SIGTERM or SIGINT: the port stays open while the node drains (new steps and
sessions answered 503 ``shutting_down``, /readyz 503, steps in flight finishing), for at least
``shutdown_drain_s`` and at most ``shutdown_grace_s``; then the fronts stop, then the workers. A second
signal skips what is left of the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

from sandboxd.config import NodeSettings
from sandboxd.eager import use_eager_tasks
from sandboxd.metrics import MULTIPROC_ENV
from sandboxd.node.core import NodeCore, node_socket
from sandboxd.node.probes import serve_probes
from sandboxd.spawn import Child, spawn

log = logging.getLogger("sandboxd.node")
FRONT_RESTART_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)


def listen(settings: NodeSettings) -> socket.socket:
    """The node's port, bound once; every front process accepts from this socket."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((settings.host, settings.port))
    sock.listen(4096)
    return sock


class Fronts:
    """K front processes on one listening socket; a front that dies is started again."""

    def __init__(self, settings: NodeSettings, core: NodeCore, sock: socket.socket) -> None:
        self.settings = settings
        self.core = core
        self.sock = sock
        self.procs: list[Child | None] = [None] * settings.front_count()
        self.stopping = False
        self.restarts = 0
        self._tasks: list[asyncio.Task[None]] = []

    def _env(self) -> dict[str, str]:
        joined = self.settings.model_copy(update={"node_socket": node_socket(self.settings.runtime_dir)})
        env = dict(os.environ)
        env["SANDBOXD_NODE_SETTINGS"] = joined.model_dump_json()
        env[MULTIPROC_ENV] = str(Path(self.settings.runtime_dir) / "metrics")
        return env

    async def _spawn(self, index: int) -> Child:
        fd = self.sock.fileno()
        # pass_fds: the fronts get the port; the socket is not inheritable, so nothing else the node starts
        # (a worker, its jails, its SQL engines) holds it, where it could accept other tenants' requests.
        return spawn(
            [sys.executable, "-m", "sandboxd.front", "--index", str(index), "--fd", str(fd)],
            env=self._env(),
            pass_fds=(fd,),
        )

    async def start(self) -> None:
        """The fronts started and joined: on a slow machine (an emulated guest, a busy host) importing the app
        takes minutes, so they get the workers' patience (``worker_start_timeout_s``), not a fixed one."""
        timeout_s = self.settings.worker_start_timeout_s
        for i in range(len(self.procs)):
            self.procs[i] = await self._spawn(i)
        deadline = time.monotonic() + timeout_s
        while len(self.core.fronts) < len(self.procs):  # each joins the node when its app has started
            if any(p is not None and p.returncode is not None for p in self.procs):
                raise RuntimeError("a front process exited while starting (see its log above)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"front processes did not join the node in {timeout_s:g}s (worker_start_timeout_s)")
            await asyncio.sleep(0.05)
        self._tasks = [asyncio.create_task(self._watch(i)) for i in range(len(self.procs))]

    async def _watch(self, index: int) -> None:
        attempt = 0
        while not self.stopping:
            proc = self.procs[index]
            assert proc is not None
            code = await proc.wait()
            if self.stopping:
                return
            log.error("front process %d (pid %s) exited (%s); starting it again", index, proc.pid, code)
            with contextlib.suppress(Exception):
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(proc.pid)  # type: ignore[no-untyped-call]
            await asyncio.sleep(FRONT_RESTART_BACKOFF_S[min(attempt, len(FRONT_RESTART_BACKOFF_S) - 1)])
            attempt += 1
            self.procs[index] = await self._spawn(index)
            self.restarts += 1

    async def stop(self, grace_s: float) -> None:
        """Tell each front to stop (uvicorn's graceful shutdown: its in-flight requests finish), then make sure."""
        self.stopping = True
        for t in self._tasks:
            t.cancel()
        for ch in list(self.core.fronts):
            ch.event("stop")
        procs = [p for p in self.procs if p is not None and p.returncode is None]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), grace_s + 5)
        for p in procs:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()


async def run_node(settings: NodeSettings, with_fronts: bool, on_ready: asyncio.Event | None = None) -> None:
    """The node process until a signal (or its parent's death) ends it, drained first."""
    loop = asyncio.get_running_loop()
    use_eager_tasks(loop)
    sock = listen(settings) if with_fronts else None
    if sock is not None and settings.port == 0:
        settings.port = sock.getsockname()[1]
    core = NodeCore(settings)
    signals = asyncio.Queue[int]()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    await core.start()
    fronts = Fronts(settings, core, sock) if sock is not None else None
    probes = await serve_probes(core, settings) if settings.probe_port else None
    try:
        if fronts is not None:
            await fronts.start()
        log.info("sandboxd node %s serving on %s:%d", settings.node_id, settings.host, settings.port)
        if on_ready is not None:
            on_ready.set()
        await signals.get()
        await drain(core, settings, signals)
    finally:
        if fronts is not None:
            await fronts.stop(settings.shutdown_grace_s)
        if probes is not None:
            probes.close()
        await core.stop()
        if sock is not None:
            sock.close()


async def drain(core: NodeCore, settings: NodeSettings, signals: asyncio.Queue[int]) -> None:
    """Keep the port open while the node leaves: at least ``shutdown_drain_s``, until nothing is in flight,
    at most ``shutdown_grace_s``; a second signal ends it at once."""
    core.begin_drain()
    started = time.monotonic()
    while True:
        waited = time.monotonic() - started
        if waited >= settings.shutdown_grace_s:
            return
        if waited >= settings.shutdown_drain_s and not await core.inflight():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(signals.get(), 0.05)
            return


def main() -> None:
    """``python -m sandboxd.node``: the node process alone (settings from ``SANDBOXD_NODE_SETTINGS`` or the
    environment)."""
    from sandboxd.config import load_settings, settings_model

    raw = os.environ.get("SANDBOXD_NODE_SETTINGS")
    settings = settings_model().model_validate_json(raw) if raw else load_settings()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s node %(levelname)s %(name)s: %(message)s", force=True
    )
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: an app that started us took us with it
    try:
        import uvloop

        uvloop.run(run_node(settings, with_fronts=False))
    except ImportError:
        asyncio.run(run_node(settings, with_fronts=False))
