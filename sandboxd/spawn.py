"""Starting the node's own processes (fronts, workers, jails, SQL engines) with only the descriptors they need.

uvloop runs every sandboxd process, and its subprocess support (libuv's spawn) closes nothing in the child:
each inheritable descriptor of the parent stays open there, beside copies of the child's stdin, stdout and
stderr that it makes for the spawn. A worker's received sandbox pipes then lived on in every jail and SQL
engine it started later, and once the worker closed its own copy, its loop kept polling a file that was
still open elsewhere and spun on EBADF (22-83% of a CPU, for as long as the node lived). So the node's
processes are started with the standard library's fork-exec instead (``close_fds``: only 0, 1, 2 and
``pass_fds`` reach the child; no ``preexec_fn``, so CPython keeps its fast ``vfork`` path), on the calling
thread (a child's parent-death signal follows the thread that forked it), and watched through a pidfd on
the running loop. ``close_inherited`` is the same rule from the child's side, for what a parent we did not
start ourselves (a process manager, a shell) left open.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import subprocess
from collections.abc import Collection, Mapping, Sequence
from typing import IO

Stdio = int | IO[bytes] | None


class Child:
    """A process this one started: ``pid``, ``returncode`` (None while it runs), ``wait``, signals."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        self._exited: asyncio.Event | None = None

    @property
    def returncode(self) -> int | None:
        return self._popen.poll()

    async def wait(self) -> int:
        """Its exit status, once it has exited (a pidfd becomes readable then: nothing polls)."""
        code = self._popen.poll()
        if code is not None:
            return code
        if self._exited is None:
            self._exited = asyncio.Event()
            try:
                pidfd = os.pidfd_open(self.pid)
            except OSError:  # already reaped elsewhere, or gone: its status is what poll says now
                return self._popen.wait()
            loop = asyncio.get_running_loop()
            event = self._exited

            def ended() -> None:
                loop.remove_reader(pidfd)
                os.close(pidfd)
                event.set()

            loop.add_reader(pidfd, ended)
        await self._exited.wait()
        return self._popen.wait()

    def send_signal(self, sig: int) -> None:
        if self._popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdin: Stdio = subprocess.DEVNULL,
    stdout: Stdio = None,
    stderr: Stdio = None,
    pass_fds: Collection[int] = (),
    start_new_session: bool = False,
) -> Child:
    """Start ``argv`` with 0, 1, 2 and ``pass_fds`` open in it, nothing else."""
    popen = subprocess.Popen(
        list(argv),
        env=env,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        close_fds=True,
        pass_fds=tuple(pass_fds),
        start_new_session=start_new_session,
    )
    return Child(popen)


def close_inherited(keep: Collection[int] = ()) -> None:
    """Close every descriptor above 2 but ``keep``: what a process needs is what it was given on purpose."""
    top = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    top = top if 0 < top < 1 << 20 else 1 << 20
    start = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, top)
