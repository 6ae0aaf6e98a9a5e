"""An executor's namespaces and mounts (stdlib only; runs inside the jail, as the zygote and its executors).

The zygote holds the jail's capabilities (nsjail ``keep_caps``) so that each executor makes its mount, pid
and IPC namespaces (and a session its network one) in the one ``clone`` that creates it, without a user
namespace of its own (uid maps cost ~0.7 ms per execution); the executor then mounts a fresh ``/tmp``,
``/dev/shm`` and ``/proc`` before it drops every capability.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # inside the jail these are plain modules beside the zygote (no sandboxd package there)
    from sandboxd.runners.jail.jailside import forking
else:
    import forking

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = (
    1,
    2,
    4,
    8,
    32,
    4096,
    8192,
    16384,
    1 << 18,
)
DEVICES = ("null", "zero", "full", "random", "urandom")
SIOCSIFFLAGS, IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x8914, 0x1, 0x8, 0x40
SYS_CLONE = {"x86_64": 56, "aarch64": 220}

WORKDIR = "/tmp"  # a fresh tmpfs per executor: the step's files, its working directory
SESSION_HOME = "/home/user"  # sandboxd.constants.SESSION_HOME (this side imports nothing of sandboxd)

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
# What os.fork() does around fork(2), done around our clone(2): take the
# interpreter's fork locks before, release them after, in each process. 3.13
# aborts ("unlocking a recursive mutex that is not owned") without the first.
_before_fork = ctypes.pythonapi.PyOS_BeforeFork
_after_fork_parent = ctypes.pythonapi.PyOS_AfterFork_Parent
_after_fork_child = ctypes.pythonapi.PyOS_AfterFork_Child


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src: str, dst: str, fstype: str, flags: int, data: str = "") -> None:
    _check(
        libc.mount(src.encode(), dst.encode(), fstype.encode(), flags, data.encode() or None),
        f"mount {fstype} on {dst}",
    )


def clone_namespaced(session: bool) -> int:
    """fork() into new mount, pid and IPC namespaces (and network, for a session) in one system call.

    IPC per execution: SysV shared memory, queues and semaphores die with the
    execution, so nothing passes to the next one and nothing stays charged to
    the slot. A network namespace per session: sessions of one jail run side
    by side, and one must not reach another's sockets (one-shots of a slot
    run one at a time and everything they start dies with their pid
    namespace, so they share the slot's: a network namespace costs a
    kernel-wide lock, ~0.5 ms, not worth paying per execution).
    """
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | signal.SIGCHLD
    if session:
        flags |= CLONE_NEWNET
    _before_fork()
    pid = libc.syscall(SYS_CLONE[os.uname().machine], ctypes.c_ulong(flags), 0, 0, 0, 0)
    if pid == 0:
        _after_fork_child()
        return 0
    err = ctypes.get_errno()
    _after_fork_parent()
    if pid < 0:
        raise OSError(err, f"clone: {os.strerror(err)}")
    return int(pid)


def prepare() -> None:
    """In the zygote: the libc calls an executor makes looked up and made once (a harmless read), so every
    executor inherits them warm instead of paying each first call's page faults (``seccomp.prepare``)."""
    libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE


def seal_dev() -> None:
    """Make the jail's /dev read-only once, before any executor exists: nothing can be planted there.

    It holds only the five harmless devices nsjail bound (null, zero, full, random, urandom) plus the
    fd links made here. Read-only, it can be shared by every execution; each still gets a fresh
    /dev/shm of its own (``setup_namespaces``). Done in the zygote, it costs nothing per execution.
    """
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        if not os.path.lexists(f"/dev/{name}"):
            os.symlink(target, f"/dev/{name}")
    if not os.path.lexists("/dev/stderr"):
        os.symlink("/proc/self/fd/2", "/dev/stderr")
    for entry in os.listdir("/dev"):
        if entry not in (*DEVICES, "fd", "stdin", "stdout", "stderr", "shm"):
            raise OSError(f"unexpected /dev/{entry} in the jail")
    mount("none", "/dev", "", MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)


def _loopback_up() -> None:
    """A new network namespace starts with ``lo`` down; programs expect 127.0.0.1 to work."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING))


def setup_namespaces(tmpfs_bytes: int, session: bool) -> int:
    # Mounts made here stay here: the zygote made its whole tree private at start.
    mount("tmpfs", WORKDIR, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_bytes},mode=0700")
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=1777")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if session:
        _loopback_up()
        if os.path.isdir(SESSION_HOME):  # the session jail's mount point: its /tmp under E2B's name too
            mount(WORKDIR, SESSION_HOME, "", MS_BIND | MS_NOSUID | MS_NODEV)
        if os.path.isdir(forking.FORK_ROOT):  # where the copies of a fork keep their files (forking.py)
            size = tmpfs_bytes * (forking.FORK_COPIES_MAX + 1)
            mount("tmpfs", forking.FORK_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=0700")
    # Opened now: once not dumpable, /proc/self belongs to root and could not be opened for writing.
    oom_adj = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no /proc/1/mem for its descendants
    return oom_adj
