"""Async client for trainers and agent backends (httpx, one connection pool).

    async with SandboxClient("http://127.0.0.1:8080") as c:
        r = await c.run_python("print(1)")
        async with c.session() as s:
            await s.run_python("x = 1")
            r = await s.run_python("print(x)")

Results are returned as dicts in the API's shape. ``StepFailed`` is raised only
for client and infrastructure errors when ``raise_infra`` is set; a program that
fails is a normal result (``ok`` false, ``error.blame == "program"``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx


class StepFailed(Exception):
    def __init__(self, result: dict[str, Any]) -> None:
        err = result.get("error") or {}
        super().__init__(f"{err.get('blame')}/{err.get('code')}: {err.get('message')}")
        self.result = result


class SandboxClient:
    def __init__(self, base_url: str, timeout_s: float = 600.0, max_connections: int = 1024) -> None:
        self.http = httpx.AsyncClient(
            base_url=base_url,
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def step(self, runner: str, action: dict[str, Any], **fields: Any) -> dict[str, Any]:
        body = {"runner": runner, "action": action, **{k: v for k, v in fields.items() if v is not None}}
        r = await self.http.post("/rollout/step", json=body)
        data: dict[str, Any] = r.json()
        return data

    async def run_python(self, code: str, **fields: Any) -> dict[str, Any]:
        action = {"code": code}
        for key in ("stdin", "files"):
            if key in fields:
                action[key] = fields.pop(key)
        return await self.step("python", action, **fields)

    async def steps(self, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        r = await self.http.post("/rollout/steps", json={"steps": steps})
        r.raise_for_status()
        results: list[dict[str, Any]] = r.json()["results"]
        return results

    async def create_session(self, runner: str = "python", **fields: Any) -> dict[str, Any]:
        r = await self.http.post("/sessions", json={"runner": runner, **fields})
        if r.status_code != 201:
            raise StepFailed(r.json())
        data: dict[str, Any] = r.json()
        return data

    async def close_session(self, session_id: str) -> None:
        await self.http.delete(f"/sessions/{session_id}")

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
