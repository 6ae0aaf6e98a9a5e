"""The sql runner kind: DuckDB over shared read-only TPC-H data (B5)."""

from __future__ import annotations

from sandboxd.runners.base import Capabilities, RunnerKind
from sandboxd.runners.sql.config import SQLRunnerConfig
from sandboxd.runners.sql.models import SQLAction, SQLObservation

KIND = RunnerKind(
    name="sql",
    title="SQL on DuckDB over read-only TPC-H (B5)",
    config=SQLRunnerConfig,
    action=SQLAction,
    observation=SQLObservation,
    runner="sandboxd.runners.sql.runner:SQLRunner",
    capabilities=Capabilities(fork=True),
)
