"""Time a sandbox was kept off the CPU by its neighbours, given back before its wall-clock limit ends it.

A step's time limit is meant for the program: time it ran, or could have run. Under a neighbour's CPU
storm a runnable program waits on the run queue, and a wall clock alone turns that wait into the
victim's ``program_timeout``. The kernel counts the wait per thread (``/proc/<pid>/task/*/schedstat``,
second field: ns runnable but not running). At its deadline a step is given back the longest wait of
any of its threads, up to its own limit once more; still starved past that, the step is the node's
failure (``NodePressure``), not the program's.

A program can make its threads wait by itself (pinned to one CPU behind its own busy child, too many
threads for its quota), and a wait it made must never become a masked failure. So time is given back
only when the starvation is seen from outside the sandbox, all three at once:
- the machine was busy: its CPUs were at least ``HOST_BUSY`` busy since the step began (``/proc/stat``,
  sampled by ``HostLoad``): a runnable thread with an idle CPU beside it waits by its own choice;
- the sandbox did not get its CPU: its group (children included) used less than ``OWN_USE`` of its
  quota over the step; a sandbox that used its cores had them;
- its group was never throttled by its own quota during the step.
Only the executor's threads' waits are counted (a child's are not): the rule can miss starvation, and
what the program does with its own threads and children cannot invent it.

Where a runner cannot count its sandbox's waits (a browser's renderers are Chromium's, shared by every
session, and its pages are the operator's, not the program's), ``CpuPressure`` reads the kernel's
pressure stall counter (``/proc/pressure/cpu``: time some runnable task waited for a CPU) across an
action instead.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import time
from collections.abc import Callable

STARVED_MIN_S = 0.02  # waits below this are scheduling noise, not a neighbour's storm
HOST_BUSY = 0.9  # the machine's CPUs this busy or more: a waiting thread had no CPU to go to
OWN_USE = 0.5  # a sandbox that used this share of its quota over the step had its CPU
SAMPLE_S = 0.25  # how often HostLoad reads /proc/stat


def thread_waits_s(pid: int) -> dict[str, float]:
    """Seconds each thread of ``pid`` spent runnable but not running (empty when it is gone)."""
    out: dict[str, float] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                out[tid] = int(f.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return out


class HostLoad:
    """The machine's CPU busy share since a moment, from ``/proc/stat`` sampled in the background (a step
    pays nothing for it)."""

    def __init__(self) -> None:
        self.samples: collections.deque[tuple[float, int, int]] = collections.deque(maxlen=int(120 / SAMPLE_S))
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self.samples.append(self._read())
            self._task = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_S)
            self.samples.append(self._read())

    @staticmethod
    def _read() -> tuple[float, int, int]:
        """(when, busy ticks, all ticks) of every CPU."""
        with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/stat", "rb") as f:
            v = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
            idle = v[3] + v[4]
            return time.monotonic(), sum(v) - idle, sum(v)
        return time.monotonic(), 0, 0

    def busy_since(self, t0: float) -> float | None:
        """Busy share of the CPUs from the last sample at or before ``t0`` until now; None without one."""
        base = None
        for sample in reversed(self.samples):
            if sample[0] <= t0:
                base = sample
                break
        if base is None:
            return None
        _, busy, total = self._read()
        return (busy - base[1]) / (total - base[2]) if total > base[2] else None


host_load = HostLoad()


class Starvation:
    """One step's account: how much wall time it is owed, and whether it ended starved."""

    def __init__(
        self,
        pid: int,
        limit_s: float,
        throttled: Callable[[], int],
        usage_s: Callable[[], float],
        cores: float,
        fresh: bool,
    ) -> None:
        """``fresh``: a process made for this step (a one-shot's executor), whose waits so far are its
        set-up's, a few ms at most: counted from 0, which saves reading them on every step."""
        self.pid = pid
        self.limit_s = limit_s
        self.cores = cores
        self._throttled, self._usage = throttled, usage_s
        self._t0 = time.monotonic()
        self._throttled0 = throttled()
        self._usage0 = usage_s()
        self._waits0 = {} if fresh else thread_waits_s(pid)
        self.given_s = 0.0
        self.starved = False

    def owed_s(self) -> float:
        """More wall time for the step now (0: none owed, or not starved as seen from outside); sets
        ``starved`` when it is owed more than the cap allows."""
        if self._throttled() > self._throttled0:
            return 0.0
        elapsed = time.monotonic() - self._t0
        busy = host_load.busy_since(self._t0)
        if busy is None or busy < HOST_BUSY:
            return 0.0
        if self._usage() - self._usage0 >= OWN_USE * self.cores * elapsed:
            return 0.0
        waits = thread_waits_s(self.pid)
        longest = max((w - self._waits0.get(tid, 0.0) for tid, w in waits.items()), default=0.0)
        owed = longest - self.given_s
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
