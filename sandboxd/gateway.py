"""The node: validation, admission, routing and results, independent of HTTP.

``app.py`` maps routes onto these methods; every failure is a ``SandboxdError``
turned into a ``StepResult`` in exactly one place (``_failed``), so that each
result says whose failure it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from typing import Any

from pydantic import ValidationError

from runners.base import StepLimits, action_model
from sandboxd.config import Settings
from sandboxd.errors import (
    BadRequest,
    PayloadTooLarge,
    SandboxdError,
    Saturated,
    SessionLost,
    UnknownRunner,
    WorkerDied,
)
from sandboxd.idempotency import IdempotencyCache, fingerprint
from sandboxd.metrics import Metrics
from sandboxd.protocol import ErrorInfo, SessionCreate, SessionInfo, StepRequest, StepResult
from sandboxd.scheduler import Scheduler
from sandboxd.sessions import SessionRecord, SessionTable, new_session_id
from sandboxd.workers import Supervisor, WorkerHandle

log = logging.getLogger("sandboxd.gateway")


def validation_message(exc: ValidationError, prefix: str) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in (prefix, *err.get("loc", ())) if p != "")
        parts.append(f"{loc}: {err.get('msg')}")
    return "; ".join(parts)


def classify(obs: dict[str, Any]) -> ErrorInfo | None:
    """The program's own failure, if any (the step itself worked)."""
    if obs.get("timed_out"):
        return ErrorInfo(blame="program", code="program_timeout", message="the program ran past its time limit")
    if obs.get("killed_by"):
        return ErrorInfo(
            blame="program", code="program_killed", message=f"the program was killed at its {obs['killed_by']} limit"
        )
    code = obs.get("exit_code")
    if code not in (None, 0):
        return ErrorInfo(blame="program", code="program_exit", message=f"the program exited with status {code}")
    if obs.get("error"):  # runners with tool-level errors (tools, sql) report them here
        return ErrorInfo(blame="program", code="action_error", message=str(obs["error"]))
    return None


class Gateway:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.node = f"sandboxd-{os.getpid()}"
        self.sessions = SessionTable()
        self.idem = IdempotencyCache(settings.idempotency_ttl_s, settings.idempotency_max_entries)
        self.supervisor = Supervisor(settings, self.node, self._worker_lost)
        self.supervisor.on_ready = self._worker_ready
        self.scheduler: Scheduler | None = None
        self.metrics = Metrics(lambda: [(w.index, w.health) for w in self.supervisor.workers])
        self.models = {kind: action_model(kind) for kind in settings.runners}
        self._reaper: asyncio.Task[None] | None = None
        self.inflight = 0
        self.started = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        os.makedirs(self.settings.runtime_dir, exist_ok=True)
        await self.supervisor.start()
        self.scheduler = Scheduler(self.supervisor.workers, self.settings.queue_max, self.settings.queue_timeout_s)
        for w in self.supervisor.workers:
            with contextlib.suppress(Exception):
                w.health = await w.call("ping")
        self._reaper = asyncio.create_task(self._reap_loop())
        self.started = True
        log.info(
            "sandboxd node %s ready: %d workers, runners %s",
            self.node,
            len(self.supervisor.workers),
            self.settings.runners,
        )

    async def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()
        deadline = time.monotonic() + self.settings.shutdown_grace_s
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.inflight:
            log.warning(
                "shutdown: %d steps still running after %.1fs grace; cancelling",
                self.inflight,
                self.settings.shutdown_grace_s,
            )
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        n_sessions = len(self.sessions.sessions)
        await self.supervisor.stop()
        shutil.rmtree(self.settings.runtime_dir, ignore_errors=True)
        log.info("sandboxd node %s stopped (%d sessions closed)", self.node, n_sessions)

    def _worker_lost(self, index: int) -> None:
        lost = self.sessions.mark_worker_lost(index)
        if self.scheduler is not None:
            self.scheduler.remove_worker(index)
        log.error("worker %d lost; %d sessions lost with it", index, lost)

    def _worker_ready(self, w: WorkerHandle) -> None:
        if self.scheduler is not None:
            self.scheduler.add_worker(w)
        self.metrics.worker_restarts.inc()

    def ready(self) -> tuple[bool, dict[str, Any]]:
        workers = [
            {"index": w.index, "pid": w.pid, "alive": w.alive, "generation": w.generation, "capacity": w.capacity}
            for w in self.supervisor.workers
        ]
        ok = self.started and all(w.alive for w in self.supervisor.workers)
        return ok, {"ready": ok, "workers": workers, "sessions": len(self.sessions.sessions)}

    # ------------------------------------------------------------------ steps

    def _limits(self, req: StepRequest) -> StepLimits:
        s = self.settings
        timeout = req.timeout_s if req.timeout_s is not None else s.default_timeout_s
        if timeout > s.max_timeout_s:
            raise BadRequest(f"timeout_s: {timeout} exceeds this node's max_timeout_s {s.max_timeout_s}")
        mem = out = None
        if req.limits is not None:
            mem, out = req.limits.memory_mb, req.limits.max_output_bytes
            if mem is not None and req.runner == "python" and mem > s.python.memory_mb:
                raise BadRequest(f"limits.memory_mb: {mem} exceeds this node's maximum {s.python.memory_mb}")
            if out is not None and req.runner == "python" and out > s.python.max_output_bytes:
                raise BadRequest(
                    f"limits.max_output_bytes: {out} exceeds this node's maximum {s.python.max_output_bytes}"
                )
        return StepLimits(timeout_s=timeout, memory_mb=mem, max_output_bytes=out)

    def _check_action(self, req: StepRequest) -> dict[str, Any]:
        model = self.models.get(req.runner)
        if model is None:
            raise UnknownRunner(f"runner {req.runner!r} is not enabled on this node (enabled: {self.settings.runners})")
        try:
            action = model.model_validate(req.action)
        except ValidationError as exc:
            raise BadRequest(validation_message(exc, "action")) from None
        if req.runner == "python":
            s = self.settings
            code = len(req.action.get("code", "").encode())
            if code > s.max_code_bytes:
                raise PayloadTooLarge(f"action.code is {code} bytes; this node takes at most {s.max_code_bytes}")
            stdin = len(req.action.get("stdin", "").encode())
            if stdin > s.max_stdin_bytes:
                raise PayloadTooLarge(f"action.stdin is {stdin} bytes; this node takes at most {s.max_stdin_bytes}")
            files = sum(len(v.encode()) for v in req.action.get("files", {}).values())
            if files > s.max_files_bytes:
                raise PayloadTooLarge(f"action.files total {files} bytes; this node takes at most {s.max_files_bytes}")
        return action.model_dump(exclude_defaults=True)

    async def step(self, req: StepRequest) -> StepResult:
        start = time.monotonic()
        self.inflight += 1
        try:
            action = self._check_action(req)
            limits = self._limits(req)
            if req.idempotency_key:
                fp = fingerprint(req.model_dump(exclude={"idempotency_key"}))
                result: StepResult = await self.idem.run(
                    f"step:{req.idempotency_key}",
                    fp,
                    lambda: self._execute(req, action, limits, start),
                    keep=lambda r: r.error is None or r.error.blame != "infra",
                )
                return result
            return await self._execute(req, action, limits, start)
        except SandboxdError as exc:
            return self._failed(req.runner, exc, start, req.session_id)
        finally:
            self.inflight -= 1

    async def _execute(self, req: StepRequest, action: dict[str, Any], limits: StepLimits, start: float) -> StepResult:
        try:
            call = {"runner": req.runner, "action": action, "limits": limits.__dict__}
            if req.session_id is not None:
                rec = self.sessions.get(req.session_id)
                if rec.runner != req.runner:
                    raise BadRequest(f"session {req.session_id} is a {rec.runner} session, not {req.runner}")
                worker = self.supervisor.workers[rec.worker]
                if worker.generation != rec.generation or not worker.alive:
                    rec.lost = rec.lost or f"worker {rec.worker} was replaced"
                    raise SessionLost(f"session {req.session_id} was lost: its worker was replaced")
                rec.last_used = time.monotonic()
                try:
                    obs = await worker.call("step", session_id=req.session_id, **call)
                except WorkerDied:
                    rec.lost = f"worker {rec.worker} died during a step"
                    raise
                rec.last_used = time.monotonic()
                rec.steps += 1
                if obs.get("session_alive") is False:
                    self.sessions.remove(req.session_id, f"its program was killed ({obs.get('killed_by') or 'exit'})")
                index = rec.worker
            else:
                assert self.scheduler is not None
                deadline = start + self.settings.queue_timeout_s
                async with self.scheduler.slot(req.runner, deadline) as worker:
                    obs = await worker.call("step", session_id=None, **call)
                    index = worker.index
        except SandboxdError as exc:
            return self._failed(req.runner, exc, start, req.session_id)
        error = classify(obs)
        elapsed = time.monotonic() - start
        self.metrics.observe_step(req.runner, "ok" if error is None else "program_error", elapsed, obs)
        return StepResult(
            ok=error is None,
            observation=obs,
            error=error,
            latency_ms=round(elapsed * 1000, 3),
            worker=index,
            runner=req.runner,
            session_id=req.session_id,
        )

    def _failed(self, runner: str, exc: SandboxdError, start: float, session_id: str | None) -> StepResult:
        elapsed = time.monotonic() - start
        self.metrics.observe_step(runner, f"{exc.blame}_error", elapsed, None)
        if isinstance(exc, Saturated):
            self.metrics.rejected.labels(runner, "saturated").inc()
        return StepResult(
            ok=False,
            status=exc.status,
            error=ErrorInfo(
                blame=exc.blame,
                code=exc.code,
                message=exc.message,
                retry_after_s=getattr(exc, "retry_after_s", None),
            ),
            latency_ms=round(elapsed * 1000, 3),
            runner=runner,
            session_id=session_id,
        )

    async def batch(self, steps: list[StepRequest]) -> list[StepResult]:
        if len(steps) > self.settings.max_batch:
            raise PayloadTooLarge(f"batch of {len(steps)} steps; this node takes at most {self.settings.max_batch}")
        return list(await asyncio.gather(*(self.step(s) for s in steps)))

    # ------------------------------------------------------------------ sessions

    async def create_session(self, req: SessionCreate) -> SessionInfo:
        if req.runner not in self.models:
            raise UnknownRunner(f"runner {req.runner!r} is not enabled on this node (enabled: {self.settings.runners})")
        if req.idempotency_key:
            fp = fingerprint(req.model_dump(exclude={"idempotency_key"}))
            info: SessionInfo = await self.idem.run(
                f"session:{req.idempotency_key}", fp, lambda: self._create_session(req), keep=lambda _: True
            )
            return info
        return await self._create_session(req)

    async def _create_session(self, req: SessionCreate) -> SessionInfo:
        s = self.settings
        ttl = min(req.ttl_s or s.session_ttl_s, s.session_ttl_s)
        idle = min(req.idle_timeout_s or s.session_idle_s, s.session_idle_s)
        alive = [w for w in self.supervisor.workers if w.alive and req.runner in w.capacity]
        if not alive:
            raise Saturated(f"no live worker serves runner {req.runner!r}", retry_after_s=1.0)
        per_worker = {w.index: 0 for w in alive}
        for rec in self.sessions.sessions.values():
            if rec.worker in per_worker:
                per_worker[rec.worker] += 1
        worker = min(alive, key=lambda w: per_worker[w.index])
        sid = new_session_id()
        await worker.call("open", runner=req.runner, session_id=sid, options=req.options)
        rec = SessionRecord(sid, req.runner, worker.index, worker.generation, ttl, idle)
        self.sessions.add(rec)
        self.metrics.sessions.labels(req.runner).set(self.sessions.count(req.runner))
        return SessionInfo.model_validate(rec.describe())

    def session_info(self, session_id: str) -> SessionInfo:
        return SessionInfo.model_validate(self.sessions.get(session_id).describe())

    async def close_session(self, session_id: str, why: str = "closed by the client") -> None:
        rec = self.sessions.sessions.get(session_id)
        if rec is None:
            self.sessions.get(session_id)  # raises the right 404
            return
        self.sessions.remove(session_id, why)
        self.metrics.sessions.labels(rec.runner).set(self.sessions.count(rec.runner))
        worker = self.supervisor.workers[rec.worker]
        if worker.alive and worker.generation == rec.generation:
            with contextlib.suppress(SandboxdError):
                await worker.call("close", runner=rec.runner, session_id=session_id)

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            for rec, why in self.sessions.expired():
                self.metrics.sessions_reaped.labels(why).inc()
                await self.close_session(rec.session_id, f"reaped ({why})")
