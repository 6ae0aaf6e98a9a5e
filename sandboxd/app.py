"""The ASGI app of a front process: one ``Gateway``, the API surfaces as routers, the OpenAPI document.

Each surface renders errors in its own shape (``api/surface.py``). What no
surface owns (an unknown path, a wrong method) is rendered in sandboxd's own
error shape here, so a client never has to parse FastAPI's ``{"detail": ...}``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException
from starlette.responses import Response

from sandboxd import __version__
from sandboxd.api import e2b, fusion, mcp_server, native, openenv, ops
from sandboxd.api.e2b.forwarding import E2bForwarding
from sandboxd.api.limits import BodyLimit
from sandboxd.api.mcp_server import McpSurface
from sandboxd.api.surface import request_error
from sandboxd.config import NodeSettings, load_settings
from sandboxd.front.auth import Auth
from sandboxd.front.gateway import Gateway
from sandboxd.front.protocol import Front
from sandboxd.front.surfaces import Surface, Surfaces, json_response, native_error

HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}
DOC_PATHS = frozenset({b"/docs", b"/openapi.json", b"/docs/oauth2-redirect", b"/redoc"})
DOCS = Surface("docs", native_error, exact=DOC_PATHS, public_exact=DOC_PATHS)


def served_surfaces(settings: NodeSettings) -> Surfaces:
    """Every surface's declaration, as its routes and the front door's refusals read it (front/surfaces.py)."""
    return Surfaces(
        [
            native.SURFACE,
            fusion.SURFACE,
            openenv.SURFACE,
            e2b.SURFACE,
            mcp_server.SURFACE,
            ops.surface(settings.auth_ops),
            DOCS,
        ]
    )


def create_app(settings: NodeSettings | None = None, index: int = 0) -> FastAPI:
    """A front process's app: the API surfaces over one ``Gateway``.

    With ``settings.node_socket`` (``sandboxd serve``, gunicorn) it joins that node as front process
    ``index``; without, it starts a node process of its own (an app embedded in another ASGI server, a
    test client) and stops it with itself. ``app.state.front`` is what the front door (``protocol.py``)
    serves the hot routes with.
    """
    settings = settings or load_settings()
    gateway = Gateway(settings, index=index, node_socket=settings.node_socket)
    auth = Auth(settings)
    mcp = McpSurface(gateway, auth)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            async with mcp.running():
                yield
        finally:
            await gateway.stop()

    app = FastAPI(
        title="sandboxd",
        version=__version__,
        summary="Sandbox execution for agentic RL rollouts and agent inference",
        lifespan=lifespan,
    )
    app.state.gateway = gateway
    app.state.front = Front(gateway, auth, settings, served_surfaces(settings))
    app.include_router(native.router(gateway, auth))
    app.include_router(fusion.router(gateway, auth))
    app.include_router(openenv.router(gateway, auth))
    app.include_router(e2b.router(gateway, auth))
    app.router.routes.extend(mcp.routes)
    app.include_router(ops.router(gateway, auth, protected=settings.auth_ops))
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, stall_timeout_s=settings.body_timeout_s)
    if settings.redis_url:  # a cluster: an E2B sandbox's data plane reaches whichever node got the call
        app.add_middleware(E2bForwarding, gateway=gateway)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> Response:
        body = {
            "ok": False,
            "status": exc.status_code,
            "error": {"blame": "client", "code": HTTP_CODES.get(exc.status_code, "http_error"), "message": exc.detail},
        }
        return json_response(body, exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> Response:
        return native_error(request_error(exc))

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_kind_schemas(
                get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes), gateway
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def with_kind_schemas(doc: dict[str, Any], gateway: Gateway) -> dict[str, Any]:
    """StepRequest.action and StepResult.observation as one of the enabled kinds' models."""
    models: list[tuple[Any, Any]] = []
    for kind in gateway.kinds.values():
        models += [(kind.action, "validation"), (kind.observation, "serialization")]
    if not models:
        return doc
    keys, defs = models_json_schema(models, ref_template="#/components/schemas/{model}")
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(defs.get("$defs", {}))
    refs = {mode: [keys[(m, mode)] for m, md in models if md == mode] for mode in ("validation", "serialization")}
    for model, field, mode in (("StepRequest", "action", "validation"), ("StepResult", "observation", "serialization")):
        prop = schemas.get(model, {}).get("properties", {}).get(field)
        if prop is not None:
            options = refs[mode] + ([{"type": "null"}] if field == "observation" else [])
            schemas[model]["properties"][field] = {"anyOf": options, "description": prop.get("description", "")}
    return doc
