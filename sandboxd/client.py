"""Async client for trainers and agent backends (httpx, one connection pool per node).

    async with SandboxClient("http://127.0.0.1:8080") as c:
        r = await c.run_python("print(1)")
        async with c.session() as s:
            await s.run_python("x = 1")
            r = await s.run_python("print(x)")

A GRPO group from one prepared state (prepare once, fork G, step, score, close)::

    async with await c.group("tools", 8, setup=[{"tool": "get_user", "args": {...}}]) as g:
        results = await g.step([{"tool": "cancel_order", "args": {...}}] * 8)

A trainer's run, labelled, renewed while the trainer lives, closed when it ends::

    async with c.keepalive(run_id="grpo-17", idle_timeout_s=60):
        s = await c.create_session("python", labels={"run_id": "grpo-17"}, idle_timeout_s=60)
        ...
    await c.close_all(run_id="grpo-17")   # if the trainer dies instead, they end 60 s after its last renewal

Several nodes (or one Service URL in front of them)::

    SandboxClient(["http://node-0:8080", "http://node-1:8080"], api_key=KEY)

One-shot steps are spread round-robin; a node that cannot be reached is skipped
for a few seconds and the step goes to the next (it never reached the first, so
it cannot run twice). A session's steps go straight to the node that created it
(its id names it); any node would forward them, this saves the hop.

A step's result is returned as a dict in the API's shape, whatever happened: a
program that fails is a normal result (``ok`` false, ``error.blame ==
"program"``), a refusal or the node's failure too (``error.blame`` "client" or
"infra"). ``StepFailed`` is raised where there is no result to return: a session
that cannot be created or forked, a refused selection of sessions, a group's setup step
that failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from sandboxd.ids import owner_of

NODE_DOWN_S = 5.0  # a node that refused a connection is skipped this long
STATUS_BATCH = 1000  # ids per POST /sessions/status (the node's most)


class StepFailed(Exception):
    def __init__(self, result: dict[str, Any]) -> None:
        err = result.get("error") or {}
        super().__init__(f"{err.get('blame')}/{err.get('code')}: {err.get('message')}")
        self.result = result


class NoNodeReachable(ConnectionError):
    pass


class SandboxClient:
    def __init__(
        self,
        base_url: str | Sequence[str],
        timeout_s: float = 600.0,
        max_connections: int = 1024,
        api_key: str | None = None,
    ) -> None:
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise ValueError("SandboxClient needs at least one node URL")
        headers = {"authorization": f"Bearer {api_key}"} if api_key else None
        self.nodes = [
            httpx.AsyncClient(
                base_url=u.rstrip("/"),
                timeout=timeout_s,
                headers=headers,
                limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            )
            for u in urls
        ]
        self.http = self.nodes[0]
        self._turn = itertools.count()
        self._down_until = [0.0] * len(self.nodes)
        self._by_node_id: dict[str, int] = {}  # node id -> index of the URL that created a session there

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for node in self.nodes:
            await node.aclose()

    def _order(self, first: int | None = None) -> list[int]:
        n = len(self.nodes)
        start = first if first is not None else next(self._turn) % n
        order = [(start + i) % n for i in range(n)]
        now = time.monotonic()
        return [i for i in order if self._down_until[i] <= now] + [i for i in order if self._down_until[i] > now]

    async def _request(self, method: str, path: str, first: int | None = None, **kw: Any) -> tuple[int, httpx.Response]:
        """Send to the first reachable node, starting at ``first`` (or the next in turn)."""
        errors = []
        for i in self._order(first):
            try:
                return i, await self.nodes[i].request(method, path, **kw)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # never sent: another node may take it
                self._down_until[i] = time.monotonic() + NODE_DOWN_S
                errors.append(f"{self.nodes[i].base_url}: {exc}")
        raise NoNodeReachable("no sandboxd node reachable: " + "; ".join(errors))

    def _home(self, session_id: str | None) -> int | None:
        owner = owner_of(session_id) if session_id else None
        return self._by_node_id.get(owner) if owner else None

    async def step(self, runner: str, action: dict[str, Any], **fields: Any) -> dict[str, Any]:
        body = {"runner": runner, "action": action, **{k: v for k, v in fields.items() if v is not None}}
        _, r = await self._request("POST", "/rollout/step", self._home(body.get("session_id")), json=body)
        data: dict[str, Any] = r.json()
        return data

    async def run_python(self, code: str, **fields: Any) -> dict[str, Any]:
        action = {"code": code}
        for key in ("stdin", "files"):
            if key in fields:
                action[key] = fields.pop(key)
        return await self.step("python", action, **fields)

    async def steps(self, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        _, r = await self._request("POST", "/rollout/steps", json={"steps": steps})
        r.raise_for_status()
        results: list[dict[str, Any]] = r.json()["results"]
        return results

    async def create_session(self, runner: str = "python", **fields: Any) -> dict[str, Any]:
        i, r = await self._request("POST", "/sessions", json={"runner": runner, **fields})
        if r.status_code != 201:
            raise StepFailed(r.json())
        data: dict[str, Any] = r.json()
        self._by_node_id[data["node_id"]] = i
        return data

    async def close_session(self, session_id: str) -> None:
        await self._request("DELETE", f"/sessions/{session_id}", self._home(session_id))

    async def fork_session(self, session_id: str, n: int, **fields: Any) -> dict[str, Any]:
        """``POST /sessions/{id}/fork``: the answer (``sessions``, ``notes``); ``StepFailed`` if refused."""
        home = self._home(session_id)
        _, r = await self._request("POST", f"/sessions/{session_id}/fork", home, json={"n": n, **fields})
        if r.status_code != 201:
            raise StepFailed(r.json())
        data: dict[str, Any] = r.json()
        return data

    async def _selection(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        _, r = await self._request(method, path, **kw)
        if r.status_code != 200:
            raise StepFailed(r.json())
        data: dict[str, Any] = r.json()
        return data

    async def list_sessions(self, **labels: str) -> list[dict[str, Any]]:
        """The caller's live sessions carrying all of ``labels``, on every node of the cluster."""
        params = [("label", f"{k}:{v}") for k, v in labels.items()]
        return list((await self._selection("GET", "/sessions", params=params))["sessions"])

    async def close_all(self, **labels: str) -> int:
        """Close every session of the caller's carrying all of ``labels`` (e.g. ``run_id=...``); how many."""
        return int((await self._selection("POST", "/sessions/close", json={"labels": labels}))["count"])

    async def renew(self, idle_timeout_s: float | None = None, **labels: str) -> int:
        """Restart the idle timers of every session carrying ``labels``; how many were renewed."""
        body: dict[str, Any] = {"labels": labels}
        if idle_timeout_s:
            body["idle_timeout_s"] = idle_timeout_s
        return int((await self._selection("POST", "/sessions/keepalive", json=body))["count"])

    @contextlib.asynccontextmanager
    async def keepalive(self, idle_timeout_s: float, **labels: str) -> AsyncIterator[None]:
        """Renew the sessions carrying ``labels`` every third of ``idle_timeout_s`` while the block runs (create
        them with the same ``idle_timeout_s``). A renewal that fails is retried at the next tick: a trainer
        that dies stops renewing, and its sessions end one idle timeout after the last renewal."""

        async def renewing() -> None:
            while True:
                await asyncio.sleep(idle_timeout_s / 3)
                with contextlib.suppress(httpx.HTTPError, StepFailed, NoNodeReachable):
                    await self.renew(idle_timeout_s, **labels)

        task = asyncio.create_task(renewing())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def session_status(self, session_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Each id's state: live (with ``session``), lost, ended or unknown; any number of ids, asked 1,000 at a
        time (the node's most per call)."""
        ids = list(dict.fromkeys(session_ids))
        states: dict[str, dict[str, Any]] = {}
        for i in range(0, len(ids), STATUS_BATCH):
            doc = await self._selection("POST", "/sessions/status", json={"session_ids": ids[i : i + STATUS_BATCH]})
            states.update(doc["sessions"])
        return states

    async def group(
        self,
        runner: str,
        n: int,
        setup: list[dict[str, Any]] | None = None,
        **fields: Any,
    ) -> Group:
        """Prepare once, fork ``n``: a session, the ``setup`` actions stepped in it (each must succeed),
        then ``n`` copies of it. The prepared session is closed; the copies are the group (close it after,
        or use ``async with``)."""
        async with self.session(runner, **fields) as prepared:
            for action in setup or []:
                result = await prepared.step(action)
                if not result.get("ok"):
                    raise StepFailed(result)
            forked = await prepared.fork(n)
        return Group(self, [Session(self, info["session_id"], runner) for info in forked["sessions"]], forked["notes"])

    @contextlib.asynccontextmanager
    async def session(self, runner: str = "python", **fields: Any) -> AsyncIterator[Session]:
        info = await self.create_session(runner, **fields)
        try:
            yield Session(self, info["session_id"], runner)
        finally:
            await self.close_session(info["session_id"])


class Session:
    def __init__(self, client: SandboxClient, session_id: str, runner: str) -> None:
        self.client, self.session_id, self.runner = client, session_id, runner

    async def step(self, action: dict[str, Any], **fields: Any) -> dict[str, Any]:
        return await self.client.step(self.runner, action, session_id=self.session_id, **fields)

    async def run_python(self, code: str, **fields: Any) -> dict[str, Any]:
        return await self.client.run_python(code, session_id=self.session_id, **fields)

    async def fork(self, n: int, **fields: Any) -> dict[str, Any]:
        """``n`` copies of this session's state now; the answer (``sessions``, ``notes``)."""
        return await self.client.fork_session(self.session_id, n, **fields)

    async def forks(self, n: int, **fields: Any) -> list[Session]:
        """``n`` copies as session objects (close each, or gather them in a ``Group``)."""
        answer = await self.fork(n, **fields)
        return [Session(self.client, info["session_id"], self.runner) for info in answer["sessions"]]

    async def close(self) -> None:
        await self.client.close_session(self.session_id)


class Group:
    """G sessions from one prepared state: step them all, collect, close (``async with`` closes)."""

    def __init__(self, client: SandboxClient, sessions: list[Session], notes: list[str]) -> None:
        self.client, self.sessions, self.notes = client, sessions, notes

    async def __aenter__(self) -> Group:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def step(self, actions: list[dict[str, Any]], **fields: Any) -> list[dict[str, Any]]:
        """One action per member, concurrently; results in member order."""
        if len(actions) != len(self.sessions):
            raise ValueError(f"{len(actions)} actions for a group of {len(self.sessions)}")
        return list(await asyncio.gather(*(s.step(a, **fields) for s, a in zip(self.sessions, actions, strict=True))))

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.sessions), return_exceptions=True)
