"""The MCP surface's server, built with the official ``mcp`` SDK (``mcp_server.py`` says what it serves and
why): its tools, one per enabled kind and one per retail tool, and the step behind each.

Imported at a front's first ``/mcp`` request, not at its start: the SDK costs ~1.5 s of CPU to import,
and most fronts never serve MCP (``mcp_server.McpSurface``).

No ``from __future__ import annotations`` here: the SDK reads the tools'
signatures at run time (the ``Context`` parameter is found by its type).
"""

import copy
import inspect
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import Field, WithJsonSchema
from pydantic_core import to_jsonable_python
from starlette.routing import Route
from starlette.types import ASGIApp

from sandboxd import __version__
from sandboxd.errors import SandboxdError
from sandboxd.front.auth import Auth
from sandboxd.front.gateway import Gateway
from sandboxd.models import SessionCreate, StepRequest, StepResult
from sandboxd.runners.base import RunnerKind

INSTRUCTIONS = (
    "Sandboxed execution for agents. One-shot tools run in a fresh sandbox; pass session_id (from "
    "open_session) to keep state across calls. ok=false results are the program's own outcome; tool "
    "errors are the sandbox's."
)


class ToolFailed(ToolError):
    """Raised inside a tool: the SDK turns it into an ``isError`` result,
    ``"Error executing tool <name>: <code>: <message>"`` (any other exception's text stays on the server)."""


def _tenant(auth: Auth, ctx: Any) -> str:
    request = ctx.request_context.request if ctx is not None else None
    if request is None:
        raise ToolFailed("unauthorized: no HTTP request behind this call")
    try:
        return auth.tenant_of(request)
    except SandboxdError as exc:
        raise ToolFailed(f"{exc.code}: {exc.message}") from None


def _result(res: StepResult) -> dict[str, Any]:
    if (exc := res.not_the_programs()) is not None:
        retry = f" (retry after {exc.retry_after_s:g} s)" if exc.retry_after_s else ""
        raise ToolFailed(f"{exc.code}: {exc.message}{retry}")
    return {
        "ok": res.ok,
        "observation": res.observation,
        "error": None if res.error is None else res.error.model_dump(exclude_none=True),
        "session_id": res.session_id,
        "latency_ms": res.latency_ms,
    }


StepTool = Callable[[Any, str, Any, "str | None", "float | None"], Awaitable[Any]]
PARAM = inspect.Parameter


def _kind_tool(kind: RunnerKind, step: StepTool) -> Callable[..., Awaitable[dict[str, Any]]]:
    """A kind's MCP tool, from its declaration alone (any registered kind, a third party's too): its action
    model's fields as the tool's parameters (their types, defaults and descriptions: the SDK draws the schema
    from the signature), or one ``action`` parameter of the model's type when the model is a union (a root
    model); then ``session_id`` and ``timeout_s``. Arguments left at their defaults are not sent, so the kind's
    own model decides what an absent field means."""
    model = kind.action
    rooted = bool(getattr(model, "__pydantic_root_model__", False))
    fields = {"action": model.model_fields["root"]} if rooted else model.model_fields
    params: list[inspect.Parameter] = []
    defaults: dict[str, Any] = {}
    for name, info in fields.items():
        default = PARAM.empty if info.is_required() else info.get_default(call_default_factory=True)
        defaults[name] = default
        described = Field(description=info.description, discriminator=info.discriminator)
        annotation = Annotated[info.annotation, *info.metadata, described]  # type: ignore[name-defined]
        params.append(PARAM(name, PARAM.KEYWORD_ONLY, annotation=annotation, default=default))
    params += [
        PARAM("session_id", PARAM.KEYWORD_ONLY, annotation=str | None, default=None),
        PARAM("timeout_s", PARAM.KEYWORD_ONLY, annotation=float | None, default=None),
        PARAM("ctx", PARAM.KEYWORD_ONLY, annotation=Context | None, default=None),
    ]

    async def call(**arguments: Any) -> dict[str, Any]:
        ctx, session_id, timeout_s = arguments.pop("ctx", None), arguments.pop("session_id"), arguments.pop("timeout_s")
        # the SDK hands nested models over as objects: the step takes the action as JSON, as any client sends it
        given = {k: to_jsonable_python(v, by_alias=True) for k, v in arguments.items() if v != defaults.get(k)}
        action = given.get("action") if rooted else given
        result: dict[str, Any] = await step(ctx, kind.name, action, session_id, timeout_s)
        return result

    call.__signature__ = inspect.Signature(params, return_annotation=dict[str, Any])  # type: ignore[attr-defined]
    call.__annotations__ = {p.name: p.annotation for p in params} | {"return": dict[str, Any]}
    return call


class McpTools:
    """The SDK's server over one gateway, and its endpoint (``endpoint``: the one route of its app)."""

    def __init__(self, gateway: Gateway, auth: Auth) -> None:
        self.gateway, self.auth = gateway, auth
        # The SDK calls logging.basicConfig with this level; `sandboxd serve` configured logging before (so
        # that is a no-op there), and an app embedded elsewhere should not get INFO logs from a library.
        self.server: MCPServer[Any] = MCPServer(
            "sandboxd", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING"
        )
        self._register()
        # Host checks are for servers on a developer's laptop reachable from a browser; a node is
        # addressed by whatever name its Service or load balancer has, and authenticates by key.
        app = self.server.streamable_http_app(
            stateless_http=True,
            json_response=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        # The SDK's app is one route (POST/GET/DELETE /mcp) when it does no auth of its own: its endpoint
        # is taken with no mount (a mount at /mcp answers POST /mcp with a redirect to /mcp/).
        (route,) = app.routes
        assert isinstance(route, Route)
        self.endpoint: ASGIApp = route.endpoint

    async def _step(self, ctx: Any, runner: str, action: Any, session_id: str | None, timeout_s: float | None) -> Any:
        tenant = _tenant(self.auth, ctx)
        try:
            req = StepRequest(runner=runner, action=action, session_id=session_id, timeout_s=timeout_s)
        except ValueError as exc:
            raise ToolFailed(f"bad_request: {exc}") from None
        return _result(await self.gateway.step(req, tenant))

    def _register(self) -> None:
        """``open_session`` and ``close_session``; a tool per enabled kind, its parameters the fields of the kind's
        action model (``_kind_tool``); and, for the retail API, a tool per retail tool."""
        server = self.server
        step = self._step

        @server.tool(description="Open a sandboxd session of a runner kind; its state persists across calls.")
        async def open_session(
            runner: str, ttl_s: float | None = None, idle_timeout_s: float | None = None, ctx: Context | None = None
        ) -> dict[str, Any]:
            tenant = _tenant(self.auth, ctx)
            try:
                info = await self.gateway.create_session(
                    SessionCreate(runner=runner, ttl_s=ttl_s, idle_timeout_s=idle_timeout_s), tenant
                )
            except SandboxdError as exc:
                raise ToolFailed(f"{exc.code}: {exc.message}") from None
            except ValueError as exc:
                raise ToolFailed(f"bad_request: {exc}") from None
            return info.model_dump()

        @server.tool(description="Close a sandboxd session and free its sandbox.")
        async def close_session(session_id: str, ctx: Context | None = None) -> dict[str, Any]:
            tenant = _tenant(self.auth, ctx)
            try:
                await self.gateway.close_session(session_id, tenant)
            except SandboxdError as exc:
                raise ToolFailed(f"{exc.code}: {exc.message}") from None
            return {"closed": session_id}

        for kind in self.gateway.kinds.values():
            description = f"{kind.title}: one step, one-shot or the next in session_id's session (open_session)."
            server.add_tool(_kind_tool(kind, step), name=kind.tool or f"run_{kind.name}", description=description)

        if "tools" in self.gateway.kinds:
            self._register_retail()

    def _register_retail(self) -> None:
        """Each retail tool as its own MCP tool, advertising the tool's own JSON schema for ``args``."""
        from sandboxd.runners.tools.tools import openai_tools

        for spec in openai_tools():
            fn = spec["function"]
            name = fn["name"]
            handler = self._retail_handler(name, fn["parameters"])
            self.server.add_tool(handler, name=f"retail_{name}", description=fn["description"])

    def _retail_handler(self, name: str, schema: dict[str, Any]) -> Callable[..., Awaitable[dict[str, Any]]]:
        """The tool's function; ``args`` carries the tool's own JSON schema in its annotation, which is how the
        SDK's public API lets a tool advertise a schema it cannot derive from a Python type."""
        step = self._step

        async def call(
            args: dict[str, Any], session_id: str | None = None, ctx: Context | None = None
        ) -> dict[str, Any]:
            result: dict[str, Any] = await step(ctx, "tools", {"tool": name, "args": args}, session_id, None)
            return result

        call.__annotations__["args"] = Annotated[dict[str, Any], WithJsonSchema(copy.deepcopy(schema))]
        return call
