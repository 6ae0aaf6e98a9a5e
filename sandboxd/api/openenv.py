"""OpenEnv's wire contract: each runner kind as an environment at ``/envs/<kind>``.

An OpenEnv client's base URL is then ``http://node:8080/envs/textgame``; the
official client (``openenv-core``'s ``EnvClient``) speaks the WebSocket at
``<base>/ws``: one environment per connection, JSON frames
``{"type": "reset"|"step"|"state"|"close", "data": ...}`` answered with
``{"type": "observation", "data": {"observation", "reward", "done"}}``,
``{"type": "state", "data": {...}}`` or ``{"type": "error", "data": {"message",
"code"}}`` with OpenEnv's codes. Here an environment is a sandboxd session,
opened by ``reset`` (a second reset starts a new one) and closed with the
connection, however it ends: a trainer that dies leaves no sandbox behind.

The HTTP routes (``/reset``, ``/step``, ``/state``, ``/schema``, ``/metadata``,
``/health``) are stateless, as in OpenEnv: each request is a fresh environment.

How a kind maps: the text game is the natural one (reset takes the seed, an
action is ``{"command": "..."}``, reward and done come from the game). Every
other kind is an environment whose action is that runner's action (python
``{"code"}``, sql ``{"query"}``, tools ``{"tool", "args"}``, browser
``{"actions": [...]}``), whose observation is the step's, reward null, done
when its sandbox ended. A program's failure is an observation (``ok: false``);
what is not the program's is an error frame.
"""

import asyncio
import contextlib
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, WebSocket, WebSocketDisconnect
from starlette.responses import Response

from sandboxd import __version__
from sandboxd.api.surface import surface_router
from sandboxd.errors import BadRequest, NotFound, SandboxdError, Saturated, SessionLost, UnknownSession
from sandboxd.front.auth import Auth
from sandboxd.front.gateway import Gateway
from sandboxd.front.surfaces import Surface, json_response
from sandboxd.models import SessionCreate, StepRequest, StepResult

MAX_FRAME_BYTES = 16 << 20
ENV_RESPONSES: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such environment: a kind this node does not run"},
    429: {"description": "no room for another environment (CAPACITY_REACHED)"},
}  # an action of any kind fits well under this; larger frames close the connection


class EnvError(Exception):
    """An error frame: OpenEnv's code and a message; ``cause`` is the sandboxd error behind it, if any."""

    def __init__(self, code: str, message: str, cause: SandboxdError | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.cause = code, message, cause

    def as_http(self) -> SandboxdError:
        """The HTTP routes' error: the sandboxd error's own status (429, 410, 5xx), or a 422 for the client's."""
        return self.cause if self.cause is not None else BadRequest(self.message)


def _env_code(exc: SandboxdError) -> str:
    if isinstance(exc, Saturated):
        return "CAPACITY_REACHED"
    if isinstance(exc, (SessionLost, UnknownSession)):
        return "SESSION_ERROR"
    if exc.blame == "client":
        return "VALIDATION_ERROR"
    return "EXECUTION_ERROR"


def _opened(session_id: str) -> dict[str, Any]:
    return {"session_id": session_id, "ready": True}


@dataclass(frozen=True)
class EnvShape:
    """How one kind looks as an environment."""

    reset: Callable[[int | None], dict[str, Any] | None]  # the sandboxd action a reset runs, if any
    action: Callable[[dict[str, Any]], Any]  # an OpenEnv action -> the sandboxd action
    result: Callable[[dict[str, Any], StepResult], tuple[dict[str, Any], float | None, bool]]
    opened: Callable[[str], dict[str, Any]] = _opened  # the first observation when a reset runs nothing
    state: Callable[[dict[str, Any] | None], dict[str, Any]] = lambda last: {}  # what /state adds


def _generic_result(obs_in: dict[str, Any], res: StepResult) -> tuple[dict[str, Any], float | None, bool]:
    obs = {
        "ok": res.ok,
        "observation": res.observation,
        "error": None if res.error is None else res.error.model_dump(exclude_none=True),
    }
    done = bool(res.observation and res.observation.get("session_alive") is False)
    return obs, None, done


def _game_result(obs_in: dict[str, Any], res: StepResult) -> tuple[dict[str, Any], float | None, bool]:
    obs = dict(res.observation or {})
    if res.error is not None:
        obs["error"] = res.error.message
    return obs, float(obs.get("reward", 0.0)), bool(obs.get("done", False))


def _code_result(obs_in: dict[str, Any], res: StepResult) -> tuple[dict[str, Any], float | None, bool]:
    """OpenEnv's coding environment observation (``CodeObservation``: stdout, stderr, an int exit_code), so its
    typed client (``CodingEnv``, whose models forbid extra fields) reads it unchanged; everything else the step
    said is in ``metadata``."""
    obs = dict(res.observation or {})
    stdout, stderr = obs.pop("stdout", ""), obs.pop("stderr", "")
    code = obs.pop("exit_code", None)
    if code is None:
        code = 128 + obs["signal"] if obs.get("signal") else (0 if res.ok else 1)
    meta = {"ok": res.ok, "error": None if res.error is None else res.error.model_dump(exclude_none=True), **obs}
    done = obs.get("session_alive") is False
    return {"stdout": stdout, "stderr": stderr, "exit_code": code, "metadata": meta}, None, done


GENERIC = EnvShape(reset=lambda seed: None, action=lambda a: a, result=_generic_result)
SHAPES: dict[str, EnvShape] = {
    "textgame": EnvShape(
        reset=lambda seed: {"op": "reset", "seed": seed or 0},
        action=lambda a: {"op": "step", "command": a.get("command")} if "op" not in a else a,
        result=_game_result,
    ),
    "python": EnvShape(
        reset=lambda seed: None,
        action=lambda a: a,
        result=_code_result,
        opened=lambda sid: {"stdout": "", "stderr": "", "exit_code": 0, "metadata": {"session_id": sid}},
        state=lambda last: {"last_exit_code": (last or {}).get("exit_code", 0)},
    ),
}


@dataclass
class Environment:
    """One connection's environment: a sandboxd session, opened by reset, closed with the connection."""

    gateway: Gateway
    kind: str
    tenant: str
    session_id: str | None = None
    episode_id: str | None = None
    step_count: int = 0
    shape: EnvShape = field(default_factory=lambda: GENERIC)
    last: dict[str, Any] | None = None  # the last observation sent

    async def reset(self, data: dict[str, Any]) -> dict[str, Any]:
        seed = data.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
            raise EnvError("VALIDATION_ERROR", f"seed must be a non-negative integer, not {seed!r}")
        await self.close()
        try:
            info = await self.gateway.create_session(SessionCreate(runner=self.kind), self.tenant)
        except SandboxdError as exc:
            raise EnvError(_env_code(exc), exc.message, exc) from None
        self.session_id = info.session_id
        self.episode_id = str(data.get("episode_id") or uuid.uuid4())
        self.step_count = 0
        first = self.shape.reset(seed)
        if first is None:
            self.last = self.shape.opened(info.session_id)
            return {"observation": self.last, "reward": None, "done": False}
        return await self._run(first, count=False)

    async def step(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise EnvError("VALIDATION_ERROR", "a step's data is the action, a JSON object")
        if self.session_id is None:
            raise EnvError("SESSION_ERROR", "no environment yet: send a reset first")
        return await self._run(self.shape.action(data))

    async def _run(self, action: Any, count: bool = True) -> dict[str, Any]:
        try:
            req = StepRequest(runner=self.kind, action=action, session_id=self.session_id)
        except ValueError as exc:
            raise EnvError("VALIDATION_ERROR", str(exc)) from None
        res = await self.gateway.step(req, self.tenant)
        if (cause := res.not_the_programs()) is not None:
            raise EnvError(_env_code(cause), f"{cause.code}: {cause.message}", cause)
        self.step_count += count
        obs, reward, done = self.shape.result(action if isinstance(action, dict) else {}, res)
        self.last = obs
        return {"observation": obs, "reward": reward, "done": done}

    def state(self) -> dict[str, Any]:
        return {
            "episode_id": self.episode_id,
            "step_count": self.step_count,
            "session_id": self.session_id,
            **self.shape.state(self.last),
        }

    async def close(self) -> None:
        if self.session_id is not None:
            sid, self.session_id = self.session_id, None
            with contextlib.suppress(SandboxdError):
                await self.gateway.close_session(sid, self.tenant, why="its OpenEnv connection ended")


def _frame(kind: str, data: Any) -> str:
    return orjson.dumps({"type": kind, "data": data}).decode()


def _error(code: str, message: str) -> str:
    return _frame("error", {"message": message, "code": code})


def openenv_error(exc: SandboxdError) -> Response:
    """HTTP routes: FastAPI's ``{"detail": ...}``, as OpenEnv's app answers."""
    return json_response({"detail": exc.message, "code": _env_code(exc)}, exc.status)


# An environment's descriptions are read by OpenEnv's clients before any key is involved; its WebSocket
# authenticates on its handshake's credentials, in the route (its refusal is a close frame there).
PUBLIC_SUFFIXES = (b"/health", b"/metadata", b"/schema", b"/ws")
SURFACE = Surface("openenv", openenv_error, prefixes=(b"/envs/",), public=lambda path: path.endswith(PUBLIC_SUFFIXES))


def router(gateway: Gateway, auth: Auth) -> APIRouter:
    api = surface_router(SURFACE.render)
    Tenant = Annotated[str, Depends(auth)]

    def shape(kind: str) -> EnvShape:
        """The environment at ``/envs/<kind>``; a kind this node does not run is no environment: 404."""
        if kind not in gateway.kinds:
            raise NotFound(f"no environment {kind!r}: runner {kind!r} is not enabled on this node")
        return SHAPES.get(kind, GENERIC)

    @api.websocket("/envs/{kind}/ws")
    async def ws(websocket: WebSocket, kind: str) -> None:
        await websocket.accept()
        try:
            tenant = auth.tenant_of(websocket)
            env = Environment(gateway, kind, tenant, shape=shape(kind))
        except SandboxdError as exc:
            await websocket.send_text(_error("SESSION_ERROR" if exc.blame != "client" else "FACTORY_ERROR",
                                             exc.message))  # fmt: skip
            await websocket.close(1008)
            return
        try:
            idle_s = gateway.settings.ws_idle_timeout_s
            while True:
                try:
                    frame = await asyncio.wait_for(websocket.receive(), idle_s)
                except TimeoutError:  # an idle environment holds a session and a connection: both go
                    await websocket.send_text(_error("SESSION_ERROR", f"no message for {idle_s:g}s: closed"))
                    await websocket.close(1001)
                    return
                if frame["type"] == "websocket.disconnect":
                    return
                raw = frame.get("text")
                if raw is None:  # a binary frame: JSON in UTF-8 is accepted, anything else is not JSON
                    raw = (frame.get("bytes") or b"").decode("utf-8", errors="replace")
                if len(raw) > MAX_FRAME_BYTES:
                    await websocket.send_text(_error("INVALID_JSON", f"frame over {MAX_FRAME_BYTES} bytes"))
                    await websocket.close(1009)
                    return
                try:
                    msg = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    await websocket.send_text(_error("INVALID_JSON", f"not JSON: {exc}"))
                    continue
                kind_of = msg.get("type") if isinstance(msg, dict) else None
                try:
                    if kind_of == "reset":
                        data = msg.get("data") or {}
                        if not isinstance(data, dict):
                            raise EnvError("VALIDATION_ERROR", "reset data must be a JSON object")
                        await websocket.send_text(_frame("observation", await env.reset(data)))
                    elif kind_of == "step":
                        await websocket.send_text(_frame("observation", await env.step(msg.get("data"))))
                    elif kind_of == "state":
                        await websocket.send_text(_frame("state", env.state()))
                    elif kind_of == "close":
                        await websocket.close(1000)
                        return
                    else:
                        raise EnvError("UNKNOWN_TYPE", f"unknown message type {kind_of!r} (reset, step, state, close)")
                except EnvError as exc:
                    await websocket.send_text(_error(exc.code, exc.message))
        except WebSocketDisconnect:
            return
        finally:
            await env.close()

    @api.post("/envs/{kind}/reset", tags=["openenv"], responses=ENV_RESPONSES)
    async def reset(kind: str, tenant: Tenant, body: dict[str, Any] | None = None) -> Response:
        """A fresh environment, reset (stateless, as OpenEnv's HTTP routes are); its first observation."""
        env = Environment(gateway, kind, tenant, shape=shape(kind))
        try:
            return json_response(await env.reset(body or {}))
        except EnvError as exc:
            raise exc.as_http() from None
        finally:
            await env.close()

    @api.post("/envs/{kind}/step", tags=["openenv"], responses=ENV_RESPONSES)
    async def step(kind: str, tenant: Tenant, body: dict[str, Any]) -> Response:
        """One action on a fresh environment (reset with seed 0 first where the kind has a reset)."""
        action = body.get("action")
        if not isinstance(action, dict):
            raise BadRequest("body.action: a JSON object is required")
        env = Environment(gateway, kind, tenant, shape=shape(kind))
        try:
            await env.reset({})
            return json_response(await env.step(action))
        except EnvError as exc:
            raise exc.as_http() from None
        finally:
            await env.close()

    @api.get("/envs/{kind}/state", tags=["openenv"], responses=ENV_RESPONSES)
    async def state(kind: str, _: Tenant) -> Response:
        shape(kind)
        return json_response({"episode_id": None, "step_count": 0})

    @api.get("/envs/{kind}/health", tags=["openenv"], responses=ENV_RESPONSES)
    async def health(kind: str) -> Response:
        shape(kind)
        return json_response({"status": "healthy"})

    @api.get("/envs/{kind}/metadata", tags=["openenv"], responses=ENV_RESPONSES)
    async def metadata(kind: str) -> Response:
        shape(kind)
        k = gateway.kind(kind)
        return json_response(
            {
                "name": kind,
                "description": k.title,
                "readme_content": None,
                "version": __version__,
                "author": "sandboxd",
                "documentation_url": None,
            }
        )

    @api.get("/envs/{kind}/schema", tags=["openenv"], responses=ENV_RESPONSES)
    async def schema(kind: str) -> Response:
        shape(kind)
        k = gateway.kind(kind)
        return json_response(
            {
                "action": k.action.model_json_schema(),
                "observation": k.observation.model_json_schema(),
                "state": {
                    "type": "object",
                    "properties": {
                        "episode_id": {"type": ["string", "null"]},
                        "step_count": {"type": "integer"},
                        "session_id": {"type": ["string", "null"]},
                    },
                },
            }
        )

    return api
