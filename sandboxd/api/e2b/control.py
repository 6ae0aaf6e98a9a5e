"""The E2B API's control plane (``X-API-Key``: a node key; SDKs before 2.46 check it has the form
``e2b_<hex>``): create, get, list with metadata filters, kill, set_timeout, connect, in both generations of
E2B's routes (``/sandboxes``, and ``/v2/sandboxes`` from SDK 2.46 on). Everything else under E2B's heads
(pause, snapshots, fork, templates, volumes, ...) is refused in E2B's shape, which every SDK raises as its own
exception.

No ``from __future__ import annotations`` here: FastAPI reads the routes' ``Annotated[..., Depends()]``
signatures at run time.
"""

import hashlib
import urllib.parse
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from sandboxd.api.e2b.labels import IMAGE_LABEL, OPEN_LABEL, PARENT_LABEL, TEMPLATE_LABEL
from sandboxd.api.e2b.models import Connect, NewSandbox, Refresh, Timeout
from sandboxd.api.e2b.paths import CONTROL_HEADS
from sandboxd.api.e2b.sandboxes import CONTAINER, HOME, TEMPLATES, Sandboxes
from sandboxd.api.e2b.shapes import e2b_error
from sandboxd.api.surface import surface_router
from sandboxd.cluster.forward import CALLER, FORWARDED_BY, Caller
from sandboxd.errors import BadRequest, NotFound, NotServed
from sandboxd.front.surfaces import json_response
from sandboxd.models import SessionCreate, SessionInfo


def _digest(key: str) -> str:
    """A client's key as the node keeps it: any length the client sent, one length kept."""
    return hashlib.sha256(key.encode()).hexdigest()


def router(sandboxes: Sandboxes) -> APIRouter:
    # E2B's contract is E2B's own API document, not ours: these routes stay out of /openapi.json.
    control = surface_router(e2b_error, tags=["e2b"], include_in_schema=False)
    gateway, auth = sandboxes.gateway, sandboxes.auth
    session_named, sandbox_info, described = sandboxes.session_named, sandboxes.info, sandboxes.described

    async def api_key(request: Request) -> str:
        """The control plane's caller: ``X-API-Key`` (or ``Authorization``). A request forwarded to another node
        carries the key as a bearer token, which that node checks itself."""
        tenant = auth.tenant_of_e2b(request.headers, data_plane=False)
        key = request.headers.get("x-api-key")
        authorization = request.headers.get("authorization") or (f"Bearer {key}" if key is not None else None)
        CALLER.set(Caller(authorization, request.headers.get(FORWARDED_BY)))
        return tenant

    Tenant = Annotated[str, Depends(api_key)]

    async def create_sandbox(req: NewSandbox, tenant: str, idempotency_key: str | None) -> Response:
        """A sandbox: a python session with the template's name and the metadata as labels. The same
        ``Idempotency-Key`` again (the SDK's retry of a create whose answer it lost) is the same sandbox."""
        if why := req.refused():
            raise NotServed(why)
        s = gateway.settings
        labels = sandboxes.labels_of(req.metadata or {}, req.template_id)
        options: dict[str, Any]
        if req.template_id in TEMPLATES:
            if "python" not in sandboxes.sizes:
                raise NotServed("this node does not run python sandboxes (enable the python runner)")
            runner, options = "python", {"keep_processes": True}  # background commands outlive their call
        elif CONTAINER in gateway.kinds:
            # A custom template: an image of the node's store, its sandbox a container session whose python
            # (the image's own) runs the code interpreter's cells and envd's calls; its envVars are set by
            # ``settle``, as a python sandbox's.
            runner, options = CONTAINER, {"image": req.template_id, "workdir": HOME}
            labels[IMAGE_LABEL] = "1"
        else:
            raise BadRequest(
                f"template {req.template_id!r} is not served here; this node serves {list(TEMPLATES)} (custom "
                "templates are images of the node's store, served where the container kind runs)"
            )
        if req.secure is False and s.e2b_insecure_sandboxes:
            labels[OPEN_LABEL] = "1"  # its id is its credential (docs/integrations.md), as the operator allowed
        create = SessionCreate(
            runner=runner,
            options=options,
            ttl_s=min(float(req.timeout), s.session_ttl_s),
            idle_timeout_s=min(float(req.timeout), s.session_idle_s),
            labels=labels,
            idempotency_key=f"e2b:{_digest(idempotency_key)}" if idempotency_key else None,
        )
        try:
            info = await gateway.create_session(create, tenant)
        except NotFound as exc:  # the image is not on this node
            if runner != CONTAINER:
                raise
            raise NotFound(f"template {req.template_id!r} is not served here: {exc.message}") from None
        sandboxes.calls.know(info.session_id, runner)
        await sandboxes.settle(info.session_id, tenant, req.env_vars or {}, runner)
        return json_response(described(info, tenant, detail=False), 201)

    @control.post("/sandboxes", status_code=201)
    async def create_v1(req: NewSandbox, tenant: Tenant) -> Response:
        return await create_sandbox(req, tenant, None)

    @control.post("/v2/sandboxes", status_code=201)
    async def create_v2(req: NewSandbox, tenant: Tenant, request: Request) -> Response:
        return await create_sandbox(req, tenant, request.headers.get("idempotency-key"))

    @control.get("/sandboxes/{sandbox_id}")
    async def get_sandbox(sandbox_id: str, tenant: Tenant) -> Response:
        return json_response(described(await sandbox_info(tenant, session_named(sandbox_id)), tenant))

    async def listing(tenant: str, request: Request) -> Response:
        query = request.query_params
        try:
            limit = int(query.get("limit") or 0)
        except ValueError:
            raise BadRequest(f"limit: a whole number, not {query.get('limit', '')[:40]!r}") from None
        if query.get("state") and "running" not in query.getlist("state") and "running" not in query["state"]:
            return json_response([])  # nothing here is ever paused
        wanted: dict[str, str] = {}
        for raw in query.getlist("metadata"):  # the SDK quotes each name and value, then url-encodes the pairs
            for k, v in urllib.parse.parse_qsl(raw, keep_blank_values=True):
                wanted[urllib.parse.unquote(k)] = urllib.parse.unquote(v)
        template = query.get("template")
        if wanted:
            sessions = (await gateway.select_sessions(tenant, wanted, "list"))["sessions"]
        else:  # every sandbox of the tenant: each carries its template's label, a custom template's its image's
            selectors = [{TEMPLATE_LABEL: name} for name in TEMPLATES] + [{IMAGE_LABEL: "1"}]
            sessions = [
                found
                for selector in selectors
                for found in (await gateway.select_sessions(tenant, selector, "list"))["sessions"]
            ]
        infos = [SessionInfo.model_validate(raw) for raw in sessions]
        listed = [
            described(info, tenant)
            for info in infos
            if TEMPLATE_LABEL in info.labels and (template is None or info.labels[TEMPLATE_LABEL] == template)
        ]
        listed.sort(key=lambda d: d["startedAt"], reverse=query.get("order", "desc") != "asc")
        return json_response(listed[:limit] if limit > 0 else listed)

    @control.get("/v2/sandboxes")
    async def list_sandboxes(request: Request, tenant: Tenant) -> Response:
        """The caller's running sandboxes; ``metadata`` filters as E2B's does (every pair must match)."""
        return await listing(tenant, request)

    @control.get("/sandboxes")
    async def list_sandboxes_v1(request: Request, tenant: Tenant) -> Response:
        return await listing(tenant, request)

    @control.delete("/sandboxes/{sandbox_id}", status_code=204)
    async def kill_sandbox(sandbox_id: str, tenant: Tenant) -> Response:
        sandbox_id = session_named(sandbox_id)
        await sandbox_info(tenant, sandbox_id)
        await gateway.close_session(sandbox_id, tenant, "killed (E2B)")
        await gateway.select_sessions(tenant, {PARENT_LABEL: sandbox_id}, "close")
        return Response(status_code=204)

    async def ends_in(sandbox_id: str, tenant: str, seconds: int) -> SessionInfo:
        """The sandbox ends ``seconds`` from now (at least 1; within the node's session TTL from its creation)."""
        await sandbox_info(tenant, sandbox_id)
        return await gateway.set_timeout(sandbox_id, tenant, float(max(seconds, 1)))

    @control.post("/sandboxes/{sandbox_id}/timeout", status_code=204)
    async def set_timeout(sandbox_id: str, req: Timeout, tenant: Tenant) -> Response:
        await ends_in(session_named(sandbox_id), tenant, req.timeout)
        return Response(status_code=204)

    @control.post("/sandboxes/{sandbox_id}/refreshes", status_code=204)
    async def refresh(sandbox_id: str, req: Refresh, tenant: Tenant) -> Response:
        await ends_in(session_named(sandbox_id), tenant, req.duration)
        return Response(status_code=204)

    async def connected(sandbox_id: str, tenant: str, timeout: int) -> Response:
        """A running sandbox, again: its timeout extended to ``timeout`` from now if it would end sooner, never
        shortened (E2B's rule; E2B would also resume a paused one, and nothing here pauses)."""
        info = await sandbox_info(tenant, sandbox_id)
        if info.expires_in_s < timeout:
            info = await ends_in(sandbox_id, tenant, timeout)
        return json_response(described(info, tenant, detail=False))

    @control.post("/sandboxes/{sandbox_id}/connect")
    async def connect_v1(sandbox_id: str, req: Timeout, tenant: Tenant) -> Response:
        return await connected(session_named(sandbox_id), tenant, req.timeout)

    @control.post("/v2/sandboxes/{sandbox_id}/connect")
    async def connect_v2(sandbox_id: str, tenant: Tenant, req: Connect | None = None) -> Response:
        return await connected(session_named(sandbox_id), tenant, (req or Connect()).timeout)

    @control.post("/sandboxes/{sandbox_id}/pause")
    async def pause(sandbox_id: str, tenant: Tenant) -> Response:
        await sandbox_info(tenant, session_named(sandbox_id))
        raise NotServed("pause is not served: a sandbox here is a live process; extend it with set_timeout")

    @control.post("/sandboxes/{sandbox_id}/resume")
    async def resume(sandbox_id: str, tenant: Tenant) -> Response:
        await sandbox_info(tenant, session_named(sandbox_id))
        raise NotServed("resume is not served: nothing here is ever paused")

    @control.post("/sandboxes/{sandbox_id}/fork")
    async def fork(sandbox_id: str, tenant: Tenant) -> Response:
        await sandbox_info(tenant, session_named(sandbox_id))
        raise NotServed(
            "fork of an E2B sandbox is not served: its copies would share one /home/user (a python session's "
            "copies share its namespaces and each works in a directory of its own); native python sessions "
            "fork with POST /sessions/{id}/fork"
        )

    # Last, under every head of E2B's API: what is not served above is refused in E2B's shape, a 501 each SDK
    # raises as its own exception (a 404 would read as "no such sandbox": kill and delete_snapshot return
    # False on one), never the node's own 404/405 (no "code": the generated client dies of a KeyError).
    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    for head in CONTROL_HEADS:

        async def not_served(request: Request, tenant: Tenant) -> Response:
            raise NotServed(
                f"{request.method} {request.url.path} is not served by this node's E2B API; it serves sandboxes "
                "of the code interpreter's templates (create, connect, list, get, kill, set_timeout) and their "
                "code, commands and files"
            )

        control.add_api_route(f"/{head}{{rest:path}}", not_served, methods=methods, include_in_schema=False)
    return control
