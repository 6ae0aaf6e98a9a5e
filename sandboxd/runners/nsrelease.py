"""Let go of namespaces off the request path: a small process that closes the descriptors it is sent.

The last reference to a mount namespace unmounts its copies of the jail's mounts
and waits for an expedited RCU grace period before ``close`` (or ``exit``)
returns: ~3 ms on this machine's VMs, more when CPUs are busy. A sandbox that
dies holding the last reference pays it inside ``exit()``, before the kernel
closes its files, so its pipes' EOF and its parent's exit report wait for it:
3 ms of a 5 ms one-shot. The worker keeps a reference to each executor's mount
namespace and hands it here when the step is answered.

A process, not a thread: a thread of the worker blocked in ``close`` comes back
wanting the GIL, and the worker's event loop, made to give it up, lost more
than the grace period it had saved (B8 c=1 p50 5.0 -> 6.3-9.7 ms).
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import socket
import subprocess
import sys

log = logging.getLogger(__name__)

# The closer: a datagram per descriptor, closed by a few threads (waiters on a grace period share it, so
# they keep up with a worker's rate of executions); the worker's end closing (it exited) ends it.
_CLOSER = """
import array, os, queue, socket, sys, threading
s = socket.socket(fileno=int(sys.argv[1]))
todo = queue.SimpleQueue()
def closer():
    while True:
        try:
            os.close(todo.get())
        except OSError:
            pass
for _ in range(4):
    threading.Thread(target=closer, daemon=True).start()
while True:
    msg, anc, _, _ = s.recvmsg(1, socket.CMSG_SPACE(4 * 16))
    if not msg and not anc:
        break
    for _level, _kind, data in anc:
        fds = array.array("i")
        fds.frombytes(data[: len(data) - len(data) % 4])
        for fd in fds:
            todo.put(fd)
"""


class NamespaceReleaser:
    """Hands descriptors to the closer process; closes them here if it cannot (slower, never lost)."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the closer now (a worker's start-up), not on the first step's path."""
        self._ensure()

    def _ensure(self) -> socket.socket | None:
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _CLOSER, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        except OSError as exc:
            log.warning("namespace closer could not start (%s): namespaces are released in-line", exc)
            ours.close()
            return None
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        return ours

    def close(self, fd: int) -> None:
        sock = self._ensure()
        if sock is not None:
            try:
                sock.sendmsg([b"c"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())])
            except OSError as exc:  # full (it fell behind) or gone: this one is closed here
                log.debug("namespace closer refused a descriptor: %s", exc)
        with contextlib.suppress(OSError):
            os.close(fd)  # ours; the closer's copy is the last reference

    def _stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(1)
            self._proc = None


releaser = NamespaceReleaser()
