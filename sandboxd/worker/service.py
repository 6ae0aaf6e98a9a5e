"""A worker process: its runners, its slots, its sessions, and the step pipeline from request to answer.

One worker per vCPU. Every front process and the node process connect to it (``links.py``). A step
arrives as the bytes the client sent; the worker validates it (the kind's action model, the node's
limits, the kind's admission hook), admits it (its own slots and queue for a one-shot, its own session
table for a session step), runs it, and answers with the bytes the client gets: the front relays them.
Each step's result is built here, in one place (``_result`` / ``_failed``), so it says whose failure it
was; the program's own verdict comes from its runner (``StepOutcome.failure``).

If the worker dies, only its own in-flight steps and sessions are lost: the fronts answer 502/410 for
them, the node starts a new worker (a new incarnation: the ids of the old one's sessions say so).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import orjson
from pydantic import BaseModel, ValidationError

from sandboxd.answers import failed_answer
from sandboxd.board import Board
from sandboxd.config import NodeSettings
from sandboxd.errors import (
    BadRequest,
    InfraError,
    PayloadTooLarge,
    SandboxdError,
    SessionBusy,
    SessionClosed,
    SessionExpired,
    SessionLost,
    Starting,
    UnknownRunner,
)
from sandboxd.ids import tenant_of_key
from sandboxd.links import Channel, Header
from sandboxd.messages import (
    CloseCall,
    DeadlineCall,
    ForkCall,
    InterruptCall,
    OpenCall,
    OwnerCall,
    SelectCall,
    SessionCall,
    StatusCall,
    WorkerHello,
)
from sandboxd.metrics import WorkerMetrics
from sandboxd.models import StepRequest
from sandboxd.registry import kinds
from sandboxd.rollouts import RolloutClock
from sandboxd.runners.base import (
    BurstingRunner,
    ForkingRunner,
    InterruptingRunner,
    Runner,
    RunnerContext,
    RunnerKind,
    StepLimits,
    StepOutcome,
    validation_message,
)
from sandboxd.worker.admission import Admission
from sandboxd.worker.sessions import SessionRecord, SessionTable
from sandboxd.worker.starting import START_PATIENCE_MAX, START_RETRY_S, start_failure

log = logging.getLogger("sandboxd.worker")

# A link operation's handler: its header is the operation's own message type (``messages.py``).
OpHandler = Callable[[Channel, Any, bytes], Awaitable[tuple[Header, bytes]]]


def hosted_kinds(settings: NodeSettings, index: int) -> list[RunnerKind]:
    """The enabled kinds whose placement puts an instance in worker ``index``."""
    registry = kinds()
    return [registry[k] for k in settings.runners if registry[k].hosted_by(index, settings.runner_config(k))]


def request_message(exc: ValidationError) -> str:
    """A bad request body's fields, located as FastAPI locates them (``body.action: Field required``)."""
    return validation_message(exc, "body")


class Worker:
    def __init__(self, settings: NodeSettings, index: int, incarnation: str, board: Board | None) -> None:
        self.settings = settings
        self.index = index
        self.incarnation = incarnation
        self.ctx = RunnerContext(
            Path(settings.runtime_dir),
            f"{settings.node_id}-{os.getppid()}-w{index}",
            index,
            Path(settings.images_dir),
            settings.image_uid_base,
        )
        registry = kinds()
        self.all_kinds = {k: registry[k] for k in settings.runners}
        self.kinds = {k.name: k for k in hosted_kinds(settings, index)}
        self.runners: dict[str, Runner] = {}  # the kinds running (started), the only ones admitted
        self._instances: dict[str, Runner] = {}  # every hosted kind's runner, running or starting
        self.pending: dict[str, str] = {}  # kinds still starting, and why (their health says so)
        self._starting: list[asyncio.Task[None]] = []
        self.board = board
        self.admission: Admission | None = None
        self.sessions = SessionTable()
        self.rollouts = RolloutClock(max_boost_s=settings.rollout_max_boost_s)
        self.metrics = WorkerMetrics(index)
        self.node: Channel | None = None  # the node process's link: session ends are told there
        self._reaper: asyncio.Task[None] | None = None
        self._borrowers: set[str] = set()
        self._max_bytes = {k: settings.runner_config(k).max_action_bytes for k in self.all_kinds}
        self._ops = self._handlers()

    async def start(self) -> None:
        """The runners made and admitted at their capacity; each kind starts in the background (``_start_kind``):
        the worker listens at once, and a kind that is slow to start (a loaded machine) or cannot start yet (a
        missing privilege) is said in its health, retried, and refused meanwhile (503 ``starting``), never the
        worker's exit."""
        # The worker's density, the one every kind's wall cap reads (``starvation.wall_cap_s``): what the
        # kinds it hosts may run at once by their slots.
        self.ctx.density.configured = sum(self.settings.runner_config(k).cores_at_once() for k in self.kinds)
        for name in self.kinds:
            self._instances[name] = self._make_runner(name)
            self.pending[name] = "starting"
        # Kinds whose steps may spread over more slots (``runners.base.SlotLender``): only they get a lender.
        self._borrowers = {name for name, kind in self.kinds.items() if kind.capabilities.borrows_slots}
        weights = {tenant_of_key(key): w for key, w in self.settings.tenant_weights.items()}
        self.admission = Admission(self.index, {}, {}, self.board, {}, weights)
        self._reaper = asyncio.create_task(self._reap_loop())
        self._starting = [asyncio.create_task(self._start_kind(name)) for name in self.kinds]

    def _make_runner(self, name: str, attempt: int = 1) -> Runner:
        kind = self.kinds[name]
        cfg = self.settings.runner_config(name).patient(min(2 ** (attempt - 1), START_PATIENCE_MAX))
        runner = kind.runner_class()(cfg, self.ctx.of_kind(name))
        if missing := kind.capabilities.missing_from(runner):
            raise TypeError(f"runner kind {name!r} declares capabilities its runner lacks: {', '.join(missing)}")
        return runner

    async def _start_kind(self, name: str) -> None:
        """Start one kind, again after each failure (its half-started state closed, a fresh instance), until it
        runs: what is slow now (a machine at load 38 timed the SQL fork server out) starts later; what is
        missing (a read-only cgroup tree) is said on every attempt and retried, since an operator can fix it
        under a running node. Admitted once it runs."""
        for attempt in itertools.count(1):
            runner = self._instances[name]
            try:
                await runner.start()
            except Exception as exc:
                why = start_failure(exc)
                self.pending[name] = f"attempt {attempt} failed: {why}"
                log.error(
                    "worker %d: runner %s did not start (attempt %d): %s; retrying", self.index, name, attempt, why
                )
                with contextlib.suppress(Exception):
                    await runner.close()
                await asyncio.sleep(START_RETRY_S[min(attempt, len(START_RETRY_S)) - 1])
                self._instances[name] = self._make_runner(name, attempt + 1)
                continue
            break
        self.runners[name] = runner
        assert self.admission is not None
        q = self.settings.queue_max
        queue_max = max(1, math.ceil(q / len(self.settings.hosting(name)))) if q else 0
        burst = cast(BurstingRunner, runner).burst_capacity() if self.kinds[name].capabilities.burst else 0
        self.admission.add(name, runner.capacity(), queue_max, burst)
        del self.pending[name]
        self._tell_node("kind_ready", kind=name)  # the node reads its health now, not at its next ping
        if attempt > 1:
            log.info("worker %d: runner %s started (attempt %d)", self.index, name, attempt)

    def ready_kind(self, name: str) -> Runner:
        """The kind's running runner, or why not: it is still starting (503, retry)."""
        run = self.runners.get(name)
        if run is None:
            why = self.pending.get(name)
            if why is None:  # a front sent a kind this worker does not host: a bug of ours, said as one
                raise InfraError(f"worker {self.index} does not host runner {name!r}")
            raise Starting(f"runner {name!r} of worker {self.index} is still starting ({why})")
        return run

    def capacity(self) -> dict[str, int]:
        return {k: r.capacity() for k, r in self._instances.items()}

    async def close(self) -> None:
        for task in self._starting:
            task.cancel()
        if self._reaper is not None:
            self._reaper.cancel()
        if self.admission is not None:
            self.admission.close()
        await asyncio.gather(*(r.close() for r in self._instances.values()), return_exceptions=True)
        if self.board is not None:
            self.board.clear(self.index)

    # ------------------------------------------------------------------ the link's requests

    async def handle(self, ch: Channel, h: Header, body: bytes) -> tuple[Header, bytes]:
        handler = self._ops.get(h["op"])
        if handler is None:
            raise InfraError(f"unknown worker op {h['op']!r}")
        return await handler(ch, h, body)

    def _handlers(self) -> dict[str, OpHandler]:
        """The link's operations (their fields: ``messages.py``)."""
        return {
            "step": lambda ch, h, body: self.step(h, body),
            "info": self._op_info,
            "close": self._op_close,
            "open": self._op_open,
            "fork": self._op_fork,
            "select": self._op_select,
            "deadline": self._op_deadline,
            "owner": self._op_owner,
            "interrupt": self._op_interrupt,
            "status": self._op_status,
            "hello": self._op_hello,
            "ping": self._op_ping,
        }

    async def _op_info(self, ch: Channel, h: SessionCall, body: bytes) -> tuple[Header, bytes]:
        return {}, orjson.dumps(self.sessions.get(h["session_id"], h["tenant"]).describe())

    async def _op_close(self, ch: Channel, h: CloseCall, body: bytes) -> tuple[Header, bytes]:
        await self.close_session(h["session_id"], h["tenant"], h.get("why") or "closed by the client")
        return {}, b""

    async def _op_open(self, ch: Channel, h: OpenCall, body: bytes) -> tuple[Header, bytes]:
        return {}, orjson.dumps(await self.open_session(h))

    async def _op_fork(self, ch: Channel, h: ForkCall, body: bytes) -> tuple[Header, bytes]:
        return {}, orjson.dumps(await self.fork_session(h))

    async def _op_select(self, ch: Channel, h: SelectCall, body: bytes) -> tuple[Header, bytes]:
        return await self.select_sessions(h), b""

    async def _op_owner(self, ch: Channel, h: OwnerCall, body: bytes) -> tuple[Header, bytes]:
        return {"tenant": self.sessions.owner(h["session_id"], h["labels"], h["named"])}, b""

    async def _op_deadline(self, ch: Channel, h: DeadlineCall, body: bytes) -> tuple[Header, bytes]:
        rec = self.sessions.get(h["session_id"], h["tenant"])
        rec.ends_in(float(h["timeout_s"]), self.settings.session_ttl_s, self.settings.session_idle_s)
        return {}, orjson.dumps(rec.describe())

    async def _op_interrupt(self, ch: Channel, h: InterruptCall, body: bytes) -> tuple[Header, bytes]:
        """Only the step its caller named: never another caller's, queued or running."""
        rec = self.sessions.get(h["session_id"], h["tenant"])
        run = self.runners.get(rec.runner)
        ours = rec.busy and rec.step_key is not None and rec.step_key == h.get("step_key")
        interruptible = run is not None and self.kind(rec.runner).capabilities.interrupt
        hit = ours and interruptible and await cast(InterruptingRunner, run).interrupt_session(rec.session_id)
        return {"interrupted": hit}, b""

    async def _op_status(self, ch: Channel, h: StatusCall, body: bytes) -> tuple[Header, bytes]:
        return {}, orjson.dumps({sid: self.sessions.state(sid, h["tenant"]) for sid in h["session_ids"]})

    async def _op_hello(self, ch: Channel, h: WorkerHello, body: bytes) -> tuple[Header, bytes]:
        ch.peer = {"role": h.get("role"), "index": h.get("index")}
        if h.get("role") == "node":
            self.node = ch
        return {"pid": os.getpid(), "incarnation": self.incarnation, "capacity": self.capacity()}, b""

    async def _op_ping(self, ch: Channel, h: Header, body: bytes) -> tuple[Header, bytes]:
        return await self.ping(), b""

    async def ping(self) -> Header:
        runners = {k: await r.health() for k, r in self.runners.items()}
        for k, why in self.pending.items():
            runners[k] = {"ready": False, "starting": why, "capacity": self._instances[k].capacity()}
        queue = {k: self.admission.queue_depth(k) for k in self.runners} if self.admission else {}
        inflight = {k: self.admission.inflight(k) for k in self.runners} if self.admission else {}
        return {"pid": os.getpid(), "runners": runners, "queue": queue, "inflight": inflight}

    def _tell_node(self, op: str, **fields: Any) -> None:
        if self.node is not None and self.node.alive:
            self.node.event(op, fields)

    # ------------------------------------------------------------------ steps

    def kind(self, name: str) -> RunnerKind:
        k = self.all_kinds.get(name)
        if k is None:
            raise UnknownRunner(f"runner {name!r} is not enabled on this node (enabled: {self.settings.runners})")
        return k

    def admit(self, req: StepRequest) -> tuple[BaseModel, StepLimits]:
        """The action, checked by its kind, and the step's limits; or the client's error."""
        kind = self.kind(req.runner)
        action = kind.parse_action(req.action)
        s = self.settings
        timeout = req.timeout_s if req.timeout_s is not None else s.default_timeout_s
        if timeout > s.max_timeout_s:
            raise BadRequest(f"timeout_s: {timeout} exceeds this node's max_timeout_s {s.max_timeout_s}")
        lim = req.limits
        limits = StepLimits(
            timeout_s=timeout,
            memory_mb=lim.memory_mb if lim else None,
            max_output_bytes=lim.max_output_bytes if lim else None,
            budget_s=s.max_timeout_s,
        )
        try:
            size = len(orjson.dumps(req.action))
        except (orjson.JSONEncodeError, ValueError, RecursionError) as exc:
            # An integer above 64 bits, nesting past 254 levels: what the client sent, not a bug of ours.
            raise BadRequest(f"action cannot be carried as JSON: {exc}") from None
        if size > self._max_bytes[req.runner]:
            raise PayloadTooLarge(
                f"action is {size} bytes as JSON; runner {req.runner!r} takes at most {self._max_bytes[req.runner]}"
            )
        if kind.admit is not None:
            kind.admit(action, limits, s.runner_config(req.runner))
        return action, limits

    async def step(self, h: Header, body: bytes) -> tuple[Header, bytes]:
        """One step, from the bytes the client sent to the bytes it gets (``status`` in the header)."""
        t0 = float(h.get("t0") or time.monotonic())
        runner = "unknown"
        session_id = None
        try:
            try:
                req = StepRequest.model_validate_json(body)
            except ValidationError as exc:
                raise BadRequest(request_message(exc)) from None
            runner, session_id = req.runner, req.session_id
            action, limits = self.admit(req)
            answer_by = h.get("answer_by")
            limits = dataclasses.replace(
                limits, tenant=str(h["tenant"]), answer_by=float(answer_by) if answer_by is not None else None
            )
            if session_id is not None:
                return await self._session_step(req, action, limits, h["tenant"], t0, h.get("step_key"))
            deadline = float(h.get("deadline") or t0 + self.settings.queue_timeout_s)
            limits = dataclasses.replace(limits, admit_by=deadline)
            priority = None
            if self.settings.scheduling == "oldest_rollout":
                priority = self.rollouts.priority(h["tenant"], req.rollout_id, t0)
            run = self.ready_kind(runner)
            assert self.admission is not None
            async with self.admission.slot(runner, deadline, priority, h["tenant"]):
                if runner not in self._borrowers:
                    outcome = await run.step(action, None, limits)
                else:
                    lender = self.admission.lender(runner, h["tenant"])
                    try:
                        outcome = await run.step(action, None, dataclasses.replace(limits, lender=lender))
                    finally:
                        while lender.lent:  # a runner that did not give back what it borrowed
                            lender.give_back()
            return self._result(runner, outcome, t0, None)
        except SandboxdError as exc:
            return self._failed(runner, exc, t0, session_id)
        except Exception as exc:  # a runner bug must not take the worker down: an infra error, logged
            log.exception("worker %s: a %s step failed", self.index, runner)
            return self._failed(runner, InfraError(f"internal error: {type(exc).__name__}"), t0, session_id)

    async def _session_step(
        self, req: StepRequest, action: BaseModel, limits: StepLimits, tenant: str, t0: float, key: str | None
    ) -> tuple[Header, bytes]:
        sid = cast(str, req.session_id)
        rec = self.sessions.claim(sid, tenant)
        rec.step_key = key
        try:
            if rec.runner != req.runner:
                raise BadRequest(f"session {sid} is a {rec.runner} session, not {req.runner}")
            try:
                outcome = await self.runners[rec.runner].step(action, sid, limits)
            except SessionLost as exc:  # the runner lost the sandbox (it stopped answering): said on every later step
                if rec.ended_mid_step is None:
                    self._lost(rec, exc.message)
                raise
        except SandboxdError as exc:
            self.sessions.release(rec, stepped=False)
            return self._failed(req.runner, rec.ended_mid_step or exc, t0, sid)
        except BaseException:  # a runner's bug (answered as infra by step), or a cancel: the session stays usable
            self.sessions.release(rec, stepped=False)
            raise
        self.sessions.release(rec, stepped=True)
        if rec.ended_mid_step is not None:
            return self._failed(req.runner, rec.ended_mid_step, t0, sid, observation=outcome.observation)
        if not outcome.session_alive:
            obs = outcome.observation.model_dump() if outcome.observation is not None else {}
            why = f"its program was killed ({outcome.killed_by or obs.get('exit_code')})"
            await self._forget(rec, why)
        return self._result(req.runner, outcome, t0, sid)

    def _result(self, runner: str, outcome: StepOutcome, t0: float, session_id: str | None) -> tuple[Header, bytes]:
        if outcome.infra is not None:
            return self._failed(runner, outcome.infra, t0, session_id, observation=outcome.observation)
        failure = outcome.failure
        error = None if failure is None else {"blame": "program", "code": failure.code, "message": failure.message}
        elapsed = time.monotonic() - t0
        self.metrics.observe_step(
            runner, "ok" if error is None else "program_error", elapsed, outcome.killed_by, outcome.limits_hit
        )
        result = {
            "ok": error is None,
            "status": 200,
            "observation": orjson.Fragment(outcome.observation.model_dump_json()),
            "error": None if error is None else {**error, "retry_after_s": None},
            "latency_ms": round(elapsed * 1000, 3),
            "worker": self.index,
            "runner": runner,
            "session_id": session_id,
        }
        return {"status": 200}, orjson.dumps(result)

    def _failed(
        self,
        runner: str,
        exc: SandboxdError,
        t0: float,
        session_id: str | None,
        observation: BaseModel | None = None,
    ) -> tuple[Header, bytes]:
        elapsed = time.monotonic() - t0
        label = runner if runner in self.all_kinds else "unknown"  # a client must not mint metric labels
        self.metrics.observe_step(label, f"{exc.blame}_error", elapsed, None, ())
        if exc.code == "saturated":
            self.metrics.rejected.labels(label, "saturated").inc()
        worker = self.index if exc.worker is None else exc.worker
        return failed_answer(exc, elapsed, runner, session_id, worker, observation)

    # ------------------------------------------------------------------ sessions

    async def open_session(self, h: OpenCall) -> dict[str, object]:
        """A new session (the node placed it here, within the tenant's quota)."""
        runner, sid = h["runner"], h["session_id"]
        run = self.ready_kind(runner)
        await run.open_session(sid, h.get("options") or {})
        rec = SessionRecord(
            sid,
            runner,
            h["tenant"],
            self.settings.node_id,
            self.index,
            h["ttl_s"],
            h["idle_timeout_s"],
            h.get("labels") or {},
        )
        self.sessions.add(rec)
        self.metrics.sessions.labels(runner).set(self.sessions.count(runner))
        return rec.describe()

    async def fork_session(self, h: ForkCall) -> dict[str, object]:
        """``new_ids`` sessions, each from a copy of the source's state now; all or none. The source must be
        idle (a step mid-way is no state); steps wait out the fork (409), forks of one source may overlap."""
        rec = self.sessions.get(h["source"], h["tenant"])
        kind = self.kind(rec.runner)
        run = self.runners[rec.runner]
        if not kind.capabilities.fork:
            raise BadRequest(kind.no_fork or f"{rec.runner} sessions cannot be forked")
        if rec.busy:
            raise SessionBusy(
                f"session {rec.session_id} is running a step; fork it when the step has answered",
                session_id=rec.session_id,
            )
        rec.forking += 1
        try:
            notes: list[str] = await cast(ForkingRunner, run).fork_session(rec.session_id, h["new_ids"])
        except SessionLost as exc:
            self._lost(rec, exc.message)
            raise
        except SandboxdError as exc:
            if exc.session_ended:  # the fork ended the source (its own code held or broke it): said from now on
                await self._forget(rec, f"ended by its fork: {exc.message}")
            raise
        finally:
            rec.forking -= 1
        rec.last_used = time.monotonic()
        copies = [
            SessionRecord(
                sid,
                rec.runner,
                rec.tenant,
                self.settings.node_id,
                self.index,
                h["ttl_s"],
                h["idle_timeout_s"],
                dict(rec.labels),
            )
            for sid in h["new_ids"]
        ]
        for copy in copies:
            self.sessions.add(copy)
        self.metrics.sessions.labels(rec.runner).set(self.sessions.count(rec.runner))
        self.metrics.forks.labels(rec.runner).inc()
        return {"sessions": [c.describe() for c in copies], "notes": notes}

    async def select_sessions(self, h: SelectCall) -> Header:
        """List, renew or close the tenant's sessions that carry ``labels``: a trainer's whole run in one call.
        Renewing restarts their idle timers (and sets a new idle timeout, at most the node's): a trainer that
        stops renewing, because it died, leaves sessions that end one idle timeout later."""
        chosen = self.sessions.select(h["tenant"], h["labels"])
        what = h["what"]
        if what == "list":
            return {"sessions": [r.describe() for r in chosen]}
        if what == "renew":
            idle_s = h.get("idle_timeout_s")
            for rec in chosen:
                rec.renew(float(idle_s) if idle_s else None, self.settings.session_idle_s)
            return {"count": len(chosen)}
        if what == "close":
            why = f"closed by label ({', '.join(f'{k}={v}' for k, v in h['labels'].items())})"[:300]
            await asyncio.gather(*(self._close(rec, why) for rec in chosen))
            return {"count": len(chosen)}
        raise InfraError(f"unknown session selection {what!r}")

    async def close_session(self, session_id: str, tenant: str, why: str) -> None:
        """Close a session; a lost one is forgotten too. Unknown ids (and other tenants' sessions) are a 404."""
        with contextlib.suppress(SessionLost):
            self.sessions.get(session_id, tenant)
        rec = self.sessions.live.get(session_id)
        if rec is not None:
            await self._close(rec, why)

    async def _close(self, rec: SessionRecord, why: str) -> None:
        """The client ends the session; a step running in it answers that, not its program's kill."""
        if rec.busy:
            rec.ended_mid_step = SessionClosed(
                f"session {rec.session_id} was closed by its client during this step ({why}); the observation, "
                "if any, is what the step had done by then",
                session_id=rec.session_id,
                worker=self.index,
            )
        await self._forget(rec, why)

    async def _forget(self, rec: SessionRecord, why: str) -> None:
        if self.sessions.remove(rec.session_id, why) is None:
            return
        self.metrics.sessions.labels(rec.runner).set(self.sessions.count(rec.runner))
        if rec.lost is None:
            self._tell_node("ended", session_id=rec.session_id, why=why)
        run = self.runners.get(rec.runner)
        if run is not None:
            with contextlib.suppress(SandboxdError):
                await run.close_session(rec.session_id)

    def _lost(self, rec: SessionRecord, why: str) -> None:
        """Its sandbox is gone: it holds nothing (no quota) but answers 410 until the reaper forgets it."""
        if rec.lost is None:
            self.sessions.mark_lost(rec, why)
            self._tell_node("ended", session_id=rec.session_id, why=why, lost=True)

    async def _reap_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            for rec, why in self.sessions.expired():
                if why == "ttl" and rec.busy:
                    rec.ended_mid_step = SessionExpired(
                        f"session {rec.session_id} reached its TTL of {rec.ttl_s:g} s during this step and was "
                        "ended; the observation, if any, is what the step had done by then",
                        session_id=rec.session_id,
                        worker=self.index,
                    )
                self.metrics.sessions_reaped.labels(why).inc()
                await self._forget(rec, f"reaped ({why})")
