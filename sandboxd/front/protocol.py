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
whole (408: a body trickled one byte at a time cannot hold a connection, whatever the method), the request
line and headers bounded in size (431), connections bounded per client address and per tenant (one client
cannot take every connection; a WebSocket counts until it closes), and ``/healthz`` and ``/readyz``
answered even when the connection limit is reached. A refusal is answered in the surface's error shape, and
in its turn: a pipelined request refused while an earlier one runs is answered after that one.

Paths are decided as the app routes them (uvicorn's parse: no query, no fragment, percent-decoded), so a
path cannot look public here and be routed elsewhere there.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import Counter
from typing import Any
from urllib.parse import unquote_to_bytes

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from sandboxd.answers import error_body
from sandboxd.cluster.forward import CALLER, FORWARDED_BY, Caller
from sandboxd.config import NodeSettings
from sandboxd.errors import (
    AtCapacity,
    BadRequest,
    ClientError,
    HeadersTooLarge,
    InfraError,
    PayloadTooLarge,
    RequestTimeout,
    SandboxdError,
    Saturated,
    Unauthorized,
)
from sandboxd.front.auth import BY_SANDBOX_ID, Auth
from sandboxd.front.gateway import Gateway
from sandboxd.front.surfaces import DropConnection, Surfaces
from sandboxd.stores.idempotency import Stored
from sandboxd.tally import CONNECTIONS

log = logging.getLogger("sandboxd.front")

HOT = {
    (b"GET", b"/healthz"): "healthz",  # here, not behind the connection limit: probes cannot be starved
    (b"GET", b"/readyz"): "readyz",
    (b"POST", b"/rollout/step"): "step",
    (b"POST", b"/rollout/steps"): "steps",
    (b"POST", b"/sessions"): "create",
}
JSON_HEADERS = b"content-type: application/json\r\n"


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class Front:
    """What every connection of one front process shares: its gateway, its keys, its counts."""

    def __init__(self, gateway: Gateway, auth: Auth, settings: NodeSettings, surfaces: Surfaces) -> None:
        self.gateway = gateway
        self.auth = auth
        self.settings = settings
        self.surfaces = surfaces
        self.by_address: Counter[str] = Counter()  # connections not authenticated (yet), per client address

    def count_address(self, address: str) -> SandboxdError | None:
        """Count one more connection from ``address`` that has not authenticated; the refusal past the cap."""
        self.by_address[address] += 1
        if self.by_address[address] <= self.settings.max_connections_per_address:
            return None
        return Saturated(
            f"this client address holds {self.by_address[address] - 1} connections to this node that have not "
            f"authenticated (max_connections_per_address {self.settings.max_connections_per_address})",
            retry_after_s=1.0,
        )

    def uncount_address(self, address: str) -> None:
        self.by_address[address] -= 1
        if self.by_address[address] <= 0:
            del self.by_address[address]

    def count_tenant(self, tenant: str) -> SandboxdError | None:
        """Count one more connection of ``tenant`` (node-wide: every front's count); the refusal past the cap."""
        held = self.gateway.tenant_count(tenant, CONNECTIONS, 1)
        if held <= self.settings.max_connections_per_tenant:
            return None
        return Saturated(
            f"this tenant holds {held - 1} connections to this node "
            f"(max_connections_per_tenant {self.settings.max_connections_per_tenant})",
            retry_after_s=1.0,
        )

    def uncount_tenant(self, tenant: str) -> None:
        self.gateway.tenant_count(tenant, CONNECTIONS, -1)

    def refusal(self, exc: SandboxdError, path: bytes) -> bytes:
        """A refusal's whole answer, ``connection: close``: what a route of ``path``'s surface answers for ``exc``
        (its shape, status and headers), written by the front door before any route runs."""
        answer = self.surfaces.render(exc, path)
        head = [STATUS_LINE[answer.status_code]]
        for name, value in answer.raw_headers:
            head += [name, b": ", value, b"\r\n"]
        if answer.status_code == 401:
            head.append(b'www-authenticate: Bearer realm="sandboxd"\r\n')
        head += [b"connection: close\r\n\r\n", bytes(answer.body)]
        return b"".join(head)


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
        self.wants_continue = False
        self.launched = False
        self.message_event = self  # uvicorn calls message_event.set() on body and end of message

    def set(self) -> None:
        self.launch()

    def launch(self) -> None:
        if self.launched or not self.runnable or self.more_body or self.disconnected:
            return
        self.launched = True
        self.proto.run_hot(self)


class Refusal:
    """A refusal waiting in the pipeline behind an earlier request still running on its connection."""

    response_complete = False
    more_body = False

    def __init__(self, data: bytes) -> None:
        self.data = data


class FrontProtocol(HttpToolsProtocol):
    front: Front | None = None  # found from the app on first use (sandboxd serve and gunicorn alike)
    header_timeout_s = 10.0
    max_header_bytes = 64 << 10

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The limit is checked here, for every route, in the surface's shape (uvicorn's own answers plain
        # text); /healthz and /readyz are exempt.
        self.max_concurrency = self.limit_concurrency
        self.limit_concurrency = None
        self._deadline: asyncio.TimerHandle | None = None
        self._address = ""
        self._tenant: str | None = None  # the connection's tenant, counted once
        self._counted = False
        self._head_bytes = 0
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
        # Counted by address until it authenticates, then by tenant only: one tenant's many connections (1,024
        # idle WebSockets) must not refuse every other tenant behind the same ingress, NAT or sidecar.
        refusal = front.count_address(self._address)
        self._counted = True
        if refusal is not None:
            self._refuse(refusal)
            return
        self._arm(self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._release()
        super().connection_lost(exc)

    def _release(self) -> None:
        if self._counted:
            self._counted = False
            front = self._front()
            if self._tenant is None:
                front.uncount_address(self._address)
            else:
                front.uncount_tenant(self._tenant)

    def handle_websocket_upgrade(self) -> None:
        """The WebSocket protocol takes the connection over: the connection stays counted (its address, its
        tenant) until the WebSocket closes, not until this protocol would have seen it close (never)."""
        self._disarm()
        super().handle_websocket_upgrade()
        ws: Any = self.transport.get_protocol()
        lost = ws.connection_lost

        def connection_lost(exc: Exception | None) -> None:
            self._release()
            lost(exc)

        ws.connection_lost = connection_lost

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
            self._refuse(RequestTimeout(f"the request body did not arrive whole within {s:g}s"), own=True)
            return
        self.transport.close()

    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        self._body_seen = 0
        self._head_bytes = 0
        self._arm(self.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        if self._refused:
            return
        self._head_bytes += len(url)
        if self._head_bytes > self.max_header_bytes:
            self._refuse(HeadersTooLarge(f"request line and headers over {self.max_header_bytes} bytes"))
            return
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > self.max_header_bytes:
            try:  # the request line is whole by now: its surface's shape (the E2B SDK's under /v2, ...)
                path = request_path(self.url)
            except httptools.HttpParserInvalidURLError:
                path = b""
            self._refuse(HeadersTooLarge(f"request line and headers over {self.max_header_bytes} bytes"), path=path)
            return
        super().on_header(name, value)

    # ------------------------------------------------------------------ requests

    def on_headers_complete(self) -> None:
        self._disarm()
        if self._refused:
            return
        front = self._front()
        method = self.parser.get_method()
        try:
            path = request_path(self.url)
        except httptools.HttpParserInvalidURLError:
            self._refuse(ClientError("the request's URL is not valid"))
            return
        upgrade = self.parser.should_upgrade() and self._should_upgrade()
        authorization: str | None = None
        credentials: dict[bytes, str] = {}
        forwarded_by = None
        length = None
        host = b""
        for name, value in self.headers:
            if name == b"authorization":
                if authorization is not None:  # which one counts would differ between layers: neither
                    self._refuse(ClientError("more than one Authorization header"), path=path)
                    return
                authorization = value.decode("latin-1")
            elif name in front.surfaces.credentials:  # a surface's own (E2B's key, a sandbox's token, ...)
                if name in credentials:
                    self._refuse(ClientError(f"more than one {name.decode()} header"), path=path)
                    return
                credentials[name] = value.decode("latin-1")
            elif name == FORWARDED_BY_B:
                forwarded_by = value.decode("latin-1")
            elif name == b"host":
                if host:  # RFC 9112: 400; the layers would disagree on which names the sandbox
                    self._refuse(ClientError("more than one Host header"), path=path)
                    return
                host = value
            elif name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = None
        if host:
            for rule in front.surfaces.host_rules:  # a header the host implies (E2B names a sandbox by it)
                if (implied := rule(path, host, credentials)) is not None:
                    self.headers.append(implied)
                    credentials[implied[0]] = implied[1].decode("latin-1")
        tenant = ""
        public = front.surfaces.is_public(path)
        if not public or authorization is not None or credentials:
            # A WebSocket authenticates in its route (its refusal is a close frame there), but one that carries
            # a key counts for its tenant here, from its handshake to its close; so does a public path's request
            # that carries one (a client's pings must not hold its address's shared count).
            try:
                tenant = front.surfaces.tenant(front.auth, authorization, credentials, path)
            except Unauthorized as exc:
                if not upgrade and not public:
                    self._refuse(exc, path=path)
                    return
            else:
                # (a call by a sandbox's id alone names no tenant yet: it stays its address's)
                if self._tenant is None and front.auth.enabled and self._counted and tenant != BY_SANDBOX_ID:
                    self._tenant = tenant  # from now on its tenant's, no longer its address's
                    front.uncount_address(self._address)
                    refusal = front.count_tenant(tenant)
                    if refusal is not None:
                        self._refuse(refusal, path=path)
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
                route, arg = ("info" if method == b"GET" else "close"), rest.decode("utf-8", "replace")
        limit = self.max_concurrency
        if (
            limit is not None
            and route not in ("healthz", "readyz")
            and (len(self.connections) > limit or len(self.tasks) >= limit)
        ):
            self._refuse(at_capacity(limit), path=path)
            return
        # Whatever the method, the rest of the request (its body, if any) arrives whole within its deadline.
        self._arm(front.settings.body_timeout_s)
        if route is None or upgrade:
            super().on_headers_complete()  # the framework's route; its body still bounded here
            if self.pipeline and self.pipeline[0][0] is self.cycle:
                self._disarm()  # queued behind an earlier request: its deadline starts with its turn
            return
        cycle = HotCycle(self, route, arg, tenant, self.parser.should_keep_alive(), time.monotonic())
        cycle.caller = Caller(authorization, forwarded_by)  # type: ignore[attr-defined]
        cycle.wants_continue = self.expect_100_continue and bool(length)
        existing = self.cycle
        self.cycle = cycle  # type: ignore[assignment]
        if existing is None or existing.response_complete:
            self._begin(cycle)
        else:
            self._disarm()  # queued behind an earlier request: its deadline starts with its turn
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, None))  # type: ignore[arg-type]

    def _begin(self, cycle: HotCycle) -> None:
        """A hot request is first in line: its body may come (``Expect: 100-continue`` answered), it may run."""
        cycle.runnable = True
        if cycle.wants_continue and cycle.more_body:
            self.transport.write(CONTINUE)

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        self._body_seen += len(body)
        if self._body_seen > self._front().settings.max_body_bytes:
            cap = self._front().settings.max_body_bytes
            self._refuse(
                PayloadTooLarge(f"request body of {self._body_seen}+ bytes; this node takes at most {cap}"), own=True
            )
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
            if cycle.more_body:
                self._arm(self._front().settings.body_timeout_s)
            self._begin(cycle)
            cycle.launch()
            return
        if isinstance(cycle, Refusal):  # a refusal whose turn came: the earlier answers are written
            self._disarm()
            if not self.transport.is_closing():
                self.transport.write(cycle.data)
                self.transport.close()
            return
        if cycle.more_body and self._deadline is None:
            self._arm(self._front().settings.body_timeout_s)  # a pipelined request's turn: its body may come
        super()._start_asgi_task(cycle, self._dropping(cycle, app))

    def _dropping(self, cycle: Any, app: Any) -> Any:
        """The app, for whom ``DropConnection`` closes the connection mid-answer, as a proxy in front would."""

        async def run(scope: Any, receive: Any, send: Any) -> None:
            try:
                await app(scope, receive, send)
            except DropConnection:
                cycle.disconnected = True  # uvicorn: an answer it need not finish, and nothing to log
                self.transport.close()

        return run

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

    def _refuse(self, exc: SandboxdError, path: bytes = b"", own: bool = False) -> None:
        """Answer in the surface's error shape and close the connection: nothing more is read.

        HTTP/1.1 answers in order: a refusal must not overtake an earlier request's answer (a client, or a
        proxy sharing the connection, would take it for that request's). So when an earlier request on this
        connection is unanswered, the refusal waits in the pipeline for its turn. ``own``: ``self.cycle`` is
        the refused request's own (its body was refused); otherwise the refusal came at the request's head,
        before it had a cycle, and ``self.cycle`` is an earlier request's.
        """
        self._refused = True
        self._disarm()
        data = self._front().refusal(exc, path)
        current = self.cycle
        if current is not None and not current.response_complete:
            if own:
                queued = [entry for entry in self.pipeline if entry[0] is current]
                for entry in queued:  # it gives its place in line to its refusal
                    self.pipeline.remove(entry)
                wait = bool(queued)
            else:
                wait = True
            if wait:
                self.flow.pause_reading()
                self.pipeline.appendleft((Refusal(data), None))  # type: ignore[arg-type]
                return
        if not self.transport.is_closing():
            self.transport.write(data)
            self.transport.close()


def request_path(url: bytes) -> bytes:
    """The path the app will route, as uvicorn makes it: without query and fragment, percent-decoded."""
    if b"%" not in url and b"#" not in url and url[:1] == b"/":
        return url.partition(b"?")[0]  # the usual request line: nothing to decode
    path: bytes = httptools.parse_url(url).path or b""
    return unquote_to_bytes(path) if b"%" in path else path


FORWARDED_BY_B = FORWARDED_BY.encode()


def at_capacity(limit: int) -> SandboxdError:
    return AtCapacity(f"this front process serves {limit} connections or requests at once (max_connections); retry")


def protocol_class(settings: NodeSettings) -> type[FrontProtocol]:
    """A protocol class of its own per server: the front it serves is found once, and kept on the class."""
    attrs = {"header_timeout_s": settings.header_timeout_s, "max_header_bytes": settings.max_header_bytes}
    return type("Front", (FrontProtocol,), {**attrs, "front": None})
