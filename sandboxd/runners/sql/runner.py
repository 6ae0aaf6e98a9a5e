"""SQL runner: DuckDB over shared read-only TPC-H data, one connection per session.

One database instance per worker, opened read-only with external access off
(no files, no network, no extension loading) and its configuration locked, so
no statement can read ``/etc/passwd`` through ``read_csv``, ATTACH a file or
change a setting. Each session gets its own connection (``cursor()``: temp
tables and prepared state are per connection); a one-shot step gets a fresh
one that is closed after it. Statements run in a thread (DuckDB releases the
GIL) and are interrupted at their timeout; results are capped in rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import decimal
import time
from pathlib import Path
from typing import Any

import duckdb

from sandboxd.errors import SandboxSetupError, UnknownSession
from sandboxd.runners.base import ProgramFailure, RunnerContext, StepLimits, StepOutcome, refuse_at_session_cap
from sandboxd.runners.sql import data
from sandboxd.runners.sql.config import SQLRunnerConfig
from sandboxd.runners.sql.models import SQLAction, SQLObservation


def _jsonable(v: Any) -> Any:
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, (datetime.date, datetime.datetime, datetime.time, datetime.timedelta)):
        return v.isoformat() if hasattr(v, "isoformat") else str(v)
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    return v


class SQLRunner:
    def __init__(self, cfg: SQLRunnerConfig, ctx: RunnerContext) -> None:
        self.cfg = cfg
        self.db: duckdb.DuckDBPyConnection | None = None
        self.queries: list[str] = []
        self.sessions: dict[str, duckdb.DuckDBPyConnection] = {}
        self.busy: dict[str, asyncio.Lock] = {}
        self.statements = 0
        self.interrupted = 0

    def capacity(self) -> int:
        return self.cfg.slots_per_worker

    async def start(self) -> None:
        try:
            path, self.queries = await asyncio.to_thread(data.ensure, Path(self.cfg.data_dir), self.cfg.scale_factor)
            self.db = duckdb.connect(
                str(path),
                read_only=True,
                config={
                    "enable_external_access": False,
                    "autoload_known_extensions": False,
                    "autoinstall_known_extensions": False,
                    "threads": self.cfg.threads,
                    "memory_limit": f"{self.cfg.memory_mb}MB",
                },
            )
            self.db.execute("SET lock_configuration = true")
        except (duckdb.Error, OSError) as exc:
            raise SandboxSetupError(f"cannot open the TPC-H data: {exc}") from exc

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        assert self.db is not None
        return self.db.cursor()

    async def step(self, action: SQLAction, session_id: str | None, limits: StepLimits) -> StepOutcome:
        act = action
        sql = act.query if act.query is not None else self.queries[(act.tpch or 1) - 1]
        max_rows = min(act.max_rows if act.max_rows is not None else self.cfg.max_rows, self.cfg.max_rows)
        if session_id is None:
            con = self._cursor()
            try:
                return await self._run(con, sql, max_rows, limits.timeout_s, act.tpch)
            finally:
                con.close()
        mine = self.sessions.get(session_id)
        if mine is None:
            raise UnknownSession(f"no sql session {session_id}", session_id=session_id)
        async with self.busy[session_id]:
            return await self._run(mine, sql, max_rows, limits.timeout_s, act.tpch)

    async def _run(
        self, con: duckdb.DuckDBPyConnection, sql: str, max_rows: int, timeout_s: float, tpch: int | None
    ) -> StepOutcome:
        self.statements += 1

        def work() -> tuple[list[str], list[tuple[Any, ...]]]:
            cur = con.execute(sql)
            cols = [d[0] for d in cur.description] if cur.description else []
            rows = cur.fetchmany(max_rows + 1) if cols else []
            return cols, rows

        t0 = time.perf_counter()
        task = asyncio.ensure_future(asyncio.to_thread(work))
        timed_out = False
        try:
            cols, rows = await asyncio.wait_for(asyncio.shield(task), timeout_s)
            error = None
        except TimeoutError:
            timed_out = True
            con.interrupt()  # really stops the statement; the thread then returns
            # the interrupt surfaces as an exception in the thread: wait for it, whatever it is
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 5.0)
            cols, rows, error = [], [], f"statement interrupted at its {timeout_s:g}s timeout"
            self.interrupted += 1
        except duckdb.Error as exc:
            cols, rows, error = [], [], f"{type(exc).__name__}: {exc}"
        elapsed = (time.perf_counter() - t0) * 1000
        truncated = len(rows) > max_rows
        obs = SQLObservation(
            columns=cols,
            rows=[[_jsonable(v) for v in r] for r in rows[:max_rows]],
            row_count=min(len(rows), max_rows),
            truncated=truncated,
            timed_out=timed_out,
            error=error,
            elapsed_ms=round(elapsed, 3),
            tpch=tpch,
        )
        if timed_out:
            failure: ProgramFailure | None = ProgramFailure("program_timeout", error or "timed out")
        elif error:
            failure = ProgramFailure("action_error", error)
        else:
            failure = None
        return StepOutcome(obs, failure=failure)

    async def open_session(self, session_id: str, options: dict[str, Any]) -> None:
        if session_id not in self.sessions:
            refuse_at_session_cap("sql", len(self.sessions), self.cfg.max_sessions_per_worker, session_id)
            self.sessions[session_id] = self._cursor()
            self.busy[session_id] = asyncio.Lock()

    async def close_session(self, session_id: str) -> None:
        con = self.sessions.pop(session_id, None)
        self.busy.pop(session_id, None)
        if con is not None:
            con.close()

    async def health(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity(),
            "sessions": len(self.sessions),
            "statements": self.statements,
            "interrupted": self.interrupted,
        }

    async def close(self) -> None:
        for sid in list(self.sessions):
            await self.close_session(sid)
        if self.db is not None:
            self.db.close()
            self.db = None
