"""Operations surface: liveness, readiness, Prometheus metrics, and the drain before a node stops."""

from __future__ import annotations

import hmac
import ipaddress

from fastapi import APIRouter, Depends, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import PlainTextResponse, Response

from sandboxd.api.surface import surface_router
from sandboxd.errors import Forbidden
from sandboxd.front.auth import Auth
from sandboxd.front.gateway import Gateway
from sandboxd.front.surfaces import Surface, json_response, native_error
from sandboxd.metrics import render
from sandboxd.node.drain import DRAIN_TOKEN_HEADER

PROBES = frozenset({b"/healthz", b"/readyz", b"/metrics"})


def surface(protected: bool) -> Surface:
    """Probes and metrics are anyone's unless ``protected`` (``auth_ops``); /drain checks its own token."""
    paths = PROBES | {b"/drain"}
    return Surface("operations", native_error, exact=paths, public_exact=paths - PROBES if protected else paths)


def router(gateway: Gateway, auth: Auth, protected: bool) -> APIRouter:
    """``protected``: probes and Prometheus must send a key too (``auth_ops``)."""
    api = surface_router(native_error, tags=["operations"], dependencies=[Depends(auth)] if protected else [])

    @api.get("/healthz")
    async def healthz() -> Response:
        """The process is up (liveness)."""
        return json_response({"ok": True})

    @api.get("/readyz", responses={503: {"description": "not ready: a worker is down or a pool is not whole"}})
    async def readyz() -> Response:
        """Every worker is up with its warm pools, and this front process reaches each (readiness); 503 otherwise."""
        ok, body = await gateway.ready()
        return json_response(body, 200 if ok else 503)

    @api.post("/drain", responses={403: {"description": "not from this machine (loopback only)"}})
    async def drain(request: Request) -> Response:
        """Stop taking new sessions and one-shot steps (503 ``shutting_down``, /readyz 503) on every front process
        of the node, while the steps in flight and the steps of live sessions go on: what a Kubernetes preStop
        hook runs (``sandboxd drain``) before SIGTERM. Only from this machine with the node's drain token
        (``X-Sandboxd-Drain-Token``, read from its token file): a tenant's key must not take a node out of
        service."""
        host = request.client.host if request.client else ""
        try:
            local = ipaddress.ip_address(host).is_loopback
        except ValueError:
            local = False
        token = str(gateway.links.topology.get("drain_token") or "")
        given = request.headers.get(DRAIN_TOKEN_HEADER, "")
        if not local or not token or not hmac.compare_digest(given.encode(), token.encode()):
            raise Forbidden("POST /drain is only taken from this machine, with the node's drain token (sandboxd drain)")
        return json_response(await gateway.drain())

    @api.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}, "description": "Prometheus text format"}},
    )
    async def metrics() -> Response:
        """The node's metrics, whichever front process answers: every process's values and the node's status."""
        return Response(render(await gateway.status()), media_type=CONTENT_TYPE_LATEST)

    return api
