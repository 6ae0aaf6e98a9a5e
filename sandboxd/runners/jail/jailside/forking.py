"""Forking a python session inside its jail (stdlib only; runs in the session's own process).

A session's state is its interpreter, pid 1 of the session's namespaces, which
may not create namespaces (nor may anything it starts). So the copies are plain
``fork()`` children sharing those namespaces, and each confines itself before
it answers (``landlock.py``, ``seccomp.build_member_filter``):

* ``n + 1`` members are forked: the ``n`` copies and the source's own
  continuation. The interpreter that held the state then ``exec``s the holder
  (``holder.py``): pid 1 must outlive every member (its exit would end them all),
  and from then on it runs none of the program's code (no hook, handler or
  finalizer the program left in that interpreter survives the ``exec``).
* Each copy works in a directory of its own under ``FORK_ROOT`` holding a copy
  of the source's ``/tmp``; the continuation stays in ``/tmp``. Each member's
  Landlock domain grants its own directory and read-only system paths, no TCP,
  and scopes signals and abstract sockets to itself; its seccomp layer closes
  what Landlock leaves open (inet sockets, SysV IPC, calls on other pids).
* The worker gives each member its channel and output pipes (SCM_RIGHTS on the
  source's channel), learns its host pid from its first frame, moves it into a
  cgroup of its own, and only then lets it copy files and confine itself, so
  what a copy writes is charged to it.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import signal
import socket
import stat
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandboxd.runners.jail.jailside import landlock, seccomp, wire
else:
    import landlock
    import seccomp
    import wire

FORK_ROOT = "/forks"  # sandboxd.runners.jail.nsjail.FORK_ROOT: an empty mount point in session jails
COPY_MAX_ENTRIES = 10_000  # entries of /tmp a fork copies into each copy; more is a refusal
COPY_MAX_PATH_BYTES = 3072  # paths under /tmp it copies (under /forks/<24 hex> they stay below PATH_MAX)
WORKDIR = "/tmp"
FORK_COPIES_MAX = 64  # sandboxd's fork_max_copies ceiling: the copies' shared tmpfs holds this many /tmp's
HOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "holder.py")
DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
# Top-level paths no member reads: the source's files (/tmp, and /home/user, its second name), the copies',
# /dev (only its device files are granted: /dev/shm below it is the source's, written before the fork).
PRIVATE = {"tmp", "home", "dev", FORK_ROOT.strip("/")}
_PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)
_forked = False  # this interpreter's state was forked once: it now lives in a member (see ``refusal``)


class ForkFailed(Exception):
    """The kernel refused a member's ``fork()``: the ones made are gone again, the session is as it was."""


def refusal(keep_processes: bool) -> str | None:
    """Why this session cannot be forked now, or None."""
    if _forked:
        return (
            "this session was forked already or is a copy: a python session forks once (its Landlock domain "
            "cannot grant new copies directories it may not read itself); fork the prepared session once, "
            "with n the whole group"
        )
    version = landlock.abi()
    if version < landlock.MIN_ABI:
        return (
            f"this kernel's Landlock ABI is {version}; forking a python session needs {landlock.MIN_ABI} (Linux 6.12)"
        )
    threads = len(os.listdir("/proc/self/task"))
    if threads > 1:
        return (
            f"the session runs {threads} threads: a fork copies only the calling thread, so the copies would "
            "hold locks nobody releases; end the threads (join them) and fork again"
        )
    if keep_processes:
        return "a session that keeps its processes (keep_processes) cannot be forked: they would escape the copies' confinement"
    children = _children()
    if children:
        return f"the session has {len(children)} processes running; fork it when it has none"
    bound = _bound_unix_paths()
    if bound:
        return (
            f"the session holds a unix socket bound at {bound[0]}: its copies could reach it by that path "
            "(Landlock does not check connecting by path); close it before forking"
        )
    return tree_refusal(WORKDIR)


def tree_refusal(top: str) -> str | None:
    """Why ``top`` cannot be copied whole into each copy (a copy is whole or the fork is refused), or None.
    Walked iteratively, and only as far as the first bound it passes."""
    entries = 0
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            it = os.scandir(f"{top}/{rel}" if rel else top)
        except OSError as exc:
            return f"/tmp/{rel} cannot be read ({exc.strerror}): a copy would not be whole"
        with it:
            for entry in it:
                entries += 1
                if entries > COPY_MAX_ENTRIES:
                    return f"/tmp holds more than {COPY_MAX_ENTRIES} entries: a fork copies it whole into every copy"
                path = f"{rel}/{entry.name}" if rel else entry.name
                if len(path.encode("utf-8", "surrogateescape")) > COPY_MAX_PATH_BYTES:
                    return (
                        f"/tmp holds a path longer than {COPY_MAX_PATH_BYTES} bytes ({path[:60]}...): a fork copies "
                        "the tree whole into every copy's own directory"
                    )
                if entry.is_dir(follow_symlinks=False):
                    stack.append(path)
    return None


def _bound_unix_paths() -> list[str]:
    """Paths of the unix sockets this process holds that are bound to a file system name."""
    inodes = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    if not inodes:
        return []
    paths = []
    with open("/proc/net/unix") as f:
        next(f, None)
        for line in f:
            cols = line.split()
            if len(cols) >= 8 and cols[6] in inodes and not cols[7].startswith("@"):
                paths.append(cols[7])
    return paths


def _children() -> list[int]:
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def recv_fds(sock: socket.socket, count: int) -> list[int]:
    """The members' descriptors, ``count`` of them, sent after our ``fork_ready``."""
    size = socket.CMSG_SPACE(count * 4)
    msg, anc, _flags, _addr = sock.recvmsg(1, size)
    fds = array.array("i")
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if not msg or len(fds) != count:
        for fd in fds:
            os.close(fd)
        raise OSError(errno.EPROTO, f"expected {count} descriptors, got {len(fds)}")
    return list(fds)


def fork_group(sock: socket.socket, n: int, fds: list[int], reseed: Callable[[], None]) -> socket.socket | None:
    """Fork ``n`` copies and a continuation (member 0), each with its three descriptors from ``fds``.

    In a member this returns its channel, confined and greeted; in the source it never returns: it
    reports the members' pids and becomes the holder."""
    global _forked
    pids: list[int] = []
    rng = sys.modules.get("random")
    rng_state = rng.getstate() if rng is not None else None  # random reseeds every fork child (an at-fork hook)
    try:
        for i in range(n + 1):
            pid = os.fork()
            if pid == 0:
                _forked = True
                if i == 0 and rng is not None:
                    rng.setstate(rng_state)  # the source goes on untouched, its generator too
                try:
                    return _member(sock, i, fds, reseed)
                except BaseException:
                    os._exit(70)  # a member that could not start: nothing of it may run on
            pids.append(pid)
    except OSError as exc:  # EAGAIN (pids), ENOMEM: not one member stays, the session goes on
        for pid in pids:
            os.kill(pid, signal.SIGKILL)  # still unconfined: ours to end
            os.waitpid(pid, 0)
        for fd in fds:
            os.close(fd)
        raise ForkFailed(f"fork of member {len(pids)} of {n + 1}: {exc.strerror}") from None
    _forked = True
    for fd in fds:
        os.close(fd)
    _become_holder(sock, pids)
    return None  # not reached


def _member(source: socket.socket, index: int, fds: list[int], reseed: Callable[[], None]) -> socket.socket:
    mine = fds[3 * index : 3 * index + 3]
    for fd in fds:
        if fd not in mine:
            os.close(fd)
    source.close()
    chan_fd, out_w, err_w = mine
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)
    chan = socket.socket(fileno=chan_fd)
    chan.setblocking(True)
    try:
        _set_up(chan, index, reseed)
    except BaseException as exc:
        with contextlib.suppress(BaseException):  # the worker learns why, and whose fault it was
            chan.sendall(wire.encode({"op": "member_failed", "error": f"{type(exc).__name__}: {exc}"[:2000]}))
        raise
    return chan


def _set_up(chan: socket.socket, index: int, reseed: Callable[[], None]) -> None:
    os.setsid()  # kill(0, ...) reaches its own group only
    _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # its orphans stay its own (and in its cgroup)
    hello, _ = wire.recv_frame(chan)
    if hello.get("op") != "hello":
        raise OSError(errno.EPROTO, "no hello")
    chan.sendall(wire.encode({"op": "member", "index": index}))  # the kernel attaches our pid (SO_PASSCRED)
    go, _ = wire.recv_frame(chan)  # sent once we are in our own cgroup: what we copy is charged to us
    if go.get("op") != "go":
        raise OSError(errno.EPROTO, "no go")
    _unshare_mappings()
    cwd = os.getcwd()
    skipped = 0
    if index == 0:
        own = WORKDIR  # the source goes on where it was, with its descriptors, bar any on the copies' side
        _reopen_descriptors(own, keep={0, 1, 2, chan.fileno()}, only_under=FORK_ROOT)
    else:
        own = f"{FORK_ROOT}/{os.urandom(12).hex()}"
        os.mkdir(own, 0o700)
        skipped = _copy_tree(WORKDIR, own)
        _reopen_descriptors(own, keep={0, 1, 2, chan.fileno()})
        os.chdir(own + cwd[len(WORKDIR) :] if cwd == WORKDIR or cwd.startswith(WORKDIR + "/") else own)
        for var in ("TMPDIR", "HOME"):
            os.environ[var] = own
        os.environ["MPLCONFIGDIR"] = own + "/.matplotlib"
        tempfile = sys.modules.get("tempfile")
        if tempfile is not None:
            tempfile.tempdir = None  # type: ignore[attr-defined]
        reseed()
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # Landlock confines the calling thread: another (an at-fork hook's) would keep every right
        raise RuntimeError(f"the copy runs {threads} threads as it confines itself (a thread started at fork)")
    read = ["/" + e for e in os.listdir("/") if e not in PRIVATE]
    landlock.restrict(read, own, list(DEVICE_FILES), listable=["/dev"])
    seccomp.install(seccomp.build_member_filter())
    ready: dict[str, Any] = {"op": "member_ready", "dir": own, "cwd": os.getcwd(), "skipped": skipped}
    chan.sendall(wire.encode(ready))


_PROT = {"r": 1, "w": 2, "x": 4}
_MAP_PRIVATE, _MAP_FIXED, _MAP_ANONYMOUS = 0x02, 0x10, 0x20
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]


def _unshare_mappings() -> None:
    """Shared writable mappings made before the fork (``mmap.mmap(-1, n)``, a shared mapping of a file)
    would be one memory for every member: each gets a private copy at the same address instead, so the
    objects that point there keep working (writes no longer reach a mapped file: the file is the source's)."""
    regions = []
    with open("/proc/self/maps") as f:
        for line in f:
            cols = line.split()
            perms = cols[1]
            if perms[3] == "s" and "w" in perms:
                lo, hi = (int(x, 16) for x in cols[0].split("-"))
                regions.append((lo, hi - lo, sum(_PROT[c] for c in perms[:3] if c in _PROT)))
    for addr, size, prot in regions:
        saved = ctypes.create_string_buffer(size) if prot & 1 else None  # write-only: nothing to keep
        if saved is not None:
            ctypes.memmove(saved, addr, size)
        got = _mmap(addr, size, prot | 3, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_FIXED, -1, 0)
        if got != addr:
            raise OSError(ctypes.get_errno(), f"cannot make the shared mapping at {addr:#x} private")
        if saved is not None:
            ctypes.memmove(addr, saved, size)
        if prot != prot | 3:
            _libc.mprotect(ctypes.c_void_p(addr), ctypes.c_size_t(size), prot)


def _copy_tree(src: str, dst: str) -> int:
    """Directories, regular files and symbolic links of ``src`` into ``dst``, iteratively (the source was
    checked against the bounds first: ``tree_refusal``); returns how many entries of other kinds (sockets,
    fifos) or unreadable ones were left out."""
    skipped = 0
    stack = [""]
    modes: list[tuple[str, int]] = []  # directories' modes, set once their contents are in
    while stack:
        rel = stack.pop()
        here, there = (f"{src}/{rel}", f"{dst}/{rel}") if rel else (src, dst)
        try:
            entries = list(os.scandir(here))
        except OSError:
            skipped += 1
            continue
        for entry in entries:
            target = f"{there}/{entry.name}"
            try:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(entry.path), target)
                elif stat.S_ISDIR(st.st_mode):
                    os.mkdir(target, 0o700)
                    stack.append(f"{rel}/{entry.name}" if rel else entry.name)
                    modes.append((target, stat.S_IMODE(st.st_mode)))
                elif stat.S_ISREG(st.st_mode):
                    _copy_file(entry.path, target, st)
                else:
                    skipped += 1
            except OSError:
                skipped += 1
    for path, mode in reversed(modes):
        with contextlib.suppress(OSError):
            os.chmod(path, mode)
    return skipped


def _copy_file(src: str, dst: str, st: os.stat_result) -> None:
    fin = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, stat.S_IMODE(st.st_mode) | 0o200)
        try:
            left = st.st_size
            while left > 0:
                sent = os.sendfile(fout, fin, None, min(left, 1 << 30)) if left else 0
                if sent <= 0:
                    break
                left -= sent
        finally:
            os.close(fout)
        os.chmod(dst, stat.S_IMODE(st.st_mode))
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(fin)


def _reopen_descriptors(own: str, keep: set[int], only_under: str | None = None) -> None:
    """Open files under the source's /tmp point at this copy's files (same flags and offset); every other
    descriptor the source held (sockets, pipes, event and memory fds) would be shared with the source and
    the other copies, and becomes /dev/null (its Python objects then fail cleanly, and no number is reused).
    ``only_under``: replace only descriptors of that tree (the continuation keeps its own, bar the copies')."""
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd in keep or fd == null:
                continue
            try:
                path = os.readlink(f"/proc/self/fd/{fd}")
                st = os.fstat(fd)
            except OSError:
                continue  # the listing's own descriptor, closed since
            if only_under is not None and not (path == only_under or path.startswith(only_under + "/")):
                continue
            cloexec = fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
            replacement = null
            if (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)) and path.startswith(WORKDIR + "/"):
                flags = fcntl.fcntl(fd, fcntl.F_GETFL) & ~(os.O_CREAT | os.O_EXCL | os.O_TRUNC)
                try:
                    replacement = os.open(own + path[len(WORKDIR) :], flags)
                    if stat.S_ISREG(st.st_mode):
                        os.lseek(replacement, os.lseek(fd, 0, os.SEEK_CUR), os.SEEK_SET)
                except OSError:
                    replacement = null
            os.dup2(replacement, fd, inheritable=not cloexec)
            if replacement != null:
                os.close(replacement)
    finally:
        os.close(null)


def _become_holder(sock: socket.socket, pids: list[int]) -> None:
    """Report the members and ``exec`` the holder; if that fails, pid 1 ends and takes the members along,
    which the worker sees as a failed fork."""
    try:
        sock.sendall(wire.encode({"op": "forked", "pids": pids}))
        fd = sock.detach()
        os.set_inheritable(fd, True)
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        os.execv(sys.executable, [sys.executable, "-I", "-S", "-B", HOLDER, str(fd), json.dumps(pids)])
    finally:
        os._exit(71)
