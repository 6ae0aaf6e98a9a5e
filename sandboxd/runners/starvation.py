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
Sleeping is not waiting: a program that sleeps past its limit is timed out at its limit. Nor is a sleep
beside a spinner: where a process of the program sleeps on a timer at a look (``in_timed_sleep``), what
the chains grew by since the last look is given back only for the share of that interval it was awake
(its CPU and waits, ``schedstat``), or as much as its own chain and its child processes' grew (what its
end may have waited on); its own process's other threads ended nothing sooner for it (``Waits.kept_s``).
A spinning thread beside a sleep, long or just past the limit, in one call or in naps, was once credited
its waits on a loaded node, and the sleep came back a success.

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
import platform
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, NamedTuple

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


class Thread(NamedTuple):
    """One thread as a look reads it: its id, the seconds it spent runnable but not running, the thread that
    started it, the CPU it used (ns), and whether it is its process's main thread."""

    tid: int
    wait_s: float
    starter: int
    cpu_ns: int
    main: bool


def tree_waits_s(pid: int) -> list[Thread]:
    """Each thread of ``pid`` and of its descendants (``pid`` started itself), parents before their children
    (empty when it is gone). Read only at a step's deadline, never on every step."""
    out: list[Thread] = []
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
                    cpu, wait = f.read().split()[:2]
                with open(f"{base}/children", "rb") as f:
                    stack.extend((int(c), tid) for c in f.read().split())
            except (OSError, ValueError, IndexError):
                continue
            # A process's other threads were started by one of its own; its main thread stands for them.
            main = tid == proc
            out.append(Thread(tid, int(wait) / 1e9, parent if main else proc, int(cpu), main))
    return out


# The system calls that only sleep, by machine: nanosleep and clock_nanosleep (``time.sleep``, ``sleep``,
# ``std::this_thread::sleep_for``, ``usleep``). Waits that merely carry a timeout are not among them: a join,
# ``future.result(timeout=)`` or ``queue.get(timeout=)`` is a futex with one, an event loop's ``epoll_wait``
# has one, and a Go program's main thread parks in either while its goroutines run on its other threads:
# counted as sleeps, an honest program that waits on its own threads that way, starved by the node, would
# lose what its threads were kept from and be blamed for the node's load.
_SLEEPS = {"x86_64": frozenset({35, 230}), "aarch64": frozenset({101, 115})}


def in_timed_sleep(tid: int, machine: str = platform.machine()) -> bool:
    """Whether ``tid`` is asleep in a call that only sleeps (``_SLEEPS``; ``/proc/<tid>/syscall``: the call's
    number while it is blocked). False when it cannot be read (a node without ``CAP_SYS_PTRACE``: the chart
    grants it, docs/deploy.md): a program is then given back what it was kept from, as before this was
    read."""
    try:
        with open(f"/proc/{tid}/syscall", "rb") as f:
            nr = int(f.read().split(maxsplit=1)[0])
    except (OSError, ValueError, IndexError):
        return False  # gone, unreadable, or "running"
    return nr in _SLEEPS.get(machine, frozenset())


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
    began, on top of its starter's chain as it was when the thread was first seen; less what fell in the
    time the program slept on a timer (``kept_s``)."""

    def __init__(
        self,
        pid: int,
        read: Callable[[int], list[Thread]] = tree_waits_s,
        root: bool = True,
        timed: Callable[[int], bool] = in_timed_sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``root``: whether ``pid`` is the program (not when the program is its child, and its waits before
        the fork are set-up: ``Starvation``'s ``pre``); ``timed``: whether a thread sleeps on a timer now."""
        self.pid = pid
        self._read = read
        self._root = root
        self._timed = timed
        self._clock = clock
        self._t = clock()
        first = read(pid)
        self._at_start = {t.tid: t.wait_s for t in first}  # threads already there
        self._base: dict[int, float] = {}  # a later thread's starter's chain when it was first seen
        self._chain: dict[int, float] = {t.tid: 0.0 for t in first}  # each thread's chain at the last look
        self._main = {t.tid: (t.cpu_ns, t.wait_s) for t in first if t.main}  # a process's CPU and waits then
        self._last_s = 0.0  # what ``kept_s`` found at the last look, before forfeits
        self._forfeit_s = 0.0  # of what it found, what fell in the time the program slept on a timer
        self.asleep = 0.0  # the share of the interval since the last look a process slept, asleep on a timer now
        self._allowed_s = 0.0  # and what its end could have waited for meanwhile: its own and its children's

    def kept_s(self, deficit_s: float) -> float:
        """What the program was kept from: its longest chain, at most ``deficit_s`` (its group's CPU shortfall;
        below ``STARVED_MIN_S`` it used its share, and its threads are not read). Where a process of the
        program sleeps on a timer at a look, what the chains grew by since the last one is given back only
        for the share of it that process was awake (or as much as its own chain and its child processes'
        grew: what it may have waited on); its end was the timer's, not the CPU's, for the rest. A spinning
        thread beside a long sleep was once credited its waits, and the sleep came back a success."""
        if deficit_s < STARVED_MIN_S:
            self._last_s = 0.0
            return 0.0
        kept = min(self.longest_s(), deficit_s)
        growth = max(0.0, kept - self._last_s)
        if self.asleep > 0.0:
            allowed = max(min(self._allowed_s, growth), growth * (1.0 - self.asleep))
            self._forfeit_s += growth - allowed
        self._last_s = kept
        return max(0.0, kept - self._forfeit_s)

    def longest_s(self) -> float:
        """The longest chain now; ``asleep`` and what the sleeper may have waited for set for the interval since
        the last look."""
        now = self._clock()
        interval, self._t = max(now - self._t, 1e-6), now
        chain: dict[int, float] = {}
        lineage: dict[int, tuple[int, ...]] = {}  # a thread's process and the processes that started it
        longest = 0.0
        threads = self._read(self.pid)
        for t in threads:  # parents before their children
            if t.main:
                lineage[t.tid] = (*lineage.get(t.starter, ()), t.tid) if t.tid != t.starter else (t.tid,)
            else:
                lineage[t.tid] = lineage.get(t.starter, (t.starter,))
            if t.tid == self.pid and not self._root:
                chain[t.tid] = 0.0
                continue
            if t.tid in self._at_start:
                c = t.wait_s - self._at_start[t.tid]
            else:
                base = self._base.get(t.tid)
                if base is None:
                    base = self._base[t.tid] = chain.get(t.starter, 0.0)
                c = base + t.wait_s
            chain[t.tid] = c
            longest = max(longest, c)
        self.asleep, self._allowed_s, sleeper = 0.0, 0.0, None
        for t in threads:
            if not t.main or (t.tid == self.pid and not self._root):
                continue
            cpu0, wait0 = self._main.get(t.tid, (0, 0.0))
            share = (interval - (t.cpu_ns - cpu0) / 1e9 - (t.wait_s - wait0)) / interval  # asleep or blocked
            if share > self.asleep and self._timed(t.tid):
                self.asleep, sleeper = min(1.0, share), t.tid
        if sleeper is not None:
            # What its end may have waited for: its own waits, and its child processes' (a poll of a child in
            # naps, as subprocess.run(timeout=) does); never its own process's other threads'.
            self._allowed_s = max(
                chain[u.tid] - self._chain.get(u.tid, self._base.get(u.tid, 0.0))
                for u in threads
                if u.tid in chain
                and (u.tid == sleeper or (sleeper in lineage[u.tid] and lineage[u.tid][-1] != sleeper))
            )
        self._main = {t.tid: (t.cpu_ns, t.wait_s) for t in threads if t.main}
        self._chain = chain
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
            self.kept_s = self._pre + self._waits.kept_s(deficit)
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
