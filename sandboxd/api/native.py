"""sandboxd's own surface: rollout steps, sessions and runner descriptions.

No ``from __future__ import annotations`` here: FastAPI reads the routes'
``Annotated[..., Depends(auth)]`` signatures at run time, and a local alias
written as a string would not resolve.
"""

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import ValidationError
from starlette.responses import Response

from sandboxd.api.surface import surface_router
from sandboxd.errors import BadRequest
from sandboxd.front.auth import Auth
from sandboxd.front.gateway import Gateway
from sandboxd.front.surfaces import Surface, json_response, native_error, retry_headers
from sandboxd.images.store import ImageStore
from sandboxd.models import (
    BatchRequest,
    BatchResult,
    ForkResult,
    SessionCreate,
    SessionFork,
    SessionInfo,
    SessionKeepalive,
    SessionList,
    SessionSelect,
    SessionsSelected,
    SessionStatuses,
    SessionStatusRequest,
    SessionTimeout,
    StepRequest,
    StepResult,
    error_responses,
)
from sandboxd.runners.base import validation_message

# Every route can answer these: auth, body limits, validation, and our own bugs.
COMMON = (401, 408, 413, 422, 500)
# Its hot routes (a step, a batch, a session's creation, look-up and close) are served by the front door itself
# (front/protocol.py), in this shape too.
SURFACE = Surface("native", native_error, prefixes=(b"/rollout/", b"/sessions", b"/runners", b"/images"))


def router(gateway: Gateway, auth: Auth) -> APIRouter:
    api = surface_router(SURFACE.render)
    Tenant = Annotated[str, Depends(auth)]

    @api.post(
        "/rollout/step",
        response_model=StepResult,
        responses=error_responses(*COMMON, 404, 409, 410, 429, 502, 503, 504),
        tags=["rollout"],
    )
    async def rollout_step(req: StepRequest, tenant: Tenant) -> Response:
        """Run one step: one-shot in a fresh sandbox, or inside ``session_id``'s sandbox."""
        result = await gateway.step(req, tenant)
        retry = result.error.retry_after_s if result.error else None
        return json_response(result.model_dump(), result.status, retry_headers(retry))

    @api.post("/rollout/steps", response_model=BatchResult, responses=error_responses(*COMMON), tags=["rollout"])
    async def rollout_steps(req: BatchRequest, tenant: Tenant) -> Response:
        """Run a batch of steps concurrently; results in request order, each with its own status."""
        results = await gateway.batch(req.steps, tenant)
        return json_response({"results": [r.model_dump() for r in results]})

    @api.post(
        "/sessions",
        response_model=SessionInfo,
        status_code=201,
        responses=error_responses(*COMMON, 429, 502, 503),
        tags=["sessions"],
    )
    async def create_session(req: SessionCreate, tenant: Tenant) -> Response:
        """Create a session pinned to one worker; its state persists across steps until closed or reaped."""
        info = await gateway.create_session(req, tenant)
        return json_response(info.model_dump(), 201)

    @api.get(
        "/sessions/{session_id}",
        response_model=SessionInfo,
        responses=error_responses(*COMMON, 404, 410),
        tags=["sessions"],
    )
    async def get_session(session_id: str, tenant: Tenant) -> Response:
        return json_response((await gateway.session_info(session_id, tenant)).model_dump())

    @api.post(
        "/sessions/{session_id}/fork",
        response_model=ForkResult,
        status_code=201,
        responses=error_responses(*COMMON, 404, 409, 410, 429, 502, 503),
        tags=["sessions"],
    )
    async def fork_session(session_id: str, req: SessionFork, tenant: Tenant) -> Response:
        """``n`` new sessions, each starting from a copy of this session's state now (a GRPO group's shared
        prefix); the source goes on untouched. All or none: 429 when the quota or a cap cannot take all ``n``.
        ``notes`` says what could not be copied. 422 for kinds whose sessions cannot be forked, saying why."""
        result = await gateway.fork_session(session_id, req, tenant)
        return json_response(result.model_dump(), 201)

    @api.get("/sessions", response_model=SessionList, responses=error_responses(*COMMON), tags=["sessions"])
    async def list_sessions(
        tenant: Tenant,
        label: Annotated[list[str], Query(description="name:value; repeat it: every one must match")],
    ) -> Response:
        """The caller's live sessions carrying every ``label`` (``?label=run_id:grpo-17``), on every node of a
        cluster; ``unreached`` names nodes that could not be asked."""
        pairs = [x.partition(":") for x in label]
        if any(not sep for _, sep, _ in pairs):
            raise BadRequest("label: give each as name:value, e.g. ?label=run_id:grpo-17")
        if len({k for k, _, _ in pairs}) < len(pairs):
            raise BadRequest("label: each name once (every label given must match, so one name cannot have two values)")
        try:
            select = SessionSelect(labels={k: v for k, _, v in pairs})
        except ValidationError as exc:
            raise BadRequest(validation_message(exc, "query")) from None
        return json_response(await gateway.select_sessions(tenant, select.labels, "list"))

    @api.post("/sessions/close", response_model=SessionsSelected, responses=error_responses(*COMMON), tags=["sessions"])
    async def close_sessions(req: SessionSelect, tenant: Tenant) -> Response:
        """Close every session of the caller's carrying all of ``labels`` (a trainer's run, when it ends or
        restarts), on every node; ``count`` says how many."""
        return json_response(await gateway.select_sessions(tenant, req.labels, "close"))

    @api.post(
        "/sessions/keepalive", response_model=SessionsSelected, responses=error_responses(*COMMON), tags=["sessions"]
    )
    async def keepalive_sessions(req: SessionKeepalive, tenant: Tenant) -> Response:
        """Restart the idle timers of every session carrying ``labels`` (and set a new idle timeout): a trainer
        renews its run this way while it lives, so a trainer that dies leaves nothing behind for longer than
        one idle timeout."""
        return json_response(await gateway.select_sessions(tenant, req.labels, "renew", req.idle_timeout_s))

    @api.post("/sessions/status", response_model=SessionStatuses, responses=error_responses(*COMMON), tags=["sessions"])
    async def sessions_status(req: SessionStatusRequest, tenant: Tenant) -> Response:
        """The state of up to 1,000 sessions in one call: live (with its description), lost, ended or unknown
        (another tenant's sessions are unknown)."""
        return json_response(await gateway.session_states(tenant, req.session_ids))

    @api.post(
        "/sessions/{session_id}/timeout",
        response_model=SessionInfo,
        responses=error_responses(*COMMON, 404, 410),
        tags=["sessions"],
    )
    async def session_timeout(session_id: str, req: SessionTimeout, tenant: Tenant) -> Response:
        """End the session ``timeout_s`` from now, sooner or later than its TTL would (never past the node's
        ``session_ttl_s`` from its creation); its idle timer restarts. E2B's ``set_timeout``."""
        return json_response((await gateway.set_timeout(session_id, tenant, req.timeout_s)).model_dump())

    @api.delete("/sessions/{session_id}", status_code=204, responses=error_responses(*COMMON, 404), tags=["sessions"])
    async def delete_session(session_id: str, tenant: Tenant) -> Response:
        await gateway.close_session(session_id, tenant)
        return Response(status_code=204)

    @api.get("/runners", responses=error_responses(*COMMON), tags=["runners"])
    async def list_runners(_: Tenant) -> Response:
        """Runner kinds enabled on this node."""
        return json_response({"runners": list(gateway.kinds)})

    @api.get("/runners/{kind}", responses=error_responses(*COMMON), tags=["runners"])
    async def describe_runner(kind: str, _: Tenant) -> Response:
        """A kind's action and observation schemas, and what else the kind says of itself (e.g. tools)."""
        k = gateway.kind(kind)
        body: dict[str, object] = {
            "runner": kind,
            "title": k.title,
            "action_schema": k.action.model_json_schema(),
            "observation_schema": k.observation.model_json_schema(),
            # what its sessions can do: sessions at all, forks (POST /sessions/{id}/fork), interrupts
            "sessions": not k.no_sessions,
            "fork": k.capabilities.fork,
            "interrupt": k.capabilities.interrupt,
        }
        if k.describe is not None:
            # Off the event loop: a kind may probe the host the first time (the code kind's toolchains).
            body.update(await asyncio.to_thread(k.describe, gateway.settings.runner_config(kind)))
        return json_response(body)

    @api.get("/images", responses=error_responses(*COMMON), tags=["images"])
    async def list_images(_: Tenant) -> Response:
        """The container images on this node (``sandboxd image import``): each name, id, layers, size and the
        configuration a sandbox of it starts with."""
        s = gateway.settings
        store = ImageStore.of(s)
        images = await asyncio.to_thread(store.images)
        return json_response({"images": [image.describe() for image in images]})

    return api
