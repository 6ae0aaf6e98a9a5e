"""Configuration of the nsjail-isolated Python runner (``SANDBOXD_PYTHON__*``): the jail core's settings
(``runners/jail/config.py``) and its sessions'."""

from __future__ import annotations

from pydantic import Field

from sandboxd.runners.base import Reservation
from sandboxd.runners.jail.config import SLOT_HEADROOM_BYTES, SLOT_OVERHEAD_PIDS, JailConfig

SESSION_ZYGOTE_BYTES = 256 << 20  # the cap of a session jail's zygote group


class PythonRunnerConfig(JailConfig):
    """The nsjail-isolated Python runner."""

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

    def pool_reservation(self) -> Reservation:
        slots = (self.slots_per_worker + self.burst_slots_per_worker) if self.warm_pool else self.slots_per_worker
        one_shot = Reservation((self.memory_mb << 20) + SLOT_HEADROOM_BYTES, self.pids_max + SLOT_OVERHEAD_PIDS)
        one_shot += self.templates_reservation()
        zygote = Reservation(SESSION_ZYGOTE_BYTES, SLOT_OVERHEAD_PIDS + 4 * (self.warm_sessions_per_jail + 1))
        return one_shot.times(slots) + zygote.times(self.session_jails_per_worker)

    def session_reservation(self) -> Reservation:
        return Reservation(self.memory_mb << 20, self.pids_max)
