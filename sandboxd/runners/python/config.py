"""Configuration of the nsjail-isolated Python runner (``SANDBOXD_PYTHON__*``): the jail core's settings
(``runners/jail/config.py``) and its sessions'."""

from __future__ import annotations

from pydantic import Field

from sandboxd.runners.base import Reservation
from sandboxd.runners.jail.config import SLOT_HEADROOM_BYTES, SLOT_OVERHEAD_PIDS, TEMPLATE_PIDS, EnvironmentsConfig

SESSION_ZYGOTE_BYTES = 256 << 20  # the cap of a session jail's zygote group


class PythonRunnerConfig(EnvironmentsConfig):
    """The nsjail-isolated Python runner."""

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

    session_jails_per_worker: int = Field(
        1,
        ge=1,
        le=64,
        description="Jails per worker that host sessions (each session still gets its own namespaces and cgroup).",
    )
    warm_sessions_per_jail: int = Field(
        2,
        ge=0,
        le=64,
        description="Pre-forked session sandboxes kept ready per session jail, so creating a session costs no fork.",
    )
    max_sessions_per_worker: int = Field(256, ge=1, description="Live Python sessions per worker; more is a 429.")

    def preloads(self, environment: str) -> list[str]:
        return self.preload.get(environment, [])

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

    def pool_reservation(self) -> Reservation:
        slots = (self.slots_per_worker + self.burst_slots_per_worker) if self.warm_pool else self.slots_per_worker
        one_shot = Reservation((self.memory_mb << 20) + SLOT_HEADROOM_BYTES, self.pids_max + SLOT_OVERHEAD_PIDS)
        one_shot += self.templates_reservation()
        zygote = Reservation(SESSION_ZYGOTE_BYTES, SLOT_OVERHEAD_PIDS + 4 * (self.warm_sessions_per_jail + 1))
        return one_shot.times(slots) + zygote.times(self.session_jails_per_worker)

    def session_reservation(self) -> Reservation:
        return Reservation(self.memory_mb << 20, self.pids_max)
