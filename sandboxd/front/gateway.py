"""A front process's gateway: where each request goes, in one place, for every API surface.

A front process takes HTTP and decides only where a request goes; the workers decide everything about a
step (validation, admission, the result), the node process everything that is node-wide (sessions'
quotas and placement, idempotency keys, status). So a step is one hop: a one-shot to the worker the
load board shows least loaded for its kind (the worker admits, queues or refuses it), a session's step
to the worker its id names, a session another node owns to that node. Its answer comes back as the
bytes the client gets.

Two faces: the raw one (``*_raw``: bytes in, status and bytes out) for the hot routes of
``protocol.py``, and the model one (``step``, ``create_session``...: ``StepRequest`` in, ``StepResult``
out) for the surfaces that render results in their own shapes (SandboxFusion, OpenEnv, MCP, Gymnasium).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import orjson
from pydantic import BaseModel, ValidationError

from sandboxd.answers import error_body, failed_answer
from sandboxd.board import Board
from sandboxd.cluster.forward import CALLER, FORWARD_TIMEOUT_S
from sandboxd.cluster.service import ClusterView, raise_for
from sandboxd.config import NodeSettings
from sandboxd.errors import (
    BadRequest,
    InfraError,
    PayloadTooLarge,
    SandboxdError,
    Saturated,
    SessionLost,
    ShuttingDown,
    UnknownRunner,
    UnknownSession,
    WorkerDied,
)
from sandboxd.front.links import NodeKV, NodeLinks
from sandboxd.front.selection import select, states_of
from sandboxd.ids import owner_of, tenant_of_key, worker_of
from sandboxd.links import Channel, Header, LinkClosed, answer_of
from sandboxd.messages import CreateCall, DeadlineCall, NodeForkCall, OwnerCall, StepCall
from sandboxd.metrics import FrontMetrics
from sandboxd.models import ForkResult, SessionCreate, SessionFork, SessionInfo, StepRequest, StepResult
from sandboxd.registry import kinds
from sandboxd.runners.base import RunnerKind, validation_message
from sandboxd.stores.idempotency import Idempotency, Stored, fingerprint
from sandboxd.tally import INFLIGHT, Tally

log = logging.getLogger("sandboxd.front")
FORK_FORWARD_TIMEOUT_S = 300.0  # a fork of many browser copies loads a page per copy
NODE_START_MARGIN_S = 60.0  # the node process's own start, beyond its workers' (worker_start_timeout_s)
MAX_OPTIONS_BYTES = 64 << 10  # a session's options as JSON: they cross the node link whole, and are settings


def as_json(value: Any, what: str) -> bytes:
    """``value`` as JSON, or the client's error: lone surrogates, integers above 64 bits and nesting past
    254 levels cannot cross to a worker, and must not surface there as a server error."""
    try:
        return orjson.dumps(value.model_dump(mode="json", exclude_none=True) if isinstance(value, BaseModel) else value)
    except (orjson.JSONEncodeError, ValueError, RecursionError) as exc:
        raise BadRequest(f"{what} cannot be carried as JSON: {exc}") from None


def kept(stored: Stored) -> bool:
    """What is stored for retries: results and the client's errors; an infrastructure failure never is (a retry
    should run again)."""
    if stored.status == 200:
        return True
    try:
        return bool(orjson.loads(stored.body)["error"]["blame"] != "infra")
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return False


class Gateway:
    def __init__(self, settings: NodeSettings, index: int = 0, node_socket: str = "") -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.index = index
        registry = kinds()
        self.kinds: dict[str, RunnerKind] = {k: registry[k] for k in settings.runners}
        self.metrics = FrontMetrics()
        self.node_socket = node_socket
        self.links = NodeLinks(node_socket, index, self._node_request, self._node_event, self._node_lost)
        self.board: Board | None = None
        self.cluster: ClusterView | None = None
        self.idem: Idempotency | None = None
        self.draining = False
        self.inflight = 0
        # This front's own counts per tenant: connections (front/protocol.py) and steps or calls in flight;
        # the caps are checked against the whole node's (``tally``, shared with the other fronts).
        self.tenant_counts: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
        self.tally: Tally | None = None
        self.sent: Counter[tuple[str, int]] = Counter()  # one-shots sent to each worker, not answered yet
        self.started = False
        self._rr = itertools.count(index * 7919)  # fronts start their round-robin at different workers
        self._node_proc: subprocess.Popen[bytes] | None = None
        self.on_node_event: Callable[[Header], None] = lambda h: None  # the front process's own (``stop``)
        # A front without its node can only refuse work: it ends, and whoever runs it sees that (gunicorn
        # restarts it, cannot reach the node, and halts; ``sandboxd serve``'s fronts die with their node).
        # Under gunicorn the worker's own SIGTERM handling ends it; ``front/__main__`` stops its server.
        self.on_node_lost: Callable[[], None] = (
            (lambda: os.kill(os.getpid(), signal.SIGTERM)) if node_socket else (lambda: None)
        )

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if not self.node_socket:  # an app on its own (embedded, TestClient): it starts its node process itself
            self._start_node()
        await self.links.connect(self.settings.worker_start_timeout_s + NODE_START_MARGIN_S, alive=self._node_alive)
        topology = self.links.topology
        self.draining = bool(topology.get("draining"))
        n = len(topology["workers"])
        self.board = Board(Path(self.links.runtime_dir) / "board", n, list(self.kinds))
        if self.links.tally_row >= 0:
            tenants = [tenant_of_key(k) for k in self.settings.all_api_keys()]
            self.tally = Tally(Path(self.links.runtime_dir) / "tally", self.links.tally_rows, tenants)
        s = self.settings
        claim_ttl_s = s.max_timeout_s + s.queue_timeout_s + 60.0
        owner = f"{self.node_id}/{os.getpid()}"
        node_idem = Idempotency(NodeKV(self.links), owner, s.idempotency_ttl_s, claim_ttl_s)
        if s.redis_url:
            self.cluster = ClusterView(s, str(topology["incarnation"]))
            await self.cluster.start()
            self.idem = Idempotency(self.cluster.kv, owner, s.idempotency_ttl_s, claim_ttl_s, fallback=node_idem)
        else:
            self.idem = node_idem
        self.started = True

    def _start_node(self) -> None:
        runtime = self.settings.runtime_dir or tempfile.mkdtemp(prefix=f"sandboxd-{os.getpid()}-")
        settings = self.settings.model_copy(update={"runtime_dir": runtime})
        env = {**os.environ, "SANDBOXD_NODE_SETTINGS": settings.model_dump_json()}
        self._node_proc = subprocess.Popen([sys.executable, "-m", "sandboxd.node"], env=env, stdin=subprocess.DEVNULL)
        self.node_socket = self.links.node_socket = str(Path(runtime) / "node.sock")

    def _node_alive(self) -> bool:
        return self._node_proc is None or self._node_proc.poll() is None

    async def stop(self) -> None:
        await self.links.close()
        if self.cluster is not None:
            await self.cluster.stop()
        if self.board is not None:
            self.board.close()
        if self._node_proc is not None and self._node_proc.poll() is None:
            self._node_proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(self._node_proc.wait, self.settings.shutdown_grace_s + 30)
            if self._node_proc.poll() is None:
                self._node_proc.kill()

    async def _node_request(self, ch: Channel, h: Header, body: bytes) -> tuple[Header, bytes]:
        if h["op"] == "inflight":
            return {"inflight": self.inflight}, b""
        raise BadRequest(f"unknown front op {h['op']!r}")

    def _node_lost(self) -> None:
        self.on_node_lost()

    def _node_event(self, h: Header) -> None:
        if h.get("op") == "drain" or (h.get("op") == "topology" and h.get("draining")):
            self.draining = True
        self.on_node_event(h)

    def kind(self, name: str) -> RunnerKind:
        try:
            return self.kinds[name]
        except KeyError:
            raise UnknownRunner(
                f"runner {name!r} is not enabled on this node (enabled: {self.settings.runners})"
            ) from None

    # ------------------------------------------------------------------ where a session lives

    def _remote(self, session_id: str) -> bool:
        """Owned by another node, and not already forwarded here by one (a forward is never forwarded)."""
        return self.cluster is not None and not self.cluster.owns(session_id) and CALLER.get().forwarded_by is None

    def _session_worker(self, session_id: str) -> Channel:
        """The link to the worker holding ``session_id`` (it says whether the tenant has such a session)."""
        place = worker_of(session_id)
        if place is None or place[0] >= len(self.links.workers) or owner_of(session_id) != self.node_id:
            raise UnknownSession(f"unknown session {session_id!r}", session_id=session_id)
        w = self.links.workers[place[0]]
        if w.incarnation != place[1]:
            raise SessionLost(
                f"session {session_id} was lost: its worker was replaced (the worker or the node restarted since "
                "it was created), and its sandbox with it",
                session_id=session_id,
                worker=place[0],
            )
        if w.channel is None or not w.channel.alive:
            raise SessionLost(
                f"session {session_id} was lost: worker {place[0]} died, and its sandbox with it",
                session_id=session_id,
                worker=place[0],
            )
        return w.channel

    async def _forward(
        self, session_id: str, tenant: str, op: str, method: str, path: str, body: bytes = b"", **kw: Any
    ) -> tuple[int, bytes]:
        assert self.cluster is not None
        try:
            status, data = await self.cluster.forward(session_id, tenant, method, path, body, **kw)
        except SandboxdError as exc:
            self.metrics.forwarded.labels(op, exc.code).inc()
            raise
        self.metrics.forwarded.labels(op, "answered").inc()
        return status, data

    # ------------------------------------------------------------------ steps, raw

    async def step_raw(
        self,
        body: bytes,
        doc: dict[str, Any],
        tenant: str,
        t0: float,
        queue_deadline: float | None = None,
        answer_by: float | None = None,
        step_key: str | None = None,
    ) -> Stored:
        """One step, as the bytes the client sent (``doc`` parsed from them): its answer, as the client gets it."""
        runner = doc.get("runner")
        session_id = doc.get("session_id")
        self.inflight += 1
        try:
            self._enter(tenant)
            if not isinstance(runner, str):
                raise BadRequest("body.runner: a runner kind (a string) is required")
            if session_id is not None and not isinstance(session_id, str):
                raise BadRequest("body.session_id: a string or null")
            if isinstance(session_id, str) and self._remote(session_id):
                budget = float(doc.get("timeout_s") or self.settings.default_timeout_s)
                budget += self.settings.queue_timeout_s + FORWARD_TIMEOUT_S
                status, data = await self._forward(
                    session_id, tenant, "step", "POST", "/rollout/step", body, timeout_s=budget
                )
                if status >= 400 and not data.startswith(b'{"ok":'):
                    raise_for(status if status >= 400 else 502, data)
                return Stored(status, data, _retry_of(status, data))
            key = doc.get("idempotency_key")
            if isinstance(key, str) and key:
                assert self.idem is not None
                fp = fingerprint({k: v for k, v in doc.items() if k != "idempotency_key"})
                before = self.idem.hits
                stored = await self.idem.run(
                    f"{tenant}:step:{key}",
                    fp,
                    lambda: self._run_step(body, runner, session_id, tenant, t0, queue_deadline, answer_by, step_key),
                    keep=kept,
                )
                if self.idem.hits != before:
                    self.metrics.replays.inc()
                return stored
            return await self._run_step(body, runner, session_id, tenant, t0, queue_deadline, answer_by, step_key)
        except SandboxdError as exc:
            # Counted here when it ended here (a worker counts what it answered).
            label = runner if isinstance(runner, str) and runner in self.kinds else "unknown"
            self.metrics.step_latency.labels(label, f"{exc.blame}_error").observe(time.monotonic() - t0)
            if exc.code == "saturated":
                self.metrics.rejected.labels(label, "saturated").inc()
            _, out = failed_answer(
                exc, time.monotonic() - t0, runner if isinstance(runner, str) else None,
                session_id if isinstance(session_id, str) else None, exc.worker,
            )  # fmt: skip
            return Stored(exc.status, out, exc.retry_after_s)
        finally:
            self.inflight -= 1
            self._leave(tenant)

    async def _run_step(
        self,
        body: bytes,
        runner: str,
        session_id: str | None,
        tenant: str,
        t0: float,
        queue_deadline: float | None,
        answer_by: float | None = None,
        step_key: str | None = None,
    ) -> Stored:
        if runner not in self.kinds:
            raise UnknownRunner(f"runner {runner!r} is not enabled on this node (enabled: {self.settings.runners})")
        if session_id is not None:
            channel = self._session_worker(session_id)
            try:
                fields: StepCall = {"tenant": tenant, "t0": t0, "step_key": step_key}
                header, out = answer_of(await channel.call_nowait("step", fields, body))
            except LinkClosed:
                place = worker_of(session_id)
                raise SessionLost(
                    f"session {session_id} was lost: worker {place[0] if place else '?'} died during a step",
                    session_id=session_id,
                ) from None
            return Stored(int(header["status"]), out, header.get("retry"))
        if self.draining:
            raise ShuttingDown("this node is shutting down; send the step to another node")
        candidates = self.links.up(runner)
        if not candidates:
            raise Saturated(f"no live worker serves runner {runner!r} right now", retry_after_s=1.0)
        assert self.board is not None
        sent = self.sent
        workers = self.links.workers
        choices = [(i, workers[i].capacity.get(runner, 1), sent[(runner, i)]) for i in candidates]
        index = self.board.pick(runner, choices, next(self._rr))
        link = workers[index].channel
        assert link is not None
        channel = link
        deadline = queue_deadline if queue_deadline is not None else t0 + self.settings.queue_timeout_s
        key = (runner, index)
        sent[key] += 1
        try:
            header, out = answer_of(
                await channel.call_nowait(
                    "step", {"tenant": tenant, "t0": t0, "deadline": deadline, "answer_by": answer_by}, body
                )
            )
        except LinkClosed:
            raise WorkerDied(f"worker {index} died mid-step", worker=index) from None
        finally:
            sent[key] -= 1
        return Stored(int(header["status"]), out, header.get("retry"))

    async def batch_raw(self, doc: dict[str, Any], tenant: str, t0: float) -> bytes:
        steps = doc.get("steps")
        if set(doc) - {"steps"}:
            raise BadRequest(f'body: unknown fields {sorted(set(doc) - {"steps"})} (a batch is {{"steps": [...]}})')
        if not isinstance(steps, list) or not steps:
            raise BadRequest("body.steps: a non-empty list of steps is required")
        if len(steps) > self.settings.max_batch:
            raise PayloadTooLarge(f"batch of {len(steps)} steps; this node takes at most {self.settings.max_batch}")
        bodies: list[bytes] = []
        jobs = []
        for s in steps:
            if not isinstance(s, dict):
                jobs.append(self._refused(BadRequest("a step must be a JSON object"), t0))
                continue
            jobs.append(self.step_raw(orjson.dumps(s), s, tenant, t0))
        results = await asyncio.gather(*jobs, return_exceptions=True)
        for res in results:
            if isinstance(res, Stored):
                bodies.append(res.body)
                continue
            if isinstance(res, asyncio.CancelledError):
                raise res
            # A bug in one step must not lose the others' results (they ran): that step alone is an infra error.
            log.error("a batch step failed: %r", res, exc_info=res)
            bodies.append(failed_answer(InfraError(f"internal error: {type(res).__name__}"), 0.0, None, None, None)[1])
        return b'{"results":[' + b",".join(bodies) + b"]}"

    async def _refused(self, exc: SandboxdError, t0: float) -> Stored:
        return Stored(exc.status, failed_answer(exc, time.monotonic() - t0, None, None, None)[1], exc.retry_after_s)

    # ------------------------------------------------------------------ steps, as models

    async def step(
        self,
        req: StepRequest,
        tenant: str,
        queue_deadline: float | None = None,
        answer_by: float | None = None,
        step_key: str | None = None,
    ) -> StepResult:
        """Run one step; ``queue_deadline`` (monotonic) replaces ``queue_timeout_s`` for a one-shot's wait;
        ``answer_by`` (monotonic): the caller stops listening then (a surface whose clients time out on their own,
        /run_code's verl), so a step the node starved is answered as the node's failure before it; ``step_key``:
        a session step's name, for ``interrupt_session``."""
        t0 = time.monotonic()
        try:
            body = as_json(req, "the step")
        except SandboxdError as exc:
            return StepResult.model_validate_json(failed_answer(exc, 0.0, req.runner, req.session_id, None)[1])
        stored = await self.step_raw(body, orjson.loads(body), tenant, t0, queue_deadline, answer_by, step_key)
        return StepResult.model_validate_json(stored.body)

    async def batch(self, steps: list[StepRequest], tenant: str) -> list[StepResult]:
        if len(steps) > self.settings.max_batch:
            raise PayloadTooLarge(f"batch of {len(steps)} steps; this node takes at most {self.settings.max_batch}")
        return list(await asyncio.gather(*(self.step(s, tenant) for s in steps)))

    # ------------------------------------------------------------------ sessions

    async def create_raw(self, doc: dict[str, Any], tenant: str) -> Stored:
        """``POST /sessions``: 201 and the session's description, or the error's own status and body."""
        try:
            try:
                req = SessionCreate.model_validate(doc)
            except ValidationError as exc:
                raise BadRequest(validation_message(exc, "body")) from None
            key = req.idempotency_key
            if key:
                assert self.idem is not None
                fp = fingerprint(req.model_dump(exclude={"idempotency_key"}))
                return await self.idem.run(
                    f"{tenant}:session:{key}", fp, lambda: self._create(req, tenant), keep=lambda st: st.status == 201
                )
            return await self._create(req, tenant)
        except SandboxdError as exc:
            return Stored(exc.status, error_body(exc), exc.retry_after_s)

    async def _create(self, req: SessionCreate, tenant: str) -> Stored:
        if self.draining:
            raise ShuttingDown("this node is shutting down; create the session on another node")
        kind = self.kind(req.runner)
        if kind.no_sessions:
            raise BadRequest(f"runner {req.runner!r} has no sessions: {kind.no_sessions}")
        options = as_json(req.options, "options")
        if len(options) > MAX_OPTIONS_BYTES:
            raise PayloadTooLarge(
                f"options is {len(options)} bytes as JSON; a session's options take at most {MAX_OPTIONS_BYTES}"
            )
        assert self.links.node is not None
        fields: CreateCall = {
            "tenant": tenant,
            "runner": req.runner,
            "options": req.options,
            "ttl_s": req.ttl_s,
            "idle_timeout_s": req.idle_timeout_s,
            "labels": req.labels,
        }
        _, info = await self.links.node.call("create", fields)
        return Stored(201, info)

    async def create_session(self, req: SessionCreate, tenant: str) -> SessionInfo:
        stored = await self.create_raw(req.model_dump(mode="json", exclude_none=True), tenant)
        if stored.status != 201:
            raise_for(stored.status, stored.body)
        return SessionInfo.model_validate_json(stored.body)

    async def info_raw(self, session_id: str, tenant: str) -> Stored:
        try:
            if self._remote(session_id):
                path = f"/sessions/{quote(session_id, safe='')}"
                status, data = await self._forward(session_id, tenant, "info", "GET", path)
                return Stored(status, data, _retry_of(status, data))
            channel = self._session_worker(session_id)
            _, out = await channel.call("info", {"session_id": session_id, "tenant": tenant})
            return Stored(200, out)
        except SandboxdError as exc:
            return Stored(exc.status, error_body(exc), exc.retry_after_s)

    async def session_owner(self, session_id: str, labels: dict[str, str], named: list[str]) -> str:
        """The tenant of this node's session ``session_id`` if it carries ``labels`` and labels ``named`` (a
        session its creator opened to whoever knows its id); ``UnknownSession`` otherwise, another node's
        included (a call for one is passed to its node as it came, and answered there)."""
        fields: OwnerCall = {"session_id": session_id, "labels": labels, "named": named}
        header, _ = await self._session_worker(session_id).call("owner", fields)
        return str(header["tenant"])

    async def session_info(self, session_id: str, tenant: str) -> SessionInfo:
        stored = await self.info_raw(session_id, tenant)
        if stored.status != 200:
            raise_for(stored.status, stored.body)
        return SessionInfo.model_validate_json(stored.body)

    async def set_timeout(self, session_id: str, tenant: str, timeout_s: float) -> SessionInfo:
        """The session ends ``timeout_s`` from now (within the node's TTL from its creation); its description."""
        if self._remote(session_id):
            path = f"/sessions/{quote(session_id, safe='')}/timeout"
            body = orjson.dumps({"timeout_s": timeout_s})
            status, data = await self._forward(session_id, tenant, "timeout", "POST", path, body)
            raise_for(status, data)
            return SessionInfo.model_validate_json(data)
        channel = self._session_worker(session_id)
        fields: DeadlineCall = {"session_id": session_id, "tenant": tenant, "timeout_s": timeout_s}
        _, out = await channel.call("deadline", fields)
        return SessionInfo.model_validate_json(out)

    async def interrupt_session(self, session_id: str, tenant: str, step_key: str) -> bool:
        """Interrupt the step ``step_key`` names (``step(..., step_key=)``) if the session runs it now, its state
        kept (a kernel's interrupt); False when it does not (queued, done, another's). A session of another node
        is interrupted by that node's front, which its client's request reached."""
        if self._remote(session_id):
            return False
        header, _ = await self._session_worker(session_id).call(
            "interrupt", {"session_id": session_id, "tenant": tenant, "step_key": step_key}
        )
        return bool(header.get("interrupted"))

    async def close_raw(self, session_id: str, tenant: str, why: str = "closed by the client") -> Stored:
        """204, or the error's status and body. A session whose worker is gone is forgotten (204)."""
        try:
            if self._remote(session_id):
                path = f"/sessions/{quote(session_id, safe='')}"
                status, data = await self._forward(session_id, tenant, "close", "DELETE", path)
                return Stored(status, data, _retry_of(status, data))
            try:
                channel = self._session_worker(session_id)
            except SessionLost:
                return Stored(204, b"")
            await channel.call("close", {"session_id": session_id, "tenant": tenant, "why": why})
            return Stored(204, b"")
        except LinkClosed:
            return Stored(204, b"")  # its worker died meanwhile: the session went with it
        except SandboxdError as exc:
            return Stored(exc.status, error_body(exc), exc.retry_after_s)

    async def close_session(self, session_id: str, tenant: str, why: str = "closed by the client") -> None:
        stored = await self.close_raw(session_id, tenant, why)
        if stored.status >= 400:
            raise_for(stored.status, stored.body)

    async def fork_session(self, session_id: str, req: SessionFork, tenant: str) -> ForkResult:
        """``req.n`` new sessions, each from a copy of ``session_id``'s state now, on its worker; all or none."""
        if self._remote(session_id):
            path = f"/sessions/{quote(session_id, safe='')}/fork"
            status, data = await self._forward(
                session_id, tenant, "fork", "POST", path, as_json(req, "fork"), timeout_s=FORK_FORWARD_TIMEOUT_S
            )
            raise_for(status, data)
            return ForkResult.model_validate_json(data)
        if self.draining:
            raise ShuttingDown("this node is shutting down; it makes no new sessions")
        self._session_worker(session_id)  # 404 / 410 for ids that name no live worker of ours
        assert self.links.node is not None
        fields: NodeForkCall = {
            "source": session_id,
            "tenant": tenant,
            "n": req.n,
            "ttl_s": req.ttl_s,
            "idle_timeout_s": req.idle_timeout_s,
        }
        _, raw = await self.links.node.call("fork", fields)
        return ForkResult.model_validate_json(raw)

    # ------------------------------------------------------------------ many sessions at once

    def tenant_count(self, tenant: str, field: int, delta: int) -> int:
        """Change this front's count of ``tenant`` (connections or calls in flight) by ``delta``; the tenant's
        count over the whole node after it (``sandboxd.tally``), or this front's alone without the node's."""
        own = self.tenant_counts[field]
        own[tenant] += delta
        if own[tenant] <= 0:
            del own[tenant]
        if self.tally is not None and self.links.tally_row >= 0:
            return self.tally.add(self.links.tally_row, tenant, field, delta)
        return own.get(tenant, 0)

    def _enter(self, tenant: str) -> None:
        """Count one more step or call of ``tenant`` in flight; 429 for it when the tenant has
        ``tenant_max_inflight`` in flight on this node already (every front counts in the node's tally)."""
        held = self.tenant_count(tenant, INFLIGHT, 1)
        if held > self.settings.tenant_max_inflight:
            raise Saturated(
                f"this tenant has {held - 1} steps or calls in flight on this node "
                f"(tenant_max_inflight {self.settings.tenant_max_inflight})",
                retry_after_s=1.0,
            )

    def _leave(self, tenant: str) -> None:
        self.tenant_count(tenant, INFLIGHT, -1)

    @contextlib.contextmanager
    def _counted(self, tenant: str) -> Iterator[None]:
        """A call that costs the workers per session it names (selections, status) counts as a step in flight:
        a tenant looping over them waits its turn like one looping over steps (a red team slowed another
        tenant's steps 250x with concurrent 10,000-id status calls)."""
        try:
            self._enter(tenant)
            yield
        finally:
            self._leave(tenant)

    async def select_sessions(
        self, tenant: str, labels: dict[str, str], what: str, idle_s: float | None = None
    ) -> dict[str, Any]:
        with self._counted(tenant):
            return await select(self, tenant, labels, what, idle_s)

    async def session_states(self, tenant: str, session_ids: list[str]) -> dict[str, Any]:
        with self._counted(tenant):
            return await states_of(self, tenant, session_ids)

    # ------------------------------------------------------------------ node

    async def ready(self) -> tuple[bool, dict[str, Any]]:
        """The node's status (from the node process), and whether this front reaches every live worker."""
        not_answered = {"ready": False, "node_id": self.node_id, "why": "the node process does not answer"}
        if self.links.node is None:  # not joined yet
            return False, not_answered
        try:
            answer, raw = await self.links.node.call("status")
        except SandboxdError:
            return False, not_answered
        body: dict[str, Any] = orjson.loads(raw)
        unreached = [w.index for w in self.links.workers if not w.up]
        ok = bool(answer.get("ready")) and not unreached and not self.draining
        body.update(ready=ok, front={"index": self.index, "pid": os.getpid(), "workers_unreached": unreached})
        return ok, body

    async def drain(self) -> dict[str, Any]:
        """Every front of this node stops taking new work (503 ``shutting_down``, /readyz 503)."""
        self.draining = True
        assert self.links.node is not None
        answer, _ = await self.links.node.call("drain")
        return {"draining": True, "inflight": answer.get("inflight", 0), "sessions": answer.get("sessions", 0)}

    async def status(self) -> dict[str, Any]:
        assert self.links.node is not None
        _, raw = await self.links.node.call("status")
        status: dict[str, Any] = orjson.loads(raw)
        return status


def _retry_of(status: int, data: bytes) -> float | None:
    if status < 400:
        return None
    try:
        retry = orjson.loads(data)["error"].get("retry_after_s")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None
    return float(retry) if isinstance(retry, int | float) else None
