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
import concurrent.futures
import contextlib
import datetime
import decimal
import time
from pathlib import Path
from typing import Any

import duckdb
import orjson

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


INTERRUPT_GRACE_S = 5.0  # how long an interrupted statement may take to stop before it counts as stuck


class SQLRunner:
    def __init__(self, cfg: SQLRunnerConfig, ctx: RunnerContext) -> None:
        self.cfg = cfg
        # Private to this worker: spilled blocks of one worker's statements are never another's.
        self.temp_dir = ctx.runtime_dir / ctx.name / "duckdb-tmp"
        # Statements run on threads of their own, so one that ignores its interrupt cannot starve the
        # worker's other blocking work (cgroup clean-up runs on the default pool).
        self.pool = concurrent.futures.ThreadPoolExecutor(cfg.slots_per_worker + 16, thread_name_prefix="duckdb")
        self.stuck = 0  # statements that ignored their interrupt and still run
        self._stuck_cons: set[int] = set()
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
                    "temp_directory": str(self.temp_dir),
                    "max_temp_directory_size": f"{self.cfg.temp_mb}MB",
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
                self._close(con)
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
        task = asyncio.get_running_loop().run_in_executor(self.pool, work)
        timed_out = False
        try:
            cols, rows = await asyncio.wait_for(asyncio.shield(task), timeout_s)
            error = None
        except TimeoutError:
            timed_out = True
            con.interrupt()  # stops most statements; the thread then returns
            # the interrupt surfaces as an exception in the thread: wait for it, whatever it is
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(task), INTERRUPT_GRACE_S)
            if not task.done():  # a function that ignores interrupts: never wait for it on the loop
                self.stuck += 1
                self._stuck_cons.add(id(con))
                task.add_done_callback(lambda _: self._unstuck(con))
            cols, rows, error = [], [], f"statement interrupted at its {timeout_s:g}s timeout"
            self.interrupted += 1
        except duckdb.Error as exc:
            cols, rows, error = [], [], f"{type(exc).__name__}: {exc}"
        elapsed = (time.perf_counter() - t0) * 1000
        kept, truncated = self._capped([[_jsonable(v) for v in r] for r in rows[:max_rows]])
        obs = SQLObservation(
            columns=cols,
            rows=kept,
            row_count=len(kept),
            truncated=truncated or len(rows) > max_rows,
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

    def _unstuck(self, con: duckdb.DuckDBPyConnection) -> None:
        self.stuck -= 1
        self._stuck_cons.discard(id(con))

    def _close(self, con: duckdb.DuckDBPyConnection) -> None:
        """Close a connection; one whose statement is stuck is closed off the event loop (it blocks)."""
        if id(con) in self._stuck_cons:
            self.pool.submit(con.close)
        else:
            con.close()

    def _capped(self, rows: list[list[Any]]) -> tuple[list[list[Any]], bool]:
        """Rows up to ``max_result_bytes`` of JSON: a few huge values must not reach the client."""
        size = 0
        for i, row in enumerate(rows):
            size += len(orjson.dumps(row, default=str))
            if size > self.cfg.max_result_bytes:
                return rows[:i], True
        return rows, False

    async def open_session(self, session_id: str, options: dict[str, Any]) -> None:
        if session_id not in self.sessions:
            refuse_at_session_cap("sql", len(self.sessions), self.cfg.max_sessions_per_worker, session_id)
            self.sessions[session_id] = self._cursor()
            self.busy[session_id] = asyncio.Lock()

    async def close_session(self, session_id: str) -> None:
        con = self.sessions.pop(session_id, None)
        self.busy.pop(session_id, None)
        if con is not None:
            self._close(con)

    async def health(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity(),
            "sessions": len(self.sessions),
            "statements": self.statements,
            "interrupted": self.interrupted,
            "stuck_statements": self.stuck,
        }

    async def close(self) -> None:
        for sid in list(self.sessions):
            await self.close_session(sid)
        if self.db is not None:
            db, self.db = self.db, None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(self.pool, db.close), 5.0)
        self.pool.shutdown(wait=False, cancel_futures=True)
