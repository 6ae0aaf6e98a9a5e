"""Configuration of the SQL runner (``SANDBOXD_SQL__*``)."""

from __future__ import annotations

from pydantic import Field

from sandboxd.runners.base import RunnerConfig


class SQLRunnerConfig(RunnerConfig):
    """DuckDB over shared read-only TPC-H data (B5)."""

    slots_per_worker: int = Field(4, ge=1, description="Concurrent one-shot SQL statements per worker.")
    max_sessions_per_worker: int = Field(1024, ge=1, description="Live SQL sessions (connections) per worker.")
    scale_factor: float = Field(
        0.1, gt=0, le=100, description="TPC-H scale factor (1 for the full B5; 0.1 builds in ~3 s)."
    )
    data_dir: str = Field(
        "/var/tmp/sandboxd/tpch", description="Where the generated TPC-H database is kept and reused."
    )
    threads: int = Field(
        1, ge=1, description="DuckDB threads per worker's database (concurrency comes from many statements)."
    )
    memory_mb: int = Field(1024, ge=64, description="DuckDB memory limit per worker.")
    max_rows: int = Field(1000, ge=1, description="Rows returned per statement at most; the result says truncated.")
    max_result_bytes: int = Field(
        4 << 20, ge=1024, description="Bytes of result rows (as JSON) returned per statement at most; truncated past."
    )
    temp_mb: int = Field(
        512, ge=0, description="Disk DuckDB may spill to per worker (its own private directory); 0 = no spilling."
    )
