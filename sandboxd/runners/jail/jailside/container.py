"""What a container's executor does with its steps (stdlib only; runs inside a container jail).

A one-shot: its request names the image; the executor enters the image's root (``rootfs.py``), writes the
step's files, and runs the command in a child whose status (and the files asked for) it reports, as the code
kind's programs (``executor.run_and_fetch``). A session: the first frame names the image and is answered
``entered`` (or why not); each later step is a shell command, run by the image's ``/bin/sh`` in a child of
this process, which stays the session's pid 1 (it reaps what the commands leave running). What a command
exports and where it ``cd``s are kept for the next one: the shell starts from a script of the session's state
(``export -p`` and ``cd``, passed as fd 3, both memfds) and writes its state back to fd 4 when the command
ends, so variables set, unset and exported and the working directory carry over, as in one terminal.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import struct
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # inside the jail these are plain modules beside the zygote (no sandboxd package there)
    from sandboxd.runners.jail.jailside import bound, executor, rootfs, staging
else:
    import bound
    import executor
    import rootfs
    import staging

__builtins__ = bound.BUILTINS  # type: ignore[assignment]  # before any def (bound.py says why)

SHELL = "/bin/sh"
CWD_MARK = "\n#sandboxd-cwd:"
# Runs each session command: the state in, the command, the state out. ``exit`` in a command ends the shell
# before the state is written: the session keeps the state it had.
WRAPPER = (
    '. /dev/fd/3; exec 3<&-; eval "$1"; __sandboxd_status=$?; '
    "{ export -p; printf '\\n#sandboxd-cwd:'; pwd; } >&4 2>/dev/null; exec 4>&-; exit $__sandboxd_status"
)
STAGE_FAILED = 125  # exchange.STAGE_FAILED: the step never ran, and its executor said why
STATE_MAX_BYTES = 1 << 20  # what a session's exports may hold; more is kept as it was before the command
CELL_HEAD = struct.Struct(">II8s")  # cellhost.py's HEAD: a cell's source and stdin lengths, and its nonce
CELL_STATUS = struct.Struct(">8si")  # cellhost.py's STATUS: the nonce again, and the cell's exit status
PYTHONS = ("python3", "python")  # a session's python kernel: the first of these on the session's PATH


def oneshot(
    sock: socket.socket, req: dict[str, Any], body: bytes, filter_program: bytes, oom_adj: int, out_w: int, err_w: int
) -> int:
    entered = _enter(sock, req.get("root"), filter_program)
    if entered is None:
        return STAGE_FAILED
    env, cwd = entered
    try:
        stdin = rootfs.stage(req, body, cwd)
    except (OSError, ValueError) as exc:
        bound.send(sock, {"op": "stage_error", "error": str(exc)})
        return STAGE_FAILED
    os.write(oom_adj, b"1000")
    os.close(oom_adj)
    _outputs(out_w, err_w)
    staging.set_limits(req, session=False)
    staging.set_stdin(stdin)
    argv = [str(a) for a in req["exec"]["argv"]]
    # Relative to the working directory (the collector reads absolute paths as they are).
    fetch = [p if p.startswith("/") else f"{cwd}/{p}" for p in (str(p) for p in req.get("fetch") or [])]
    return executor.run_and_fetch(sock, lambda: _exec(argv, env), fetch, int(req.get("fetch_max_bytes", 0)))


def session(
    sock: socket.socket, req: dict[str, Any], filter_program: bytes, oom_adj: int, out_w: int, err_w: int
) -> int:
    if req.get("op") != "enter":
        return 73
    with open(os.path.join(os.path.dirname(__file__), "cellhost.py"), "rb") as f:
        host_source = f.read()  # read before the pivot: the jail's files are not there after it
    entered = _enter(sock, req.get("root"), filter_program)
    if entered is None:
        return 0
    env, cwd = entered
    os.write(oom_adj, b"1000")
    os.close(oom_adj)
    _outputs(out_w, err_w)
    staging.set_stdin(b"")
    exports = "".join(f"export {key}={_quote(value)}\n" for key, value in env.items() if _shell_name(key))
    running = [0, 0]  # the pid of what runs now, and 1 when it is the python kernel
    kernel = Kernel(host_source, env)

    def interrupt(signum: int, frame: Any) -> None:
        """The step's deadline (the worker's SIGINT): a command and all it started end; a python cell is
        interrupted (KeyboardInterrupt, its globals kept), and its kernel killed if it has not stopped within
        half the worker's grace. The session stays."""
        pid = running[0]
        if not pid:
            return
        try:
            if running[1]:
                os.kill(pid, signal.SIGINT)
                signal.setitimer(signal.ITIMER_REAL, kernel.grace_s)
            else:
                os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def overdue(signum: int, frame: Any) -> None:
        """Half the grace after the interrupt: the kernel and its group killed, and the wait for its status
        given up (something it started elsewhere may hold its channel open)."""
        if running[0] and running[1]:
            _kill(running[0])
            raise Overdue

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGALRM, overdue)
    bound.send(sock, {"op": "entered"})
    while True:
        try:
            req, body = bound.recv_frame(sock)
        except BaseException:
            return 0
        if req.get("op") == "close":
            return 0
        tag = req.get("tag") if type(req.get("tag")) is int else 0
        try:
            stdin = rootfs.stage(req, body, cwd)
        except (OSError, ValueError) as exc:
            bound.send(sock, {"op": "stage_error", "error": str(exc), "tag": tag})
            continue
        staging.set_limits(req, session=True)
        cell_len = req.get("python_len")
        if type(cell_len) is int and 0 <= cell_len <= len(body):
            kernel.grace_s = max(0.01, float(req.get("interrupt_grace_s", 1.0)) / 2)
            code = kernel.run(body[len(body) - cell_len :], stdin, cwd, running)
        else:
            staging.set_stdin(stdin)
            code, exports, cwd = _command(str(req.get("command", "")), exports, cwd, running)
        ended = time.monotonic()  # the worker's clock too: a reply it sees late is judged on this
        kernel.reaped(_reap())
        done: dict[str, Any] = {"op": "done", "exit_code": code, "tag": tag, "t": ended}
        if 128 < code <= 128 + 64:
            done["signal"] = code - 128  # a shell's word for a command a signal ended (a kill at a limit)
        bound.send(sock, done)


def _enter(sock: socket.socket, root: Any, filter_program: bytes) -> tuple[dict[str, str], str] | None:
    """Enter the image's root; None when it could not be, the worker told why and whose fault it was."""
    op = "enter_error"
    try:
        env, cwd, uid = rootfs.enter(dict(root))
    except rootfs.ImageFault as exc:
        bound.send(sock, {"op": op, "error": str(exc)})
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        bound.send(sock, {"op": op, "error": f"the sandbox's root could not be made: {exc}", "node": True})
        return None
    try:
        rootfs.lock(filter_program, uid)
    except OSError as exc:
        bound.send(sock, {"op": op, "error": f"the sandbox could not be locked down: {exc}", "node": True})
        return None
    return env, cwd


def _outputs(out_w: int, err_w: int) -> None:
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)


def _exec(argv: list[str], env: dict[str, str]) -> int:
    """Replace this process with the image's program, found on the image's PATH, as a runtime would."""
    for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        os.write(2, f"sandboxd: cannot run {argv[0]}: {exc.strerror}\n".encode())
        return 126 if isinstance(exc, PermissionError) else 127
    return 127


def _command(command: str, exports: str, cwd: str, running: list[int]) -> tuple[int, str, str]:
    """Run one command in the session's shell; its status and the session's state after it (what it exports,
    where it is)."""
    given = os.memfd_create("state", 0)
    saved = os.memfd_create("saved", 0)
    try:
        script = f"{exports}\ncd -- {_quote(cwd)} 2>/dev/null || cd /\n".encode(errors="surrogateescape")
        pos = 0
        while pos < len(script):
            pos += os.write(given, script[pos:])
        os.lseek(given, 0, os.SEEK_SET)
        try:
            pid = os.fork()
        except OSError as exc:  # its processes fill its pids limit (a fork bomb's, left running): the step's
            os.write(2, _cannot_fork("the command", exc))
            return 126, exports, cwd
        if pid == 0:
            code = 127
            try:
                os.setpgid(0, 0)  # its group: what it starts ends with it at a deadline
                os.dup2(given, 3)
                os.dup2(saved, 4)
                for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                os.execve(SHELL, ["sh", "-c", WRAPPER, "sh", command], {})
            except OSError as exc:
                os.write(
                    2, f"sandboxd: a session runs its commands with the image's {SHELL}: {exc.strerror}\n".encode()
                )
            finally:
                os._exit(code)
        running[0] = pid
        status = 0
        while True:
            try:
                _, status = os.waitpid(pid, 0)
                break
            except InterruptedError:
                continue
        running[0] = 0
        code = os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell says
        size = os.lseek(saved, 0, os.SEEK_END)
        if 0 < size <= STATE_MAX_BYTES:
            os.lseek(saved, 0, os.SEEK_SET)
            out = os.read(saved, size).decode("utf-8", errors="surrogateescape")
            after, mark, where = out.rpartition(CWD_MARK)
            if mark:
                exports, cwd = after, where.removesuffix("\n")
        return code, exports, cwd
    finally:
        os.close(given)
        os.close(saved)


def _shell_name(key: str) -> bool:
    """A name the shell exports (POSIX: ASCII letters, digits, ``_``, not first a digit); others are kept
    from the shell's environment, as a runtime's ``sh`` would drop them."""
    return key.isascii() and key.isidentifier()


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def _reap() -> set[int]:
    """As the session's pid 1: collect what its commands started and has ended (background jobs); their pids."""
    ended: set[int] = set()
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended.add(pid)


class Kernel:
    """The session's python kernel (``cellhost.py`` in the image's interpreter), started by its first cell and
    again after one that killed it (its globals are then gone, and the cell's stderr says so)."""

    def __init__(self, source: bytes, env: dict[str, str]) -> None:
        self.source = source
        self.env = env
        self.pid = 0
        self.cells = self.status = -1
        self.grace_s = 0.5
        self.last_nonce = b""  # the last cell's: its real status may come after a forgery answered it

    def run(self, source: bytes, stdin: bytes, cwd: str, running: list[int]) -> int:
        """One cell; its status (128 + N when the kernel died of signal N)."""
        if self.pid:
            try:
                ended = os.waitpid(self.pid, os.WNOHANG)[0]
            except ChildProcessError:
                ended = self.pid
            if ended:  # it ended between cells (a thread's os._exit)
                self._forget()
        if not self.pid:
            refused = self._start(cwd)
            if refused:
                return refused
        nonce = os.urandom(8)
        frame = CELL_HEAD.pack(len(source), len(stdin), nonce) + source + stdin
        got = b""
        stale, self.last_nonce = self.last_nonce, nonce
        running[:] = [self.pid, 1]
        try:
            try:
                view = memoryview(frame)
                while view:
                    view = view[os.write(self.cells, view) :]
                while True:
                    got = self._read_status()
                    if got[:8] != stale or not stale:
                        break
                    # The last cell's own status, come after one it wrote itself (its nonce can be read from the
                    # kernel's frames: it shares that interpreter): its forgery answered it, and this, its real
                    # end, answers nothing. Skipped once, so it never answers this cell.
                    stale = b""
            except OSError:  # its end of the pipe closed: it died
                got = b""
        except Overdue:  # killed past its grace (raised into the wait, or into the handling of its death)
            got = b""
        finally:
            running[:] = [0, 0]
            signal.setitimer(signal.ITIMER_REAL, 0)
        if len(got) == CELL_STATUS.size:
            said, rc = CELL_STATUS.unpack(got)
            if said == nonce:
                return int(rc)
            # Not this cell's status, nor the last one's late end: a cell wrote statuses of its own, and every
            # later one would answer the wrong cell. The kernel ends; the session stays.
            return self._died("a cell wrote on the kernel's own status channel")
        return self._died()

    def _read_status(self) -> bytes:
        got = b""
        while len(got) < CELL_STATUS.size:
            chunk = os.read(self.status, CELL_STATUS.size - len(got))
            if not chunk:
                break
            got += chunk
        return got

    def _start(self, cwd: str) -> int:
        """0, the kernel started; or the cell's status, why not said on its stderr."""
        python = _on_path(PYTHONS, self.env.get("PATH", "/usr/local/bin:/usr/bin:/bin"))
        if python is None:
            os.write(2, b"sandboxd: python cells need python3 (or python) on the session's PATH; this image has none\n")
            return 127
        cells_r, self_w = os.pipe()
        self_r, status_w = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            for fd in (cells_r, self_w, self_r, status_w):
                os.close(fd)
            os.write(2, _cannot_fork("the python kernel", exc))
            return 126
        if pid == 0:
            try:
                os.setpgid(0, 0)  # its group: what it starts in it ends with it when it is killed
                cells, status = _above(cells_r, 5), _above(status_w, 5)  # not clobbered by the other's dup2
                os.dup2(cells, 3)  # inheritable: what exec keeps
                os.dup2(status, 4)
                null = os.open("/dev/null", os.O_RDONLY)  # not the stdin of the command before it
                os.dup2(null, 0)
                for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGALRM):
                    signal.signal(sig, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # until its first cell: cellhost.py takes it over
                # The session's CPU backstop is this process's, set for each command; the kernel outlives many
                # cells (their time is kept by the worker's deadline and the group's CPU quota).
                _, hard = resource.getrlimit(resource.RLIMIT_CPU)
                resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
                try:
                    os.chdir(cwd)
                except OSError:
                    os.chdir("/")
                os.execve(python, [python, "-u", "-c", self.source.decode()], self.env)
            except OSError as exc:
                os.write(2, f"sandboxd: cannot start {python}: {exc.strerror}\n".encode())
            finally:
                os._exit(127)
        os.close(cells_r)
        os.close(status_w)
        self.pid, self.cells, self.status = pid, self_w, self_r
        return 0

    def _died(self, why: str = "") -> int:
        """The kernel ended mid-cell (killed at its deadline or a limit, or the cell ended it), or its channel
        broke (it is ended now, whatever it does): its status."""
        _kill(self.pid)  # an end of its channel closed or redirected by the cell: it may still run
        status = signal.SIGKILL.value  # if it was reaped already: killed, as far as anyone can tell
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self._forget()
        said = f" ({why})" if why else ""
        os.write(
            2,
            f"sandboxd: the python kernel ended{said}; the next cell starts a new one (its variables are gone)\n".encode(),
        )
        code = os.waitstatus_to_exitcode(status)
        return 128 - code if code < 0 else code

    def reaped(self, pids: set[int]) -> None:
        """Between steps: a kernel that ended on its own (a background thread's ``os._exit``) is forgotten."""
        if self.pid in pids:
            self._forget()

    def _forget(self) -> None:
        for fd in (self.cells, self.status):
            if fd >= 0:
                os.close(fd)
        self.pid, self.cells, self.status = 0, -1, -1
        self.last_nonce = b""


class Overdue(Exception):
    """Raised by the deadline's second alarm into the wait for a kernel's status."""


def _kill(pid: int) -> None:
    """SIGKILL to the process and its group (it may have left the group it was started in)."""
    for kill, target in ((os.kill, pid), (os.killpg, pid)):
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _cannot_fork(what: str, exc: OSError) -> bytes:
    return (
        f"sandboxd: {what} could not start ({exc.strerror}): the session's own processes hold its process "
        "limit; end them (a cell of a kernel that runs can: os.kill(-1, 9)) or close the session\n"
    ).encode()


def _above(fd: int, floor: int) -> int:
    """``fd`` again as a descriptor at ``floor`` or above (the copies below are close-on-exec)."""
    while fd < floor:
        fd = os.dup(fd)
    return fd


def _on_path(names: tuple[str, ...], path: str) -> str | None:
    for name in names:
        for d in path.split(":"):
            full = os.path.join(d or ".", name)
            if os.path.isfile(full) and os.access(full, os.X_OK):
                return full
    return None
