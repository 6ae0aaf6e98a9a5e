"""CPU seconds of a node's processes by role, read from /proc (for CPU-per-step figures).

Roles: ``front`` (processes that take HTTP: each front process, or a single gateway process), ``node``
(the node process, which owns node-wide state, when fronts are separate), ``worker`` (worker processes) and
``sandbox`` (everything a worker started: jails, executors, engines, browsers). A process's CPU is its
own plus that of its children it has reaped (``cutime``): summed over the live processes, every
process that ever ran in the tree is counted once.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
ROLES = ("front", "node", "worker", "sandbox")


def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, CPU seconds incl. reaped children) of ``pid``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), sum(int(x) for x in fields[11:15]) * TICK_S


def _cmdline(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return ""


def role_of(cmdline: str) -> str | None:
    if "sandboxd.workerproc" in cmdline or "sandboxd.worker " in cmdline:
        return "worker"
    if "sandboxd.front" in cmdline:
        return "front"
    if "sandboxd.node" in cmdline:
        return "node"
    return None


def cpu_by_role(root: int) -> dict[str, float]:
    """CPU seconds so far of ``root``'s tree, by role; ``root`` itself is a front unless its command says."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None:
                parents[int(entry.name)], cpu[int(entry.name)] = st
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out = dict.fromkeys(ROLES, 0.0)
    # The root is the node process when front processes are its children, else the one process taking HTTP.
    fronts = any(role_of(_cmdline(c)) == "front" for c in children.get(root, []))
    todo = [(root, role_of(_cmdline(root)) or ("node" if fronts else "front"))]
    while todo:
        pid, role = todo.pop()
        out[role] += cpu.get(pid, 0.0)
        for child in children.get(pid, []):
            own = role_of(_cmdline(child))
            todo.append((child, "sandbox" if role in ("worker", "sandbox") else (own or "sandbox")))
    return out
