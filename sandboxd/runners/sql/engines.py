"""Worker side of the SQL engine processes: start the fork server, spawn engines, talk to them.

An ``Engine`` is one DuckDB process in its own cgroup (see ``engine.py`` for
what it does to itself before it serves). The worker addresses it only by the
pidfd the fork server sent, so a kill can never reach a process that merely
inherited its number.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from sandboxd import ipc
from sandboxd.errors import SandboxSetupError
from sandboxd.runners.cgroups import CgroupGroup
from sandboxd.runners.sql.engine import SPILL_DIR
from sandboxd.spawn import Child, spawn

MAX_SPILL_ENTRIES = 10_000


class EngineGone(Exception):
    """The engine process ended (killed at a limit, crashed, or killed by us) before it answered."""


async def read_frame(reader: asyncio.StreamReader, limit: int) -> dict[str, Any] | None:
    """The engine's next answer (``ipc`` framing), None once it closed; a bad frame is ``EngineGone``."""
    try:
        return await ipc.read(reader, limit)
    except ValueError as exc:
        raise EngineGone(f"the engine sent a bad frame: {exc}") from None


@dataclass(eq=False)  # compared and hashed by identity: a set of live engines
class Engine:
    name: str
    pid: int
    pidfd: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    cgroup: CgroupGroup
    temp_dir: Path
    frame_limit: int
    killed_by: str | None = None  # why the worker killed it: "time", "disk" or "closed"
    recycle: bool = False  # a slot engine that should not serve another one-shot (it said so)
    closed: bool = False

    async def request(self, body: dict[str, Any], deadline_s: float) -> dict[str, Any]:
        """Send a statement, wait for its answer; past ``deadline_s`` the engine is killed (``EngineGone``)."""
        try:
            self.writer.write(ipc.pack(body))
            await self.writer.drain()
            answer = await asyncio.wait_for(read_frame(self.reader, self.frame_limit), deadline_s)
        except TimeoutError:
            self.kill("time")
            raise EngineGone(f"no answer within {deadline_s:g}s") from None
        except ConnectionError as exc:
            raise EngineGone(str(exc)) from None
        if answer is None:
            raise EngineGone("the engine process ended")
        return answer

    def spill_bytes(self) -> int:
        """Disk the engine's spill directory holds now, subdirectories included (``COPY ... PARTITION_BY``
        writes there too: DuckDB allows statements its temp directory); allocated blocks, as files can be
        sparse. Counts at most ``MAX_SPILL_ENTRIES`` entries: more is treated as over any budget."""
        total = entries = 0
        for root, dirs, files in os.walk(self.temp_dir / SPILL_DIR):
            for name in [*dirs, *files]:
                entries += 1
                if entries > MAX_SPILL_ENTRIES:
                    return 1 << 62
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(root, name)).st_blocks * 512
        return total

    def has_spilled(self) -> bool:
        """Anything in the spill directory: a slot engine that leaves files there is not reused."""
        try:
            with os.scandir(self.temp_dir / SPILL_DIR) as it:
                return any(True for _ in it)
        except OSError:
            return False

    def kill(self, reason: str | None = None) -> None:
        """SIGKILL through the pidfd; a no-op once closed. (Before, a kill after close signalled whatever
        the worker had reopened under that fd number: a python executor's pidfd, found SIGKILLed idle.)"""
        if self.killed_by is None:
            self.killed_by = reason
        if self.pidfd < 0:
            return
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    async def close(self) -> None:
        """Kill the process, then remove its cgroup and spill directory (off the event loop: both can block)."""
        if self.closed:
            return
        self.closed = True
        self.kill()
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        pidfd, self.pidfd = self.pidfd, -1  # never used again: the number will be someone else's
        os.close(pidfd)
        await asyncio.to_thread(self._clean)

    def _clean(self) -> None:
        for _ in range(3):
            if self.cgroup.remove():
                break
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _recv_fds(sock: socket.socket, bufsize: int, maxfds: int) -> tuple[bytes, list[int]]:
    """``socket.recv_fds`` with the descriptors close-on-exec (the standard one drops its ``flags``): an engine's
    pidfd must not live on in a jail the worker starts later."""
    fds = array.array("i")
    msg, anc, _flags, _addr = sock.recvmsg(bufsize, socket.CMSG_LEN(maxfds * fds.itemsize), socket.MSG_CMSG_CLOEXEC)
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    return msg, list(fds)


class EngineHost:
    """The worker's fork server of DuckDB engines (one per worker; it runs no statement itself)."""

    def __init__(self, config: dict[str, Any], temp_root: Path, frame_limit: int, start_timeout_s: float) -> None:
        self.config = config
        self.start_timeout_s = start_timeout_s  # fork + opening the database
        self.temp_root = temp_root
        self.frame_limit = frame_limit
        self.proc: Child | None = None
        self.ctl: socket.socket | None = None
        self.lock = asyncio.Lock()
        self.ids = itertools.count(1)

    async def start(self) -> None:
        """Start the fork server; from the loop's thread, since its parent-death signal follows that thread."""
        self.temp_root.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            config = orjson.dumps(self.config).decode()
            self.proc = spawn(
                [sys.executable, "-m", "sandboxd.runners.sql.engine", config, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        ours.settimeout(self.start_timeout_s)
        self.ctl = ours

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def spawn(self, name: str, cgroup: CgroupGroup, duckdb_memory_mb: int) -> Engine:
        """A new engine in ``cgroup``, ready to serve (its database open, its privileges dropped)."""
        if not self.alive():
            await self.stop()
            await self.start()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        temp_dir = self.temp_root / name
        req = {
            "id": next(self.ids),
            "cgroup_procs": [str(p) for p in cgroup.procs_files],
            "temp_dir": str(temp_dir),
            "duckdb_memory_mb": duckdb_memory_mb,
        }
        try:
            async with self.lock:  # one request at a time on the control socket
                pid, pidfd = await asyncio.to_thread(self._fork, req, theirs)
        finally:
            theirs.close()
        try:
            reader, writer = await asyncio.open_unix_connection(sock=ours, limit=1 << 16)
        except OSError as exc:
            os.close(pidfd)
            ours.close()
            raise SandboxSetupError(f"sql engine socket: {exc}") from exc
        engine = Engine(name, pid, pidfd, reader, writer, cgroup, temp_dir, self.frame_limit)
        try:
            ready = await asyncio.wait_for(read_frame(reader, self.frame_limit), self.start_timeout_s)
        except (TimeoutError, EngineGone):
            ready = None
        if not ready or not ready.get("ready"):
            await engine.close()
            raise SandboxSetupError("the SQL engine did not start (see the worker's log)")
        return engine

    def _fork(self, req: dict[str, Any], theirs: socket.socket) -> tuple[int, int]:
        assert self.ctl is not None
        try:
            socket.send_fds(self.ctl, [orjson.dumps(req)], [theirs.fileno()])
            msg, fds = _recv_fds(self.ctl, 1 << 16, 1)
        except OSError as exc:
            raise SandboxSetupError(f"the SQL fork server does not answer: {exc}") from exc
        if not msg:
            raise SandboxSetupError("the SQL fork server has exited")
        answer = orjson.loads(msg)
        if answer.get("id") != req["id"] or not fds:
            for fd in fds:
                os.close(fd)
            raise SandboxSetupError(f"the SQL fork server failed: {answer.get('error', answer)}")
        return int(answer["pid"]), fds[0]

    async def stop(self) -> None:
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        self.proc = None
