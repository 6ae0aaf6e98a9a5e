"""Gymnasium environments backed by sandboxd sessions: one class, one instance per kind.

    env = SandboxdEnv("http://node:8080", runner="textgame")
    obs, info = env.reset(seed=7)
    obs, reward, terminated, truncated, info = env.step("look")

Observations and actions are text (``gymnasium.spaces.Text``), what an LLM
policy reads and writes: the game's text and a command (textgame); a program
and its output (python); a query and its rows as CSV (sql); a JSON tool call
and its JSON result (tools); a JSON list of browser actions and the page's
results (browser). Each ``reset`` opens a fresh session on the node (closing
the previous one); ``close`` ends it, so nothing is left on the node.

``AsyncSandboxdEnv`` has the same methods as coroutines for trainers that step
many environments at once on one event loop (Gymnasium's own API is sync).

A program's failure is part of the observation; a failure that is not the
program's (the node overloaded, the session lost) raises ``SandboxdEnvError``
rather than becoming a zero reward.
"""

from __future__ import annotations

import json
import string
from typing import Any

import gymnasium
import httpx
from gymnasium import spaces

from sandboxd.csvtext import as_csv

CHARSET = frozenset(string.printable)  # what observations and actions are made of (other characters become "?")
MAX_TEXT = 65_536
MAX_ACTION = {"textgame": 200}  # what the kind accepts (a game command is at most 200 characters); others MAX_TEXT


class SandboxdEnvError(RuntimeError):
    """The node failed the step (not the program): never to be scored as the policy's failure."""


def _text(value: str) -> str:
    return "".join(c if c in CHARSET else "?" for c in value[:MAX_TEXT])


def _action(runner: str, action: str) -> dict[str, Any]:
    if runner == "textgame":
        return {"op": "step", "command": action}
    if runner == "python":
        return {"code": action}
    if runner == "sql":
        return {"query": action}
    try:
        parsed = json.loads(action)  # tools: {"tool", "args"}; browser: {"actions": [...]} or a list
    except ValueError as exc:
        raise ValueError(f"a {runner} action is JSON text: {exc}") from None
    if runner == "browser" and isinstance(parsed, list):
        parsed = {"actions": parsed}
    if not isinstance(parsed, dict):
        raise ValueError(f"a {runner} action is a JSON object")
    return parsed


def _observe(runner: str, result: dict[str, Any]) -> tuple[str, float, bool]:
    """(observation text, reward, terminated) of one step result."""
    obs = result.get("observation") or {}
    if runner == "textgame":
        return _text(str(obs.get("text", ""))), float(obs.get("reward", 0.0)), bool(obs.get("done", False))
    if runner == "python":
        return _text(str(obs.get("stdout", "")) + str(obs.get("stderr", ""))), 0.0, obs.get("session_alive") is False
    if runner == "sql":
        if obs.get("error"):
            return _text(f"error: {obs['error']}"), 0.0, False
        return _text(as_csv(obs.get("columns", []), obs.get("rows", []))), 0.0, False
    return _text(json.dumps(obs, sort_keys=True)), 0.0, False


def _check(r: httpx.Response, what: str) -> dict[str, Any]:
    try:
        body: dict[str, Any] = r.json()
    except ValueError:
        raise SandboxdEnvError(f"{what}: HTTP {r.status_code}: {r.text[:200]}") from None
    err = body.get("error") or {}
    if r.status_code >= 300 or (err and err.get("blame") not in (None, "program")):
        raise SandboxdEnvError(f"{what}: HTTP {r.status_code} {err.get('code')}: {err.get('message')}")
    return body


class _Core:
    """What both variants share: the kind, the spaces, the request bodies."""

    def __init__(self, runner: str, max_steps: int) -> None:
        self.runner = runner
        self.max_steps = max_steps
        self.session_id: str | None = None
        self.steps = 0

    def first_action(self, seed: int | None) -> dict[str, Any] | None:
        if self.runner == "textgame":
            return {"op": "reset", "seed": 0 if seed is None else int(seed) % (2**31 - 1), "max_steps": self.max_steps}
        return None

    def body(self, action: dict[str, Any]) -> dict[str, Any]:
        return {"runner": self.runner, "action": action, "session_id": self.session_id}

    def spaces(self) -> tuple[spaces.Text, spaces.Text]:
        """(observation, action) spaces: text, an action no longer than the kind accepts."""
        return (
            spaces.Text(max_length=MAX_TEXT, min_length=0, charset=CHARSET),
            spaces.Text(max_length=MAX_ACTION.get(self.runner, MAX_TEXT), min_length=1, charset=CHARSET),
        )

    def opened(self, info: dict[str, Any]) -> None:
        self.session_id, self.steps = info["session_id"], 0

    def first_observation(self, result: dict[str, Any] | None) -> tuple[str, dict[str, Any]]:
        obs = "" if result is None else _observe(self.runner, result)[0]
        return obs, {"session_id": self.session_id}

    def step_body(self, action: str) -> dict[str, Any]:
        if self.session_id is None:
            raise gymnasium.error.ResetNeeded("call reset() before step()")
        return self.body(_action(self.runner, action))

    def outcome(self, result: dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        obs, reward, terminated = _observe(self.runner, result)
        truncated = not terminated and self.steps >= self.max_steps
        return obs, reward, terminated, truncated, {"ok": result.get("ok")}

    def ending(self) -> str | None:
        """The session to delete, forgotten here first (a failed delete must not be retried forever)."""
        sid, self.session_id = self.session_id, None
        return sid


class SandboxdEnv(gymnasium.Env[str, str]):
    """A Gymnasium environment whose state is a sandboxd session of ``runner``."""

    metadata: dict[str, Any] = {"render_modes": []}  # Gymnasium reads it from the class

    def __init__(
        self,
        base_url: str,
        runner: str = "textgame",
        api_key: str | None = None,
        max_steps: int = 50,
        timeout_s: float = 120.0,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s)
        self._core = _Core(runner, max_steps)
        self.observation_space, self.action_space = self._core.spaces()

    @property
    def session_id(self) -> str | None:
        return self._core.session_id

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._end_session()
        self._core.opened(_check(self._http.post("/sessions", json={"runner": self._core.runner}), "opening a session"))
        first = self._core.first_action(seed)
        body = None if first is None else self._core.body(first)
        result = None if body is None else _check(self._http.post("/rollout/step", json=body), "reset")
        return self._core.first_observation(result)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        body = self._core.step_body(action)
        return self._core.outcome(_check(self._http.post("/rollout/step", json=body), "step"))

    def _end_session(self) -> None:
        if (sid := self._core.ending()) is not None:
            self._http.delete(f"/sessions/{sid}")

    def close(self) -> None:
        self._end_session()
        self._http.close()
        super().close()


class AsyncSandboxdEnv:
    """The same environment with coroutine methods: many environments stepped concurrently on one loop."""

    def __init__(
        self,
        base_url: str,
        runner: str = "textgame",
        api_key: str | None = None,
        max_steps: int = 50,
        timeout_s: float = 120.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._own = client is None
        self._http = client or httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s)
        self._core = _Core(runner, max_steps)
        self.observation_space, self.action_space = self._core.spaces()

    async def reset(self, *, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        await self._end_session()
        opened = await self._http.post("/sessions", json={"runner": self._core.runner})
        self._core.opened(_check(opened, "opening a session"))
        first = self._core.first_action(seed)
        body = None if first is None else self._core.body(first)
        result = None if body is None else _check(await self._http.post("/rollout/step", json=body), "reset")
        return self._core.first_observation(result)

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        body = self._core.step_body(action)
        return self._core.outcome(_check(await self._http.post("/rollout/step", json=body), "step"))

    async def _end_session(self) -> None:
        if (sid := self._core.ending()) is not None:
            await self._http.delete(f"/sessions/{sid}")

    async def close(self) -> None:
        await self._end_session()
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncSandboxdEnv:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
