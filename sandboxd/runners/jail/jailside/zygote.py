"""Fork-server that lives inside one nsjail jail (stdlib only; runs as uid nobody).

Process tree inside a jail, and why it is this shape::

    zygote (pid 1 of the jail)       warm interpreter; never reads request data
      └─ executor (one per execution or session), made by ONE clone():
             new mount + pid + IPC namespaces (it is pid 1 there; sessions also
             get a network namespace of their own), a fresh tmpfs /tmp and
             /dev/shm, fresh /proc, no capabilities, seccomp, rlimits; /dev
             itself was made read-only by the zygote (only null, zero, full,
             random, urandom and fd links), so nothing can be planted there

* One clone per execution, nothing else on the request path: the executor is
  created, namespaced and locked down before its request arrives. A clone of
  this interpreter costs ~1.3 ms of CPU here (page handling); every extra fork
  would cost as much again, so there is no monitor process in between.
* The zygote never holds request data (so no child can inherit another
  request's code). It hands the worker, per executor, four descriptors over
  SCM_RIGHTS: the executor's request socket and its stdout/stderr pipes. The
  worker writes the request and reads the output itself.
* Exit status and rusage come from the zygote (``wait4``), never from the
  program, so a one-shot program cannot fake its own result. The executor is
  init of its pid namespace: when it exits the kernel kills whatever it left
  behind, and nothing it starts can see or signal the zygote.
"""

from __future__ import annotations

import _socket
import array
import atexit
import builtins
import ctypes
import errno
import io
import json
import linecache
import os
import resource
import select
import signal
import socket
import stat
import sys
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # inside the jail these are plain modules beside this file (no sandboxd package there)
    from sandboxd.runners.jail.jailside import forking, seccomp, wire
else:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import forking
    import seccomp
    import wire

# The program's import path: the interpreter's own, without this harness's directory (``import wire`` is
# the program's business), headed by its script's directory or, as under ``python -c``, the working one.
_PROGRAM_PATH = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]

# What the harness calls once a program has run, bound here, before any program exists. A program shares
# this interpreter (one-shots until they exit, session cells for the session's life) and can rebind any
# module attribute or builtin it sees: ``os._exit = None``, ``builtins.exec = ...``, ``sys.stdout = None``,
# ``threading._shutdown = ...``. None of that may change how its execution ends or what the worker is told.
# Functions defined below resolve builtins through a private copy of the builtins namespace, so a program
# that rebinds ``builtins.exec`` or ``builtins.isinstance`` changes its own world only.
__builtins__ = dict(builtins.__dict__)  # type: ignore[assignment]  # before any def: a function takes its builtins when it is made
_exit = os._exit
_os_write = os.write
_os_read = os.read
_os_open = os.open
_os_close = os.close
_os_fstat = os.fstat
_os_readlink = os.readlink
_os_fork = os.fork
_os_kill = os.kill
_os_waitpid = os.waitpid
_os_dup2 = os.dup2
_os_makedirs = os.makedirs
_normpath = os.path.normpath
_dirname = os.path.dirname
_S_ISREG = stat.S_ISREG
_WIFSIGNALED, _WTERMSIG, _WEXITSTATUS = os.WIFSIGNALED, os.WTERMSIG, os.WEXITSTATUS
_setrlimit, _getrusage = resource.setrlimit, resource.getrusage
_setitimer = signal.setitimer
_signal = signal.signal
_sleep = __import__("time").sleep
_sock_sendall = _socket.socket.sendall
_sock_recv = _socket.socket.recv
_json_decode = json.JSONDecoder().decode
_json_encode = json.JSONEncoder(separators=(",", ":")).encode
_PREFIX = wire.PREFIX
_threading = threading
_threading_shutdown = threading._shutdown  # type: ignore[attr-defined]
_atexit_run = atexit._run_exitfuncs
_print_exception = traceback.print_exception
_linecache = linecache.cache
_sys_excepthook = sys.__excepthook__
_TextIOWrapper, _BytesIO = io.TextIOWrapper, io.BytesIO
_ModuleType = type(sys)
_sys = sys
_streams: list[Any] = []  # the stdio objects the harness made for the program: flushed whatever it rebinds
# The environments this jail serves, by index: (site directory, modules its template preloads). From argv.
_ENVS: list[tuple[str, list[str]]] = []
# The modules plain ``python main.py`` of this interpreter holds when ``main.py`` starts (from argv: the
# worker asked the interpreter once). A step's own module named like one of these loses to it there, and
# here; named like anything else this harness (or a template) imported, it wins there, and must here.
_STARTUP: frozenset[str] = frozenset()
_MODULE_SUFFIXES = (".py", ".pyc", ".pyw", ".so")  # and the ``.cpython-...so`` kind, which ends in ``.so``

# Modules that typical agent programs import, loaded once here so that every
# execution starts with them warm (shared copy-on-write pages, not an import).
PRELOAD = [
    "abc",
    "array",
    "bisect",
    "collections",
    "collections.abc",
    "copy",
    "dataclasses",
    "functools",
    "hashlib",
    "heapq",
    "io",
    "itertools",
    "json",
    "math",
    "operator",
    "random",
    "re",
    "string",
    "struct",
    "threading",
    "traceback",
    "types",
    "typing",
    "linecache",
    "atexit",
]

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

JAIL_UID = 65534
WORKDIR = "/tmp"
SESSION_HOME = "/home/user"  # sandboxd.constants.SESSION_HOME (this side imports nothing of sandboxd)
FORK_COPIES_MAX = 64  # sandboxd's fork_max_copies ceiling: the copies' shared tmpfs holds this many /tmp's

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
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


def _mount(src: str, dst: str, fstype: str, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(src.encode(), dst.encode(), fstype.encode(), flags, data.encode() or None),
        f"mount {fstype} on {dst}",
    )


def _clone_namespaced(session: bool) -> int:
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
    pid = _libc.syscall(SYS_CLONE[os.uname().machine], ctypes.c_ulong(flags), 0, 0, 0, 0)
    if pid == 0:
        _after_fork_child()
        return 0
    err = ctypes.get_errno()
    _after_fork_parent()
    if pid < 0:
        raise OSError(err, f"clone: {os.strerror(err)}")
    return int(pid)


# --------------------------------------------------------------------------- zygote


TEMPLATE_MAX_FAILURES = 3  # an environment's template that died this often in one jail is not restarted


def _boot() -> None:
    for name in sorted(_STARTUP):  # what plain python has at start is here too, whatever -S left out
        try:
            __import__(name)
        except ImportError:
            pass
    for name in PRELOAD:
        __import__(name)
    # ``python -S`` (no site-packages on the jail's path) also skips the builtins ``site`` adds; programs
    # call ``exit()`` and ``quit()`` as under any interpreter started without -S.
    import site

    site.setquit()
    site.setcopyright()
    site.sethelper()


def _make_executor(mode: str, tmpfs_bytes: int, filter_program: bytes, close: tuple[int, ...]) -> tuple[int, list[int]]:
    """Clone one executor; return its pid (in the jail) and our ends: request socket, stdout, stderr."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        pid = _clone_namespaced(mode == "session")
    except OSError:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        ours.close()
        theirs.close()
        raise
    if pid == 0:
        code = 70
        try:
            # A process group of its own: ``kill(0, sig)`` from the program reaches its own processes, never
            # the zygote's group (its template, the prepared executor, the jail's other sessions).
            os.setsid()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (*close, out_r, err_r):
                os.close(fd)
            ours.close()
            code = executor_main(theirs, out_w, err_w, filter_program, mode, tmpfs_bytes)
        except BaseException:
            pass  # nothing of the harness may reach the program's output; the status says enough
        finally:
            _exit(code)
    theirs.close()
    os.close(out_w)
    os.close(err_w)
    return pid, [ours.detach(), out_r, err_r]


def _send_fds(sock: socket.socket, header: dict[str, Any], fds: list[int]) -> None:
    sock.sendmsg([wire.encode(header)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
    for fd in fds:
        os.close(fd)


class _Template:
    """A child of the zygote that imported an environment's preload list and forks executors from there.

    It is the zygote in all but its imports (same jail, capabilities and namespaces; it never reads request
    data either), so an execution that imports numpy finds it already loaded, in copy-on-write pages.
    The worker starts it (``wire.START_TEMPLATE``) with the zygote in a cgroup of the template's own, so its
    memory is never counted against a program's limit; until it is ready, requests for it get plain
    executors. Its executors are children of the template, born in its cgroup, and moved by the worker into
    the slot's before their program arrives: what a program dirties is its own. The template reports their
    exits, and the zygote relays everything.
    """

    def __init__(self, env: int, pid: int, sock: socket.socket) -> None:
        self.env, self.pid, self.sock = env, pid, sock
        self.ready = False
        self.failed = False
        self.buf = bytearray()
        self.fds: list[int] = []
        self.pending: list[int] = []  # request numbers of the executors asked of it, in order
        # Its executors by pid, apart from the zygote's own: the template reaps them and says so later, and
        # by then the zygote may have forked an executor that got the same pid (a fork bomb runs the jail's
        # pids round in seconds). In one map, that one's step was answered with the other's exit (SIGKILL,
        # the other's CPU time) while its program ran on.
        self.ids: dict[int, int] = {}


def _start_template(env: int, mode: str, tmpfs_bytes: int, filter_program: bytes, close: tuple[int, ...]) -> _Template:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            signal.set_wakeup_fd(-1)
            for fd in close:
                os.close(fd)
            ours.close()
            template_main(theirs, env, mode, tmpfs_bytes, filter_program)
        except BaseException:
            code = 1
        finally:
            _exit(code)
    theirs.close()
    return _Template(env, pid, ours)


def template_main(chan: socket.socket, env: int, mode: str, tmpfs_bytes: int, filter_program: bytes) -> None:
    global _IN_TEMPLATE
    _IN_TEMPLATE = True
    site, modules = _ENVS[env]
    sys.path[:] = [*_PROGRAM_PATH, site]
    failed = []
    for name in modules:
        try:
            __import__(name)
        except BaseException as exc:  # a broken package costs its importers the import, nothing else
            failed.append(f"{name}: {exc!r}")
    tops = sorted({name.split(".", 1)[0] for name in sys.modules})
    chan.sendall(wire.encode({"op": "template_ready", "failed": failed, "modules": tops}))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        try:
            ready, _, _ = select.select([chan.fileno(), wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 512)
        for pid, status, ru in _reaped():
            chan.sendall(wire.encode({**wire.exit_report(status, ru), "pid": pid}))
        if chan.fileno() not in ready:
            continue
        wanted = chan.recv(64)
        if not wanted:
            return  # the zygote is gone
        for _ in wanted:
            try:
                pid, fds = _make_executor(mode, tmpfs_bytes, filter_program, (wake_r, wake_w, chan.fileno()))
            except OSError as exc:
                chan.sendall(wire.encode({"op": "spawn_error", "error": str(exc)}))
                continue
            _send_fds(chan, {"op": "executor", "pid": pid}, fds)


def _template_frames(t: _Template) -> list[dict[str, Any]]:
    """The complete frames a template has sent (collecting the descriptors passed with them)."""
    data, anc, _flags, _addr = t.sock.recvmsg(65536, socket.CMSG_SPACE(16 * 4))
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds = array.array("i")
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
            t.fds.extend(fds)
    if not data:
        raise EOFError
    t.buf += data
    frames = []
    while (frame := wire.pop_header(t.buf)) is not None:
        frames.append(frame)
    return frames


def zygote_main(mode: str, tmpfs_bytes: int) -> None:
    _boot()
    # The zygote holds the jail's capabilities (nsjail keep_caps) so that each
    # executor can make its mount and pid namespaces without a user namespace
    # of its own (uid maps cost ~0.7 ms per execution). Private propagation
    # once here means no executor's mount is ever seen by another.
    _mount("none", "/", "", MS_REC | MS_PRIVATE)
    _seal_dev()
    filter_program = seccomp.build_filter()
    ctl = socket.socket(fileno=0)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select via the wakeup fd
    ids: dict[int, int] = {}  # pid -> executor id (the zygote's own executors and its templates')
    templates: dict[int, _Template] = {}  # environment index -> its template
    failures: dict[int, int] = {}  # environment index -> templates of it that died; past the cap, no more
    next_id = 0
    asked = 0  # spawn requests read from the worker: each reply names the one it answers
    ctl.sendall(wire.encode({"op": "zygote_ready", "pid": os.getpid()}))

    def lean(req: int) -> None:
        nonlocal next_id
        try:
            pid, fds = _make_executor(
                mode, tmpfs_bytes, filter_program, (wake_r, wake_w, ctl.fileno(), *_template_fds())
            )
        except OSError as exc:
            ctl.sendall(wire.encode({"op": "spawn_error", "error": str(exc), "req": req}))
            return
        next_id += 1
        ids[pid] = next_id
        _send_fds(ctl, {"op": "executor", "id": next_id, "req": req, "warm": False}, fds)

    def _template_fds() -> list[int]:
        return [t.sock.fileno() for t in templates.values()]

    def drop(t: _Template) -> None:
        templates.pop(t.env, None)
        failures[t.env] = failures.get(t.env, 0) + 1
        for req in t.pending:
            lean(req)  # asked of a template that is gone: served plainly, never lost
        t.pending.clear()
        for pid, ex_id in t.ids.items():  # its executors still alive are ours now (orphans come to pid 1)
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    ids[pid] = ex_id
            except ChildProcessError:
                pass  # it reaped that one already and its word was lost with it: that step's deadline tells
        t.ids.clear()
        for fd in t.fds:
            os.close(fd)
        t.sock.close()

    while True:
        watched = [ctl.fileno(), wake_r, *_template_fds()]
        try:
            ready, _, _ = select.select(watched, [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 512)
        for pid, status, ru in _reaped():
            ex_id = ids.pop(pid, None)
            if ex_id is None:  # a dying template's executor, reparented to us before the template was dropped
                for t in templates.values():
                    if pid in t.ids:
                        ex_id = t.ids.pop(pid)
                        break
            if ex_id is not None:
                ctl.sendall(wire.encode({**wire.exit_report(status, ru), "id": ex_id}))
            for t in list(templates.values()):
                if t.pid == pid:
                    t.failed = True
        for t in list(templates.values()):
            if t.sock.fileno() not in ready and not t.failed:
                continue
            try:
                frames = _template_frames(t) if t.sock.fileno() in ready else []
            except (EOFError, OSError, ValueError):
                frames, t.failed = [], True
            for frame in frames:
                op = frame.get("op")
                if op == "template_ready":
                    t.ready = True
                    # The worker forks a step from it only when none of the step's files is named like a
                    # module it imported: those would lose to the template's, and win under ``python main.py``.
                    modules = frame.get("modules")
                    ctl.sendall(wire.encode({"op": "template_ready", "env": t.env, "modules": modules}))
                elif op == "executor" and t.pending:
                    next_id += 1
                    t.ids[int(frame["pid"])] = next_id
                    fds, t.fds = t.fds[:3], t.fds[3:]
                    header = {"op": "executor", "id": next_id, "req": t.pending.pop(0), "warm": True}
                    _send_fds(ctl, header, fds)
                elif op == "spawn_error" and t.pending:
                    lean(t.pending.pop(0))
                elif op == "exit":
                    ex_id = t.ids.pop(int(frame["pid"]), None)
                    if ex_id is not None:
                        frame.pop("pid")
                        ctl.sendall(wire.encode({**frame, "id": ex_id}))
            if t.failed:
                drop(t)
        if ctl.fileno() not in ready:
            continue
        wanted = ctl.recv(64)
        if not wanted:
            os._exit(0)  # the worker is gone: end the jail (pid 1 exiting kills the rest)
        for byte in wanted:
            if byte >= wire.START_TEMPLATE:
                env = byte - wire.START_TEMPLATE
                started = (
                    mode == "oneshot"
                    and env < len(_ENVS)
                    and bool(_ENVS[env][1])
                    and env not in templates
                    and failures.get(env, 0) < TEMPLATE_MAX_FAILURES  # past it, its preloads keep killing it
                )
                if started:
                    try:
                        templates[env] = _start_template(
                            env, mode, tmpfs_bytes, filter_program, (wake_r, wake_w, ctl.fileno(), *_template_fds())
                        )
                    except OSError:
                        started = False
                ctl.sendall(wire.encode({"op": "template", "env": env, "started": started}))
                continue
            asked += 1
            env = byte - wire.SPAWN_ENV
            tpl = templates.get(env) if byte != wire.SPAWN_LEAN else None
            if tpl is None or not tpl.ready:
                lean(asked)  # no template (not asked for, or gone), or still importing: a plain one
                continue
            tpl.pending.append(asked)
            try:
                tpl.sock.sendall(b"f")
            except OSError:
                drop(tpl)  # it died just now: what was asked of it is served plainly


def _reaped() -> list[tuple[int, int, Any]]:
    out: list[tuple[int, int, Any]] = []
    while True:
        try:
            pid, status, ru = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, status, ru))


# ------------------------------------------------------------------------- executor


def _seal_dev() -> None:
    """Make the jail's /dev read-only once, before any executor exists: nothing can be planted there.

    It holds only the five harmless devices nsjail bound (null, zero, full, random, urandom) plus the
    fd links made here. Read-only, it can be shared by every execution; each still gets a fresh
    /dev/shm of its own (``_setup_namespaces``). Done in the zygote, it costs nothing per execution.
    """
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        if not os.path.lexists(f"/dev/{name}"):
            os.symlink(target, f"/dev/{name}")
    if not os.path.lexists("/dev/stderr"):
        os.symlink("/proc/self/fd/2", "/dev/stderr")
    for entry in os.listdir("/dev"):
        if entry not in (*DEVICES, "fd", "stdin", "stdout", "stderr", "shm"):
            raise OSError(f"unexpected /dev/{entry} in the jail")
    _mount("none", "/dev", "", MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)


def _loopback_up() -> None:
    """A new network namespace starts with ``lo`` down; programs expect 127.0.0.1 to work."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING))


def _setup_namespaces(tmpfs_bytes: int, session: bool) -> int:
    # Mounts made here stay here: the zygote made its whole tree private at start.
    _mount("tmpfs", WORKDIR, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_bytes},mode=0700")
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=1777")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if session:
        _loopback_up()
        if os.path.isdir(SESSION_HOME):  # the session jail's mount point: its /tmp under E2B's name too
            _mount(WORKDIR, SESSION_HOME, "", MS_BIND | MS_NOSUID | MS_NODEV)
        if os.path.isdir(forking.FORK_ROOT):  # where the copies of a fork keep their files (forking.py)
            size = tmpfs_bytes * (FORK_COPIES_MAX + 1)
            _mount("tmpfs", forking.FORK_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=0700")
    # Opened now: once not dumpable, /proc/self belongs to root and could not be opened for writing.
    oom_adj = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    _libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no /proc/1/mem for its descendants
    return oom_adj


def executor_main(
    sock: socket.socket, out_w: int, err_w: int, filter_program: bytes, mode: str, tmpfs_bytes: int
) -> int:
    try:
        oom_adj = _setup_namespaces(tmpfs_bytes, mode == "session")
        os.chdir(WORKDIR)
        seccomp.drop_capabilities()
        seccomp.install(filter_program)
        # The worker greets first so that it can receive our credentials (pid).
        hello, _ = wire.recv_frame(sock)
        if hello.get("op") != "hello":
            return 73
    except wire.WireError:
        return 0
    except Exception as exc:
        try:
            sock.sendall(wire.encode({"op": "error", "error": repr(exc)}))
        except OSError:
            pass
        return 72
    sock.sendall(wire.encode({"op": "ready"}))
    try:
        req, body = wire.recv_frame(sock)
    except wire.WireError:
        return 0
    # Only now, with a program to run, is this executor the one to kill first under memory pressure.
    # Marked while it waited, a prepared executor could be the OOM killer's pick while the slot's
    # running program outgrew the limit, and the next, honest program was then found killed.
    os.write(oom_adj, b"1000")
    os.close(oom_adj)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)
    _reseed()
    if mode == "session":
        _stdin(b"")  # each cell gets its stdin as a buffer; fd 0 stays a valid empty file
        return _session_loop(sock, req, body, _env_site(req))
    try:
        code, stdin = _stage(req, body)
    except (OSError, ValueError) as exc:
        # Not the program's failure (it never ran): the worker answers the client's error from this frame.
        _send(sock, {"op": "stage_error", "error": str(exc)})
        return 125
    _limits(req, session=False)
    _stdin(stdin)
    fetch = req.get("fetch")
    spec = req.get("exec")
    if isinstance(spec, dict):  # another program: run in a child, its status and files reported from here
        return _run_and_fetch(sock, lambda: _exec_program(spec), list(fetch or []), int(req.get("fetch_max_bytes", 0)))
    script = WORKDIR + "/" + str(req["script"]) if req.get("script") else None
    site = _env_site(req)
    if fetch:
        program = lambda: _run_oneshot(code, script, site, _tops(req))  # noqa: E731
        return _run_and_fetch(sock, program, list(fetch), int(req["fetch_max_bytes"]))
    sock.close()  # the program gets no channel to the worker
    return _run_oneshot(code, script, site, _tops(req))


def _exec_program(spec: dict[str, Any]) -> int:
    """Replace this process with ``spec["argv"]`` (a compiler, a compiled program, an interpreter), in the
    jail's environment with ``spec["environ"]`` over it, found on its PATH, after marking ``spec["x"]`` (staged files) executable. The signals
    CPython ignores (SIGPIPE, SIGXFSZ) get their default action back, as ``subprocess`` does: a program
    writing to a closed pipe or past its file-size limit ends as it would anywhere."""
    for rel in spec.get("x", []):
        path = _normpath(WORKDIR + "/" + str(rel))
        if path.startswith(WORKDIR + "/"):
            os.chmod(path, 0o755)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    argv = [str(a) for a in spec["argv"]]
    environ = {**os.environ, **{str(k): str(v) for k, v in dict(spec.get("environ") or {}).items()}}
    try:
        os.execvpe(argv[0], argv, environ)
    except OSError as exc:
        os.write(2, f"sandboxd: cannot run {argv[0]}: {exc.strerror}\n".encode())
    return 127


def _send(sock: socket.socket, header: dict[str, Any] | bytes, body: bytes = b"") -> None:
    """A frame to the worker, built from the harness's own references (never the program's ``json``)."""
    head = header if isinstance(header, bytes) else _json_encode(header).encode()
    _sock_sendall(sock, _PREFIX.pack(len(head), len(body)) + head + body)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = _sock_recv(sock, min(n - len(buf), 1 << 20))
        if not chunk:
            raise _WireError("peer closed the stream")
        buf += chunk
    return bytes(buf)


def _recv_frame(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    """``wire.recv_frame`` on private references: a session's next request, read after its cells ran."""
    head_len, body_len = _PREFIX.unpack(_recv_exact(sock, _PREFIX.size))
    if head_len > wire.MAX_HEADER_BYTES or body_len > wire.MAX_BODY_BYTES:
        raise _WireError(f"frame too large: header {head_len} B, body {body_len} B")
    header = _json_decode(_recv_exact(sock, head_len).decode())
    if not isinstance(header, dict):
        raise _WireError("frame header is not an object")
    return header, _recv_exact(sock, body_len) if body_len else b""


_WireError = wire.WireError


def _stage(req: dict[str, Any], body: bytes) -> tuple[bytes, bytes]:
    """Write the request's files into the workdir; return (code, stdin)."""
    view = memoryview(body)
    pos = 0
    for rel, size in req.get("files", []):
        path = _normpath(WORKDIR + "/" + rel)
        if not path.startswith(WORKDIR + "/"):
            raise ValueError(f"file path escapes the workdir: {rel!r}")
        _os_makedirs(_dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(view[pos : pos + size])
        pos += size
    stdin_len = int(req.get("stdin_len", 0))
    stdin = bytes(view[pos : pos + stdin_len])
    code = bytes(view[pos + stdin_len :])
    script = req.get("script")
    if script:
        path = _normpath(WORKDIR + "/" + str(script))
        if _dirname(path) != WORKDIR:
            raise ValueError(f"script is not a file of the workdir: {script!r}")
        with open(path, "wb") as f:
            f.write(code)
    return code, stdin


def _limits(req: dict[str, Any], session: bool) -> None:
    cpu = max(1, int(req["cpu_s"]))
    if session:
        used = _getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime) + cpu + 1
        _setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
        return
    # A backstop only: the worker ends a step at its own time (the wall less what others kept from it), and the
    # kernel's count behind RLIMIT_CPU ran ~1.5x the process's own rusage on a saturated machine (a loop was
    # SIGKILLed at 1.9 s of its 2 s limit, as "exited by signal 9").
    backstop = 2 * cpu + 5
    _setrlimit(resource.RLIMIT_CPU, (backstop, backstop))
    _setrlimit(resource.RLIMIT_FSIZE, (int(req["fsize_bytes"]),) * 2)
    _setrlimit(resource.RLIMIT_NOFILE, (int(req["nofile"]),) * 2)
    _setrlimit(resource.RLIMIT_CORE, (0, 0))


def _stdin(data: bytes) -> None:
    """fd 0 = a memfd holding the step's stdin (no feeder process, no pipe)."""
    fd = os.memfd_create("stdin", 0)
    if data:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    if fd != 0:  # fd 0 may be free (the zygote's channel was closed): then it is already stdin
        os.dup2(fd, 0)
        os.close(fd)


# Generators a preloaded library seeds from the OS once, at import: in a template that import was shared by
# every executor, so each gets fresh state as a fresh interpreter would (module, attributes).
_LIBRARY_RNGS = (("sympy.core.random", ("rng", "_assumptions_rng")),)


def _reseed() -> None:
    import random

    random.seed()  # the zygote's state is shared by every child: start each afresh
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # a template's numpy: its global generator was seeded once, for every executor
        numpy.random.seed()
    for module, names in _LIBRARY_RNGS:
        mod = sys.modules.get(module)
        for name in names:
            rng = getattr(mod, name, None)
            if isinstance(rng, random.Random):
                rng.seed()


def _env_site(req: dict[str, Any]) -> str | None:
    env = req.get("env")
    return _ENVS[env][0] if type(env) is int and 0 <= env < len(_ENVS) else None


def _tops(req: dict[str, Any]) -> set[str]:
    """The top-level module names the step's files could be imported as (a name too many only costs a purge)."""
    out = set()
    for given, *_ in req.get("files", []):
        rel = os.path.normpath(str(given))  # as staged: "./calendar.py" is calendar.py
        first = rel.split("/", 1)[0]
        if "/" in rel:
            out.add(first)
        elif first.endswith(_MODULE_SUFFIXES):
            out.add(first.split(".", 1)[0])
    script = req.get("script")
    if script:
        out.add(str(script).split(".", 1)[0])
    return out


_ORIGINALS: dict[str, Any] = {}  # the modules the harness imported, as it imported them (``_shadow``)
# In a template and its executors: its preloads (numpy, ...) cannot be imported twice in one process, so a
# step whose files are named like a module it imported is never sent here (the worker runs it lean).
_IN_TEMPLATE = False


def _shadow(tops: set[str]) -> None:
    """Make the step's own modules win as they would under ``python main.py`` in its directory: when one is
    named like a module this interpreter imported and plain python would not have at start, every such
    module still as the harness imported it leaves ``sys.modules``, and the program imports afresh (its
    own files first on the path) whatever it imports. The harness keeps its own references."""
    if not tops or _IN_TEMPLATE:  # most steps have no files: nothing to look at
        return
    if not _ORIGINALS:
        _ORIGINALS.update(sys.modules)
    startup_tops = {name.split(".", 1)[0] for name in _STARTUP}
    present = {name.split(".", 1)[0] for name, mod in sys.modules.items() if _ORIGINALS.get(name) is mod}
    if not (tops & present) - startup_tops:
        return
    for name, mod in list(sys.modules.items()):
        if name not in _STARTUP and _ORIGINALS.get(name) is mod:
            del sys.modules[name]


def _fresh_main(script: str | None = None, site: str | None = None) -> dict[str, Any]:
    """``__main__`` as CPython makes it for ``python -c`` (no script) or ``python <script>``; the step's
    environment, if any, last on the path, where site-packages would be."""
    for name in [m for m in sys.modules if m in ("seccomp", "wire", "landlock", "forking", "__mp_main__")]:
        del sys.modules[name]
    main = _ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins  # the real module: the program's own, to change as it likes
    sys.modules["__main__"] = main
    tail = [site] if site else []
    # A program's own ``python3 -c ...`` (a reward's test harness, ``subprocess.run``, ``!pip list``) is this
    # interpreter (first on PATH) with the same environment, as a venv's would be, not the system's bare one.
    if site:
        os.environ["PYTHONPATH"] = site
    else:
        os.environ.pop("PYTHONPATH", None)
    if script:
        main.__dict__.update(__file__=script, __cached__=None)
        sys.argv = [script]
        sys.path[:] = [_dirname(script), *_PROGRAM_PATH, *tail]
    else:
        sys.argv = ["-c"]
        sys.path[:] = ["", *_PROGRAM_PATH, *tail]
    return main.__dict__


def _stdio() -> None:
    sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
    _streams[:] = [sys.stdout, sys.stderr]


def _flush() -> None:
    """What the program wrote reaches its pipes, whatever it rebound: CPython flushes ``sys.stdout`` and
    ``sys.stderr`` at exit, and the objects it made them (still referenced) when they are finalized."""
    for stream in (getattr(_sys, "stdout", None), getattr(_sys, "stderr", None), *_streams):
        try:
            stream.flush()
        except BaseException:
            pass


def _exit_status(exc: SystemExit) -> int:
    """``sys.exit(x)`` as CPython ends with it: None is 0, an int its low byte, anything else printed, 1."""
    try:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        stream = getattr(_sys, "stderr", None)
        print(code, file=stream if stream is not None else _streams[1])
    except BaseException:
        pass
    return 1


def _report(exc: BaseException) -> None:
    """An uncaught exception as CPython reports it (through ``sys.excepthook``), starting at the program's
    own frame; a hook the program broke or removed falls back to the standard report."""
    try:
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        hook = getattr(_sys, "excepthook", None)
        if hook is not None and hook is not _sys_excepthook:
            try:
                hook(type(exc), exc, tb)
                return
            except BaseException:
                pass
        stream = getattr(_sys, "stderr", None)
        _print_exception(type(exc), exc, tb, file=stream if stream is not None else _streams[1])
    except BaseException:
        pass


def _exec_code(code: bytes, namespace: dict[str, Any], filename: str = "<program>") -> int:
    """Run ``code`` like ``python -c`` would; return its exit code."""
    text = code.decode("utf-8", errors="replace")
    _linecache[filename] = (len(text), None, text.splitlines(True), filename)
    try:
        exec(compile(text, filename, "exec"), namespace)
        return 0
    except SystemExit as exc:
        return _exit_status(exc)
    except BaseException as exc:
        _report(exc)
        return 1


def _end_program(rc: int) -> int:
    """The end of ``python -c``: wait for non-daemon threads, run exit handlers, flush; the status stays
    ``rc`` unless a handler ends the process itself (``os._exit`` in an atexit function is the program's)."""
    try:
        _threading_shutdown()
    except BaseException:
        pass
    current = _sys.modules.get("threading")
    if current is not None and current is not _threading:  # imported afresh (``_shadow``): its threads too
        try:
            current._shutdown()
        except BaseException:
            pass
    try:
        _atexit_run()
    except BaseException:
        pass
    _flush()
    return rc


def _run_oneshot(code: bytes, script: str | None, site: str | None, tops: set[str]) -> int:
    _shadow(tops)
    namespace = _fresh_main(script, site)
    _stdio()
    return _end_program(_exec_code(code, namespace, script or "<program>"))


def _run_and_fetch(sock: socket.socket, program: Callable[[], int], paths: list[str], cap: int) -> int:
    """A one-shot whose files are returned after it ends, as SandboxFusion's ``fetch_files``; and every
    one-shot that runs another program (``_exec_program``), whose status only its parent can report.

    The program runs in a child, exactly as any one-shot (its threads joined, its exit handlers run, its
    status its own); this process, which never ran a line of it, waits for it, reads the files from the
    sandbox's own view (the same mounts and uid: nothing the program could not have read itself), and
    sends the worker the program's status and the files. The child never holds this channel; it cannot
    signal its pid namespace's init (SIGINT is the one signal with a handler here, so it is ignored), nor
    read this process (not dumpable, no ptrace).
    """
    pid = _os_fork()
    if pid == 0:
        rc = 70
        try:
            sock.close()
            rc = program()
        finally:
            _exit(rc)
    _signal(signal.SIGINT, signal.SIG_IGN)
    _os_close(1)
    _os_close(2)
    status: int | None = None
    while status is None:
        try:
            _, status = _os_waitpid(pid, 0)
        except ChildProcessError:
            break
    header: dict[str, Any] = {"op": "fetched", "exit_code": 70, "signal": None}
    if status is not None:
        if _WIFSIGNALED(status):
            header["signal"] = _WTERMSIG(status)
            header["exit_code"] = 128 + _WTERMSIG(status)
        else:
            header["exit_code"] = _WEXITSTATUS(status)
    sizes, missing, body = _collect(paths, cap)
    header.update(sizes=sizes, missing=missing)
    _send(sock, header, body)
    return 0


def _collect(paths: list[str], cap: int) -> tuple[list[int], dict[str, str], bytes]:
    """Each path's size (-1 when not returned) and why not, and the contents of those returned, in order.

    Relative paths are in the working directory, absolute ones anywhere the sandbox sees. Only regular
    files are read, without blocking (a FIFO or a device is refused), and at most ``cap`` bytes in all.
    """
    sizes: list[int] = []
    missing: dict[str, str] = {}
    chunks: list[bytes] = []
    total = 0
    for i, path in enumerate(paths):
        full = path if path.startswith("/") else WORKDIR + "/" + path
        sizes.append(-1)
        try:
            fd = _os_open(full, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            missing[str(i)] = exc.strerror or type(exc).__name__
            continue
        try:
            if not _S_ISREG(_os_fstat(fd).st_mode):
                missing[str(i)] = "not a regular file"
                continue
            if _os_readlink(f"/proc/self/fd/{fd}").startswith("/proc/"):
                # Through a link the program left, this process's own /proc entries (it is the namespace's
                # init, which the program may not read): what it asks for must be the sandbox's files.
                missing[str(i)] = "not a file of the sandbox's file systems (/proc)"
                continue
            room = cap - total
            data = bytearray()
            while len(data) <= room:
                chunk = _os_read(fd, min(room + 1 - len(data), 1 << 20))
                if not chunk:
                    break
                data += chunk
            if len(data) > room:
                missing[str(i)] = f"the fetched files exceed {cap} bytes in all"
                continue
        except OSError as exc:
            missing[str(i)] = exc.strerror or type(exc).__name__
            continue
        finally:
            _os_close(fd)
        sizes[i] = len(data)
        total += len(data)
        chunks.append(bytes(data))
    return sizes, missing, b"".join(chunks)


def _session_loop(sock: socket.socket, req: dict[str, Any], body: bytes, site: str | None) -> int:
    """Cells in one interpreter, one reply each, carrying its request's tag (the worker's check that a frame
    the program wrote on this channel cannot stand in for a later cell's reply). Outside its cells (while
    the harness reads, writes and cleans up) SIGINT is held back: the worker's interrupt at a cell's
    deadline belongs to that cell, and one that lands after the cell finished is dropped instead of
    breaking the harness or the next cell."""
    namespace = _fresh_main(None, site)
    _stdio()
    cell = 0
    sigint = {signal.SIGINT}
    _hold(sigint)
    while True:
        op = req.get("op")
        if op == "close":
            return 0
        tag = req.get("tag")
        tag = tag if type(tag) is int else 0
        reply: bytes | None
        if op == "fork":
            try:
                why, member = _fork(sock, req, tag)
            except forking.ForkFailed as exc:
                why, member, op = str(exc), None, "fork_failed"
            except BaseException:  # the worker broke off, or the descriptors never came: this session ends
                return 0
            else:
                op = "fork_refused"
            if member is None:
                reply = _json_encode({"op": op, "error": why, "tag": tag}).encode()
            else:
                sock, reply = member, None  # a member: its own channel now, already greeted
        else:
            cell += 1
            reply = _cell(req, body, namespace, cell, tag, sigint)
        try:
            if reply is not None:
                _send(sock, reply)
            req, body = _recv_frame(sock)
        except BaseException:  # the worker closed the channel, or the program broke it (its own session)
            return 0


def _cell(
    req: dict[str, Any], body: bytes, namespace: dict[str, Any], cell: int, tag: int, sigint: set[signal.Signals]
) -> bytes:
    try:
        code, stdin = _stage(req, body)
    except (OSError, ValueError) as exc:
        return _json_encode({"op": "stage_error", "error": str(exc), "tag": tag}).encode()
    _limits(req, session=True)
    _shadow(_tops(req))
    _sys.stdin = _TextIOWrapper(_BytesIO(stdin), encoding="utf-8")
    if signal.SIGINT in _sigpending():
        _sigtimedwait(sigint, 0)  # an interrupt meant for an earlier cell
    rc = 1
    try:
        _sigmask(signal.SIG_UNBLOCK, sigint)
        rc = _exec_code(code, namespace, f"<cell {cell}>")
    except BaseException:  # the deadline's interrupt, landing between the cell's end and here
        pass
    _hold(sigint)
    _flush()
    if req.get("keep") is True:
        _reap_exited()
    else:
        _reap_strays()
    return b'{"op":"done","exit_code":%d,"tag":%d}' % (rc, tag)


def _fork(sock: socket.socket, req: dict[str, Any], tag: int) -> tuple[str, socket.socket | None]:
    """A fork request between cells (``forking.py``): a refusal's reason, or, in a member, its channel."""
    n = req.get("n")
    why = forking.refusal(req.get("keep") is True)
    if why is None and not (type(n) is int and 1 <= n <= FORK_COPIES_MAX):
        why = f"n must be 1..{FORK_COPIES_MAX}"
    if why is not None or type(n) is not int:
        return str(why), None
    _send(sock, _json_encode({"op": "fork_ready", "tag": tag}).encode())
    fds = forking.recv_fds(sock, 3 * (n + 1))
    member = forking.fork_group(sock, n, fds, _reseed)
    _stdin(b"")  # fd 0: a memfd of its own, not the source's
    return "", member


def _hold(signals: set[signal.Signals]) -> None:
    """Block ``signals``; ``pthread_sigmask`` runs the Python handlers of signals already delivered, so an
    interrupt that arrived just before is raised here, once, and dropped."""
    while True:
        try:
            _sigmask(signal.SIG_BLOCK, signals)
            return
        except BaseException:
            continue


_sigpending, _sigtimedwait, _sigmask = signal.sigpending, signal.sigtimedwait, signal.pthread_sigmask


def _reap_exited() -> None:
    """A session that keeps its processes (``keep_processes``): as its pid 1, collect the ones that ended, so
    they do not pile up as zombies against its pids limit. Processes the cell's own code still waits for are
    collected here too; callers that need an exit status keep it themselves (E2B's commands write theirs)."""
    _reap(until_none_left=False)


def _reap_strays() -> None:
    """Kill whatever a cell left running: a session's state lives in globals, not processes."""
    try:
        _os_kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _reap(until_none_left=True)


REAPED_KEPT = 4096  # exit statuses kept for whoever started the process (E2B's commands ask for theirs)


def _reap(until_none_left: bool) -> None:
    """Collect ended children; their statuses are kept (the kernel's word, not a file a process could write)
    in ``sys.modules["_sandboxd_reaped"].statuses`` for the code that started them."""
    kept = _reaped_statuses()
    while True:
        try:
            pid, status = _os_waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if not until_none_left:
                return
            _sleep(0.001)
            continue
        kept[pid] = status
        if len(kept) > REAPED_KEPT:
            del kept[next(iter(kept))]


def _reaped_statuses() -> dict[int, int]:
    module = sys.modules.get("_sandboxd_reaped")
    if module is None:
        module = type(sys)("_sandboxd_reaped")
        module.statuses = {}  # type: ignore[attr-defined]
        sys.modules["_sandboxd_reaped"] = module
    statuses: dict[int, int] = module.statuses
    return statuses


if __name__ == "__main__":
    try:
        _ENVS[:] = [(str(site), [str(m) for m in mods]) for site, mods in json.loads(sys.argv[3])]
        _STARTUP = frozenset(str(m) for m in json.loads(sys.argv[4]))
        zygote_main(sys.argv[1], int(sys.argv[2]))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
