"""Configuration of the SQL runner (``SANDBOXD_SQL__*``)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from sandboxd.runners.base import Reservation, RunnerConfig

DUCKDB_HEADROOM_MB = 64  # of an engine's cgroup memory, kept for the interpreter around DuckDB


class SQLRunnerConfig(RunnerConfig):
    """DuckDB over shared read-only TPC-H data (B5), one engine process per one-shot slot and per session."""

    START_TIMEOUTS: ClassVar[tuple[str, ...]] = ("engine_start_timeout_s",)

    slots_per_worker: int = Field(4, ge=1, description="Concurrent one-shot SQL statements per worker.")
    max_sessions_per_worker: int = Field(
        256,
        ge=1,
        description="Live SQL sessions per worker; each is an engine process (~14 MiB PSS after a TPC-H query).",
    )
    scale_factor: float = Field(
        0.1, gt=0, le=100, description="TPC-H scale factor (1 for the full B5; 0.1 builds in ~3 s)."
    )
    data_dir: str = Field(
        "/var/tmp/sandboxd/tpch", description="Where the generated TPC-H database is kept and reused."
    )
    threads: int = Field(1, ge=1, description="DuckDB threads per engine (concurrency comes from many engines).")
    memory_mb: int = Field(
        512,
        ge=128,
        description="Memory cap (cgroup) of one engine, a one-shot slot or a session; DuckDB's own "
        f"memory_limit is {DUCKDB_HEADROOM_MB} MiB less. A statement past it ends its engine.",
    )
    pids_max: int = Field(64, ge=8, description="Processes and threads of one engine at most.")
    cpu_cores: float = Field(1.0, gt=0, description="CPU quota of one engine, in cores.")
    max_rows: int = Field(1000, ge=1, description="Rows returned per statement at most; the result says truncated.")
    max_result_bytes: int = Field(
        4 << 20, ge=1024, description="Bytes of result rows (as JSON) returned per statement at most; truncated past."
    )
    fork_max_state_bytes: int = Field(
        8 << 20,
        ge=0,
        description="Bytes (as JSON) of a session's temp tables a fork copies at most; more is a 422 naming the table.",
    )
    temp_mb: int = Field(
        256,
        ge=0,
        description="Disk one engine may spill to (its own private directory, removed with it); 0 = no spilling.",
    )
    interrupt_grace_s: float = Field(
        1.0,
        gt=0,
        le=30,
        description="How long a statement interrupted at its timeout may take to stop before its engine is killed.",
    )
    engine_start_timeout_s: float = Field(
        20.0,
        gt=0,
        description="An engine the fork server has not made (forked, database open, privileges dropped) this long "
        "after it was asked failed to start. Raise it on slow machines: an emulated guest sharing its host with "
        "another took longer, and its workers did not start.",
    )
    cgroup_mount: str = Field("/sys/fs/cgroup", description="Where the cgroup file systems are mounted.")

    def cores_at_once(self) -> float:
        return self.slots_per_worker * self.cpu_cores

    def pool_reservation(self) -> Reservation:
        return Reservation(self.memory_mb << 20, self.pids_max).times(self.slots_per_worker)

    def session_reservation(self) -> Reservation:
        return Reservation(self.memory_mb << 20, self.pids_max)
