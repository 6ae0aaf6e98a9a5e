"""One route class per surface: every ``SandboxdError`` leaving a route is rendered by that surface.

FastAPI's exception handlers are app-wide, but each wire contract (sandboxd's
own, SandboxFusion's, OpenEnv's, MCP's) has its own error shape for the same
failure. A surface's router is built with ``surface_router(render)``, the
renderer its declaration names (``front/surfaces.py``); its routes catch
``SandboxdError`` and FastAPI's request validation errors (bad JSON, missing
fields) and hand both, as one ``SandboxdError``, to ``render``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.responses import Response

from sandboxd.errors import BadRequest, InfraError, SandboxdError
from sandboxd.front.surfaces import DropConnection, ErrorRenderer

log = logging.getLogger("sandboxd.api")


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


def request_error(exc: RequestValidationError) -> BadRequest:
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()]
    return BadRequest("; ".join(parts) or "invalid request")


def surface_router(render: ErrorRenderer, **kwargs: Any) -> APIRouter:
    """A router whose routes answer every error with ``render`` (its surface's, ``front/surfaces.py``)."""

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
