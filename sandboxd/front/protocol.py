"""The front door: uvicorn's HTTP protocol with sandboxd's checks before any body is read, and its hot routes
served without the framework.

Where a light step costs the worker ~0.15 ms, the framework's per-request layers cost the front several
times that (middleware, dependency solving, routing, models, an ASGI cycle and a task per request). So
the routes trainers call for every step are served here, at the protocol level, from the bytes httptools
parsed: ``POST /rollout/step``, ``POST /rollout/steps``, ``POST /sessions``, ``GET|DELETE
/sessions/{id}``. Their answers are the workers' bytes, relayed. Every other request (OpenAPI, the other
surfaces, operations) goes to the FastAPI app as before; the hot routes are there too, with the same
schemas, for the OpenAPI document and for an app embedded without this protocol.

Before any route, for every request: a deadline for the headers (idle connections cannot fill the
server), the API key checked from the headers alone (an anonymous client never gets a body read, let
alone parsed), the body bounded in size (413 as soon as it is known to be too large) and in time as a
whole (408: a body trickled one byte at a time cannot hold a connection), connections bounded per client
address and per tenant (one client cannot take every connection), and ``/healthz`` and ``/readyz``
answered even when the connection limit is reached.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import Counter
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from sandboxd.answers import error_body
from sandboxd.api.auth import Auth
from sandboxd.cluster.forward import CALLER, FORWARDED_BY, Caller
from sandboxd.config import NodeSettings
from sandboxd.errors import (
    BadRequest,
    InfraError,
    PayloadTooLarge,
    SandboxdError,
    SandboxSetupError,
    Saturated,
    Unauthorized,
)
from sandboxd.front.gateway import Gateway
from sandboxd.stores.idempotency import Stored

log = logging.getLogger("sandboxd.front")

# Paths served to anyone: probes, the OpenAPI document, SandboxFusion's ping, OpenEnv's environment
# descriptions (its clients read them before any key is involved), /drain (its own token), WebSockets
# (they authenticate on their first frame's connection, in the route).
OPS = {b"/healthz", b"/readyz", b"/metrics"}
PUBLIC_EXACT = {
    b"/v1/ping",
    b"/docs",
    b"/openapi.json",
    b"/docs/oauth2-redirect",
    b"/redoc",
    b"/drain",
}
PUBLIC_ENV_SUFFIXES = (b"/health", b"/metadata", b"/schema", b"/ws")
HOT = {
    (b"GET", b"/healthz"): "healthz",  # here, not behind the connection limit: probes cannot be starved
    (b"GET", b"/readyz"): "readyz",
    (b"POST", b"/rollout/step"): "step",
    (b"POST", b"/rollout/steps"): "steps",
    (b"POST", b"/sessions"): "create",
}
JSON_HEADERS = b"content-type: application/json\r\n"


class Front:
    """What every connection of one front process shares: its gateway, its keys, its counts."""

    def __init__(self, gateway: Gateway, auth: Auth, settings: NodeSettings) -> None:
        self.gateway = gateway
        self.auth = auth
        self.settings = settings
        self.by_address: Counter[str] = Counter()
        self.by_tenant: Counter[str] = Counter()
        self.protected_metrics = settings.auth_ops

    def public(self, path: bytes) -> bool:
        if path in OPS:
            return not self.protected_metrics  # auth_ops: probes and Prometheus send a key too
        if path in PUBLIC_EXACT:
            return True
        return path.startswith(b"/envs/") and path.endswith(PUBLIC_ENV_SUFFIXES)


class HotCycle:
    """A hot request: its body as it arrives, then one task that writes the answer. It has what uvicorn's
    protocol reads of a request cycle (pipelining, keep-alive, disconnects) so the two kinds interleave."""

    def __init__(self, proto: FrontProtocol, route: str, arg: str, tenant: str, keep_alive: bool, t0: float) -> None:
        self.proto = proto
        self.route = route
        self.arg = arg
        self.tenant = tenant
        self.keep_alive = keep_alive
        self.t0 = t0
        self.body = bytearray()
        self.more_body = True
        self.response_complete = False
        self.disconnected = False
        self.runnable = False  # first in line on its connection (not behind a pipelined request)
        self.launched = False
        self.message_event = self  # uvicorn calls message_event.set() on body and end of message

    def set(self) -> None:
        self.launch()

    def launch(self) -> None:
        if self.launched or not self.runnable or self.more_body or self.disconnected:
            return
        self.launched = True
        self.proto.run_hot(self)


class FrontProtocol(HttpToolsProtocol):
    front: Front | None = None  # found from the app on first use (sandboxd serve and gunicorn alike)
    header_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._address = ""
        self._tenant: str | None = None  # the connection's tenant, counted once
        self._body_seen = 0
        self._refused = False

    # ------------------------------------------------------------------ the front it serves

    def _front(self) -> Front:
        front = type(self).front
        if front is None:
            app: Any = self.app
            while not hasattr(app, "state") and hasattr(app, "app"):
                app = app.app
            front = type(self).front = app.state.front
        return front

    # ------------------------------------------------------------------ connections

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        front = self._front()
        self._address = self.client[0] if self.client else ""
        front.by_address[self._address] += 1
        if front.by_address[self._address] > front.settings.max_connections_per_address:
            self._refuse(Saturated(
                f"this client address holds {front.by_address[self._address] - 1} connections to this node "
                f"(max_connections_per_address {front.settings.max_connections_per_address})",
                retry_after_s=1.0,
            ))  # fmt: skip
            return
        self._arm(self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        front = self._front()
        front.by_address[self._address] -= 1
        if front.by_address[self._address] <= 0:
            del front.by_address[self._address]
        if self._tenant is not None:
            front.by_tenant[self._tenant] -= 1
            if front.by_tenant[self._tenant] <= 0:
                del front.by_tenant[self._tenant]
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        """Headers not finished in time (the connection is closed), or a body not finished in time (408)."""
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        pending = cycle is not None and not cycle.response_complete and cycle.more_body
        if pending and not getattr(cycle, "response_started", False):
            s = self._front().settings.body_timeout_s
            self._refuse(BadRequest(f"the request body did not arrive within {s:g}s"), status=408)
            return
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._body_seen = 0
        self._arm(self.header_timeout_s)

    # ------------------------------------------------------------------ requests

    def on_headers_complete(self) -> None:
        self._disarm()
        if self._refused:
            return
        front = self._front()
        method = self.parser.get_method()
        path, _, _ = self.url.partition(b"?")
        upgrade = self.parser.should_upgrade() and self._should_upgrade()
        authorization = ""
        forwarded_by = None
        length = None
        for name, value in self.headers:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == FORWARDED_BY_B:
                forwarded_by = value.decode("latin-1")
            elif name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = None
        tenant = ""
        if not upgrade and not front.public(path):
            try:
                tenant = front.auth.tenant_of_header(authorization)
            except Unauthorized as exc:
                self._refuse(exc, path=path)
                return
            if self._tenant is None and front.auth.enabled:
                self._tenant = tenant
                front.by_tenant[tenant] += 1
                if front.by_tenant[tenant] > front.settings.max_connections_per_tenant:
                    self._refuse(Saturated(
                        f"this tenant holds {front.by_tenant[tenant] - 1} connections to this node "
                        f"(max_connections_per_tenant {front.settings.max_connections_per_tenant})",
                        retry_after_s=1.0,
                    ), path=path)  # fmt: skip
                    return
        if length is not None and length > front.settings.max_body_bytes:
            self._refuse(
                PayloadTooLarge(
                    f"request body of {length}+ bytes; this node takes at most {front.settings.max_body_bytes}"
                ),
                path=path,
            )
            return
        route = HOT.get((method, path))
        arg = ""
        if route is None and path.startswith(b"/sessions/") and method in (b"GET", b"DELETE"):
            rest = path[len(b"/sessions/") :]
            if rest and b"/" not in rest:
                route, arg = ("info" if method == b"GET" else "close"), _unquote(rest)
        if route is None or upgrade:
            # The framework's route; its body still bounded here, as a whole, in size and time.
            if method in (b"POST", b"PUT", b"PATCH"):
                self._arm(front.settings.body_timeout_s)
            super().on_headers_complete()
            return
        limit = self.limit_concurrency
        if (
            limit is not None
            and route not in ("healthz", "readyz")
            and (len(self.connections) > limit or len(self.tasks) >= limit)
        ):
            self._refuse(at_capacity(limit), path=path)
            return
        cycle = HotCycle(self, route, arg, tenant, self.parser.should_keep_alive(), time.monotonic())
        cycle.caller = Caller(authorization or None, forwarded_by)  # type: ignore[attr-defined]
        existing = self.cycle
        self.cycle = cycle  # type: ignore[assignment]
        if method == b"POST":
            self._arm(front.settings.body_timeout_s)
        if existing is None or existing.response_complete:
            cycle.runnable = True
        else:
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, None))  # type: ignore[arg-type]

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        self._body_seen += len(body)
        if self._body_seen > self._front().settings.max_body_bytes:
            cap = self._front().settings.max_body_bytes
            self._refuse(PayloadTooLarge(f"request body of {self._body_seen}+ bytes; this node takes at most {cap}"))
            return
        if isinstance(self.cycle, HotCycle):  # read whole (bounded above): nobody else would resume the reading
            if not self.cycle.response_complete:
                self.cycle.body += body
            return
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        if self._refused:
            return
        super().on_message_complete()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if isinstance(cycle, HotCycle):  # a pipelined hot request, now first in line
            cycle.runnable = True
            cycle.launch()
            return
        super()._start_asgi_task(cycle, app)

    # ------------------------------------------------------------------ hot routes

    def run_hot(self, cycle: HotCycle) -> None:
        ctx = contextvars.copy_context()
        ctx.run(CALLER.set, cycle.caller)  # type: ignore[attr-defined]
        task = self.loop.create_task(self._hot(cycle), context=ctx)
        if not task.done():
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _hot(self, cycle: HotCycle) -> None:
        gw = self._front().gateway
        try:
            if cycle.route == "healthz":
                stored = Stored(200, b'{"ok":true}')
            elif cycle.route == "readyz":
                ok, status = await gw.ready()
                stored = Stored(200 if ok else 503, orjson.dumps(status))
            elif cycle.route == "info":
                stored = await gw.info_raw(cycle.arg, cycle.tenant)
            elif cycle.route == "close":
                stored = await gw.close_raw(cycle.arg, cycle.tenant)
            else:
                body = bytes(cycle.body)
                try:
                    doc = orjson.loads(body)
                except orjson.JSONDecodeError as exc:
                    raise BadRequest(f"body: not valid JSON: {exc}") from None
                if not isinstance(doc, dict):
                    raise BadRequest("body: a JSON object is required")
                if cycle.route == "step":
                    stored = await gw.step_raw(body, doc, cycle.tenant, cycle.t0)
                elif cycle.route == "steps":
                    stored = Stored(200, await gw.batch_raw(doc, cycle.tenant, cycle.t0))
                else:
                    stored = await gw.create_raw(doc, cycle.tenant)
        except SandboxdError as exc:
            stored = Stored(exc.status, error_body(exc), exc.retry_after_s)
        except Exception:
            log.exception("a hot route failed")
            stored = Stored(500, error_body(InfraError("internal error")))
        self._respond(cycle, stored)

    def _respond(self, cycle: HotCycle, stored: Stored) -> None:
        if cycle.disconnected or self.transport.is_closing():
            cycle.response_complete = True
            return
        head = [STATUS_LINE[stored.status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        if stored.status != 204:
            head += [JSON_HEADERS, b"content-length: ", str(len(stored.body)).encode(), b"\r\n"]
        if stored.retry_after_s is not None:
            head += [b"retry-after: ", str(max(1, int(stored.retry_after_s + 0.999))).encode(), b"\r\n"]
        if not cycle.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if stored.status != 204:
            head.append(stored.body)
        self.transport.write(b"".join(head))
        cycle.response_complete = True
        if not cycle.keep_alive:
            self.transport.close()
        self.on_response_complete()

    # ------------------------------------------------------------------ refusals

    def _refuse(self, exc: SandboxdError, path: bytes = b"", status: int | None = None) -> None:
        """Answer now, in the surface's error shape, and close the connection: nothing more is read."""
        self._refused = True
        code = status or exc.status
        if path.startswith(b"/run_code"):
            body = orjson.dumps({"detail": exc.message})
        elif path.startswith(b"/envs/"):
            body = orjson.dumps(
                {"detail": exc.message, "code": "VALIDATION_ERROR" if exc.blame == "client" else "CAPACITY_REACHED"}
            )
        elif path.startswith(b"/mcp"):
            body = orjson.dumps(
                {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": f"{exc.code}: {exc.message}"}}
            )
        else:
            err = {"blame": exc.blame, "code": "request_timeout" if code == 408 else exc.code, "message": exc.message}
            body = orjson.dumps({"ok": False, "status": code, "error": {**err, "retry_after_s": exc.retry_after_s}})
        head = [STATUS_LINE[code], JSON_HEADERS, b"content-length: ", str(len(body)).encode(), b"\r\n"]
        if exc.retry_after_s is not None:
            head += [b"retry-after: ", str(max(1, int(exc.retry_after_s + 0.999))).encode(), b"\r\n"]
        if code == 401:
            head.append(b'www-authenticate: Bearer realm="sandboxd"\r\n')
        head += [b"connection: close\r\n\r\n", body]
        if not self.transport.is_closing():
            self.transport.write(b"".join(head))
            self.transport.close()


FORWARDED_BY_B = FORWARDED_BY.encode()


def at_capacity(limit: int) -> SandboxdError:
    return SandboxSetupError(
        f"this front process serves {limit} connections or requests at once (max_connections); retry",
        retry_after_s=1.0,
    )


def _unquote(raw: bytes) -> str:
    from urllib.parse import unquote

    return unquote(raw.decode("latin-1"))


def protocol_class(header_timeout_s: float) -> type[FrontProtocol]:
    """A protocol class of its own per server: the front it serves is found once, and kept on the class."""
    return type("Front", (FrontProtocol,), {"header_timeout_s": header_timeout_s, "front": None})
