"""A session's cells, one interpreter for the session's life, and its forks (stdlib only; runs in the
session's executor, pid 1 of its namespaces)."""

from __future__ import annotations

import os
import signal
import socket
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # inside the jail these are plain modules beside the zygote (no sandboxd package there)
    from sandboxd.runners.jail.jailside import bound, forking, program, staging
else:
    import bound
    import forking
    import program
    import staging

__builtins__ = bound.BUILTINS  # type: ignore[assignment]  # before any def (bound.py says why)
_os_kill, _os_waitpid, _sleep, _json_encode = bound._os_kill, bound._os_waitpid, bound._sleep, bound._json_encode
_monotonic = bound._monotonic
_sys, _TextIOWrapper, _BytesIO = bound._sys, bound._TextIOWrapper, bound._BytesIO
_sigpending, _sigtimedwait, _sigmask = bound._sigpending, bound._sigtimedwait, bound._sigmask


def session_loop(sock: socket.socket, req: dict[str, Any], body: bytes, site: str | None) -> int:
    """Cells in one interpreter, one reply each, carrying its request's tag (the worker's check that a frame
    the program wrote on this channel cannot stand in for a later cell's reply). Outside its cells (while
    the harness reads, writes and cleans up) SIGINT is held back: the worker's interrupt at a cell's
    deadline belongs to that cell, and one that lands after the cell finished is dropped instead of
    breaking the harness or the next cell."""
    namespace = program.fresh_main(None, site)
    program.stdio()
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
                bound.send(sock, reply)
            req, body = bound.recv_frame(sock)
        except BaseException:  # the worker closed the channel, or the program broke it (its own session)
            return 0


def _cell(
    req: dict[str, Any], body: bytes, namespace: dict[str, Any], cell: int, tag: int, sigint: set[signal.Signals]
) -> bytes:
    try:
        code, stdin = staging.stage(req, body)
    except (OSError, ValueError) as exc:
        return _json_encode({"op": "stage_error", "error": str(exc), "tag": tag}).encode()
    staging.set_limits(req, session=True)
    program.shadow(program.tops_of(req))
    _sys.stdin = _TextIOWrapper(_BytesIO(stdin), encoding="utf-8")
    if signal.SIGINT in _sigpending():
        _sigtimedwait(sigint, 0)  # an interrupt meant for an earlier cell
    rc = 1
    try:
        _sigmask(signal.SIG_UNBLOCK, sigint)
        rc = program.exec_code(code, namespace, f"<cell {cell}>")
    except BaseException:  # the deadline's interrupt, landing between the cell's end and here
        pass
    _hold(sigint)
    program.flush()
    if req.get("keep") is True:
        _reap_exited()
    else:
        _reap_strays()
    return b'{"op":"done","exit_code":%d,"tag":%d,"t":%.6f}' % (rc, tag, _monotonic())  # when it ended


def _fork(sock: socket.socket, req: dict[str, Any], tag: int) -> tuple[str, socket.socket | None]:
    """A fork request between cells (``forking.py``): a refusal's reason, or, in a member, its channel."""
    n = req.get("n")
    why = forking.refusal(req.get("keep") is True)
    if why is None and not (type(n) is int and 1 <= n <= forking.FORK_COPIES_MAX):
        why = f"n must be 1..{forking.FORK_COPIES_MAX}"
    if why is not None or type(n) is not int:
        return str(why), None
    bound.send(sock, _json_encode({"op": "fork_ready", "tag": tag}).encode())
    fds = forking.recv_fds(sock, 3 * (n + 1))
    member = forking.fork_group(sock, n, fds, staging.reseed)
    staging.set_stdin(b"")  # fd 0: a memfd of its own, not the source's
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
