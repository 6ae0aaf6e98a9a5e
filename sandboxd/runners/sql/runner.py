"""SQL runner: DuckDB over shared read-only TPC-H data, in engine processes the worker can kill.

Each one-shot slot and each session is an engine process of its own (see
``engine.py``), in a cgroup with the kind's memory, pids and CPU limits and a
private spill directory. A one-shot statement runs on a fresh connection of a
warm slot engine (its temp tables die with the connection; the engine's cache
of the read-only data stays warm); a session keeps one connection in its own
engine. A statement that ignores its interrupt, or outgrows the memory limit,
ends its own engine only: a slot is replaced in the background, a session ends
with that step. Nothing a statement does reaches another slot, session or the
worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from pathlib import Path
from typing import Any

from sandboxd.errors import BadRequest, NodePressure, SandboxSetupError, SessionLost, UnknownSession
from sandboxd.runners.base import (
    ProgramFailure,
    RunnerContext,
    StepLimits,
    StepOutcome,
    refuse_at_session_cap,
    refuse_fork_at_cap,
)
from sandboxd.runners.cgroups import CgroupRoot, Counters, memory_kill
from sandboxd.runners.jailconf import JAIL_UID
from sandboxd.runners.sql import data
from sandboxd.runners.sql.config import DUCKDB_HEADROOM_MB, SQLRunnerConfig
from sandboxd.runners.sql.engines import Engine, EngineGone, EngineHost
from sandboxd.runners.sql.models import SQLAction, SQLObservation
from sandboxd.runners.starvation import starved_error, usable_cores, wall_cap_s

ANSWER_MARGIN_S = 2.0  # past timeout + grace, an engine that has not answered is killed by the worker
REFILL_BACKOFF_S = 1.0
RECYCLE_AT_MEMORY_FRACTION = 0.25  # a slot engine that keeps more than this, unaccounted, is replaced
FORK_TIMEOUT_S = 30.0  # reading a session's objects out, or making them in a copy, at most this long
SPILL_POLL_S = 0.1  # a statement spilling at ~1 GB/s overshoots the budget by at most ~100 MB


class SQLRunner:
    def __init__(self, cfg: SQLRunnerConfig, ctx: RunnerContext) -> None:
        self.cfg = cfg
        self.name = ctx.name
        self.density = ctx.density
        # Private to this worker, and each engine spills into a directory of its own below it.
        self.temp_root = ctx.runtime_dir / ctx.name / "duckdb-tmp"
        self.host: EngineHost | None = None
        self.root: CgroupRoot | None = None
        self.queries: list[str] = []
        self.idle: asyncio.LifoQueue[Engine] = asyncio.LifoQueue()  # the hottest engine first: its caches are warm
        self.slots: set[Engine] = set()
        self.sessions: dict[str, Engine] = {}
        self.busy: dict[str, asyncio.Lock] = {}
        self.names = itertools.count(1)
        self.refills: set[asyncio.Task[None]] = set()
        self.stats = {
            "statements": 0,
            "interrupted": 0,
            "engines_killed": 0,
            "killed_memory": 0,
            "killed_disk": 0,
            "engine_lost": 0,
            "slots_recycled": 0,
            "node_pressure": 0,  # engines killed for memory by a limit above their own
        }

    def capacity(self) -> int:
        return self.cfg.slots_per_worker

    async def start(self) -> None:
        try:
            path, self.queries = await asyncio.to_thread(data.ensure, Path(self.cfg.data_dir), self.cfg.scale_factor)
        except Exception as exc:  # duckdb.Error, OSError: the node cannot serve SQL at all
            raise SandboxSetupError(f"cannot open the TPC-H data: {exc}") from exc
        self.root = CgroupRoot(self.name, Path(self.cfg.cgroup_mount))
        # Where the fork server lives between its visits to an engine's group: a leaf of its own. Not the
        # worker's group (the cgroup v2 guest): once controllers are handed down from a group, cgroup v2 lets
        # no process join it (EBUSY), and the fork server died going back there after its first engine.
        home = self.root.slot("server")
        self.host = EngineHost(
            {
                "db": str(path),
                "threads": self.cfg.threads,
                "temp_mb": self.cfg.temp_mb,
                "max_rows": self.cfg.max_rows,
                "max_result_bytes": self.cfg.max_result_bytes,
                "fork_max_state_bytes": self.cfg.fork_max_state_bytes,
                "grace_s": self.cfg.interrupt_grace_s,
                "cores": usable_cores(self.cfg.cpu_cores),
                "recycle_bytes": int((self.cfg.memory_mb << 20) * RECYCLE_AT_MEMORY_FRACTION),
                "uid": JAIL_UID,
                "home_procs": [str(p) for p in home.procs_files],
            },
            self.temp_root,
            frame_limit=2 * max(self.cfg.max_result_bytes, self.cfg.fork_max_state_bytes) + (1 << 20),
            start_timeout_s=self.cfg.engine_start_timeout_s,
        )
        await self.host.start()
        engines = await asyncio.gather(*(self._spawn("slot") for _ in range(self.cfg.slots_per_worker)))
        for e in engines:
            self.slots.add(e)
            self.idle.put_nowait(e)

    async def _spawn(self, kind: str) -> Engine:
        assert self.host is not None and self.root is not None
        name = f"{kind}{next(self.names)}"
        cg = self.root.slot(name)
        cg.set_limits(self.cfg.memory_mb << 20, self.cfg.pids_max)
        cg.set_cpu(self.cfg.cpu_cores)
        try:
            return await self.host.spawn(name, cg, max(64, self.cfg.memory_mb - DUCKDB_HEADROOM_MB))
        except BaseException:
            await asyncio.to_thread(cg.remove)
            raise

    async def step(self, action: SQLAction, session_id: str | None, limits: StepLimits) -> StepOutcome:
        sql = action.query if action.query is not None else self.queries[(action.tpch or 1) - 1]
        max_rows = min(action.max_rows if action.max_rows is not None else self.cfg.max_rows, self.cfg.max_rows)
        req = {"sql": sql, "max_rows": max_rows, "timeout_s": limits.timeout_s, "fresh": session_id is None}
        if session_id is None:
            engine = await self.idle.get()
            done = False
            try:
                outcome = await self._run(engine, req, action.tpch, None)
                done = True
                return outcome
            finally:
                if done and not engine.closed and self._reusable(engine):
                    self.idle.put_nowait(engine)
                else:  # ended, cancelled mid-statement (its answer would arrive out of turn), or marked
                    self._refill(engine)
        engine_or_none = self.sessions.get(session_id)
        if engine_or_none is None:
            raise UnknownSession(f"no sql session {session_id}", session_id=session_id)
        async with self.busy[session_id]:
            try:
                outcome = await self._run(engine_or_none, req, action.tpch, session_id)
            except asyncio.CancelledError:
                engine_or_none.kill()  # its answer would arrive out of turn: the session cannot go on
                raise
        if not outcome.session_alive:
            await self.close_session(session_id)
        return outcome

    async def _run(self, engine: Engine, req: dict[str, Any], tpch: int | None, session_id: str | None) -> StepOutcome:
        self.stats["statements"] += 1
        before = engine.cgroup.counters(start=True)
        req["wall_cap_s"] = wall_cap_s(float(req["timeout_s"]), self.density.cores_at_once())
        deadline = req["wall_cap_s"] + self.cfg.interrupt_grace_s + ANSWER_MARGIN_S
        watch = asyncio.ensure_future(self._watch_spill(engine))
        try:
            with self.density.step(self.cfg.cpu_cores):
                answer = await engine.request(req, deadline)
        except EngineGone as exc:
            return await self._engine_ended(engine, req, tpch, session_id, before, str(exc))
        finally:
            watch.cancel()
        if answer.get("starved"):
            self.stats["node_pressure"] += 1
            raise starved_error("the statement", answer["kept_s"], answer["wall_s"])
        engine.recycle = bool(answer.get("recycle"))
        if answer.get("stuck"):  # the engine ends itself after this answer
            self.stats["interrupted"] += 1
            self.stats["engines_killed"] += 1
            await engine.close()
            return self._timed_out(req, tpch, float(answer.get("elapsed_ms", 0.0)), session_alive=session_id is None)
        obs = SQLObservation(
            columns=answer.get("columns") or [],
            rows=answer.get("rows") or [],
            row_count=len(answer.get("rows") or []),
            truncated=bool(answer.get("truncated")),
            timed_out=bool(answer.get("timed_out")),
            error=answer.get("error"),
            elapsed_ms=float(answer.get("elapsed_ms", 0.0)),
            tpch=tpch,
        )
        if obs.timed_out:
            self.stats["interrupted"] += 1
            return StepOutcome(obs, ProgramFailure("program_timeout", obs.error or "timed out"), limits_hit=("time",))
        if obs.error:
            return StepOutcome(obs, ProgramFailure("action_error", obs.error))
        return StepOutcome(obs)

    def _reusable(self, engine: Engine) -> bool:
        """May the next one-shot, maybe another tenant's, have this slot engine? Not if this one left files
        in its spill directory (statements can read and write there) or left memory behind (the allocator
        keeps freed memory, see engine.left_behind: the next statement would start near the limit)."""
        if engine.has_spilled():
            self.stats["slots_recycled"] += 1
            return False
        if engine.recycle:
            self.stats["slots_recycled"] += 1
            return False
        return True

    async def _watch_spill(self, engine: Engine) -> None:
        """Kill the engine once its spill directory outgrows ``temp_mb`` (DuckDB does not hold to it)."""
        limit = self.cfg.temp_mb << 20
        while True:
            await asyncio.sleep(SPILL_POLL_S)
            if engine.spill_bytes() > limit:
                engine.kill("disk")
                return

    def _timed_out(self, req: dict[str, Any], tpch: int | None, elapsed_ms: float, session_alive: bool) -> StepOutcome:
        msg = (
            f"statement interrupted at its {float(req['timeout_s']):g}s timeout "
            "(it ignored the interrupt, so its engine was ended)"
        )
        obs = SQLObservation(timed_out=True, error=msg, elapsed_ms=round(elapsed_ms, 3), tpch=tpch)
        return StepOutcome(
            obs,
            ProgramFailure("program_timeout", msg),
            session_alive=session_alive,
            killed_by="time",
            limits_hit=("time",),
        )

    def _killed(self, limit: str, what: str, tpch: int | None, session_alive: bool) -> StepOutcome:
        self.stats[f"killed_{limit}"] += 1
        msg = f"the statement was killed at its {what}"
        return StepOutcome(
            SQLObservation(error=msg, tpch=tpch),
            ProgramFailure("program_killed", msg),
            session_alive=session_alive,
            killed_by=limit,
            limits_hit=(limit,),
        )

    async def _engine_ended(
        self, engine: Engine, req: dict[str, Any], tpch: int | None, session_id: str | None, before: Counters, why: str
    ) -> StepOutcome:
        """The engine died mid-statement: the statement's fault only if a limit of its own says so (an OOM
        kill counts in the engine's group whichever limit was reached: its own, or the node's or pod's)."""
        by_us = engine.killed_by
        kill = memory_kill(before, engine.cgroup.counters())
        await engine.close()
        self.stats["engines_killed"] += 1
        alive = session_id is None
        if by_us == "closed" and session_id is not None:
            raise UnknownSession(
                f"session {session_id} was closed by the client during this step", session_id=session_id
            )
        if by_us == "time":  # it did not answer by timeout + grace + margin
            self.stats["interrupted"] += 1
            return self._timed_out(req, tpch, float(req["timeout_s"]) * 1000, session_alive=alive)
        if by_us == "disk":
            return self._killed("disk", f"spill limit ({self.cfg.temp_mb} MiB of temp disk)", tpch, alive)
        if kill == "own":
            return self._killed("memory", f"memory limit ({self.cfg.memory_mb} MiB)", tpch, alive)
        if kill == "node":
            self.stats["node_pressure"] += 1
            why = "killed for memory under its own limit: the node (or its pod) ran out of memory"
            if session_id is not None:
                raise SessionLost(f"session {session_id}: its SQL engine was {why}", session_id=session_id)
            raise NodePressure(f"the SQL engine was {why}; retry")
        self.stats["engine_lost"] += 1
        if session_id is not None:
            raise SessionLost(
                f"session {session_id}: its SQL engine ended mid-statement ({why})", session_id=session_id
            )
        raise SandboxSetupError(f"the SQL engine ended mid-statement ({why}); retry")

    def _refill(self, dead: Engine) -> None:
        """Replace a slot engine that ended, off the request path; keep trying until it starts."""
        self.slots.discard(dead)
        dead.kill()

        async def refill() -> None:
            await dead.close()
            while True:
                try:
                    engine = await self._spawn("slot")
                except SandboxSetupError:
                    await asyncio.sleep(REFILL_BACKOFF_S)
                    continue
                self.slots.add(engine)
                self.idle.put_nowait(engine)
                return

        task = asyncio.ensure_future(refill())
        self.refills.add(task)
        task.add_done_callback(self.refills.discard)

    async def open_session(self, session_id: str, options: dict[str, Any]) -> None:
        if session_id in self.sessions:
            return
        refuse_at_session_cap("sql", len(self.busy), self.cfg.max_sessions_per_worker, session_id)
        self.busy[session_id] = asyncio.Lock()  # holds the place while the engine starts
        try:
            self.sessions[session_id] = await self._spawn("s")
        except BaseException:
            self.busy.pop(session_id, None)
            raise

    async def fork_session(self, source_id: str, new_ids: list[str]) -> list[str]:
        """What the session made (``state.py``), read from its engine and made again in a fresh engine per
        copy. DuckDB's thread pool rules out forking the engine process itself."""
        source = self.sessions.get(source_id)
        if source is None:
            raise UnknownSession(f"no sql session {source_id}", session_id=source_id)
        refuse_fork_at_cap("sql", len(self.busy), len(new_ids), self.cfg.max_sessions_per_worker, source_id)
        for sid in new_ids:
            self.busy[sid] = asyncio.Lock()  # hold the places while the engines start
        made: list[Engine] = []
        try:
            async with self.busy[source_id]:
                try:
                    state = await source.request(
                        {"op": "export", "max_bytes": self.cfg.fork_max_state_bytes}, FORK_TIMEOUT_S
                    )
                except EngineGone as exc:
                    await self.close_session(source_id)
                    raise SessionLost(
                        f"session {source_id}: its engine ended while its state was read ({exc})"
                    ) from None
            if "error" in state:
                raise BadRequest(f"sql: {state['error']}")
            spawned = await asyncio.gather(*(self._spawn("s") for _ in new_ids), return_exceptions=True)
            made = [e for e in spawned if isinstance(e, Engine)]
            failed = next((e for e in spawned if not isinstance(e, Engine)), None)
            if failed is not None:
                raise SandboxSetupError(f"sql: a copy's engine did not start: {failed!r}")
            answers = await asyncio.gather(
                *(e.request({"op": "restore", "state": state}, FORK_TIMEOUT_S) for e in made), return_exceptions=True
            )
            for answer in answers:
                if isinstance(answer, BaseException):
                    raise SandboxSetupError(f"sql: a copy's engine ended while its objects were made: {answer!r}")
                if "error" in answer:
                    raise BadRequest(f"sql: {answer['error']}")
        except BaseException:
            for sid in new_ids:
                self.busy.pop(sid, None)
            for e in made:
                await e.close()
            raise
        for sid, engine in zip(new_ids, made, strict=True):
            self.sessions[sid] = engine
        notes: list[str] = state.get("notes") or []
        return notes

    async def close_session(self, session_id: str) -> None:
        engine = self.sessions.pop(session_id, None)
        self.busy.pop(session_id, None)
        if engine is not None:
            engine.kill("closed")  # a step in flight learns why its engine ended
            await engine.close()

    async def health(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity(),
            "free_slots": self.idle.qsize(),
            "slot_engines": len(self.slots),
            "sessions": len(self.sessions),
            "fork_server_alive": self.host is not None and self.host.alive(),
            **self.stats,
        }

    async def close(self) -> None:
        for task in list(self.refills):
            task.cancel()
        for sid in list(self.sessions):
            await self.close_session(sid)
        for engine in list(self.slots):
            await engine.close()
        self.slots.clear()
        if self.host is not None:
            await self.host.stop()
        if self.root is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self.root.group.remove)
