"""HTTP routes (FastAPI). Thin: parse, call the ``Gateway``, render.

Every error leaves through one handler with the same body shape as a step
result (``ok``, ``status``, ``error{blame, code, message}``), so clients parse
one thing whatever went wrong.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from runners.base import import_string
from sandboxd.config import Settings
from sandboxd.errors import SandboxdError, Saturated, UnknownRunner
from sandboxd.gateway import Gateway
from sandboxd.protocol import BatchRequest, BatchResult, SessionCreate, SessionInfo, StepRequest, StepResult


def _json(data: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json", headers=headers)


def _error_body(exc: SandboxdError) -> dict[str, object]:
    err = exc.to_dict()
    if isinstance(exc, Saturated):
        err["retry_after_s"] = exc.retry_after_s
    return {"ok": False, "status": exc.status, "error": err}


def _retry_headers(retry_after_s: float | None) -> dict[str, str] | None:
    return {"Retry-After": str(max(1, int(retry_after_s + 0.999)))} if retry_after_s is not None else None


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    gateway = Gateway(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(
        title="sandboxd",
        version="0.1.0",
        summary="Sandbox execution for agentic RL rollouts and agent inference",
        lifespan=lifespan,
    )
    app.state.gateway = gateway

    @app.exception_handler(SandboxdError)
    async def _sandboxd_error(_: Request, exc: SandboxdError) -> Response:
        return _json(_error_body(exc), exc.status, _retry_headers(getattr(exc, "retry_after_s", None)))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()]
        body = {
            "ok": False,
            "status": 422,
            "error": {"blame": "client", "code": "bad_request", "message": "; ".join(parts)},
        }
        return _json(body, 422)

    @app.post(
        "/rollout/step", response_model=StepResult, responses={429: {"model": StepResult}, 504: {"model": StepResult}}
    )
    async def rollout_step(req: StepRequest) -> Response:
        """Run one step: one-shot in a fresh sandbox, or inside ``session_id``'s sandbox."""
        result = await gateway.step(req)
        retry = result.error.retry_after_s if result.error else None
        return _json(result.model_dump(), result.status, _retry_headers(retry))

    @app.post("/rollout/steps", response_model=BatchResult)
    async def rollout_steps(req: BatchRequest) -> Response:
        """Run a batch of steps concurrently; results in request order, each with its own status."""
        results = await gateway.batch(req.steps)
        return _json({"results": [r.model_dump() for r in results]})

    @app.post("/sessions", response_model=SessionInfo, status_code=201)
    async def create_session(req: SessionCreate) -> Response:
        """Create a session pinned to one worker; its state persists across steps until closed or reaped."""
        info = await gateway.create_session(req)
        return _json(info.model_dump(), 201)

    @app.get("/sessions/{session_id}", response_model=SessionInfo)
    async def get_session(session_id: str) -> Response:
        return _json(gateway.session_info(session_id).model_dump())

    @app.delete("/sessions/{session_id}", status_code=204)
    async def delete_session(session_id: str) -> Response:
        await gateway.close_session(session_id)
        return Response(status_code=204)

    @app.get("/runners")
    async def list_runners() -> Response:
        """Runner kinds enabled on this node."""
        return _json({"runners": settings.runners})

    @app.get("/runners/{kind}")
    async def describe_runner(kind: str) -> Response:
        """A runner's action schema, and for ``tools`` the tool listing in the OpenAI function-calling shape."""
        model = gateway.models.get(kind)
        if model is None:
            raise UnknownRunner(f"runner {kind!r} is not enabled on this node (enabled: {settings.runners})")
        body: dict[str, object] = {"runner": kind, "action_schema": model.model_json_schema()}
        extra = getattr(model, "describe_runner", None)
        if isinstance(extra, str):
            body["tools"] = import_string(extra)()
        return _json(body)

    @app.get("/healthz")
    async def healthz() -> Response:
        return _json({"ok": True})

    @app.get("/readyz")
    async def readyz() -> Response:
        ok, body = gateway.ready()
        return _json(body, 200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        g = gateway
        if g.scheduler is not None:
            for kind in settings.runners:
                g.metrics.queue_depth.labels(kind).set(g.scheduler.queue_depth(kind))
                g.metrics.inflight.labels(kind).set(g.scheduler.inflight(kind))
        return Response(generate_latest(g.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
