"""Configuration of the ``code`` runner (``SANDBOXD_CODE__*``): the jail core's settings, plus
compilation's own limits and the compile cache."""

from __future__ import annotations

from pydantic import Field

from sandboxd.runners.base import Reservation
from sandboxd.runners.jail.config import SLOT_HEADROOM_BYTES, SLOT_OVERHEAD_PIDS, EnvironmentsConfig


class CodeRunnerConfig(EnvironmentsConfig):
    """Compiled and interpreted languages in the jail core's warm jails (one-shot steps only)."""

    slots_per_worker: int = Field(
        2, ge=1, le=256, description="Warm one-shot jails per worker: concurrent compilations or runs per worker."
    )
    burst_slots_per_worker: int = Field(
        1, ge=0, le=64, description="Warm jails beyond slots_per_worker, for tenants below their fair share."
    )
    tmpfs_mb: int = Field(
        256, ge=16, description="The private /tmp of each compilation or run (compilers' temporaries go there)."
    )
    max_fetch_bytes: int = Field(64 << 20, ge=1 << 20, description="Largest artifact a compilation may leave.")
    languages: list[str] = Field(
        default_factory=list,
        description="Languages offered (of c, cpp, java, go, rust, javascript, bash, pytest); empty = every one "
        "whose toolchain is installed (scripts/setup.sh installs them all).",
    )
    compile_timeout_s: float = Field(
        20.0,
        gt=0,
        le=60,
        description="A compilation's wall-clock limit (a step may ask for less). At most 60 s: a step's runs "
        "are bounded by the node's max_timeout_s, and its idempotency key is held that long plus 60 s.",
    )
    compile_memory_mb: int = Field(512, ge=64, description="A compilation's memory cap (its sandbox's cgroup).")
    compile_cache_dir: str = Field(
        "/var/cache/sandboxd/compile",
        description="The compile cache, on the host (no jail mounts it); shared by the node's workers.",
    )
    compile_cache_mb: int = Field(
        1024, ge=0, description="The compile cache's size cap; least recently used entries go first. 0 = no cache."
    )
    max_cases: int = Field(256, ge=1, le=10_000, description="Most test cases one step may carry.")

    def pool_reservation(self) -> Reservation:
        slots = (self.slots_per_worker + self.burst_slots_per_worker) if self.warm_pool else self.slots_per_worker
        biggest = max(self.memory_mb, self.compile_memory_mb)
        return Reservation((biggest << 20) + SLOT_HEADROOM_BYTES, self.pids_max + SLOT_OVERHEAD_PIDS).times(slots)

    def session_reservation(self) -> Reservation:
        return Reservation()
