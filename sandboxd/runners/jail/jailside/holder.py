"""pid 1 of a forked python session's namespaces, once its members exist (stdlib only, a fresh interpreter).

Why it exists: the members of a fork are children of the session's first
process, pid 1 of the namespaces they share; if pid 1 ended, the kernel would
end them all. So that process ``exec``s this script (none of the program's
code or hooks survive the ``exec``) and stays: it reaps whatever ends in the
namespaces and tells the worker how each member ended (the kernel's status,
which nothing else can report: only a parent can wait for a process). It ends
when the worker closes its channel, taking what is left with it.

argv: the channel's descriptor, the members' pids (JSON).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandboxd.runners.jail.jailside import wire
else:  # beside this file in the jail (no sandboxd package there)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import wire


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a late deadline interrupt meant for the old session
    fd, members = int(sys.argv[1]), set(json.loads(sys.argv[2]))
    null = os.open("/dev/null", os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(null, std)
    sock = socket.socket(fileno=fd)
    pidfds: dict[int, int] = {os.pidfd_open(pid): pid for pid in members}
    while True:
        readable, _, _ = select.select([sock.fileno(), *pidfds], [], [], 1.0)
        if sock.fileno() in readable and not sock.recv(4096):
            return  # the worker closed the lineage: everything in the namespaces ends with us
        for pfd in [p for p in readable if p in pidfds]:
            os.close(pfd)
            del pidfds[pfd]
        while True:  # members, and orphans whose own parent ended
            try:
                pid, status, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid in members:
                sock.sendall(wire.encode({**wire.exit_report(status, ru), "pid": pid}))


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError):
        pass
