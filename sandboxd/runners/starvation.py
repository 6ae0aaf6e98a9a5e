"""Time a sandbox was kept off the CPU by others, given back before its wall-clock limit ends it.

A step's time limit is meant for the program: time it ran, or could have run. On a full node a runnable
program waits on the run queue behind other sandboxes (the node's own slots, its sessions, a neighbour
outside the node, a pod's CPU quota), and a wall clock alone turns that wait into the victim's
``program_timeout``. So a step is timed on its *own* time: the wall time since it began less the time it
was kept off a CPU it was entitled to. It ends as the program's timeout when its own time reaches its
limit, however long that took on the wall, and as the node's failure (``NodePressure``) only when a wall
cap (``wall_cap_s``: a multiple of the limit that allows for the node's own density) came first.

Kept-off time is the smaller of two readings, so that neither the program nor its neighbours can invent it:
- the longest chain of waits: the time one of its threads (the executor's, and its descendants') spent
  runnable but not running since the step began (``/proc/<pid>/task/<tid>/schedstat``, second field),
  plus what the thread that started it had waited when it was first seen, and so on up to the executor.
  One thread alone undercounts: an executor that waited a second before it forked the program, or a
  shell whose command waited and then sat in ``wait()`` while its child waited in turn (a deep process
  tree came back ``program_timeout`` with 0.3 s of CPU), each kept the step from its end in sequence.
  Siblings are never added together (threads that wait side by side are kept from their end at once),
  and a parent's waits after its child was first seen are not the child's;
- the CPU its group did not get of what it may use: ``cores`` (its quota, at most the CPUs there are)
  times the wall time, less its group's CPU usage. A sandbox whose threads wait behind each other
  (more threads than its quota, nice or scheduling games among its own) used its whole share: this
  bound is 0, and so is what it is given back. A program cannot pin its threads to fewer CPUs than its
  quota (``sched_setaffinity`` is refused in every sandbox), which is how a red team once made its own
  waits count.
Sleeping is not waiting: a program that sleeps past its limit is timed out at its limit.

Where the executor runs the program in a child (an ``exec``: a compiled binary, a shell, a container's
command, or a one-shot whose files are fetched), the program's time begins when that child was forked
(the kernel's start time of the executor's first child, ``first_child_start``): what came before was the
executor's set-up (a container's image mounted, the step's files staged), blocked in the kernel as often
as waiting for a CPU, and none of it the program's. The executor is the sandbox's pid 1 and reaps only that
child: when it ends the step ends, so no later process can stand in for it.

Where a runner cannot count its sandbox's waits (a browser's renderers are Chromium's, shared by every
session, and its pages are the operator's, not the program's), ``CpuPressure`` reads the kernel's
pressure stall counter (``/proc/pressure/cpu``: time some runnable task waited for a CPU) across an
action instead.

One rule for every kind (``decide`` and ``wall_cap_s``): a jailed kind's executions and session cells, an
SQL statement (its engine keeps the account itself) and a browser action all ask the same two functions,
with the same inputs meaning the same thing: the limit, the wall time so far, the time the sandbox was
kept off the CPU (read as each kind can), and the wall cap, which depends on the worker's density alone
(``Density``: the cores' worth of sandboxes its kinds may run at once, or run now), never on which kind
asks. The same loop under the same load is then one class whichever kind ran it.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from sandboxd.errors import NodePressure

STARVED_MIN_S = 0.02  # own time this close to the limit is the limit (scheduling noise, clock reads)
MAX_TASKS = 4096  # threads read per check: a sandbox holds at most its pids limit of them


WALL_FLOOR = 2.0  # a step's wall cap is at least this many times its limit
DENSITY_MARGIN = 1.5  # and one and a half times the cores' worth of sandboxes its worker runs at once


def wall_cap_s(limit_s: float, cores_at_once: float, patience_s: float = math.inf) -> float:
    """How long on the wall a step may take before time others kept from it is the node's failure: its limit
    times the worker's density (``DENSITY_MARGIN`` x the cores its sandboxes may run at once, at least
    ``WALL_FLOOR``), never past the caller's patience. A program on a worker as full as its slots (or its
    sessions) allow is still timed out as its own; kept off the CPU past this, it was the node's load."""
    return min(limit_s * max(WALL_FLOOR, DENSITY_MARGIN * cores_at_once), patience_s)


class Density:
    """One worker's density, shared by all its runners (``RunnerContext.density``): the cores' worth of
    sandboxes its kinds may run at once by their slots (``configured``, set by the worker at start), and of
    those running now, every kind counted (session cells are not bounded by slots)."""

    def __init__(self, configured: float = 0.0) -> None:
        self.configured = configured
        self.running = 0.0

    def cores_at_once(self) -> float:
        return max(self.configured, self.running)

    @contextlib.contextmanager
    def step(self, cores: float) -> Iterator[None]:
        """A step running for its duration, ``cores`` its quota."""
        self.running += cores
        try:
            yield
        finally:
            self.running -= cores


@dataclass(frozen=True)
class Decision:
    """What a step's time says at a check: ``timeout`` (its own time is up: the program's), ``starved`` (the
    wall cap came first: the node's), or ``more`` (kept off the CPU: ``more_s`` more wall seconds)."""

    outcome: Literal["timeout", "starved", "more"]
    own_s: float
    more_s: float = 0.0


def decide(limit_s: float, elapsed_s: float, kept_s: float, cap_s: float) -> Decision:
    """The one rule: a step's own time is its wall time less what it was kept off the CPU (``kept_s``); when
    that reaches its limit it is the program's timeout, however long it took on the wall; when the wall cap
    comes first it was starved.

    The time given is ``left``, the own time it has left, never more: own time grows at most as fast as the
    wall, so a step that ends before its next check ended within its own time, and one still running at it
    is read again. Given more (the rest at the pace it had so far), a program starved while it started and
    then asleep ended past its limit inside time it was given, and came back a success: what it ran after
    the last reading cannot be read once it is gone (its threads' waits go with it)."""
    own = elapsed_s - max(0.0, kept_s)
    left = limit_s - own
    if left < STARVED_MIN_S:
        return Decision("timeout", own)
    room = cap_s - elapsed_s
    if room < STARVED_MIN_S:
        return Decision("starved", own)
    return Decision("more", own, min(room, left))


def starved_error(what: str, kept_s: float, wall_s: float) -> NodePressure:
    """The node's failure for a step whose wall cap came first (``what``: "the program", "the statement")."""
    return NodePressure(
        f"{what} was kept from running (behind other sandboxes on the CPU, or while its sandbox was set up) for "
        f"{kept_s:.1f} s of the {wall_s:.1f} s it was given (its limit times the worker's density, every kind's); "
        "it did not use its own time limit"
    )


def ended_late(limit_s: float, elapsed_s: float, kept_s: float) -> bool:
    """A step whose end was seen past its deadline (the loop that keeps it was late, or its last extension
    ran out as it ended): past its own time at its end, it is the program's timeout, not a success."""
    return elapsed_s - max(0.0, kept_s) > limit_s + STARVED_MIN_S


def usable_cores(cores: float) -> float:
    """A sandbox's quota in cores, at most the CPUs this process may run on: what it could use."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except OSError:
        cpus = os.cpu_count() or 1
    return min(cores, float(cpus))


def tree_waits_s(pid: int) -> list[tuple[int, float, int]]:
    """Each thread of ``pid`` and of its descendants: its id, the seconds it spent runnable but not running,
    and the thread that started it (``pid`` itself for ``pid``), parents before their children (empty when
    it is gone). Read only at a step's deadline, never on every step."""
    out: list[tuple[int, float, int]] = []
    stack = [(pid, pid)]  # (process, the thread that started it)
    while stack and len(out) < MAX_TASKS:
        proc, parent = stack.pop()
        try:
            tids = sorted(int(t) for t in os.listdir(f"/proc/{proc}/task"))
        except (OSError, ValueError):
            continue
        for tid in tids:
            base = f"/proc/{proc}/task/{tid}"
            try:
                with open(f"{base}/schedstat", "rb") as f:
                    wait = int(f.read().split()[1]) / 1e9
                with open(f"{base}/children", "rb") as f:
                    stack.extend((int(c), tid) for c in f.read().split())
            except (OSError, ValueError, IndexError):
                continue
            # A process's other threads were started by one of its own; its main thread stands for them.
            out.append((tid, wait, parent if tid == proc else proc))
    return out


_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def first_child_start(pid: int) -> float | None:
    """When ``pid``'s first child still running was forked, on ``CLOCK_BOOTTIME`` (a process's start time
    in ``/proc/<pid>/stat``, in clock ticks since boot); None when it has none."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            children = f.read().split()
    except OSError:
        return None
    starts = []
    for child in children:
        try:
            with open(b"/proc/%s/stat" % child, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # after the command, which may hold anything
            starts.append(int(fields[19]) * _TICK_S)  # the stat file's 22nd field; this list starts at its 3rd
        except (OSError, ValueError, IndexError):
            continue
    return min(starts, default=None)


class Waits:
    """A step's longest chain of waits (the module's docstring): each thread's own waits since the step
    began, on top of its starter's chain as it was when the thread was first seen."""

    def __init__(
        self, pid: int, read: Callable[[int], list[tuple[int, float, int]]] = tree_waits_s, root: bool = True
    ) -> None:
        """``root``: whether ``pid``'s own waits count (not when the program is its child, and its waits
        before the fork are set-up: ``Starvation``'s ``pre``)."""
        self.pid = pid
        self._read = read
        self._root = root
        self._at_start = {tid: wait for tid, wait, _ in read(pid)}  # threads already there
        self._base: dict[int, float] = {}  # a later thread's starter's chain when it was first seen

    def longest_s(self) -> float:
        chain: dict[int, float] = {}
        longest = 0.0
        for tid, wait, parent in self._read(self.pid):
            if tid == self.pid and not self._root:
                chain[tid] = 0.0
                continue
            if tid in self._at_start:
                c = wait - self._at_start[tid]
            else:
                base = self._base.get(tid)
                if base is None:
                    base = self._base[tid] = chain.get(parent, 0.0)
                c = base + wait
            chain[tid] = c
            longest = max(longest, c)
        return longest


class Starvation:
    """One step's account of its own time: how much more wall time it gets, and whether it ended starved."""

    def __init__(
        self,
        pid: int,
        limit_s: float,
        usage_s: Callable[[], float],
        cores: float,
        wall_cap_s: float,
        cap_now: Callable[[], float] | None = None,
        program_in_child: bool = False,
    ) -> None:
        """``usage_s``: the sandbox group's CPU seconds so far; ``cores``: what it may use (``usable_cores``);
        ``cap_now``: the wall cap the worker's density allows at a check (the cap only grows: the densest
        moment a step saw counts); ``program_in_child``: the executor runs the program in a child (the
        module's docstring). The threads' waits are read now, as the request goes out: a one-shot's
        executor was prepared before (on a busy machine its set-up waited hundreds of ms), and what it waited
        then is not time this step was kept from."""
        self.pid = pid
        self.limit_s = limit_s
        self.cores = cores
        self.wall_cap_s = max(wall_cap_s, limit_s)
        self._cap_now = cap_now
        self._usage = usage_s
        self._t0 = time.monotonic()
        self._boot0 = time.clock_gettime(time.CLOCK_BOOTTIME)  # the same moment on the kernel's start-time clock
        self._usage0 = usage_s()
        self._waits = Waits(pid, root=not program_in_child)
        self._pre: float | None = None if program_in_child else 0.0  # seconds before the program began
        self.kept_s = 0.0  # time it was kept off the CPU (or before its program began), as of the last check
        self.starved = False

    def more_s(self) -> float:
        """More wall time for the step now; 0 when its own time is up (the program's timeout) or when the
        wall cap came first (``starved``: the node's)."""
        elapsed = self.read()
        if self._cap_now is not None:
            self.wall_cap_s = max(self.wall_cap_s, self._cap_now())
        d = decide(self.limit_s, elapsed, self.kept_s, self.wall_cap_s)
        self.starved = d.outcome == "starved"
        return d.more_s

    def read(self) -> float:
        """The wall time so far; ``kept_s`` read again (a session's cell that ended: its kernel is still there)."""
        elapsed = time.monotonic() - self._t0
        if self._pre is None:
            start = first_child_start(self.pid)
            if start is not None:  # seen once, kept: the first child is the program, as long as the step runs
                self._pre = min(max(0.0, start - self._boot0), elapsed)
        if self._pre is None:
            self.kept_s = elapsed  # its program has not begun: all of it was set-up
        else:
            # The set-up's CPU is in the group's usage too: the deficit since the program began is at most this.
            deficit = max(0.0, self.cores * (elapsed - self._pre) - (self._usage() - self._usage0))
            longest = self._waits.longest_s() if deficit >= STARVED_MIN_S else 0.0
            self.kept_s = self._pre + max(0.0, min(longest, deficit))
        return elapsed

    def ended_late(self, elapsed_s: float) -> bool:
        """The step ended ``elapsed_s`` after it began, past its deadline: past its own time then
        (``ended_late``, with the time it was kept from as last read: a one-shot's processes are gone)?"""
        return ended_late(self.limit_s, elapsed_s, self.kept_s)


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
