"""The worker's side of forking a python session (the jail's side is ``jailside/forking.py``).

A fork turns the session's process into its namespaces' holder and leaves
``n + 1`` members in them: the copies and the source's continuation. Each
member gets from here its channel and output pipes (passed through the source's
channel), a cgroup of its own (joined before it copies a byte), and a pidfd;
the holder reports how each member ended, since only a parent can wait for a
process. The namespaces, and the holder, last until their last member closes.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import re
import signal
import socket
from dataclasses import dataclass, field
from typing import Any

from sandboxd.errors import BadRequest, SandboxSetupError
from sandboxd.runners.cgroups import CgroupGroup, in_group
from sandboxd.runners.jail.exchange import (
    SANDBOX_READY_TIMEOUT_S,
    SESSION_REPLY_MAX_HEADER_BYTES,
    Executor,
    introduction,
    recv_frame,
)
from sandboxd.runners.jail.jailside import landlock, wire
from sandboxd.runners.jail.nsjail import FORK_ROOT
from sandboxd.runners.trees import remove_tree

BIRTH_BYTES = 2 << 20  # charged to the source's group per member born there (page tables of ~200 MB, a stack)
COPIES_MAX = 64  # jailside zygote.FORK_COPIES_MAX: the copies' shared tmpfs is sized for this many
MEMBER_READY_MAX_HEADER_BYTES = 4096
# What a member's harness reports when it is ready; the worker trusts its word on paths only.
LOST = {"exit_code": None, "signal": None, "lost": True}
# A member's working directory, as its harness names it: read by the worker (grading) under /proc/PID/root.
WORKDIR = re.compile(rf"/tmp|{FORK_ROOT}/[0-9a-f]{{24}}")


def host_refusal() -> str | None:
    """Why no python session can be forked on this kernel (judged once, in the worker: same kernel)."""
    version = landlock.abi()
    if version < landlock.MIN_ABI:
        return (
            f"python sessions cannot be forked on this node: its kernel's Landlock ABI is {version}, and a copy "
            f"confines itself with Landlock ABI {landlock.MIN_ABI} (Linux 6.12: signal and abstract-socket "
            "scoping); fork tools, textgame and browser sessions, or create sessions and replay the setup cells"
        )
    return None


class Hung(BadRequest):
    """The session did not answer its fork in time (its own code held it): it is in no known state."""


class NotForked(SandboxSetupError):
    """The session could not make its members (the kernel refused a fork): none exists, the session is intact."""


@dataclass
class Lineage:
    """The namespaces of a forked session: their pid 1 (the holder), its group, and who lives there."""

    holder: Executor
    cgroup: CgroupGroup
    members: set[str] = field(default_factory=set)
    exits: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)  # by pid in the namespaces
    reader: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        """The holder's reports, until it ends: then every member still running ended with it."""
        try:
            with self.holder.in_use():  # closed meanwhile, the holder's channel goes once this read stops
                while True:
                    head, _ = await recv_frame(self.holder.sock, SESSION_REPLY_MAX_HEADER_BYTES, 0)
                    fut = self.exits.get(head.get("pid", -1)) if head.get("op") == "exit" else None
                    if fut is not None and not fut.done():
                        fut.set_result({k: head.get(k) for k in ("exit_code", "signal", "cpu_s", "max_rss_kb")})
        except (wire.WireError, OSError):
            pass
        finally:
            for fut in self.exits.values():
                if not fut.done():
                    fut.set_result(dict(LOST))

    def close(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
        self.holder.close()  # pid 1 of the namespaces: whatever is left there ends with it


@dataclass
class Member:
    executor: Executor
    cgroup: CgroupGroup
    workdir: str
    skipped: int = 0  # entries of the source's /tmp that are not files, directories or links (fifos, sockets)


@dataclass
class _Ends:
    """One member's descriptors: ours to keep, theirs to send."""

    sock: socket.socket
    out_r: int
    err_r: int
    theirs: list[int]

    @classmethod
    def make(cls) -> _Ends:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # its host pid, with its first frame
        ours.setblocking(False)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        return cls(ours, out_r, err_r, [theirs.detach(), out_w, err_w])

    def close_theirs(self) -> None:
        for fd in self.theirs:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.theirs = []

    def close(self) -> None:
        self.close_theirs()
        self.sock.close()
        for fd in (self.out_r, self.err_r):
            with contextlib.suppress(OSError):
                os.close(fd)


async def fork(
    source: Executor, source_cgroup: CgroupGroup, n: int, cgroups: list[CgroupGroup], keep: bool
) -> tuple[Lineage, list[Member | BaseException]]:
    """Fork ``source`` into its continuation (index 0) and ``n`` copies, member i in ``cgroups[i]``.

    ``BadRequest`` when the session refused (threads running, forked before...): nothing changed then; also
    when it did not answer in time (its own hooks held it): ``Hung``, and the caller closes it.
    ``SandboxSetupError`` when the fork broke before its members existed: the session's process is then in
    no known state. Otherwise the lineage (its holder is the source's old process) and, per member, a live
    ``Member`` or what stopped it; the caller keeps or closes each."""
    with source.in_use():
        return await _fork(source, source_cgroup, n, cgroups, keep)


async def _fork(
    source: Executor, source_cgroup: CgroupGroup, n: int, cgroups: list[CgroupGroup], keep: bool
) -> tuple[Lineage, list[Member | BaseException]]:
    loop = asyncio.get_running_loop()
    tag = int.from_bytes(os.urandom(7), "big")
    ends = [_Ends.make() for _ in range(n + 1)]
    try:
        await loop.sock_sendall(source.sock, wire.encode({"op": "fork", "n": n, "tag": tag, "keep": keep}))
        async with asyncio.timeout(SANDBOX_READY_TIMEOUT_S):
            head, _ = await recv_frame(source.sock, SESSION_REPLY_MAX_HEADER_BYTES, 0)
        if head.get("tag") != tag:
            raise SandboxSetupError("the session answered its fork with a frame that is not the harness's")
        if head.get("op") == "fork_refused":
            raise BadRequest(f"python: {head.get('error')}")
        if head.get("op") == "fork_failed":
            raise NotForked(f"python: the session could not fork: {head.get('error')}")
        if head.get("op") != "fork_ready":
            raise SandboxSetupError(f"the session answered its fork with {head.get('op')!r}")
        fds = [fd for e in ends for fd in e.theirs]
        source.sock.sendmsg([b"F"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
        for e in ends:
            e.close_theirs()
        async with asyncio.timeout(SANDBOX_READY_TIMEOUT_S):
            head, _ = await recv_frame(source.sock, SESSION_REPLY_MAX_HEADER_BYTES, 0)
        if head.get("op") == "fork_failed" and head.get("tag") == tag:
            raise NotForked(f"python: the session could not fork: {head.get('error')}")
        pids = head.get("pids")
        if head.get("op") != "forked" or not isinstance(pids, list) or len(pids) != n + 1:
            raise SandboxSetupError(f"the session's fork answered {head!r}")
    except TimeoutError:
        for e in ends:
            e.close()
        raise Hung(
            f"python: the session did not answer its fork within {SANDBOX_READY_TIMEOUT_S:g} s (its own code ran "
            "in the fork: an at-fork hook or a signal handler held it); the session is closed"
        ) from None
    except BaseException:
        for e in ends:
            e.close()
        raise
    lineage = Lineage(source, source_cgroup)
    for pid in pids:
        lineage.exits[int(pid)] = loop.create_future()
    lineage.start()
    with contextlib.suppress(OSError):  # pid 1 writes nothing now: the members have pipes of their own
        os.close(source.out_r)
        os.close(source.err_r)
    source.out_r = source.err_r = -1
    filters = seccomp_filters(source.host_pid)
    results = await asyncio.gather(
        *(_greet(e, i, source_cgroup, cgroups[i], lineage.exits[int(pids[i])], filters) for i, e in enumerate(ends)),
        return_exceptions=True,
    )
    for e, r in zip(ends, results, strict=True):
        if not isinstance(r, Member):
            e.close()
    return lineage, list(results)


async def _greet(
    e: _Ends,
    index: int,
    source: CgroupGroup,
    cgroup: CgroupGroup,
    exit_fut: asyncio.Future[dict[str, Any]],
    filters: int,
) -> Member:
    """Learn the member's host pid, move it into its group, let it set up; a live ``Member``.

    A member whose own harness says why it failed (a thread an at-fork hook started, ...) and one that
    did not confine itself (the session's code changed the harness before the fork) are the client's
    ``BadRequest``; the worker checks the part of the confinement it can see, the member's seccomp layer."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(SANDBOX_READY_TIMEOUT_S):
            first, host_pid = await introduction(e.sock, MEMBER_READY_MAX_HEADER_BYTES)
            _failed(first, index)
            if first.get("op") != "member" or first.get("index") != index or host_pid <= 0:
                raise SandboxSetupError(f"copy {index} introduced itself as {first!r} (pid {host_pid})")
            pidfd = os.pidfd_open(host_pid)
            try:
                if not in_group(
                    host_pid, source.dirs.values()
                ):  # a number is not a process: born in the source's group
                    raise SandboxSetupError(f"copy {index}: pid {host_pid} is not the source's child any more")
                executor = Executor(-1, e.sock, e.out_r, e.err_r, pidfd, host_pid, exit_fut)
                await asyncio.to_thread(cgroup.add, host_pid)
                await loop.sock_sendall(e.sock, wire.encode({"op": "go"}))
                ready, _ = await recv_frame(e.sock, MEMBER_READY_MAX_HEADER_BYTES, 0)
                _failed(ready, index)
                if ready.get("op") != "member_ready" or not WORKDIR.fullmatch(str(ready.get("dir"))):
                    raise SandboxSetupError(f"copy {index} did not set up: {ready!r}")
                layers = seccomp_filters(host_pid)
                if layers != filters + 1:
                    raise BadRequest(
                        f"python: copy {index} did not confine itself (its seccomp layers: {layers}, expected "
                        f"{filters + 1}): the session's code changed the fork's harness before the fork"
                    )
            except BaseException:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # its descriptors are the caller's to close
                os.close(pidfd)
                raise
    except TimeoutError:
        raise BadRequest(
            f"python: copy {index} did not set up within {SANDBOX_READY_TIMEOUT_S:g} s (the session's own code, "
            "an at-fork hook or a signal handler, held it)"
        ) from None
    skipped = ready.get("skipped")
    return Member(executor, cgroup, str(ready["dir"]), skipped if type(skipped) is int else 0)


def _failed(frame: dict[str, Any], index: int) -> None:
    if frame.get("op") == "member_failed":
        raise BadRequest(f"python: copy {index} could not confine itself: {str(frame.get('error'))[:500]}")


def seccomp_filters(pid: int) -> int:
    """How many seccomp filters ``pid`` runs under (-1 when unreadable)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Seccomp_filters:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return -1


def remove_workdir(holder_pid: int, workdir: str) -> bool:
    """Delete a closed copy's directory, seen through the holder's root (the copy's processes are gone, and
    no other member may reach it: nothing changes under the walk); True when it is gone. Any depth: the
    copy's own program shaped it (``trees.remove_tree``)."""
    if not (WORKDIR.fullmatch(workdir) and workdir.startswith(FORK_ROOT + "/")):
        return True
    if not os.path.isdir(f"/proc/{holder_pid}"):
        return True  # the holder, its namespaces and their /forks tmpfs are gone: so are the files
    return remove_tree(f"/proc/{holder_pid}/root{workdir}")


def notes(copies: list[Member]) -> list[str]:
    """What a fork's answer says of how the copies differ from the source (the response's ``notes``)."""
    skipped = max(m.skipped for m in copies)
    uncopied = (
        f"python: {skipped} entries of the source's /tmp are neither files, directories nor links (fifos, "
        "sockets) and were not copied"
    )
    return [
        *([uncopied] if skipped else []),
        f"python: each copy works in a directory of its own ({copies[0].workdir}, ...: a copy of the source's "
        "/tmp, with TMPDIR and HOME there), not in /tmp: the copies share the source's namespaces and each is "
        "confined to its own files by Landlock",
        "python: after a fork neither the source nor its copies have TCP or UDP sockets, SysV IPC or writes "
        "to /dev/shm (what they share); named unix sockets cannot be made",
        "python: open files under /tmp were reopened on each copy's files at the same offset; other open "
        "descriptors (sockets, pipes) read and write /dev/null in the copies",
        "python: random, numpy and sympy generators are reseeded in each copy; the source keeps its state",
        "python: a forked session, and each copy, cannot be forked again",
    ]
