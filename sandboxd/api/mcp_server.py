"""MCP (streamable HTTP) at ``/mcp``: every enabled runner kind as tools, for agent inference backends.

Built on the official ``mcp`` SDK's server, stateless and answering in JSON: a
tool call is one sandboxd step, so no MCP session state is needed, and any
gateway process can answer any call. State lives in sandboxd sessions, named
explicitly: ``open_session`` returns an id that the step tools take as
``session_id`` (and ``close_session`` ends it; idle ones are reaped like any
session). The caller's ``Authorization: Bearer <key>`` header picks the tenant
exactly as on the native API.

What a tool returns follows the blame rule: a program's own failure (an
exception, a non-zero exit, a selector that matches nothing, an SQL error) is
a normal result with ``ok: false`` -- an observation for the agent; anything
that is not the program's (a bad argument, an unknown session, an overloaded
node, a worker that died) is an MCP tool error (``isError``) whose text starts
with the sandboxd error code, so the agent framework can tell "try something
else" from "the sandbox failed".

The SDK's part is ``mcp_tools.py``, imported at a front's first ``/mcp`` request (``McpSurface``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sandboxd.errors import SandboxdError
from sandboxd.front.auth import Auth
from sandboxd.front.gateway import Gateway
from sandboxd.front.surfaces import Surface, json_response, retry_headers

if TYPE_CHECKING:
    from sandboxd.api.mcp_tools import McpTools

PATH = "/mcp"


def mcp_error(exc: SandboxdError) -> Response:
    """A refusal before the MCP server saw the call (no key, too large, at capacity): a JSON-RPC error whose
    message starts with the sandboxd error code, as the tools' errors do; the HTTP status is the refusal's."""
    error = {"code": -32001, "message": f"{exc.code}: {exc.message}"}
    return json_response({"jsonrpc": "2.0", "id": None, "error": error}, exc.status, retry_headers(exc.retry_after_s))


SURFACE = Surface("mcp", mcp_error, prefixes=(b"/mcp",))


class NoStream:
    """``GET /mcp`` is 405, as the spec asks of a server that offers no SSE stream at its endpoint.

    The SDK's stateless server answered 200 and then dropped the connection ~30 s later ("ASGI callable
    returned without completing response"): an anonymous client could hold connections that way. (A class,
    not a function: Starlette's ``Route`` runs an object as a plain ASGI app.)
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            response = JSONResponse(
                {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": "no SSE stream here: POST"}},
                status_code=405,
                headers={"allow": "POST, DELETE"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class McpSurface:
    """The MCP server over one gateway; ``routes`` (just ``/mcp``) join the node's app.

    The server is built at the first ``/mcp`` request, not when the front starts: the SDK costs ~1.5 s of
    CPU to import (a fifth of a node's start), and most fronts never serve MCP. That first request waits
    for it (the import runs in a thread, so the front's other requests go on); its session manager then
    runs until the app stops (``running``)."""

    def __init__(self, gateway: Gateway, auth: Auth) -> None:
        self.gateway, self.auth = gateway, auth
        self.routes: list[BaseRoute] = [Route(PATH, endpoint=NoStream(self._serve))]
        self._endpoint: ASGIApp | None = None
        self._lock = asyncio.Lock()
        self._manager: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The app's lifetime: the SDK's session manager, once started, stops with it."""
        try:
            yield
        finally:
            self._stop.set()
            if self._manager is not None:
                await self._manager

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self._endpoint or await self._start()
        await endpoint(scope, receive, send)

    async def _start(self) -> ASGIApp:
        async with self._lock:
            if self._endpoint is None:
                module = await asyncio.to_thread(importlib.import_module, "sandboxd.api.mcp_tools")
                tools: McpTools = module.McpTools(self.gateway, self.auth)
                started = asyncio.get_running_loop().create_future()
                self._manager = asyncio.create_task(self._manage(tools, started))
                await started  # its failure to start is this request's (a 500); the next one tries again
                self._endpoint = tools.endpoint
        return self._endpoint

    async def _manage(self, tools: McpTools, started: asyncio.Future[None]) -> None:
        """The SDK's session manager must run while its app serves (a mounted app's lifespan never runs)."""
        try:
            async with tools.server.session_manager.run():
                started.set_result(None)
                await self._stop.wait()
        except Exception as exc:
            if started.done():
                raise  # it failed while serving: the app's stop reports it
            started.set_exception(exc)
