"""The node: validation, admission, routing and results. It has no HTTP routes of its own; the one HTTP it
speaks is forwarding a session's request to the node that owns it (``sandboxd.cluster``).

API surfaces (``sandboxd/api/``) call these methods and render what comes
back in their own shape. Every failure is a ``SandboxdError``; a step's
failure becomes a ``StepResult`` in exactly one place (``_failed``), so each
result says whose failure it was. The program's own verdict comes from its
runner (``StepOutcome.failure``), never from guessing at observation keys.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import orjson
from pydantic import BaseModel

from sandboxd.api.models import (
    ErrorInfo,
    ForkResult,
    SessionCreate,
    SessionFork,
    SessionInfo,
    StepRequest,
    StepResult,
)
from sandboxd.cluster.forward import CALLER
from sandboxd.cluster.service import Cluster, raise_for
from sandboxd.config import NodeSettings, make_runtime_dir
from sandboxd.errors import (
    BadRequest,
    InfraError,
    PayloadTooLarge,
    SandboxdError,
    Saturated,
    SessionBusy,
    SessionExpired,
    SessionLost,
    ShuttingDown,
    UnknownRunner,
    WorkerDied,
)
from sandboxd.ids import new_session_id
from sandboxd.metrics import Metrics
from sandboxd.registry import kinds
from sandboxd.rollouts import RolloutClock
from sandboxd.runners.base import RunnerKind, StepLimits, WireOutcome
from sandboxd.scheduler import Scheduler
from sandboxd.stores.idempotency import IdempotencyStore, MemoryIdempotencyStore, fingerprint
from sandboxd.stores.sessions import MemorySessionStore, SessionRecord, SessionStore
from sandboxd.supervisor import Supervisor, WorkerHandle

log = logging.getLogger("sandboxd.gateway")
FORWARD_TIMEOUT_S = 30.0  # a forwarded request's own budget beyond any step time (session info, close)
FORK_FORWARD_TIMEOUT_S = 300.0  # a fork of many browser copies loads a page per copy


def as_json(value: Any, what: str) -> bytes:
    """``value`` as JSON, or the client's error: lone surrogates, integers above 64 bits and nesting past
    254 levels cannot cross to a worker, and must not surface there as a server error."""
    try:
        return orjson.dumps(value.model_dump(mode="json") if isinstance(value, BaseModel) else value)
    except (orjson.JSONEncodeError, ValueError, RecursionError) as exc:
        raise BadRequest(f"{what} cannot be carried as JSON: {exc}") from None


class Gateway:
    def __init__(
        self,
        settings: NodeSettings,
        sessions: SessionStore | None = None,
        idempotency: IdempotencyStore | None = None,
    ) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        registry = kinds()
        self.kinds: dict[str, RunnerKind] = {k: registry[k] for k in settings.runners}
        # With Redis, the stores are shared by the service's nodes and requests for sessions owned by
        # another node are forwarded to it; without, the node is the whole service (the embedded default).
        self.cluster = Cluster(settings) if settings.redis_url else None
        self.sessions: SessionStore = sessions or (self.cluster.sessions if self.cluster else MemorySessionStore())
        self.idem: IdempotencyStore = idempotency or (
            self.cluster.idempotency
            if self.cluster
            else MemoryIdempotencyStore(settings.idempotency_ttl_s, settings.idempotency_max_entries)
        )
        self.supervisor = Supervisor(settings, self._worker_lost)
        self.supervisor.on_ready = self._worker_ready
        self.scheduler: Scheduler | None = None
        self.metrics = Metrics(
            lambda: [(w.index, w.health) for w in self.supervisor.workers], replays=lambda: self.idem.hits
        )
        self._reaper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._busy: set[str] = set()  # sessions with a step running: a second one is a 409, not a queue
        self._expired_mid_step: dict[str, str] = {}  # sessions the reaper ended at their TTL during a step
        self._forking: Counter[str] = Counter()  # sessions being copied: forks may overlap, steps may not
        self._tenant_inflight: Counter[str] = Counter()
        self._own_runtime_dir = not settings.runtime_dir
        self.inflight = 0
        self.started = False
        self.draining = False
        self.rollouts = RolloutClock(max_boost_s=self.settings.rollout_max_boost_s)
        self._opening_by_worker: Counter[tuple[str, int]] = Counter()  # session opens in flight, for placement
        self._opening_by_tenant: Counter[str] = Counter()  # and for the tenant's session quota

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.settings.runtime_dir = str(make_runtime_dir(self.settings))
        await self.supervisor.start()
        self.scheduler = Scheduler(self.supervisor.workers, self.settings.queue_max, self.settings.queue_timeout_s)
        for w in self.supervisor.workers:
            with contextlib.suppress(Exception):
                w.health = await w.call("ping")
        if self.cluster is not None:
            await self.cluster.start()
        self._reaper = asyncio.create_task(self._reap_loop())
        self.started = True
        log.info(
            "sandboxd node %s ready: %d workers, runners %s",
            self.node_id,
            len(self.supervisor.workers),
            self.settings.runners,
        )

    def begin_drain(self) -> None:
        """Stop taking work but keep answering: new steps and sessions get 503 ``shutting_down`` (retry on
        another node) and /readyz 503, while the steps in flight finish (``stop`` then waits for them)."""
        self.draining = True
        if self.scheduler is not None:
            self.scheduler.close()

    async def stop(self) -> None:
        self.begin_drain()
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
        n_sessions = await self.sessions.count()
        if self.cluster is not None:  # leave first: the others answer 410 for our sessions from now on
            await self.cluster.stop()
        await self.supervisor.stop()
        if self._own_runtime_dir:
            shutil.rmtree(self.settings.runtime_dir, ignore_errors=True)
        log.info("sandboxd node %s stopped (%d sessions closed)", self.node_id, n_sessions)

    def _worker_lost(self, index: int) -> None:
        if self.scheduler is not None:
            self.scheduler.remove_worker(index)

        async def mark() -> None:
            lost = await self.sessions.mark_worker_lost(index, f"worker {index} died and its sandboxes with it")
            log.error("worker %d lost; %d sessions lost with it", index, lost)

        task = asyncio.get_running_loop().create_task(mark())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _worker_ready(self, w: WorkerHandle) -> None:
        if self.scheduler is not None:
            self.scheduler.add_worker(w)
        self.metrics.worker_restarts.inc()

    async def ready(self) -> tuple[bool, dict[str, Any]]:
        workers = [
            {"index": w.index, "pid": w.pid, "alive": w.alive, "generation": w.generation, "capacity": w.capacity}
            for w in self.supervisor.workers
        ]
        # A worker is ready when it is up and every runner says its pools are whole (e.g. no dead jail).
        ok = (
            self.started
            and not self.draining
            and (self.cluster is None or self.cluster.registry.held_by is None)
            and all(
                w.alive and all(h.get("ready", True) for h in (w.health.get("runners") or {}).values())
                for w in self.supervisor.workers
            )
        )
        body = {
            "ready": ok,
            "node_id": self.node_id,
            "pid": os.getpid(),
            "workers": workers,
            "sessions": await self.sessions.count(),
            "draining": self.draining,
            "inflight": self.inflight,
        }
        if self.cluster is not None:  # a node without Redis still serves one-shots: ready, but say so
            cluster: dict[str, Any] = {
                "store": "ok" if self.cluster.registry.healthy else "unavailable",
                "incarnation": self.cluster.incarnation,
                "url": self.cluster.me.url,
                "peers": sorted(self.cluster.registry.peers),
            }
            if (holder := self.cluster.registry.held_by) is not None:
                cluster["node_id_held_by"] = {"url": holder.url, "incarnation": holder.incarnation}
            body["cluster"] = cluster
        return ok, body

    def kind(self, name: str) -> RunnerKind:
        try:
            return self.kinds[name]
        except KeyError:
            raise UnknownRunner(
                f"runner {name!r} is not enabled on this node (enabled: {self.settings.runners})"
            ) from None

    # ------------------------------------------------------------------ steps

    def _limits(self, req: StepRequest) -> StepLimits:
        s = self.settings
        timeout = req.timeout_s if req.timeout_s is not None else s.default_timeout_s
        if timeout > s.max_timeout_s:
            raise BadRequest(f"timeout_s: {timeout} exceeds this node's max_timeout_s {s.max_timeout_s}")
        limits = req.limits
        return StepLimits(
            timeout_s=timeout,
            memory_mb=limits.memory_mb if limits else None,
            max_output_bytes=limits.max_output_bytes if limits else None,
        )

    def admit(self, req: StepRequest) -> tuple[orjson.Fragment, StepLimits]:
        """The action, checked by its kind and serialised once, and the step's limits; or the client's error.

        Everything that could fail later because of what the client sent fails here, as the client's:
        a value JSON cannot carry (a lone surrogate, an integer above 64 bits, nesting deeper than 254
        levels) would otherwise surface as a server error on the way to the worker.
        """
        kind = self.kind(req.runner)
        action = kind.parse_action(req.action)
        limits = self._limits(req)
        cfg = self.settings.runner_config(req.runner)
        raw = as_json(action, "action")
        if len(raw) > cfg.max_action_bytes:
            raise PayloadTooLarge(
                f"action is {len(raw)} bytes as JSON; runner {req.runner!r} takes at most {cfg.max_action_bytes}"
            )
        if kind.admit is not None:
            kind.admit(action, limits, cfg)
        return orjson.Fragment(raw), limits

    async def step(self, req: StepRequest, tenant: str, queue_deadline: float | None = None) -> StepResult:
        """Run one step; ``queue_deadline`` (monotonic) replaces ``queue_timeout_s`` for a one-shot's wait."""
        start = time.monotonic()
        self.inflight += 1
        self._tenant_inflight[tenant] += 1
        try:
            if self._tenant_inflight[tenant] > self.settings.tenant_max_inflight:
                raise Saturated(
                    f"this tenant has {self._tenant_inflight[tenant] - 1} steps in flight "
                    f"(tenant_max_inflight {self.settings.tenant_max_inflight})",
                    retry_after_s=1.0,
                )
            # Admitted here first: what the client sent is judged (and refused as the client's) where it
            # arrived, never re-encoded into a server error on the way to the owner, nor carried there whole.
            action, limits = self.admit(req)
            if req.session_id is not None and self._remote(req.session_id):
                return await self._forward_step(req, tenant, start)
            if req.idempotency_key:
                fp = fingerprint(req.model_dump(exclude={"idempotency_key"}))
                result: StepResult = await self.idem.run(
                    f"{tenant}:step:{req.idempotency_key}",
                    fp,
                    lambda: self._execute(req, tenant, action, limits, start, queue_deadline),
                    keep=lambda r: r.error is None or r.error.blame != "infra",
                    model=StepResult,
                )
                return result
            return await self._execute(req, tenant, action, limits, start, queue_deadline)
        except SandboxdError as exc:
            return self._failed(req.runner, exc, start, req.session_id)
        finally:
            self.inflight -= 1
            self._tenant_inflight[tenant] -= 1
            if not self._tenant_inflight[tenant]:
                del self._tenant_inflight[tenant]

    def _remote(self, session_id: str) -> bool:
        """Owned by another node, and not already forwarded here by one (a forward is never forwarded)."""
        return self.cluster is not None and not self.cluster.owns(session_id) and CALLER.get().forwarded_by is None

    async def _forward(
        self,
        session_id: str,
        tenant: str,
        op: str,
        method: str,
        path: str,
        body: Any = None,
        timeout_s: float = FORWARD_TIMEOUT_S,
    ) -> tuple[int, Any]:
        assert self.cluster is not None
        try:
            status, data = await self.cluster.forward(session_id, tenant, method, path, body, timeout_s)
        except SandboxdError as exc:
            self.metrics.forwarded.labels(op, exc.code).inc()
            raise
        self.metrics.forwarded.labels(op, "answered").inc()
        return status, data

    async def _forward_ok(self, session_id: str, tenant: str, op: str, method: str, path: str, **kw: Any) -> Any:
        """A forwarded session operation's body; its error answer raised as the owner's error."""
        status, data = await self._forward(session_id, tenant, op, method, path, **kw)
        raise_for(status, data)
        return data

    async def _forward_step(self, req: StepRequest, tenant: str, start: float) -> StepResult:
        """The owner's answer as it gave it (its idempotency, its blame); only the hop's own failures are ours."""
        assert req.session_id is not None
        # The owner may take the step's own time limit, and may queue it (a fork holding the session).
        budget = (req.timeout_s or self.settings.default_timeout_s) + self.settings.queue_timeout_s + FORWARD_TIMEOUT_S
        body = req.model_dump(mode="json", exclude_none=True)
        status, data = await self._forward(req.session_id, tenant, "step", "POST", "/rollout/step", body, budget)
        if isinstance(data, dict) and "latency_ms" in data:
            result = StepResult.model_validate(data)
            result.status = status
            return result
        raise_for(status if status >= 400 else 502, data)
        raise AssertionError("unreachable")

    async def _execute(
        self,
        req: StepRequest,
        tenant: str,
        action: orjson.Fragment,
        limits: StepLimits,
        start: float,
        queue_deadline: float | None = None,
    ) -> StepResult:
        call = {"runner": req.runner, "action": action, "limits": limits.__dict__}
        try:
            if req.session_id is not None:
                try:
                    raw, index = await self._session_step(req.session_id, tenant, req.runner, call)
                except SandboxdError as exc:
                    if (expired := self._expired_mid_step.pop(req.session_id, None)) is not None:
                        raise SessionExpired(expired, session_id=req.session_id, worker=exc.worker) from None
                    raise
                if (expired := self._expired_mid_step.pop(req.session_id, None)) is not None:
                    return self._expired(req, expired, raw, index, start)
            else:
                assert self.scheduler is not None
                deadline = queue_deadline if queue_deadline is not None else start + self.settings.queue_timeout_s
                priority = None
                if self.settings.scheduling == "oldest_rollout":
                    priority = self.rollouts.priority(tenant, req.rollout_id, start)
                async with self.scheduler.slot(req.runner, deadline, priority) as worker:
                    raw = await worker.call("step", session_id=None, **call)
                    index = worker.index
        except SandboxdError as exc:
            return self._failed(req.runner, exc, start, req.session_id)
        outcome = WireOutcome.from_wire(raw)
        failure = outcome.failure
        error = None if failure is None else ErrorInfo(blame="program", code=failure.code, message=failure.message)
        elapsed = time.monotonic() - start
        self.metrics.observe_step(
            req.runner, "ok" if error is None else "program_error", elapsed, outcome.killed_by, outcome.limits_hit
        )
        return StepResult(
            ok=error is None,
            observation=outcome.observation,
            error=error,
            latency_ms=round(elapsed * 1000, 3),
            worker=index,
            runner=req.runner,
            session_id=req.session_id,
        )

    def _expired(self, req: StepRequest, why: str, raw: dict[str, Any], worker: int, start: float) -> StepResult:
        """A step cut short by its session's TTL: what it did until then, said as the session's end (410,
        ``session_expired``), never as the program's exit or kill."""
        result = self._failed(req.runner, SessionExpired(why, session_id=req.session_id), start, req.session_id)
        result.observation = WireOutcome.from_wire(raw).observation
        result.worker = worker
        return result

    async def _session_step(
        self, session_id: str, tenant: str, runner: str, call: dict[str, Any]
    ) -> tuple[dict[str, Any], int]:
        rec = await self.sessions.get(session_id, tenant)
        if session_id in self._busy:
            raise SessionBusy(
                f"session {session_id} is running a step; send the next one when it has answered",
                session_id=session_id,
            )
        if self._forking[session_id]:
            raise SessionBusy(
                f"session {session_id} is being forked; step it when the fork has answered", session_id=session_id
            )
        self._busy.add(session_id)
        try:
            return await self._session_step_unlocked(rec, runner, call)
        finally:
            self._busy.discard(session_id)

    async def _session_step_unlocked(
        self, rec: SessionRecord, runner: str, call: dict[str, Any]
    ) -> tuple[dict[str, Any], int]:
        session_id = rec.session_id
        if rec.runner != runner:
            raise BadRequest(f"session {session_id} is a {rec.runner} session, not {runner}")
        worker = await self._worker_of(rec)
        await self.sessions.touch(session_id, stepped=False)
        try:
            raw: dict[str, Any] = await worker.call("step", session_id=session_id, **call)
        except WorkerDied as exc:  # the session's state went with its worker: that is what the client must learn
            why = f"worker {rec.worker} died during a step"
            await self.sessions.mark_lost(session_id, why)
            raise SessionLost(
                f"session {session_id} was lost: {why}", session_id=session_id, worker=rec.worker
            ) from exc
        except SessionLost as exc:  # the runner lost the sandbox (it stopped answering): say so on every later step
            await self.sessions.mark_lost(session_id, exc.message)
            raise
        await self.sessions.touch(session_id, stepped=True)
        if raw.get("session_alive") is False:
            obs = raw.get("observation") or {}
            await self._forget(session_id, f"its program was killed ({raw.get('killed_by') or obs.get('exit_code')})")
        return raw, rec.worker

    async def _worker_of(self, rec: SessionRecord) -> WorkerHandle:
        """The worker holding ``rec``'s state; if it was replaced since, the session is lost (said once, kept)."""
        worker = self.supervisor.workers[rec.worker]
        if worker.generation != rec.generation or not worker.alive:
            await self.sessions.mark_lost(rec.session_id, f"worker {rec.worker} was replaced")
            raise SessionLost(
                f"session {rec.session_id} was lost: its worker was replaced",
                session_id=rec.session_id,
                worker=rec.worker,
            )
        return worker

    def _failed(self, runner: str, exc: SandboxdError, start: float, session_id: str | None) -> StepResult:
        elapsed = time.monotonic() - start
        label = runner if runner in self.kinds else "unknown"  # a client must not mint metric labels
        self.metrics.observe_step(label, f"{exc.blame}_error", elapsed, None, ())
        if isinstance(exc, Saturated):
            self.metrics.rejected.labels(label, "saturated").inc()
        return StepResult(
            ok=False,
            status=exc.status,
            error=ErrorInfo(blame=exc.blame, code=exc.code, message=exc.message, retry_after_s=exc.retry_after_s),
            latency_ms=round(elapsed * 1000, 3),
            worker=exc.worker,
            runner=runner,
            session_id=session_id,
        )

    async def batch(self, steps: list[StepRequest], tenant: str) -> list[StepResult]:
        if len(steps) > self.settings.max_batch:
            raise PayloadTooLarge(f"batch of {len(steps)} steps; this node takes at most {self.settings.max_batch}")
        results = await asyncio.gather(*(self.step(s, tenant) for s in steps), return_exceptions=True)
        out = []
        for req, res in zip(steps, results, strict=True):
            if isinstance(res, StepResult):
                out.append(res)
                continue
            if isinstance(res, asyncio.CancelledError):
                raise res
            # A bug in one step must not lose the others' results (they ran): that step alone is an infra error.
            log.error("a batch step failed: %r", res, exc_info=res)
            out.append(
                self._failed(
                    req.runner, InfraError(f"internal error: {type(res).__name__}"), time.monotonic(), req.session_id
                )
            )
        return out

    # ------------------------------------------------------------------ sessions

    async def create_session(self, req: SessionCreate, tenant: str) -> SessionInfo:
        """A new session on this node (the node that takes the request owns what it creates)."""
        self.kind(req.runner).parse_options(req.options)
        as_json(req.options, "options")
        if req.idempotency_key:
            fp = fingerprint(req.model_dump(exclude={"idempotency_key"}))
            info: SessionInfo = await self.idem.run(
                f"{tenant}:session:{req.idempotency_key}",
                fp,
                lambda: self._create_session(req, tenant),
                keep=lambda _: True,
                model=SessionInfo,
            )
            return info
        return await self._create_session(req, tenant)

    async def _check_room(self, tenant: str, n: int) -> None:
        """``n`` more sessions fit the tenant's quota, or a 429. Sessions being opened count too: a storm of
        concurrent creates (or forks) all saw the store before any was put."""
        held = await self.sessions.count(tenant=tenant) + self._opening_by_tenant[tenant]
        cap = self.settings.tenant_max_sessions
        if held + n > cap:
            more = "another" if n == 1 else f"{n} more"
            raise Saturated(
                f"this tenant holds {held} sessions; {more} would pass tenant_max_sessions {cap}; close some first",
                retry_after_s=5.0,
            )

    def _lifetimes(self, ttl_s: float | None, idle_s: float | None) -> tuple[float, float]:
        """A new session's TTL and idle timeout: what was asked, at most the node's."""
        s = self.settings
        return min(ttl_s or s.session_ttl_s, s.session_ttl_s), min(idle_s or s.session_idle_s, s.session_idle_s)

    @contextlib.contextmanager
    def _opening(self, tenant: str, runner: str, worker: int, n: int) -> Iterator[None]:
        """``n`` sessions being made for ``tenant`` on ``worker``: counted for quotas and placement meanwhile."""
        self._opening_by_worker[(runner, worker)] += n
        self._opening_by_tenant[tenant] += n
        try:
            yield
        finally:
            self._opening_by_worker[(runner, worker)] -= n
            self._opening_by_tenant[tenant] -= n
            if not self._opening_by_tenant[tenant]:  # tenants come and go: keep no zero entries
                del self._opening_by_tenant[tenant]

    async def _create_session(self, req: SessionCreate, tenant: str) -> SessionInfo:
        if self.draining:
            raise ShuttingDown("this node is shutting down; create the session on another node")
        if self.cluster is not None:
            self.cluster.refuse_if_out()
        await self._check_room(tenant, 1)
        ttl, idle = self._lifetimes(req.ttl_s, req.idle_timeout_s)
        alive = [w for w in self.supervisor.workers if w.alive and req.runner in w.capacity]
        if not alive:
            raise Saturated(f"no live worker serves runner {req.runner!r}", retry_after_s=1.0)
        per_worker = await self.sessions.per_worker(req.runner)
        opening = self._opening_by_worker
        worker = min(alive, key=lambda w: per_worker.get(w.index, 0) + opening[(req.runner, w.index)])
        sid = new_session_id(self.node_id)
        with self._opening(tenant, req.runner, worker.index, 1):
            await worker.call("open", runner=req.runner, session_id=sid, options=req.options)
            rec = SessionRecord(sid, req.runner, tenant, self.node_id, worker.index, worker.generation, ttl, idle)
            try:
                await self.sessions.put(rec)
            except SandboxdError:  # not recorded (the shared store did not answer): nobody could reach it
                with contextlib.suppress(SandboxdError):
                    await worker.call("close", runner=req.runner, session_id=sid)
                raise
        self.metrics.sessions.labels(req.runner).set(await self.sessions.count(req.runner))
        return SessionInfo.model_validate(rec.describe())

    async def fork_session(self, session_id: str, req: SessionFork, tenant: str) -> ForkResult:
        """``req.n`` new sessions, each from a copy of ``session_id``'s state now, on its worker; all or none.

        The source must be idle: a fork of a session mid-step is a 409 (its state is not a state yet). While
        copies are made a step for the source is a 409 too, so none changes it under the copy; forks of one
        source may overlap (they only read it). Each copy
        counts against the tenant's session quota and its worker's session cap like any session.
        """
        if self._remote(session_id):
            path = f"/sessions/{quote(session_id, safe='')}/fork"
            body = req.model_dump(exclude_none=True)
            data = await self._forward_ok(
                session_id, tenant, "fork", "POST", path, body=body, timeout_s=FORK_FORWARD_TIMEOUT_S
            )
            return ForkResult.model_validate(data)
        if self.draining:
            raise ShuttingDown("this node is shutting down; it makes no new sessions")
        if self.cluster is not None:
            self.cluster.refuse_if_out()
        s = self.settings
        if req.n > s.fork_max_copies:
            raise BadRequest(f"n: {req.n} copies; this node makes at most fork_max_copies {s.fork_max_copies}")
        rec = await self.sessions.get(session_id, tenant)
        kind = self.kind(rec.runner)
        if kind.no_fork:
            raise BadRequest(kind.no_fork)
        if session_id in self._busy:
            raise SessionBusy(
                f"session {session_id} is running a step; fork it when the step has answered", session_id=session_id
            )
        await self._check_room(tenant, req.n)
        worker = await self._worker_of(rec)
        ttl, idle = self._lifetimes(req.ttl_s, req.idle_timeout_s)
        new_ids = [new_session_id(self.node_id) for _ in range(req.n)]
        self._forking[session_id] += 1
        self.inflight += 1  # a shutdown waits for forks as for steps
        copies = [
            SessionRecord(sid, rec.runner, tenant, self.node_id, worker.index, worker.generation, ttl, idle)
            for sid in new_ids
        ]
        recorded: list[str] = []
        try:
            with self._opening(tenant, rec.runner, rec.worker, req.n):
                try:
                    answer = await worker.call("fork", runner=rec.runner, session_id=session_id, new_ids=new_ids)
                except WorkerDied as exc:  # the source went with its worker, and no copy was made
                    why = f"worker {rec.worker} died during a fork"
                    await self.sessions.mark_lost(session_id, why)
                    raise SessionLost(f"session {session_id} was lost: {why}", session_id=session_id) from exc
                try:
                    for copy in copies:
                        await self.sessions.put(copy)
                        recorded.append(copy.session_id)
                except SandboxdError:  # not recorded (Redis): none of the group may outlive the refusal
                    for sid in recorded:
                        await self.sessions.remove(sid, "its fork failed")
                    for sid in new_ids:
                        with contextlib.suppress(SandboxdError):
                            await worker.call("close", runner=rec.runner, session_id=sid)
                    raise
        finally:
            self.inflight -= 1
            self._forking[session_id] -= 1
            if not self._forking[session_id]:
                del self._forking[session_id]
        await self.sessions.touch(session_id, stepped=False)
        self.metrics.sessions.labels(rec.runner).set(await self.sessions.count(rec.runner))
        self.metrics.forks.labels(rec.runner).inc()
        infos = [SessionInfo.model_validate(copy.describe()) for copy in copies]
        return ForkResult(source_id=session_id, sessions=infos, notes=list(answer.get("notes") or []))

    async def session_info(self, session_id: str, tenant: str) -> SessionInfo:
        if self._remote(session_id):
            path = f"/sessions/{quote(session_id, safe='')}"
            return SessionInfo.model_validate(await self._forward_ok(session_id, tenant, "info", "GET", path))
        return SessionInfo.model_validate((await self.sessions.get(session_id, tenant)).describe())

    async def close_session(self, session_id: str, tenant: str, why: str = "closed by the client") -> None:
        """Close a session; a lost one is forgotten too. Unknown ids (and other tenants' sessions) are a 404."""
        if self._remote(session_id):
            await self._forward_ok(session_id, tenant, "close", "DELETE", f"/sessions/{quote(session_id, safe='')}")
            return
        with contextlib.suppress(SessionLost):
            await self.sessions.get(session_id, tenant)
        await self._forget(session_id, why)

    async def _forget(self, session_id: str, why: str) -> None:
        rec = await self.sessions.remove(session_id, why)
        if rec is None:
            return
        self.metrics.sessions.labels(rec.runner).set(await self.sessions.count(rec.runner))
        worker = self.supervisor.workers[rec.worker]
        if worker.alive and worker.generation == rec.generation:
            with contextlib.suppress(SandboxdError):
                await worker.call("close", runner=rec.runner, session_id=session_id)

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            for rec, why in await self.sessions.expired():
                if why == "idle" and (rec.session_id in self._busy or self._forking[rec.session_id]):
                    continue  # a session running a step is not idle, however long the step (its TTL still holds)
                if why == "ttl" and rec.session_id in self._busy:
                    self._expired_mid_step[rec.session_id] = (
                        f"session {rec.session_id} reached its TTL of {rec.ttl_s:g} s during this step and was "
                        "ended; the observation, if any, is what the step had done by then"
                    )
                self.metrics.sessions_reaped.labels(why).inc()
                await self._forget(rec.session_id, f"reaped ({why})")
