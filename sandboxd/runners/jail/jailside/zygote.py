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

The harness, one job per module beside this one: ``namespaces`` (the clone and the executor's mounts),
``executor`` (what an executor does with its step), ``staging`` (files, limits, stdin), ``program`` (a
python program run as the interpreter would run it), ``session`` (cells and forks), ``bound`` (the
references the harness keeps from the program), ``wire``, ``seccomp``, ``landlock`` and ``forking``.
"""

from __future__ import annotations

import array
import errno
import gc
import json
import os
import select
import signal
import socket
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # inside the jail these are plain modules beside this file (no sandboxd package there)
    from sandboxd.runners.jail.jailside import bound, executor, namespaces, program, seccomp, wire
else:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bound
    import executor
    import namespaces
    import program
    import seccomp
    import wire

__builtins__ = bound.BUILTINS  # type: ignore[assignment]  # before any def (bound.py says why)
_exit = bound._exit

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

# --------------------------------------------------------------------------- zygote


TEMPLATE_MAX_FAILURES = 3  # an environment's template that died this often in one jail is not restarted


def _boot() -> None:
    for name in sorted(program.STARTUP):  # what plain python has at start is here too, whatever -S left out
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


def _freeze() -> None:
    """Everything made so far out of the garbage collector's sight: a collection in an executor (or a
    template's) then never walks, and writes the headers of, the objects it shares with its zygote, pages it
    would otherwise copy for itself."""
    gc.collect()
    gc.freeze()


def _make_executor(mode: str, tmpfs_bytes: int, filter_program: bytes, close: tuple[int, ...]) -> tuple[int, list[int]]:
    """Clone one executor; return its pid (in the jail) and our ends: request socket, stdout, stderr."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        pid = namespaces.clone_namespaced(mode in executor.SESSION_MODES)
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
            code = executor.executor_main(theirs, out_w, err_w, filter_program, mode, tmpfs_bytes)
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
    program.enter_template()
    site, modules = program.ENVS[env]
    sys.path[:] = [*program.PROGRAM_PATH, site]
    failed = []
    for name in modules:
        try:
            __import__(name)
        except BaseException as exc:  # a broken package costs its importers the import, nothing else
            failed.append(f"{name}: {exc!r}")
    tops = sorted({name.split(".", 1)[0] for name in sys.modules} - bound.HARNESS_MODULES)
    _freeze()
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
    # executor can make its namespaces.mount and pid namespaces without a user namespace
    # of its own (uid maps cost ~0.7 ms per execution). Private propagation
    # once here means no executor's namespaces.mount is ever seen by another.
    namespaces.mount("none", "/", "", namespaces.MS_REC | namespaces.MS_PRIVATE)
    namespaces.seal_dev()
    filter_program = seccomp.build_filter()
    seccomp.prepare(filter_program)
    namespaces.prepare()
    _freeze()
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
                    and env < len(program.ENVS)
                    and bool(program.ENVS[env][1])
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


if __name__ == "__main__":
    try:
        program.ENVS[:] = [(str(site), [str(m) for m in mods]) for site, mods in json.loads(sys.argv[3])]
        program.STARTUP.update(str(m) for m in json.loads(sys.argv[4]))
        zygote_main(sys.argv[1], int(sys.argv[2]))
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
