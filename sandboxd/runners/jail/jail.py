"""One nsjail jail holding a warm zygote, and the monitors it hands out.

The jail is started once per pool slot (or per session host) and lives as long
as its worker: namespaces (user, pid, mount, net, ipc, uts, cgroup), the network
namespace (a kernel-wide lock, ~0.5 ms, so never per execution), the cgroup and
the interpreter start-up (12-18 ms of CPU) are all paid here, off the request
path. See ``jailside/zygote.py`` for what happens inside.

Worker side of one execution: the zygote hands over the executor's request
socket and its stdout/stderr pipes; the worker greets the executor (to learn its
pid through SO_PASSCRED, and open a pidfd on it: kills are race-free), writes the
request, reads the output with caps, kills at the deadline, and takes the exit
status from the zygote's report, never from the program.
"""

from __future__ import annotations

import array
import ast
import asyncio
import contextlib
import functools
import json
import logging
import os
import select
import shlex
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsjail.config import Exe, IdMap, MountPt, NsJailConfig
from nsjail.enums import LogLevel, Mode, RLimitType
from nsjail.serializers.textproto import to_textproto

from sandboxd.constants import SESSION_HOME
from sandboxd.errors import SandboxSetupError
from sandboxd.runners import jailconf
from sandboxd.runners.cgroups import CgroupGroup
from sandboxd.runners.jail.config import JailConfig
from sandboxd.runners.jail.jailside import wire
from sandboxd.runners.python import environments
from sandboxd.runners.python.environments import Environment
from sandboxd.runners.starvation import Starvation
from sandboxd.spawn import Child, spawn

log = logging.getLogger(__name__)

JAILSIDE_DIR = Path(__file__).parent / "jailside"
JAILSIDE_MOUNT = "/opt/sandboxd/jailside"
ENVS_MOUNT = "/opt/sandboxd/envs"
FORK_ROOT = "/forks"  # jailside/forking.py: where a forked session's copies keep their files
THREAD_POOL_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
SANDBOX_READY_TIMEOUT_S = 10.0


def kafel_policy() -> str:
    """The jail's own filter; the per-execution one (jailside/seccomp.py) adds mount, unshare and
    namespace flags on clone on top."""
    return jailconf.kafel_policy("sandboxd_jail")


def nsjail_binary(cfg: JailConfig) -> str:
    return jailconf.nsjail_binary(cfg.nsjail_path)


def python_executable(prefix: str) -> str:
    import sys

    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    exe = Path(prefix) / "bin" / name
    if not exe.exists():
        raise SandboxSetupError(f"no {name} under python prefix {prefix}")
    return str(exe)


def env_path(env: Environment) -> str:
    """Where ``env``'s package tree is in every jail. Under ``/usr`` (the default directory) it is there
    already, read-only, at its own path: no mount of its own, which every execution's mount namespace
    would copy (one bind mount more cost B1 ~1.5% of its one-shots/s, measured side by side). Elsewhere
    it is bound at a fixed path (never under /tmp, which each execution gets afresh)."""
    if env.site.startswith("/usr/"):
        return env.site
    return f"{ENVS_MOUNT}/{env.name}/site"


def jail_environments(cfg: JailConfig) -> list[tuple[str, Environment]]:
    """The environments a jail serves, in the order the zygote numbers them (``action.env`` -> index)."""
    return list(environments.served(cfg.environments_dir).items())  # by name, as ``served`` keeps them


JAIL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}


@functools.cache
def startup_modules(prefix: str) -> tuple[str, ...]:
    """The modules ``python main.py`` of the jail's interpreter holds when ``main.py`` starts (asked once per
    process): the zygote has them too, and a step's own file named like one loses, as there."""
    exe = python_executable(prefix)
    probe = "import sys; print(repr(sorted(sys.modules)))"  # importing json here would count json, re, ..."
    env = {**JAIL_ENV, "LD_LIBRARY_PATH": f"{prefix}/lib"}
    try:
        out = subprocess.run([exe, "-s", "-c", probe], env=env, cwd="/", capture_output=True, timeout=30, check=True)
        names = ast.literal_eval(out.stdout.decode())
    except (OSError, subprocess.SubprocessError, ValueError, SyntaxError) as exc:
        raise SandboxSetupError(f"cannot ask {exe} which modules it starts with: {exc!r}") from exc
    return tuple(str(n) for n in names if n != "__main__")


def build_config(cfg: JailConfig, mode: str = "oneshot", hostname: str = "sandbox") -> NsJailConfig:
    """The jail: empty tmpfs root, read-only system and interpreter, nothing of /run, /var, /home (sessions:
    only ``SESSION_HOME``, their own /tmp bound again); the built environments read-only at their own path."""
    prefix = cfg.resolved_prefix()
    mounts = [
        *jailconf.base_mounts("size=1m", "size=1m"),
        MountPt(src=prefix, dst=prefix, is_bind=True),
        MountPt(src=str(JAILSIDE_DIR), dst=JAILSIDE_MOUNT, is_bind=True),
    ]
    if mode == "session":  # where each session sees its /tmp again (the executor binds it): E2B's home
        mounts.append(MountPt(dst=SESSION_HOME, fstype="tmpfs", rw=False, is_dir=True, options="size=4k,mode=0755"))
        # ... and where each session mounts a tmpfs for the copies a fork makes of it
        mounts.append(MountPt(dst=FORK_ROOT, fstype="tmpfs", rw=False, is_dir=True, options="size=4k,mode=0755"))
    envs = jail_environments(cfg)
    mounts += [MountPt(src=env.site, dst=env_path(env), is_bind=True) for _, env in envs if env_path(env) != env.site]
    served = [[env_path(env), cfg.preload.get(name, [])] for name, env in envs]
    return NsJailConfig(
        name="sandboxd",
        mode=Mode.ONCE,
        hostname=hostname,
        cwd="/tmp",
        time_limit=0,
        nice_level=0,
        log_level=LogLevel.WARNING,
        # LD_LIBRARY_PATH: a copied pyenv build still has its RPATH pointing at the original tree.
        envar=[
            *(f"{k}={v}" for k, v in JAIL_ENV.items() if k != "PATH"),
            f"PATH={prefix}/bin:{JAIL_ENV['PATH']}",  # python and python3 are the jail's interpreter
            f"LD_LIBRARY_PATH={prefix}/lib",
            # Native libraries' thread pools: one thread each, so a template forks safely (a fork copies
            # one thread; a pool's others would be gone in every child) and a step uses its one core.
            *(f"{var}=1" for var in THREAD_POOL_VARS),
            "MPLBACKEND=Agg",
            "MPLCONFIGDIR=/tmp/.matplotlib",
        ],
        uidmap=[IdMap(inside_id=str(jailconf.JAIL_UID), outside_id=str(jailconf.JAIL_UID))],
        gidmap=[IdMap(inside_id=str(jailconf.JAIL_UID), outside_id=str(jailconf.JAIL_UID))],
        rlimit_as_type=RLimitType.INF,
        rlimit_cpu_type=RLimitType.INF,
        rlimit_fsize=cfg.fsize_mb,
        rlimit_nofile=max(cfg.nofile, 64),
        rlimit_nproc_type=RLimitType.SOFT,  # raising it is refused in the user namespace; cgroup pids caps it
        rlimit_core=0,
        # The zygote keeps the jail's capabilities (inside the jail's user
        # namespace only) to build each executor's mount/pid namespaces; every
        # executor drops them all before it reads its request.
        keep_caps=True,
        clone_newnet=True,
        clone_newcgroup=True,
        mount=mounts,
        seccomp_string=[kafel_policy()],
        exec_bin=Exe(
            path=python_executable(prefix),
            arg=[
                *("-I", "-S", "-B", f"{JAILSIDE_MOUNT}/zygote.py", mode, str(cfg.tmpfs_mb << 20)),
                *(json.dumps(served), json.dumps(startup_modules(prefix))),
            ],
        ),
    )


@dataclass
class Executor:
    """A namespaced, locked-down process waiting for its request (or its session's steps)."""

    ex_id: int
    sock: socket.socket
    out_r: int
    err_r: int
    pidfd: int
    host_pid: int
    exit: asyncio.Future[dict[str, Any]]
    flavor: int | None = None  # the environment whose template it was forked from (its preloads); None: lean
    users: int = 0  # steps, forks and readers working on its descriptors now (``in_use``)
    closing: bool = False  # closed while in use: its descriptors go when the last user lets go

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self.pidfd, sig)

    def alive(self) -> bool:
        """Still running: judged by its pidfd (readable once the process exited), never by a pid number."""
        if self.pidfd < 0 or self.exit.done():
            return False
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return not poller.poll(0)

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """While a step, a fork or a reader works on its descriptors (the loop watches them): ``close`` then
        only kills, and they are released when the last user lets go. A descriptor closed under the loop's
        watch leaves it polling whatever gets that number next."""
        self.users += 1
        try:
            yield
        finally:
            self.users -= 1
            if self.closing and self.users == 0:
                self._release()

    def close(self) -> None:
        """Kill (a no-op once it has exited) and release every descriptor (see ``in_use``)."""
        self.kill()
        if self.users:
            self.closing = True
            return
        self._release()

    def _release(self) -> None:
        for fd in (self.out_r, self.err_r, self.pidfd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.out_r = self.err_r = self.pidfd = -1
        self.sock.close()


@dataclass
class Output:
    """What one step wrote to stdout and stderr, capped, with the totals."""

    cap: int
    kill_at: int
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    out_total: int = 0
    err_total: int = 0

    def add(self, which: int, chunk: bytes) -> bool:
        """Keep what fits; return True when the stream went past ``kill_at``."""
        buf = self.out if which == 1 else self.err
        room = self.cap - len(buf)
        if room > 0:
            buf += chunk[:room]
        if which == 1:
            self.out_total += len(chunk)
            return self.out_total > self.kill_at
        self.err_total += len(chunk)
        return self.err_total > self.kill_at


# What a session's process may send back after a step: {"op": "done", "exit_code": N}, nothing more.
# User code runs in that process and can write to the channel: anything larger is a broken sandbox.
SESSION_REPLY_MAX_HEADER_BYTES = 4096


class ChannelGarbage(wire.WireError):
    """A frame that is too large or unreadable (not a channel that closed because its process died)."""


async def recv_frame(
    sock: socket.socket, max_header: int = wire.MAX_HEADER_BYTES, max_body: int = wire.MAX_BODY_BYTES
) -> tuple[dict[str, Any], bytes]:
    loop = asyncio.get_running_loop()
    buf = bytearray()
    while len(buf) < wire.PREFIX.size:
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            raise wire.WireError("sandbox closed its channel")
        buf += chunk
    try:
        head_len, body_len = wire.decode_prefix(bytes(buf[: wire.PREFIX.size]))
    except wire.WireError as exc:
        raise ChannelGarbage(str(exc)) from exc
    if head_len > max_header or body_len > max_body:
        raise ChannelGarbage(f"frame of {head_len}+{body_len} bytes where at most {max_header}+{max_body} fit")
    total = wire.PREFIX.size + head_len + body_len
    while len(buf) < total:
        chunk = await loop.sock_recv(sock, max(65536, total - len(buf)))
        if not chunk:
            raise wire.WireError("sandbox closed its channel")
        buf += chunk
    if len(buf) > total:  # the harness writes one frame per request: more is the program writing on the channel
        raise ChannelGarbage(f"{len(buf) - total} bytes after the frame")
    try:
        header = json.loads(bytes(buf[wire.PREFIX.size : wire.PREFIX.size + head_len]))
    except ValueError as exc:
        raise ChannelGarbage(f"unreadable frame header: {exc}") from exc
    if not isinstance(header, dict):
        raise ChannelGarbage("frame header is not an object")
    return header, bytes(buf[wire.PREFIX.size + head_len : total])


async def _recvmsg(sock: socket.socket, bufsize: int, ancsize: int) -> tuple[bytes, list[tuple[int, int, bytes]]]:
    """``recvmsg`` for a non-blocking socket (asyncio has no ancillary-data API). Descriptors arrive
    close-on-exec: a process the worker starts later (a jail, an SQL engine) must never hold a sandbox's
    pipe, or closing it here would leave the worker's loop polling a file that is still open elsewhere."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data, anc, _flags, _addr = sock.recvmsg(bufsize, ancsize, socket.MSG_CMSG_CLOEXEC)
            return data, anc
        except BlockingIOError:
            fut: asyncio.Future[None] = loop.create_future()
            loop.add_reader(sock.fileno(), _wake, fut)
            try:
                await fut
            finally:
                loop.remove_reader(sock.fileno())


async def introduction(sock: socket.socket, max_bytes: int) -> tuple[dict[str, Any], int]:
    """Greet a process on its channel (SO_PASSCRED set) and read its first frame: (frame, its host pid, 0
    when the kernel attached none). An executor and a fork's member introduce themselves this way."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(BrokenPipeError):  # it failed early; its error frame waits below
        await loop.sock_sendall(sock, wire.encode({"op": "hello"}))
    data, anc = await _recvmsg(sock, max_bytes, socket.CMSG_SPACE(12))
    host_pid = 0
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            host_pid = int.from_bytes(payload[:4], "little", signed=True)
    if len(data) < wire.PREFIX.size:
        raise wire.WireError(f"sent {len(data)} bytes instead of its first frame")
    head_len, _ = wire.decode_prefix(data[: wire.PREFIX.size])
    first: dict[str, Any] = json.loads(data[wire.PREFIX.size : wire.PREFIX.size + head_len])
    return first, host_pid


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Jail:
    """A running nsjail + zygote; hands out executors in the given ``mode``."""

    def __init__(self, name: str, mode: str, cfg: JailConfig, cgroup: CgroupGroup, runtime_dir: Path) -> None:
        self.name, self.mode, self.cfg, self.cgroup = name, mode, cfg, cgroup
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
        self.runtime_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = self.runtime_dir / f"{self.name}.cfg"
        cfg_path.write_text(to_textproto(build_config(self.cfg, self.mode)))
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
            header = await asyncio.wait_for(self._next_ctl_frame(), SANDBOX_READY_TIMEOUT_S)
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
            data, anc = await _recvmsg(self.ctl, 65536, socket.CMSG_SPACE(16 * 4) + socket.CMSG_SPACE(12))
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


CHANNEL_CLOSED_GRACE_S = 1.0  # a session channel at EOF: how long its executor's exit report may lag
STAGE_FAILED = 125  # a one-shot executor's status when the step's files could not be written (it said why)
HARNESS_FRAME_TIMEOUT_S = 2.0  # the executor has exited: its last frame is already in the socket


def _exit_code(ex: Executor) -> int | None:
    if ex.exit.done() and ex.exit.exception() is None:
        code = ex.exit.result().get("exit_code")
        return code if isinstance(code, int) else None
    return None


async def _harness_frame(
    sock: socket.socket, max_body: int, reading: asyncio.Future[tuple[dict[str, Any], bytes]] | None = None
) -> tuple[dict[str, Any], bytes] | None:
    """The one-shot harness's last word (files it fetched, or why it could not stage the step), if it sent
    one. Only the harness ever holds a one-shot's channel: the program runs after it is closed, or in a
    child that closed it first. ``reading``: the read, started when the request went out (a frame larger
    than the socket's buffer is only sent whole while someone reads it, and the harness exits after)."""
    try:
        async with asyncio.timeout(HARNESS_FRAME_TIMEOUT_S):
            return await (reading if reading is not None else recv_frame(sock, wire.MAX_HEADER_BYTES, max_body))
    except (TimeoutError, wire.WireError, OSError):
        return None


async def run_step(
    ex: Executor,
    header: dict[str, Any],
    body: bytes,
    timeout_s: float,
    cap: int,
    kill_at: int,
    session: bool,
    grace_s: float,
    account: Callable[[], Starvation] | None = None,
) -> tuple[dict[str, Any], Output]:
    """Feed one request to ``ex``; collect output; enforce the wall clock and the output cap.

    ``account``: the step's account of its own time, opened when its request goes out; given, time the
    program was kept off the CPU by others is given back at the deadline (``starvation.py``)."""
    with ex.in_use():
        return await _run_step(ex, header, body, timeout_s, cap, kill_at, session, grace_s, account)


async def _run_step(
    ex: Executor,
    header: dict[str, Any],
    body: bytes,
    timeout_s: float,
    cap: int,
    kill_at: int,
    session: bool,
    grace_s: float,
    account: Callable[[], Starvation] | None,
) -> tuple[dict[str, Any], Output]:
    loop = asyncio.get_running_loop()
    out = Output(cap, kill_at)
    done: asyncio.Future[None] = loop.create_future()
    open_fds = {ex.out_r: 1, ex.err_r: 2}
    killed_by: str | None = None
    timed_out = False
    harness: tuple[dict[str, Any], bytes] | None = None

    def readable(fd: int) -> None:
        nonlocal killed_by
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            loop.remove_reader(fd)
            open_fds.pop(fd, None)
            if not open_fds and not session and not done.done():
                done.set_result(None)
            return
        if out.add(open_fds[fd], chunk) and killed_by is None:
            killed_by = "output"
            ex.kill()

    for fd in open_fds:
        loop.add_reader(fd, readable, fd)
    step_exit: dict[str, Any] | None = None
    reading: asyncio.Future[tuple[dict[str, Any], bytes]] | None = None
    try:
        await loop.sock_sendall(ex.sock, wire.encode(header, body))
        if not session and "fetch" in header:
            reading = asyncio.ensure_future(
                recv_frame(ex.sock, wire.MAX_HEADER_BYTES, header.get("fetch_max_bytes", 0))
            )
        starvation = account() if account is not None else None
        # One-shot: the program is done when its executor (init of its pid namespace) exits, not when
        # its pipes close: a program that closes stdout and stderr and sleeps is still running.
        waiter: asyncio.Future[Any] = (
            asyncio.ensure_future(recv_frame(ex.sock, SESSION_REPLY_MAX_HEADER_BYTES, 0)) if session else ex.exit
        )
        deadline = loop.time() + timeout_s
        interrupted = False
        while True:
            wait_on = {waiter, ex.exit}
            finished, _ = await asyncio.wait(
                wait_on, timeout=max(0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED
            )
            if waiter in finished and (not session or waiter.exception() is None):
                if session:
                    step_exit = waiter.result()[0]
                    code = step_exit.get("exit_code")
                    ours = step_exit.get("tag") == header.get("tag")
                    if ours and step_exit.get("op") == "stage_error":
                        break  # the cell never ran: its files could not be written
                    if not ours or step_exit.get("op") != "done" or not isinstance(code, int) or isinstance(code, bool):
                        # A frame the program wrote itself: not the reply to this request (an earlier cell's
                        # forgery leaves the real reply behind it, answering the wrong cell). The session ends.
                        step_exit = None
                        killed_by = killed_by or "protocol"
                        ex.kill()
                break
            if ex.exit in finished or (session and waiter in finished):
                if session and not ex.exit.done():
                    if not isinstance(waiter.exception(), ChannelGarbage):
                        # The channel closed: its executor dying (its exit report follows at once), or the
                        # program closing the descriptor itself (it runs in that process; nothing else holds it).
                        await asyncio.wait({ex.exit}, timeout=CHANNEL_CLOSED_GRACE_S)
                    if not ex.exit.done():
                        killed_by = killed_by or "protocol"  # garbage on, or a close of, its own channel
                        ex.kill()
                break  # the executor died (killed at a limit, or its kernel crashed)
            if starvation is not None and not interrupted:
                more = starvation.more_s()
                if more > 0:
                    deadline = loop.time() + more
                    continue
            timed_out = True
            if session and not interrupted:
                ex.kill(signal.SIGINT)  # like a notebook: interrupt first, state survives
                interrupted = True
                deadline = loop.time() + grace_s
                continue
            killed_by = killed_by or "time"
            ex.kill()
            await asyncio.wait({ex.exit}, timeout=SANDBOX_READY_TIMEOUT_S)
            break
        if session and step_exit is None and not ex.exit.done():
            await asyncio.wait({ex.exit}, timeout=SANDBOX_READY_TIMEOUT_S)
        if not session:
            await asyncio.wait({ex.exit}, timeout=SANDBOX_READY_TIMEOUT_S)  # the zygote's report
            # Everything in its pid namespace died with it, so the pipes close at once.
            await asyncio.wait({done}, timeout=SANDBOX_READY_TIMEOUT_S)
            if killed_by is None and not timed_out and ("fetch" in header or _exit_code(ex) == STAGE_FAILED):
                harness = await _harness_frame(ex.sock, header.get("fetch_max_bytes", 0), reading)
        if session and not waiter.done():
            waiter.cancel()
        elif session and not waiter.cancelled():
            waiter.exception()  # retrieved: a channel that closed with its executor is not worth a log line
    finally:
        if reading is not None:
            if not reading.done():
                reading.cancel()
            elif not reading.cancelled():
                reading.exception()  # retrieved: a channel that closed with its executor says nothing more
        for fd in list(open_fds):
            loop.remove_reader(fd)
            # drain what was written before the step ended
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except OSError:
                    break
                if not chunk:
                    break
                out.add(open_fds[fd], chunk)
    result: dict[str, Any] = {"timed_out": timed_out, "killed_by": killed_by}
    if timed_out and starvation is not None and starvation.starved:
        result.update(starved=True, kept_s=starvation.kept_s, wall_s=starvation.wall_cap_s)
    if step_exit is not None and step_exit.get("op") == "stage_error":
        result.update(stage_error=str(step_exit.get("error")), exit_code=None, signal=None, alive=True)
    elif step_exit is not None:
        result.update(exit_code=int(step_exit["exit_code"]), signal=None, alive=True)
    elif ex.exit.done() and ex.exit.exception() is None:
        result.update(ex.exit.result(), alive=False)
    else:
        result.update(exit_code=None, signal=None, alive=False, lost=True)
    if harness is not None:
        head, files = harness
        if head.get("op") == "stage_error":
            result["stage_error"] = str(head.get("error"))
        elif head.get("op") == "fetched":
            # The program's own status, as the process that ran nothing of it saw it end, and its files.
            result.update(exit_code=head.get("exit_code"), signal=head.get("signal"), fetched=(head, files))
    elif "fetch" in header:
        result["fetched"] = None  # the sandbox ended before the files could be read
    if "fetch" in header:
        result["fetch_paths"] = header["fetch"]
    return result, out
