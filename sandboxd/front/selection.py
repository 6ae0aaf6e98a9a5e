"""A gateway's calls about many sessions at once: select them by labels (list, renew, close) and read their
states, on every worker of the node and, in a cluster, once on every other node."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson

from sandboxd.cluster.forward import CALLER, FORWARD_TIMEOUT_S
from sandboxd.cluster.service import raise_for
from sandboxd.errors import SandboxdError, SessionLost, UnknownSession
from sandboxd.ids import owner_of, worker_of
from sandboxd.links import LinkClosed
from sandboxd.messages import SelectCall

if TYPE_CHECKING:
    from sandboxd.front.gateway import Gateway


async def select(gw: Gateway, tenant: str, labels: dict[str, str], what: str, idle_s: float | None) -> dict[str, Any]:
    """List (``sessions``), renew or close (``count``) the tenant's sessions carrying ``labels``, on every
    worker of this node and, in a cluster, every other node (asked once: a forwarded call is not passed
    on). Nodes that could not be asked are named in ``unreached``; their sessions were not touched."""
    fields: SelectCall = {"tenant": tenant, "labels": labels, "what": what, "idle_timeout_s": idle_s}
    live = [w.channel for w in gw.links.workers if w.channel is not None and w.channel.alive]
    answers = await asyncio.gather(*(ch.call("select", fields) for ch in live), return_exceptions=True)
    sessions: list[Any] = []
    count = 0
    unreached: list[str] = []
    for answer in answers:
        if isinstance(answer, BaseException):
            if not isinstance(answer, SandboxdError | LinkClosed):
                raise answer
            unreached.append(gw.node_id)  # a worker died meanwhile: its sessions went with it
            continue
        sessions.extend(answer[0].get("sessions") or [])
        count += int(answer[0].get("count") or 0)
    if gw.cluster is not None and CALLER.get().forwarded_by is None:
        peers = [p for node, p in gw.cluster.registry.peers.items() if node != gw.node_id]
        method, path, body = _selection_request(labels, what, idle_s)
        replies = await asyncio.gather(
            *(gw.cluster.forwarder.send(p, method, path, body, FORWARD_TIMEOUT_S) for p in peers),
            return_exceptions=True,
        )
        for peer, reply in zip(peers, replies, strict=True):
            if isinstance(reply, BaseException) and not isinstance(reply, Exception):
                raise reply  # cancellation, not the peer's failure
            if isinstance(reply, Exception) or reply[0] != 200:
                unreached.append(peer.node_id)
                continue
            doc = orjson.loads(reply[1])
            sessions.extend(doc.get("sessions") or [])
            count += int(doc.get("count") or 0)
            unreached.extend(doc.get("unreached") or [])
    out: dict[str, Any] = {"sessions": sessions} if what == "list" else {"count": count}
    out["unreached"] = sorted(set(unreached))
    return out


async def states_of(gw: Gateway, tenant: str, session_ids: list[str]) -> dict[str, Any]:
    """Each id's state (live, lost, ended, unknown), asking each worker once for its ids and, in a cluster,
    each other owner once for its own."""
    states: dict[str, Any] = {}
    by_worker: dict[int, list[str]] = {}
    by_owner: dict[str, list[str]] = {}
    for sid in dict.fromkeys(session_ids):
        owner = owner_of(sid)
        if owner != gw.node_id:
            if owner is not None and gw.cluster is not None and CALLER.get().forwarded_by is None:
                by_owner.setdefault(owner, []).append(sid)
            else:
                states[sid] = {"state": "unknown"}
            continue
        try:
            gw._session_worker(sid)
        except SessionLost as exc:
            states[sid] = {"state": "lost", "why": exc.message}
            continue
        except UnknownSession:
            states[sid] = {"state": "unknown"}
            continue
        place = worker_of(sid)
        assert place is not None
        by_worker.setdefault(place[0], []).append(sid)

    async def ask_worker(index: int, ids: list[str]) -> None:
        ch = gw.links.workers[index].channel
        try:
            if ch is None:
                raise LinkClosed("no link")
            _, raw = await ch.call("status", {"tenant": tenant, "session_ids": ids})
            states.update(orjson.loads(raw))
        except (LinkClosed, SandboxdError):
            states.update({sid: {"state": "lost", "why": f"worker {index} died"} for sid in ids})

    async def ask_owner(ids: list[str]) -> None:
        try:
            body = orjson.dumps({"session_ids": ids})
            status, data = await gw._forward(ids[0], tenant, "status", "POST", "/sessions/status", body)
            raise_for(status, data)
            states.update(orjson.loads(data)["sessions"])
        except SandboxdError as exc:  # the owner is gone (410: its sessions with it) or did not answer
            lost = exc.status == 410
            states.update({sid: {"state": "lost" if lost else "unknown", "why": exc.message} for sid in ids})

    await asyncio.gather(
        *(ask_worker(i, ids) for i, ids in by_worker.items()), *(ask_owner(ids) for ids in by_owner.values())
    )
    return {"sessions": states}


def _selection_request(labels: dict[str, str], what: str, idle_s: float | None) -> tuple[str, str, bytes]:
    """The same selection as another node's HTTP request (what it answers for its own sessions)."""
    if what == "list":
        query = "&".join(f"label={quote(f'{k}:{v}', safe='')}" for k, v in labels.items())
        return "GET", f"/sessions?{query}", b""
    if what == "renew":
        body: dict[str, Any] = {"labels": labels}
        if idle_s:
            body["idle_timeout_s"] = idle_s
        return "POST", "/sessions/keepalive", orjson.dumps(body)
    return "POST", "/sessions/close", orjson.dumps({"labels": labels})
