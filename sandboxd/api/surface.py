"""One route class per surface: every ``SandboxdError`` leaving a route is rendered by that surface.

FastAPI's exception handlers are app-wide, but each wire contract (sandboxd's
own, SandboxFusion's, OpenEnv's, MCP's) has its own error shape for the same
failure. A surface's router is built with ``surface_router(render)``; its
routes catch ``SandboxdError`` and FastAPI's request validation errors (bad
JSON, missing fields) and hand both, as one ``SandboxdError``, to ``render``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.responses import Response

from sandboxd.errors import BadRequest, InfraError, SandboxdError

log = logging.getLogger("sandboxd.api")

ErrorRenderer = Callable[[SandboxdError], Response]


class DropConnection(Exception):
    """Raised by an answer that has started: the connection closes without the rest of it. E2B's proxy drops the
    connection of a sandbox that ends during a request, and the SDKs read exactly that as "the sandbox was
    killed while the request was in progress"."""


class Dropped(Response):
    """An answer that starts and then drops its connection (``DropConnection``)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # no content-length (Response's would be 0, a complete answer): the client waits for a body that never comes
        headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        raise DropConnection


async def until_disconnected(receive: Any) -> None:
    """Returns once the client has gone (call it after the request's body was read whole: what ``receive``
    gives then is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def json_response(data: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json", headers=headers)


def retry_headers(retry_after_s: float | None) -> dict[str, str] | None:
    """HTTP Retry-After in whole seconds, never 0 (clients would retry in a hot loop)."""
    return {"Retry-After": str(max(1, int(retry_after_s + 0.999)))} if retry_after_s is not None else None


def request_error(exc: RequestValidationError) -> BadRequest:
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()]
    return BadRequest("; ".join(parts) or "invalid request")


def native_error(exc: SandboxdError) -> Response:
    """sandboxd's own shape: the same body as a failed step result."""
    err = {"blame": exc.blame, "code": exc.code, "message": exc.message, "retry_after_s": exc.retry_after_s}
    body = {"ok": False, "status": exc.status, "error": err}
    return json_response(body, exc.status, retry_headers(exc.retry_after_s))


def surface_router(render: ErrorRenderer, **kwargs: Any) -> APIRouter:
    class SurfaceRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def route(request: Request) -> Response:
                try:
                    return await handler(request)
                except SandboxdError as exc:
                    return render(exc)
                except RequestValidationError as exc:
                    return render(request_error(exc))
                except HTTPException as exc:  # FastAPI's own refusals, e.g. a body that is not UTF-8 JSON
                    if exc.status_code >= 500:
                        raise
                    return render(BadRequest(f"request: {exc.detail}"))
                except Exception as exc:  # a bug of ours: still one error shape, blamed on us, and logged
                    log.exception("%s %s failed", request.method, request.url.path)
                    return render(InfraError(f"internal error: {type(exc).__name__}"))

            return route

    return APIRouter(route_class=SurfaceRoute, **kwargs)
