"""Configuration of the ``container`` runner (``SANDBOXD_CONTAINER__*``): the jail core's settings, the
writable layer's size and its sessions'. The images themselves are the node's (``SANDBOXD_IMAGES_DIR``)."""

from __future__ import annotations

from pydantic import Field

from sandboxd.runners.base import Reservation
from sandboxd.runners.jail.config import SLOT_HEADROOM_BYTES, SLOT_OVERHEAD_PIDS, JailConfig

SESSION_ZYGOTE_BYTES = 256 << 20  # the cap of the session jail's zygote group


class ContainerRunnerConfig(JailConfig):
    """Sandboxes whose root is a container image of the node's store."""

    slots_per_worker: int = Field(
        2, ge=1, le=256, description="Warm one-shot jails per worker: concurrent container one-shots per worker."
    )
    burst_slots_per_worker: int = Field(
        1, ge=0, le=64, description="Warm jails beyond slots_per_worker, for tenants below their fair share."
    )
    tmpfs_mb: int = Field(
        512,
        ge=16,
        description="The writable layer of each sandbox (what it writes over the image, /tmp included): a tmpfs "
        "of this size, its pages charged to the sandbox's memory.",
    )
    max_sessions_per_worker: int = Field(64, ge=1, description="Live container sessions per worker; more is a 429.")

    def pool_reservation(self) -> Reservation:
        slots = (self.slots_per_worker + self.burst_slots_per_worker) if self.warm_pool else self.slots_per_worker
        one_shot = Reservation((self.memory_mb << 20) + SLOT_HEADROOM_BYTES, self.pids_max + SLOT_OVERHEAD_PIDS)
        return one_shot.times(slots) + Reservation(SESSION_ZYGOTE_BYTES, SLOT_OVERHEAD_PIDS + 4)

    def session_reservation(self) -> Reservation:
        return Reservation(self.memory_mb << 20, self.pids_max)
