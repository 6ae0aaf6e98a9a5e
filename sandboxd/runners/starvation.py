"""Time a sandbox was kept off the CPU by its neighbours, given back before its wall-clock limit ends it.

A step's time limit is meant for the program: time it ran, or could have run. Under a neighbour's CPU
storm a runnable program waits on the run queue, and a wall clock alone turns that wait into the
victim's ``program_timeout``. The kernel counts the wait per thread (``/proc/<pid>/task/*/schedstat``,
second field: ns runnable but not running). At its deadline a step is given that wait back, up to its
own limit once more; still starved past that, the step is the node's failure (``NodePressure``), not
the program's.

Waiting because of the sandbox's *own* CPU quota is the program's doing (too many busy threads for its
cores): the kernel counts that wait too, so a group throttled during the step gets nothing back.
Only the executor's threads are counted (a program's child processes are not): the rule can miss
starvation, never invent it.

Where a runner cannot count its sandbox's waits (a browser's renderers are Chromium's, shared by every
session), ``CpuPressure`` reads the kernel's pressure stall counter (``/proc/pressure/cpu``: time some
runnable task waited for a CPU) across an action instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable

STARVED_MIN_S = 0.02  # waits below this are scheduling noise, not a neighbour's storm


def run_queue_wait_s(pid: int) -> float:
    """Seconds the threads of ``pid`` spent runnable but not running (0 when it is gone)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


class Starvation:
    """One step's account: how much wall time it is owed, and whether it ended starved."""

    def __init__(self, pid: int, limit_s: float, throttled: Callable[[], int], fresh: bool) -> None:
        """``fresh``: a process made for this step (a one-shot's executor), whose waits so far are its
        set-up's, a few ms at most: counted from 0, which saves reading them on every step."""
        self.pid = pid
        self.limit_s = limit_s
        self._throttled = throttled
        self._throttled0 = throttled()
        self._wait0 = 0.0 if fresh else run_queue_wait_s(pid)
        self.given_s = 0.0
        self.starved = False

    def owed_s(self) -> float:
        """More wall time for the step now (0: none owed, or its own quota throttled it); sets ``starved``
        when it is owed more than the cap allows."""
        if self._throttled() > self._throttled0:
            return 0.0
        owed = run_queue_wait_s(self.pid) - self._wait0 - self.given_s
        if owed < STARVED_MIN_S:
            return 0.0
        room = self.limit_s - self.given_s
        if room < STARVED_MIN_S:
            self.starved = True
            return 0.0
        give = min(owed, room)
        self.given_s += give
        return give


class CpuPressure:
    """The machine's CPU stall time (PSI ``some``), in seconds; 0 where the kernel does not keep it."""

    PATH = "/proc/pressure/cpu"

    def __init__(self) -> None:
        try:
            self._fd = os.open(self.PATH, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = -1

    def stalled_s(self) -> float:
        if self._fd < 0:
            return 0.0
        try:
            first = os.pread(self._fd, 256, 0).split(b"\n", 1)[0]  # some avg10=.. avg60=.. avg300=.. total=<us>
            return int(first.rsplit(b"total=", 1)[1]) / 1e6
        except (OSError, ValueError, IndexError):
            return 0.0


CONTENDED_SHARE = 0.2  # stalled this share of an action's time or more: the action was starved, not slow
