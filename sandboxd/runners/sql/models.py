"""Edge models of the SQL runner."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SQLAction(BaseModel):
    """One SQL statement against the shared read-only TPC-H data (``tpch`` picks one of the 22 queries)."""

    model_config = ConfigDict(extra="forbid")

    query: str | None = Field(None, min_length=1, max_length=100_000, description="The SQL to run.")
    tpch: int | None = Field(None, ge=1, le=22, description="Run TPC-H query number N instead of `query`.")
    max_rows: int | None = Field(None, ge=0, description="Rows returned at most (at most the node's cap).")

    @model_validator(mode="after")
    def _one_of(self) -> SQLAction:
        if (self.query is None) == (self.tpch is None):
            raise ValueError("give exactly one of 'query' or 'tpch'")
        return self


class SQLObservation(BaseModel):
    """A statement's result set (capped), or its error; ``timed_out`` when interrupted at the timeout."""

    columns: list[str] = Field(default_factory=list)
    rows: list[list[Any]] = Field(default_factory=list)
    row_count: int = 0
    truncated: bool = False
    timed_out: bool = False
    error: str | None = None
    elapsed_ms: float = 0.0
    tpch: int | None = None
