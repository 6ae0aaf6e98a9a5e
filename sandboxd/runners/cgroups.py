"""Per-slot cgroups, v1 (this machine) and v2 (most production hosts).

Each pool slot gets its group once, when its jail starts, and every execution in
that slot is forked from inside it: moving a process per request costs ~0.4 ms
and serialises forks machine-wide (see docs/isolation.md). Each session gets a
group of its own, and is born in it: its jail's zygote visits the group for the
fork (``Jail.spawn(into=...)``), because what the kernel charges for a new process
stays where the process was made, whatever moves later.

Counters (OOM kills, pids-limit hits) are read before and after each execution
so that a kill can be attributed to the limit that caused it; with one execution
at a time per slot the delta is unambiguous. Which limit: the kernel counts an
OOM kill, and (v1) a refused fork, in the victim's own group whichever ancestor's
limit was reached, so each is checked against the group's own limit: its own
memory limit's hits (v2 ``memory.events`` max, counted only where the limit
is; v1: the group's peak reached its limit during the execution, since v1 does
not count ``failcnt`` where memsw is limited and memsw is charged first) and,
for pids, whether the group ever reached its own ``pids.max`` and no ancestor
is at its own. A kill or refusal from above is the
node's (``NodePressure``), never the program's.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sandboxd.errors import SandboxSetupError

log = logging.getLogger("sandboxd.cgroups")

V1_CONTROLLERS = ("memory", "pids")
V1_OPTIONAL = ("cpu", "cpuacct")  # used where mounted: a CPU quota per sandbox, and its CPU time
CPU_PERIOD_US = 100_000
AT_LIMIT_BYTES = 2 << 20  # a v1 peak this close to the limit reached it (charges come in batches of 64 pages)


@dataclass(frozen=True)
class Counters:
    oom_kills: int
    pids_max_hits: int
    memory_limit_hits: int = 0  # charges this group's own memory limit stopped (reclaimed or not)
    # v2: forks refused by an ancestor's limit (the node's group, its pod's), summed over the ancestors'
    # ``pids.events``. From kernel 6.12 a refusal is counted where the limit is, not in the forking group.
    pids_refused_above: int = 0


def memory_kill(before: Counters, after: Counters) -> Literal["own", "node"] | None:
    """Whose memory limit an OOM kill between two readings of a sandbox's group was, the one rule every kind
    asks (a jailed execution or session, an SQL engine): ``own`` when its own limit was reached (the
    program's verdict, ``program_killed``), ``node`` when it was not (the node's or its pod's memory ran
    out: ``node_pressure``, never the program's), None when nothing was killed. The kernel counts an OOM kill
    in the victim's group whichever limit was reached, so the group's own limit's hits tell which."""
    if after.oom_kills <= before.oom_kills:
        return None
    return "own" if after.memory_limit_hits > before.memory_limit_hits else "node"


def _parse_kv(text: bytes) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(b" ")
        with contextlib.suppress(ValueError):
            out[key.decode()] = int(value)
    return out


def _read_kv(path: Path) -> dict[str, int]:
    try:
        return _parse_kv(path.read_bytes())
    except OSError:
        return {}


def _read_int(path: Path, default: int = 0) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def _read_limit(path: Path) -> int | None:
    """A limit file's value; None for "max" (none) or unreadable."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _own_path(controller: str | None) -> str:
    """Our own cgroup inside ``controller`` (None: the v2 unified one)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if controller is None and ctrls == "":
            return path
        if controller is not None and controller in ctrls.split(","):
            return path
    return "/"


class CgroupGroup:
    """One cgroup (a directory per controller on v1, a single one on v2)."""

    def __init__(self, dirs: dict[str, Path], version: int) -> None:
        self.dirs = dirs
        self.version = version
        self.memory_limit = 0  # set_limits' (0: none set here)
        self._fds: dict[str, int] = {}  # counter files kept open: a pread is ~2 us, an open-read-close ~27
        self._generation = 0  # renew_pids' fresh groups
        self._pids_local_seen = 0  # v2: pids.events.local max at the last counters(start=True)
        self._closed = False  # close_files ran: the group is going
        self._delegating = False  # v2: its controllers are handed to its children (``child``)
        self._above: list[Path] | None = None  # v2: its ancestors with pids.events (``_ancestors``)

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in dict.fromkeys(self.dirs.values())]

    def set_limits(self, memory_bytes: int, pids: int) -> None:
        try:
            if self.version == 1:
                mem = self.dirs["memory"]
                # memsw (may be absent: swap accounting off) must stay >= memory, so
                # when raising write it first, when lowering write it last.
                memsw = mem / "memory.memsw.limit_in_bytes"
                with contextlib.suppress(OSError):
                    memsw.write_text(str(memory_bytes))
                (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    memsw.write_text(str(memory_bytes))
                (self.dirs["pids"] / "pids.max").write_text(str(pids))
                self.memory_limit = memory_bytes
            else:
                d = self.dirs["unified"]
                (d / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (d / "memory.swap.max").write_text("0")
                (d / "pids.max").write_text(str(pids))
        except OSError as exc:
            raise SandboxSetupError(f"cannot set cgroup limits: {exc}") from exc

    def set_cpu(self, cores: float) -> None:
        """At most ``cores`` CPUs for everything in the group (CFS quota), so no sandbox, and nothing it
        leaves running between session steps, takes more than its share of the machine."""
        quota = max(1000, int(cores * CPU_PERIOD_US))
        try:
            if self.version == 1:
                d = self.dirs.get("cpu")
                if d is not None:
                    (d / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                    (d / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (self.dirs["unified"] / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
        except OSError as exc:
            raise SandboxSetupError(f"cannot set the cgroup CPU quota: {exc}") from exc

    def set_weight(self, weight: int) -> None:
        """The group's CPU weight among its siblings (v2 ``cpu.weight``, 100 = default; v1 ``cpu.shares``)."""
        try:
            if self.version == 1:
                d = self.dirs.get("cpu")
                if d is not None:
                    (d / "cpu.shares").write_text(str(max(2, weight * 1024 // 100)))
            else:
                (self.dirs["unified"] / "cpu.weight").write_text(str(weight))
        except OSError as exc:
            raise SandboxSetupError(f"cannot set the cgroup CPU weight: {exc}") from exc

    def add(self, pid: int) -> None:
        try:
            for f in self.procs_files:
                f.write_text(str(pid))
        except OSError as exc:
            raise SandboxSetupError(f"cannot move pid {pid} into cgroup: {exc}") from exc

    def _pread(self, path: str) -> bytes:
        """A counter file's current text (cgroup files regenerate at offset 0); b"" when unreadable. Kept
        open for the next read, unless the group is being removed (``close_files``)."""
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return b""
            if self._closed:
                try:
                    return os.pread(fd, 4096, 0)
                except OSError:
                    return b""
                finally:
                    os.close(fd)
            self._fds[path] = fd
        try:
            return os.pread(fd, 4096, 0)
        except OSError:
            return b""

    def close_files(self) -> None:
        """Close the counter files (``remove`` runs in a thread while the loop may still read a counter: the
        dictionary is swapped, never iterated while it changes, and later reads keep nothing open)."""
        self._closed = True
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)

    def counters(self, start: bool = False) -> Counters:
        """The group's counters; ``start``: read before an execution (the v1 peak is reset if it stands at
        the limit, so that the reading after says whether this execution reached it)."""
        if self.version == 1:
            mem = self.dirs["memory"]
            oom = _parse_kv(self._pread(f"{mem}/memory.oom_control")).get("oom_kill", 0)
            pids = _parse_kv(self._pread(f"{self.dirs['pids']}/pids.events")).get("max", 0)
            hits = 0
            if self.memory_limit:  # v1's failcnt is not counted where memsw is limited (it is charged first)
                peak = int(self._pread(f"{mem}/memory.max_usage_in_bytes") or 0)
                if peak >= self.memory_limit - AT_LIMIT_BYTES:
                    hits = 1
                    if start:
                        with contextlib.suppress(OSError):
                            (mem / "memory.max_usage_in_bytes").write_text("0")
                        hits = 0
        else:
            events = _parse_kv(self._pread(f"{self.dirs['unified']}/memory.events"))
            oom, hits = events.get("oom_kill", 0), events.get("max", 0)
            pids = _parse_kv(self._pread(f"{self.dirs['unified']}/pids.events")).get("max", 0)
            if start:
                local = _parse_kv(self._pread(f"{self.dirs['unified']}/pids.events.local"))
                self._pids_local_seen = local.get("max", 0)
            above = sum(_parse_kv(self._pread(f"{p}/pids.events")).get("max", 0) for p in self._ancestors())
            return Counters(oom, pids, hits, above)
        return Counters(oom, pids, hits)

    def _ancestors(self) -> list[Path]:
        """v2: the groups above this one that count pids events (the root has no pids.events), found once."""
        if self._above is None:
            d = self.dirs["unified"]
            self._above = [p for p in d.parents if (p / "pids.events").exists()]
        return self._above

    def throttled_periods(self) -> int:
        """CFS periods in which the group ran out of its own CPU quota (0 without a cpu controller)."""
        d = self.dirs.get("cpu" if self.version == 1 else "unified")
        return _parse_kv(self._pread(f"{d}/cpu.stat")).get("nr_throttled", 0) if d is not None else 0

    def cpu_usage_s(self) -> float:
        """CPU seconds used by everything in the group so far (0 without the accounting)."""
        if self.version == 1:
            d = self.dirs.get("cpuacct")
            return int(self._pread(f"{d}/cpuacct.usage") or 0) / 1e9 if d is not None else 0.0
        return _parse_kv(self._pread(f"{self.dirs['unified']}/cpu.stat")).get("usage_usec", 0) / 1e6

    def pids_refused_here(self) -> bool:
        """Whether a refused fork counted in this group can have been its own limit's doing.

        v2 (``pids.events.local``, kernel 6.12+): exactly, its own ``max`` hits. v1 counts a refusal in the
        forking group whichever limit refused it, so: not when the group never reached its own
        ``pids.max`` (``pids.peak``, which only rises: ``renew_pids`` gives a slot a fresh group once it
        has), nor while an ancestor (the node's group, its pod's) is at its own. Unknown: the group's.
        """
        d = self.dirs["pids" if self.version == 1 else "unified"]
        if self.version == 2 and (d / "pids.events.local").exists():
            return _read_kv(d / "pids.events.local").get("max", 0) > self._pids_local_seen
        if self._pids_peak_vs_limit(d) is False:
            return False
        for parent in d.parents:
            if not (parent / "pids.max").exists():
                break
            cap = _read_limit(parent / "pids.max")
            if cap is not None and _read_int(parent / "pids.current") >= cap:
                return False
        return True

    def pids_peak_reached(self) -> bool:
        """The group's ``pids.peak`` stands at its ``pids.max`` (a fork bomb ran here) where the peak is all
        there is to tell its own refusals from a parent's (v1, and v2 before ``pids.events.local``), so that
        later refusals could no longer be told apart (``renew_pids``). Kernel 6.1 with cgroup v2: a slot's
        fork bomb left the honest program after it, refused by its pod's limit, blamed (``program_exit``)."""
        d = self.dirs["pids" if self.version == 1 else "unified"]
        if self.version == 2 and (d / "pids.events.local").exists():
            return False
        return self._pids_peak_vs_limit(d) is True

    @staticmethod
    def _pids_peak_vs_limit(d: Path) -> bool | None:
        """Whether ``pids.peak`` reached ``pids.max`` in ``d``; None when either is unknown (no limit)."""
        peak, limit = _read_int(d / "pids.peak", -1), _read_limit(d / "pids.max")
        return None if peak < 0 or limit is None else peak >= limit

    def renew_pids(self) -> None:
        """Move everything in this group's pids group to a fresh one with the same limits, and remove the old:
        its peak starts again from what is there. v1: the pids hierarchy alone (the controller moves the
        charges). v2: the whole group, each limit copied (memory charged so far stays with the old group,
        which goes once its last page does)."""
        which = "pids" if self.version == 1 else "unified"
        old = self.dirs[which]
        self._generation += 1
        new = old.parent / f"{old.name.split('~')[0]}~{self._generation}"
        new.mkdir(exist_ok=True)
        limits = (
            ("pids.max",)
            if self.version == 1
            else ("pids.max", "memory.max", "memory.swap.max", "cpu.max", "cpu.weight")
        )
        for name in limits:
            with contextlib.suppress(FileNotFoundError):
                value = (old / name).read_text().strip()
                (new / name).write_text(value)
        for _ in range(50):  # a fork in flight lands in the old group: move until it is empty
            pids = [p for p in (old / "cgroup.procs").read_text().split() if p]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):  # gone meanwhile
                    (new / "cgroup.procs").write_text(pid)
        self.dirs[which] = new
        for path in [p for p in list(self._fds) if p.startswith(f"{old}/")]:
            with contextlib.suppress(OSError):
                os.close(self._fds.pop(path))
        if not _kill_and_rmdir(old):
            log.warning("cgroup %s: could not be removed after its processes moved to %s", old, new)

    def memory(self) -> tuple[int, int]:
        """Bytes charged now and the limit (0 when unreadable or unlimited)."""
        d = self.dirs["memory" if self.version == 1 else "unified"]
        names = (
            ("memory.usage_in_bytes", "memory.limit_in_bytes")
            if self.version == 1
            else ("memory.current", "memory.max")
        )
        out = []
        for name in names:
            try:
                out.append(int((d / name).read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                out.append(0)
        return out[0], out[1]

    def child(self, name: str) -> CgroupGroup:
        """A group inside this one. On v2 a child has a controller's files (``memory.max``, ``pids.max``,
        ``cpu.max``) only once its parent hands the controller down (``cgroup.subtree_control``), and writing a
        file that is not there is EACCES: so the first child makes this group delegate them, which it can
        while it holds no process itself (a session jails' host: its zygote and sessions are its children)."""
        if self.version == 2 and not self._delegating:
            _delegate_controllers(self.dirs["unified"])
            self._delegating = True
        dirs = {k: v / name for k, v in self.dirs.items()}
        for d in dict.fromkeys(dirs.values()):
            d.mkdir(exist_ok=True)
        return CgroupGroup(dirs, self.version)

    def enable_subtree(self) -> None:
        """v2 only: let children of this group have memory, pids and CPU limits."""
        if self.version == 2:
            _delegate_controllers(self.dirs["unified"])
            self._delegating = True

    def kill_all(self) -> None:
        """SIGKILL every process in the group (each checked to be a member: a pid number is not a process)."""
        for d in dict.fromkeys(self.dirs.values()):
            for _ in range(5):
                try:
                    pids = [int(p) for p in (d / "cgroup.procs").read_text().split()]
                except (OSError, ValueError):
                    break
                if not pids:
                    break
                for pid in pids:
                    kill_if_member(pid, d)

    def remove(self) -> bool:
        """Remove the group; kill what is left in it first (never leak a sandbox).

        False when a directory is still busy (a process killed with a lot of memory can take longer
        to exit than we wait here): the caller tries again later, so no empty group is left behind.
        """
        self.close_files()
        gone = True
        for d in dict.fromkeys(self.dirs.values()):
            for sub in sorted((p for p in d.glob("**/") if p != d), key=lambda p: -len(p.parts)):
                gone = _kill_and_rmdir(sub) and gone
            gone = _kill_and_rmdir(d) and gone
        return gone


def kill_if_member(pid: int, group_dir: Path) -> None:
    """SIGKILL ``pid`` only if it is still the process in ``group_dir``: a pid number is not a process.

    The pidfd pins one process; /proc/<pid>/cgroup read after it is open tells
    whether that process is ours (if the number was reused before, the new
    owner lives elsewhere and is left alone; if it dies after, the signal
    finds nothing).
    """
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if in_group(pid, [group_dir]):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        return
    finally:
        os.close(pidfd)


def in_group(pid: int, group_dirs: Iterable[Path]) -> bool:
    """Whether ``pid`` is in one of ``group_dirs``, as its /proc/<pid>/cgroup says (read it after a pidfd
    pinned the process: a pid number is not a process). Matched by the last three parts of the path, which
    include the worker's own root name: unique on the host."""
    tails = tuple("/" + "/".join(d.parts[-3:]) for d in group_dirs)
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return any(line.rstrip("\n").endswith(tails) for line in f)
    except OSError:
        return False


def _kill_and_rmdir(d: Path) -> bool:
    procs = d / "cgroup.procs"
    for _ in range(50):
        try:
            pids = [int(p) for p in procs.read_text().split()]
        except (OSError, ValueError):
            pids = []
        for pid in pids:
            kill_if_member(pid, d)
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.01)
    return False


class CgroupRoot:
    """Where sandboxd's groups live: under our own group, so a host limit still applies."""

    def __init__(self, name: str, mount: Path = Path("/sys/fs/cgroup"), version: int | None = None) -> None:
        self.mount = mount
        self.version = version or detect_version(mount)
        if self.version == 1:
            ctrls = [*V1_CONTROLLERS, *(c for c in V1_OPTIONAL if (mount / c).is_dir())]
            dirs = {c: mount / c / _own_path(c).lstrip("/") / name for c in ctrls}
        else:
            dirs = {"unified": mount / _own_path(None).lstrip("/") / name}
        try:
            for d in dirs.values():
                d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SandboxSetupError(f"cannot create cgroup {name}: {exc}") from exc
        self.group = CgroupGroup(dirs, self.version)
        if self.version == 2:
            own = dirs["unified"].parent
            if not _delegate_controllers(own):
                _move_into_leaf(own)  # cgroup v2: a group with processes cannot hand controllers to children
                _delegate_controllers(own)
            self.group.enable_subtree()

    def slot(self, name: str) -> CgroupGroup:
        return self.group.child(name)


def sweep_dead_nodes(node_id: str, mount: Path = Path("/sys/fs/cgroup")) -> list[str]:
    """Remove the groups an earlier node of this id left when it died without stopping (SIGKILL, the OOM
    killer, a crash): its workers' ``<node_id>-<pid>-w<k>[-<kind>]``, where ``pid`` is no live process or is
    this process's own (a container restarted in its pod gives the new node the old one's pid; none of its
    groups exists yet). Whatever still runs in them is killed: a sandbox of a dead node is nobody's, and it
    holds memory and CPU no budget counts. Call it before the workers start; returns the names removed. A node
    id names one node at a time (a second one is refused: ``NodeIdConflict``), so no live node's groups match."""
    try:
        version = detect_version(mount)
    except SandboxSetupError:
        return []
    if version == 1:
        ctrls = [*V1_CONTROLLERS, *(c for c in V1_OPTIONAL if (mount / c).is_dir())]
        parents = {c: mount / c / _own_path(c).lstrip("/") for c in ctrls}
    else:
        parents = {"unified": mount / _own_path(None).lstrip("/")}
    pattern = re.compile(rf"^{re.escape(node_id)}-(\d+)-w\d+(-[a-z]+)?$")
    names = set()
    for parent in parents.values():
        with contextlib.suppress(OSError):
            for child in parent.iterdir():
                found = pattern.match(child.name)
                if found and child.is_dir() and not _alive_elsewhere(int(found.group(1))):
                    names.add(child.name)
    removed = []
    for name in sorted(names):
        dirs = {k: p / name for k, p in parents.items() if (p / name).is_dir()}
        if CgroupGroup(dirs, version).remove():
            removed.append(name)
    return removed


def _alive_elsewhere(pid: int) -> bool:
    """A live process other than this one."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _delegate_controllers(group: Path) -> bool:
    """memory, pids and cpu for ``group``'s children; False when the kernel says the group must be empty first."""
    try:
        (group / "cgroup.subtree_control").write_text("+memory +pids +cpu")
        return True
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return False
        if exc.errno == errno.EINVAL:  # cpu not available here: memory and pids are what limits need
            with contextlib.suppress(OSError):
                (group / "cgroup.subtree_control").write_text("+memory +pids")
        return True


def _move_into_leaf(group: Path) -> None:
    """Move every process of ``group`` into ``group/node`` (what container inits do under cgroup v2).

    cgroup v2's no-internal-processes rule: a group other than the real root that holds processes cannot
    enable controllers for its children. In a container with its own cgroup namespace the node's group is
    such a group (it holds the node itself, tini, the workers), so sandboxd moves them all into a leaf first.
    """
    leaf = group / "node"
    leaf.mkdir(exist_ok=True)
    for _ in range(3):  # processes forked meanwhile land in the old group: move again
        pids = [p for p in (group / "cgroup.procs").read_text().split() if p]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, OSError):
                (leaf / "cgroup.procs").write_text(pid)
    log.warning("cgroup %s still holds processes after moving them to %s", group, leaf)


def ceilings(mount: Path = Path("/sys/fs/cgroup")) -> tuple[int, int]:
    """The memory (bytes) and pids this process's cgroups and the host allow it and what it starts: the
    least limit on the way up from its own group (a pod's, a systemd slice's), the host's memory and the
    kernel's pid and thread limits."""
    version = detect_version(mount)
    memory = _meminfo_total()
    pids = min(
        _read_int(Path("/proc/sys/kernel/pid_max"), 1 << 22), _read_int(Path("/proc/sys/kernel/threads-max"), 1 << 22)
    )
    if version == 1:
        places = [("memory", "memory.limit_in_bytes"), ("pids", "pids.max")]
        dirs = [mount / c / _own_path(c).lstrip("/") for c, _ in places]
    else:
        own = mount / _own_path(None).lstrip("/")
        places, dirs = [("", "memory.max"), ("", "pids.max")], [own, own]
    for (_, name), d in zip(places, dirs, strict=True):
        for group in [d, *d.parents]:
            if not str(group).startswith(str(mount)) or group == mount.parent:
                break
            cap = _read_limit(group / name)
            if cap is None:
                continue
            if name.startswith("memory"):
                memory = min(memory, cap)
            else:
                pids = min(pids, cap)
    return memory, pids


def _meminfo_total() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 62


def detect_version(mount: Path = Path("/sys/fs/cgroup")) -> int:
    """2 when the unified hierarchy holds the memory controller, else 1."""
    controllers = mount / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return 2
    if (mount / "memory").is_dir():
        return 1
    raise SandboxSetupError(f"no usable cgroup memory controller under {mount}")
