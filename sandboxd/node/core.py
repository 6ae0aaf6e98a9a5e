"""The node process: what one node holds for all of its processes, in one place.

::

    node process (this)         workers' lifecycle, the session ledger (quotas, placement), idempotency
    │                           keys (memory), drain, readiness, the registry heartbeat and session directory
    │   <runtime>/node.sock     (Redis), the probe listener
    ├── front processes (K)     HTTP: each takes any request, sends steps straight to workers
    └── workers (N)             runners, their own slots and queues, their own sessions

Front processes ask the node for what must be decided node-wide (a new session or fork within a tenant's
quota, an idempotency claim, the node's status) and go straight to the workers for everything else (a
step, a session's step, info or close). Workers tell the node when a session ends. The node tells the
fronts when a worker is replaced and when to drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from sandboxd import links
from sandboxd.board import Board
from sandboxd.cluster.service import NodeCluster
from sandboxd.config import NodeSettings, make_runtime_dir
from sandboxd.errors import (
    BadRequest,
    InfraError,
    SandboxdError,
    Saturated,
    SessionLost,
    ShuttingDown,
    UnknownRunner,
    UnknownSession,
)
from sandboxd.ids import new_session_id, tenant_of_key, worker_of
from sandboxd.links import Channel, Header
from sandboxd.messages import CreateCall, ForkCall, KvCall, NodeForkCall, NodeHello, OpenCall
from sandboxd.metrics import MULTIPROC_ENV
from sandboxd.node.budget import node_budget
from sandboxd.node.drain import DrainToken
from sandboxd.node.ledger import Entry, Ledger
from sandboxd.node.workers import WorkerProc, Workers
from sandboxd.registry import kinds
from sandboxd.runners.cgroups import sweep_dead_nodes
from sandboxd.stores.idempotency import MemoryKV
from sandboxd.tally import Tally, rows_for

log = logging.getLogger("sandboxd.node")


def node_socket(runtime_dir: str | Path) -> str:
    return str(Path(runtime_dir) / "node.sock")


class NodeCore:
    def __init__(self, settings: NodeSettings) -> None:
        self.settings = settings
        self.node_id = settings.node_id
        self.incarnation = secrets.token_hex(8)
        registry = kinds()
        self.kinds = {k: registry[k] for k in settings.runners}
        caps = {
            k: len(settings.hosting(k)) * int(getattr(settings.runner_config(k), "max_sessions_per_worker", 1 << 20))
            for k in self.kinds
        }
        weights = {tenant_of_key(key): w for key, w in settings.tenant_weights.items()}
        self.ledger = Ledger(settings.tenant_max_sessions, node_budget(settings), caps, weights)
        self.kv = MemoryKV(settings.idempotency_max_entries)
        self._ops = self._handlers()
        self.workers: Workers | None = None
        self.board: Board | None = None
        self.tally: Tally | None = None
        self._tally_rows: set[int] = set()
        self.cluster: NodeCluster | None = None
        self.fronts: set[Channel] = set()
        self.server: asyncio.Server | None = None
        self.draining = False
        self.started = False
        self._own_runtime_dir = not settings.runtime_dir
        self.drain_token = DrainToken(settings.port)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        s = self.settings
        s.runtime_dir = str(make_runtime_dir(s))
        metrics = Path(s.runtime_dir) / "metrics"
        shutil.rmtree(metrics, ignore_errors=True)
        metrics.mkdir(mode=0o700)
        os.environ[MULTIPROC_ENV] = str(metrics)  # for every process started from here on
        self.board = Board(Path(s.runtime_dir) / "board", s.worker_count(), list(self.kinds), create=True)
        for i in range(s.worker_count()):
            self.board.clear(i)
        tenants = [tenant_of_key(k) for k in s.all_api_keys()]
        self.tally = Tally(Path(s.runtime_dir) / "tally", rows_for(s.front_count()), tenants, create=True)
        swept = await asyncio.to_thread(sweep_dead_nodes, s.node_id)
        if swept:
            log.warning(
                "removed the cgroups (and what ran in them) of an earlier node %s that died: %s", s.node_id, swept
            )
        self.workers = Workers(s, self._worker_lost, self._worker_ready, self._worker_event)
        await self.workers.start()
        if s.redis_url:
            self.cluster = NodeCluster(s, self.incarnation, self._live_sessions)
            await self.cluster.start()
        self.server = await links.serve(node_socket(s.runtime_dir), self._front_channel)
        self.drain_token.write()
        self.started = True
        log.info("sandboxd node %s ready: %d workers, runners %s", self.node_id, s.worker_count(), s.runners)

    def _front_channel(self) -> Channel:
        return Channel(self.handle, on_close=self._front_gone)

    def _front_gone(self, ch: Channel) -> None:
        self.fronts.discard(ch)
        row = ch.peer.get("tally_row") if isinstance(ch.peer, dict) else None
        if isinstance(row, int) and self.tally is not None:
            self.tally.clear(row)  # its connections and steps ended with it
            self._tally_rows.discard(row)

    def _tally_row(self) -> int:
        """The lowest row of the tally no live front holds (zeroed: a front that died may have left counts)."""
        assert self.tally is not None
        row = next((r for r in range(self.tally.rows) if r not in self._tally_rows), -1)
        if row >= 0:
            self._tally_rows.add(row)
            self.tally.clear(row)
        return row

    def begin_drain(self) -> None:
        """Stop taking work but keep answering: every front answers new steps and sessions 503 ``shutting_down``
        and /readyz 503, while the steps in flight (and the steps of live sessions) go on."""
        if not self.draining:
            self.draining = True
            for ch in list(self.fronts):
                ch.event("drain")

    async def inflight(self) -> int:
        """Steps the fronts are serving now (each front counts its own)."""
        counts = await asyncio.gather(*(ch.call("inflight") for ch in list(self.fronts)), return_exceptions=True)
        return sum(int(c[0].get("inflight", 0)) for c in counts if isinstance(c, tuple))

    async def stop(self) -> None:
        self.begin_drain()
        deadline = time.monotonic() + self.settings.shutdown_grace_s
        while time.monotonic() < deadline and await self.inflight():
            await asyncio.sleep(0.05)
        if left := await self.inflight():
            log.warning(
                "shutdown: %d steps still running after %.1fs grace; cancelling", left, self.settings.shutdown_grace_s
            )
        n_sessions = self.ledger.count()
        if self.cluster is not None:  # leave first: the others answer 410 for our sessions from now on
            await self.cluster.stop()
        if self.server is not None:
            self.server.close()
        if self.workers is not None:
            await self.workers.stop()
        if self.board is not None:
            self.board.close()
        self.drain_token.remove()
        if self._own_runtime_dir:
            shutil.rmtree(self.settings.runtime_dir, ignore_errors=True)
        log.info("sandboxd node %s stopped (%d sessions closed)", self.node_id, n_sessions)

    # ------------------------------------------------------------------ workers

    def _worker_lost(self, w: WorkerProc) -> None:
        if self.board is not None:
            self.board.clear(w.index)
        gone = self.ledger.worker_lost(w.index)
        log.error("worker %d lost; %d sessions lost with it", w.index, len(gone))
        self._topology_changed()

    def _worker_ready(self, w: WorkerProc) -> None:
        self._topology_changed()

    def _worker_event(self, index: int, header: Header) -> None:
        if header.get("op") == "kind_ready" and self.workers is not None:
            self.workers.refresh(index)
        if header.get("op") == "ended":
            entry = self.ledger.remove(str(header["session_id"]))
            if entry is not None and self.cluster is not None and not header.get("lost"):
                task = asyncio.get_running_loop().create_task(self.cluster.directory.delete(str(header["session_id"])))
                task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    def _topology_changed(self) -> None:
        topology = self.topology()
        for ch in list(self.fronts):
            ch.event("topology", topology)
        self._share_queue()

    def _share_queue(self) -> None:
        """The node's ``queue_max``, shared out over the live workers that host each kind."""
        assert self.workers is not None
        q = self.settings.queue_max
        for kind in self.kinds:
            alive = self._alive(kind)
            for w in alive:
                if w.link is not None:
                    w.link.event("queue", {"queue_max": {kind: max(1, -(-q // len(alive))) if q else 0}})

    def topology(self) -> Header:
        assert self.workers is not None
        return {
            "node_id": self.node_id,
            "incarnation": self.incarnation,
            "runtime_dir": self.settings.runtime_dir,
            "draining": self.draining,
            "drain_token": self.drain_token.value,
            "workers": [
                {"index": w.index, "incarnation": w.incarnation, "alive": w.alive, "capacity": w.capacity}
                for w in self.workers.procs
            ],
        }

    def _live_sessions(self) -> list[tuple[str, str, str, float]]:
        ttl = self.settings.session_ttl_s
        return [(sid, e.tenant, e.runner, ttl) for sid, e in self.ledger.sessions.items()]

    # ------------------------------------------------------------------ the fronts' requests

    async def handle(self, ch: Channel, h: Header, body: bytes) -> tuple[Header, bytes]:
        handler = self._ops.get(h["op"])
        if handler is None:
            raise InfraError(f"unknown node op {h['op']!r}")
        return await handler(ch, h, body)

    def _handlers(self) -> dict[str, Callable[[Channel, Any, bytes], Awaitable[tuple[Header, bytes]]]]:
        """The fronts' operations (their fields: ``messages.py``)."""
        return {
            "hello": self._op_hello,
            "create": self._op_create,
            "fork": self._op_fork,
            "status": self._op_status,
            "drain": self._op_drain,
            "kv": self._op_kv,
        }

    async def _op_hello(self, ch: Channel, h: NodeHello, body: bytes) -> tuple[Header, bytes]:
        self.fronts.add(ch)
        row = self._tally_row()
        ch.peer = {"role": "front", "index": h.get("index"), "pid": h.get("pid"), "tally_row": row}
        return {**self.topology(), "tally_row": row, "tally_rows": self.tally.rows if self.tally else 0}, b""

    async def _op_create(self, ch: Channel, h: CreateCall, body: bytes) -> tuple[Header, bytes]:
        return {}, orjson.dumps(await self.create_session(h))

    async def _op_fork(self, ch: Channel, h: NodeForkCall, body: bytes) -> tuple[Header, bytes]:
        return {}, orjson.dumps(await self.fork_session(h))

    async def _op_status(self, ch: Channel, h: Header, body: bytes) -> tuple[Header, bytes]:
        ok, status = await self.status()
        return {"ready": ok}, orjson.dumps(status)

    async def _op_drain(self, ch: Channel, h: Header, body: bytes) -> tuple[Header, bytes]:
        self.begin_drain()
        return {"inflight": await self.inflight(), "sessions": self.ledger.count()}, b""

    async def _op_kv(self, ch: Channel, h: KvCall, body: bytes) -> tuple[Header, bytes]:
        return await self.kv_op(h), b""

    async def kv_op(self, h: KvCall) -> Header:
        kv, key = self.kv, str(h["key"])
        what = h["what"]
        if what == "claim":
            return {"claimed": await kv.claim(key, str(h["value"]).encode(), int(h["ttl_ms"]))}
        if what == "get":
            raw = await kv.get(key)
            return {"value": None if raw is None else raw.decode()}
        if what == "put":
            await kv.put(key, str(h["value"]).encode(), int(h["ttl_ms"]))
        elif what == "delete":
            await kv.delete(key)
        return {}

    def _refuse_new(self) -> None:
        if self.draining:
            raise ShuttingDown("this node is shutting down; create the session on another node")
        if self.cluster is not None:
            self.cluster.refuse_if_out()

    def _lifetimes(self, ttl_s: float | None, idle_s: float | None) -> tuple[float, float]:
        """A new session's TTL and idle timeout: what was asked, at most the node's."""
        s = self.settings
        return min(ttl_s or s.session_ttl_s, s.session_ttl_s), min(idle_s or s.session_idle_s, s.session_idle_s)

    def _alive(self, runner: str) -> list[WorkerProc]:
        assert self.workers is not None
        return [w for w in self.workers.procs if w.alive and runner in w.capacity]

    async def create_session(self, h: CreateCall) -> dict[str, Any]:
        """A new session on this node, within the tenant's quota, on the hosting worker with fewest sessions."""
        self._refuse_new()
        tenant, runner = str(h["tenant"]), str(h["runner"])
        kind = self.kinds.get(runner)
        if kind is None:
            raise UnknownRunner(f"runner {runner!r} is not enabled on this node (enabled: {self.settings.runners})")
        options = h.get("options") or {}
        kind.parse_options(options)
        self.ledger.check_room(tenant, 1)
        self.ledger.check_share(tenant, runner)
        try:
            self.ledger.check_budget(runner, 1)
        except Saturated:  # the node's capacity, not the tenant's quota: it waits for its share
            self.ledger.note_refused(tenant, runner)
            raise
        ttl, idle = self._lifetimes(h.get("ttl_s"), h.get("idle_timeout_s"))
        alive = {w.index: w for w in self._alive(runner)}
        if not alive:
            raise Saturated(f"no live worker serves runner {runner!r}", retry_after_s=1.0)
        w = alive[self.ledger.place(runner, list(alive))]
        sid = new_session_id(self.node_id, w.index, w.incarnation)
        assert w.link is not None
        with self.ledger.opening(tenant, runner, w.index, 1):
            fields: OpenCall = {
                "session_id": sid,
                "runner": runner,
                "tenant": tenant,
                "options": options,
                "labels": h.get("labels") or {},
                "ttl_s": ttl,
                "idle_timeout_s": idle,
            }
            try:
                _, info = await w.link.call("open", fields)
            except Saturated:  # a worker's session cap
                self.ledger.note_refused(tenant, runner)
                raise
            self.ledger.note_served(tenant, runner)
            if self.cluster is not None:
                try:
                    await self.cluster.directory.put(sid, tenant, runner, ttl)
                except SandboxdError:  # not recorded (the shared store did not answer): nobody could reach it
                    with contextlib.suppress(SandboxdError):
                        await w.link.call("close", {"session_id": sid, "tenant": tenant, "why": "not recorded"})
                    raise
            self.ledger.add(sid, Entry(tenant, runner, w.index, w.incarnation))
        described: dict[str, Any] = orjson.loads(info)
        return described

    async def fork_session(self, h: NodeForkCall) -> dict[str, Any]:
        """``n`` new sessions from a copy of a session's state, on its worker; all or none, within the quota."""
        self._refuse_new()
        source, tenant, n = str(h["source"]), str(h["tenant"]), int(h["n"])
        s = self.settings
        if n > s.fork_max_copies:
            raise BadRequest(f"n: {n} copies; this node makes at most fork_max_copies {s.fork_max_copies}")
        place = worker_of(source)
        entry = self.ledger.sessions.get(source)
        if place is None or entry is None or entry.tenant != tenant:
            w = self._worker_at(place)
            if w is None:
                raise UnknownSession(f"unknown session {source!r}", session_id=source)
            # Not in the ledger: a lost session (410) or an unknown one (404), as its worker says.
            assert w.link is not None
            await w.link.call("info", {"session_id": source, "tenant": tenant})
            raise UnknownSession(f"unknown session {source!r}", session_id=source)
        w = self._worker_at(place)
        if w is None:
            raise SessionLost(f"session {source} was lost: its worker was replaced", session_id=source)
        kind = self.kinds[entry.runner]
        if not kind.capabilities.fork:
            raise BadRequest(kind.no_fork or f"{entry.runner} sessions cannot be forked")
        self.ledger.check_room(tenant, n)
        self.ledger.check_budget(entry.runner, n)
        ttl, idle = self._lifetimes(h.get("ttl_s"), h.get("idle_timeout_s"))
        new_ids = [new_session_id(self.node_id, w.index, w.incarnation) for _ in range(n)]
        assert w.link is not None
        with self.ledger.opening(tenant, entry.runner, w.index, n):
            call: ForkCall = {
                "source": source,
                "tenant": tenant,
                "new_ids": new_ids,
                "ttl_s": ttl,
                "idle_timeout_s": idle,
            }
            _, raw = await w.link.call("fork", call)
            recorded: list[str] = []
            try:
                if self.cluster is not None:
                    for sid in new_ids:
                        await self.cluster.directory.put(sid, tenant, entry.runner, ttl)
                        recorded.append(sid)
            except SandboxdError:  # not recorded (Redis): none of the group may outlive the refusal
                for sid in recorded:
                    await self.cluster.directory.delete(sid)  # type: ignore[union-attr]
                for sid in new_ids:
                    with contextlib.suppress(SandboxdError):
                        await w.link.call("close", {"session_id": sid, "tenant": tenant, "why": "its fork failed"})
                raise
            for sid in new_ids:
                self.ledger.add(sid, Entry(tenant, entry.runner, w.index, w.incarnation))
        forked: dict[str, Any] = orjson.loads(raw)
        return {"source_id": source, "sessions": forked["sessions"], "notes": forked["notes"]}

    def _budget_status(self) -> dict[str, int]:
        """Reserved at the sandboxes' limits, of the budget (times overcommit): MiB and pids."""
        budget = self.ledger.budget
        if budget is None:
            return {}
        held = self.ledger.reserved()
        return {
            "memory_mb": held.memory_bytes >> 20,
            "memory_budget_mb": budget.limit.memory_bytes >> 20,
            "pids": held.pids,
            "pids_budget": budget.limit.pids,
        }

    def _worker_at(self, place: tuple[int, str] | None) -> WorkerProc | None:
        """The live worker an id names, if it is still the incarnation that made the id."""
        if place is None or self.workers is None or place[0] >= len(self.workers.procs):
            return None
        w = self.workers.procs[place[0]]
        return w if w.alive and w.incarnation == place[1] else None

    async def status(self) -> tuple[bool, dict[str, Any]]:
        assert self.workers is not None
        procs = self.workers.procs
        workers = [
            {
                "index": w.index,
                "pid": w.pid,
                "alive": w.alive,
                "incarnation": w.incarnation,
                "capacity": w.capacity,
                "health": w.health,
            }
            for w in procs
        ]
        # A worker is ready when it is up and every runner says its pools are whole (e.g. no dead jail).
        ok = (
            self.started
            and not self.draining
            and (self.cluster is None or self.cluster.registry.held_by is None)
            and all(
                w.alive and all(r.get("ready", True) for r in (w.health.get("runners") or {}).values()) for w in procs
            )
        )
        body: dict[str, Any] = {
            "ready": ok,
            "node_id": self.node_id,
            "pid": os.getpid(),
            "workers": workers,
            "fronts": sorted(int(ch.peer.get("pid") or 0) for ch in self.fronts),
            "sessions": self.ledger.count(),
            "budget": self._budget_status(),
            "draining": self.draining,
            "inflight": await self.inflight(),
            "restarts": self.workers.restarts,
        }
        starting = [
            f"worker {w.index}: {kind}: {r['starting']}"
            for w in procs
            for kind, r in (w.health.get("runners") or {}).items()
            if r.get("starting")
        ]
        if starting:  # what a node not ready yet is waiting for, by kind (a slow start, or a missing privilege)
            body["starting"] = starting
        if self.cluster is not None:  # a node without Redis still serves one-shots: ready, but say so
            reg = self.cluster.registry
            cluster: dict[str, Any] = {
                "store": "ok" if reg.healthy else "unavailable",
                "incarnation": self.incarnation,
                "url": self.cluster.me.url,
                "peers": sorted(reg.peers),
            }
            if (holder := reg.held_by) is not None:
                cluster["node_id_held_by"] = {"url": holder.url, "incarnation": holder.incarnation}
            body["cluster"] = cluster
        return ok, body
