"""Operations surface: liveness, readiness, Prometheus metrics, and the drain before a node stops."""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import secrets
import tempfile
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import PlainTextResponse, Response

from sandboxd.api.auth import Auth
from sandboxd.api.surface import json_response, native_error, surface_router
from sandboxd.errors import Forbidden
from sandboxd.gateway import Gateway

DRAIN_TOKEN_HEADER = "x-sandboxd-drain-token"


def drain_token_path(port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"sandboxd-drain-{port}.token"


class DrainToken:
    """A random token only processes on this machine (in this container) can read: the key to ``/drain``.

    A peer address of 127.0.0.1 is not proof enough: a service-mesh sidecar relays every remote client
    from loopback. The token file is 0600 in the node's own temp dir (an emptyDir no sidecar mounts);
    ``sandboxd drain`` reads it.
    """

    def __init__(self, port: int) -> None:
        self.value = secrets.token_urlsafe(32)
        self.path = drain_token_path(port) if port else None

    def write(self) -> None:
        if self.path is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a token left by a node killed on this port
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.value)

    def remove(self) -> None:
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                if self.path.read_text() == self.value:
                    self.path.unlink()

    def matches(self, given: str) -> bool:
        return hmac.compare_digest(given.encode(), self.value.encode())


def router(gateway: Gateway, auth: Auth, protected: bool, drain_token: DrainToken) -> APIRouter:
    """``protected``: probes and Prometheus must send a key too (``auth_ops``)."""
    api = surface_router(native_error, tags=["operations"], dependencies=[Depends(auth)] if protected else [])

    @api.get("/healthz")
    async def healthz() -> Response:
        """The process is up (liveness)."""
        return json_response({"ok": True})

    @api.get("/readyz", responses={503: {"description": "not ready: a worker is down or a pool is not whole"}})
    async def readyz() -> Response:
        """Every worker is up with its warm pools (readiness); 503 otherwise."""
        ok, body = await gateway.ready()
        return json_response(body, 200 if ok else 503)

    @api.post("/drain", responses={403: {"description": "not from this machine (loopback only)"}})
    async def drain(request: Request) -> Response:
        """Stop taking new sessions and one-shot steps (503 ``shutting_down``, /readyz 503) while the steps in
        flight and the steps of live sessions go on: what a Kubernetes preStop hook runs (``sandboxd drain``)
        before SIGTERM. Only from this machine with the node's drain token (``X-Sandboxd-Drain-Token``, read
        from its token file): a tenant's key must not take a node out of service."""
        host = request.client.host if request.client else ""
        try:
            local = ipaddress.ip_address(host).is_loopback
        except ValueError:
            local = False
        if not local or not drain_token.matches(request.headers.get(DRAIN_TOKEN_HEADER, "")):
            raise Forbidden("POST /drain is only taken from this machine, with the node's drain token (sandboxd drain)")
        gateway.begin_drain()
        return json_response(
            {"draining": True, "inflight": gateway.inflight, "sessions": await gateway.sessions.count()}
        )

    @api.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}, "description": "Prometheus text format"}},
    )
    async def metrics() -> Response:
        g = gateway
        if g.scheduler is not None:
            for kind in g.kinds:
                g.metrics.queue_depth.labels(kind).set(g.scheduler.queue_depth(kind))
                g.metrics.inflight.labels(kind).set(g.scheduler.inflight(kind))
        return Response(generate_latest(g.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return api
