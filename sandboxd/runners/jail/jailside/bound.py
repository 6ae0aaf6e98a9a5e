"""The harness's own references to what a program can rebind (stdlib only; runs inside the jail).

A program shares the harness's interpreter (a one-shot until it exits, a session's cells for the session's
life) and can rebind any module attribute or builtin it sees: ``os._exit = None``, ``builtins.exec = ...``,
``sys.stdout = None``, ``threading._shutdown = ...``. None of that may change how its execution ends or what
the worker is told. So what the harness calls once a program has run is bound here, when the zygote imports
the harness and before any program exists; each harness module takes the names it uses with
``from bound import ...`` (a binding of its own, never a lookup through a module at call time), and its
functions resolve builtins through ``BUILTINS``, a private copy of the builtins namespace, so a program that
rebinds ``builtins.exec`` or ``builtins.isinstance`` changes its own world only.
"""

from __future__ import annotations

import _socket
import atexit
import builtins
import io
import json
import linecache
import os
import resource
import signal
import socket
import stat
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # inside the jail these are plain modules beside this file (no sandboxd package there)
    from sandboxd.runners.jail.jailside import wire
else:
    import wire

# Set as each harness module's ``__builtins__`` before its first ``def``: a function takes its builtins when
# it is made.
BUILTINS: dict[str, Any] = dict(builtins.__dict__)
__builtins__ = BUILTINS  # type: ignore[assignment]

# The harness's modules: none is the program's (``program.fresh_main`` takes them out of ``sys.modules``, so a
# step's own ``session.py`` or ``wire.py`` is imported from its files), and none makes a step's file a shadow.
HARNESS_MODULES = frozenset(
    {
        "bound",
        "wire",
        "seccomp",
        "landlock",
        "forking",
        "namespaces",
        "staging",
        "program",
        "executor",
        "session",
        "rootfs",
        "container",
    }
)

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
_sigpending, _sigtimedwait, _sigmask = signal.sigpending, signal.sigtimedwait, signal.pthread_sigmask
_sleep = __import__("time").sleep
_monotonic = __import__("time").monotonic
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
_WireError = wire.WireError


def send(sock: socket.socket, header: dict[str, Any] | bytes, body: bytes = b"") -> None:
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


def recv_frame(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    """``wire.recv_frame`` on private references: a session's next request, read after its cells ran."""
    head_len, body_len = _PREFIX.unpack(_recv_exact(sock, _PREFIX.size))
    if head_len > wire.MAX_HEADER_BYTES or body_len > wire.MAX_BODY_BYTES:
        raise _WireError(f"frame too large: header {head_len} B, body {body_len} B")
    header = _json_decode(_recv_exact(sock, head_len).decode())
    if not isinstance(header, dict):
        raise _WireError("frame header is not an object")
    return header, _recv_exact(sock, body_len) if body_len else b""
