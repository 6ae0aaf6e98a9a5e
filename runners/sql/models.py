"""Edge models of the SQL runner."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SQLAction(BaseModel):
    """One SQL statement against the shared read-only TPC-H data (``tpch`` picks one of the 22 queries)."""

    model_config = ConfigDict(extra="forbid")

    query: str | None = Field(None, min_length=1, max_length=100_000, description="The SQL to run.")
    tpch: int | None = Field(None, ge=1, le=22, description="Run TPC-H query number N instead of `query`.")
    max_rows: int | None = Field(None, ge=0, description="Rows returned at most (at most the node's cap).")
