"""The executor: the process one execution or one session is (stdlib only; runs inside the jail).

Cloned by the zygote (or a template) into namespaces of its own, it mounts its file systems, drops its
capabilities and installs seccomp before any request exists; then the worker greets it, sends the step, and
it runs the program: a python one-shot in this interpreter (``program.py``), another program (a compiler,
a compiled binary) by ``exec`` in a child whose status and files it reports, or a session's cells
(``session.py``).
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # inside the jail these are plain modules beside the zygote (no sandboxd package there)
    from sandboxd.runners.jail.jailside import bound, container, namespaces, program, seccomp, session, staging, wire
else:
    import bound
    import container
    import namespaces
    import program
    import seccomp
    import session
    import staging
    import wire

__builtins__ = bound.BUILTINS  # type: ignore[assignment]  # before any def (bound.py says why)
_exit, _os_fork, _os_close, _os_waitpid, _signal = (
    bound._exit,
    bound._os_fork,
    bound._os_close,
    bound._os_waitpid,
    bound._signal,
)
_os_open, _os_read, _os_fstat, _os_readlink = bound._os_open, bound._os_read, bound._os_fstat, bound._os_readlink
_S_ISREG, _normpath = bound._S_ISREG, bound._normpath
_WIFSIGNALED, _WTERMSIG, _WEXITSTATUS = bound._WIFSIGNALED, bound._WTERMSIG, bound._WEXITSTATUS
WORKDIR = staging.WORKDIR
SESSION_MODES = ("session", "container_session")  # a network namespace of its own per sandbox
CONTAINER_MODES = ("container", "container_session")  # an image's root (container.py)


def executor_main(
    sock: socket.socket, out_w: int, err_w: int, filter_program: bytes, mode: str, tmpfs_bytes: int
) -> int:
    contained = mode in CONTAINER_MODES  # locked down after its request, once it has entered the image
    try:
        oom_adj = namespaces.setup_namespaces(tmpfs_bytes, mode in SESSION_MODES)
        os.chdir(WORKDIR)
        if not contained:
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
    if mode == "container":
        return container.oneshot(sock, req, body, filter_program, oom_adj, out_w, err_w)
    if mode == "container_session":
        return container.session(sock, req, filter_program, oom_adj, out_w, err_w)
    # Only now, with a program to run, is this executor the one to kill first under memory pressure.
    # Marked while it waited, a prepared executor could be the OOM killer's pick while the slot's
    # running program outgrew the limit, and the next, honest program was then found killed.
    os.write(oom_adj, b"1000")
    os.close(oom_adj)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    os.close(out_w)
    os.close(err_w)
    staging.reseed()
    if mode == "session":
        staging.set_stdin(b"")  # each cell gets its stdin as a buffer; fd 0 stays a valid empty file
        return session.session_loop(sock, req, body, program.env_site(req))
    try:
        code, stdin = staging.stage(req, body)
    except (OSError, ValueError) as exc:
        # Not the program's failure (it never ran): the worker answers the client's error from this frame.
        bound.send(sock, {"op": "stage_error", "error": str(exc)})
        return 125
    staging.set_limits(req, session=False)
    staging.set_stdin(stdin)
    fetch = req.get("fetch")
    spec = req.get("exec")
    if isinstance(spec, dict):  # another program: run in a child, its status and files reported from here
        return run_and_fetch(sock, lambda: exec_program(spec), list(fetch or []), int(req.get("fetch_max_bytes", 0)))
    script = WORKDIR + "/" + str(req["script"]) if req.get("script") else None
    site = program.env_site(req)
    if fetch:
        oneshot = lambda: program.run_oneshot(code, script, site, program.tops_of(req))  # noqa: E731
        return run_and_fetch(sock, oneshot, list(fetch), int(req["fetch_max_bytes"]))
    sock.close()  # the program gets no channel to the worker
    return program.run_oneshot(code, script, site, program.tops_of(req))


def exec_program(spec: dict[str, Any]) -> int:
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


def run_and_fetch(sock: socket.socket, run: Callable[[], int], paths: list[str], cap: int) -> int:
    """A one-shot whose files are returned after it ends, as SandboxFusion's ``fetch_files``; and every
    one-shot that runs another program (``exec_program``), whose status only its parent can report.

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
            rc = run()
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
    bound.send(sock, header, body)
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
