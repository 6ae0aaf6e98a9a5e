"""The E2B SDK's API (``e2b``, ``e2b-code-interpreter``), served by a node: point ``E2B_API_URL`` and
``E2B_SANDBOX_URL`` at it and the official SDKs run unchanged.

An E2B sandbox is a python session: one jail with its interpreter (the code interpreter's default context)
and its working directory. Its metadata are the session's labels; its timeout is the session's TTL, moved by
``set_timeout``; its ``envdAccessToken`` opens its data plane and nothing else (``front/auth.py``). Extra code
contexts are python sessions of their own, labelled with their sandbox and closed with it.

Control plane (``X-API-Key``: a node key; SDKs before 2.46 check it has the form ``e2b_<hex>``): create, get,
list with metadata filters, kill, set_timeout, connect, in both generations of E2B's routes (``/sandboxes``,
and ``/v2/sandboxes`` from SDK 2.46 on). Data plane (``E2b-Sandbox-Id`` with ``X-Access-Token``, or the code
interpreter's ``E2B-Traffic-Access-Token``, the same token): the code interpreter's ``/execute`` and
``/contexts``, envd's ``/health``, ``/files`` and its processes and filesystem (Connect-RPC, ``envd.py``).
Everything else under E2B's paths (pause, snapshots, fork, templates, volumes, network, metrics) is refused
in E2B's ``{code, message}`` shape, which every SDK raises as its own exception.

A custom template (``Sandbox.create(template=NAME)``, NAME not one of the code interpreter's) is an image of the
node's store where the container kind runs: the sandbox is a container session of it, and the image's own
python3 (``jailside/cellhost.py``) runs the same cells, run_code's and envd's, with ``/home/user`` its real
home and the whole root its to write. An image without python3 is refused at create, by name.

No ``from __future__ import annotations`` here: FastAPI reads the routes' ``Annotated[..., Depends()]``
signatures at run time (as in ``native.py``).
"""

import asyncio
import base64
import contextlib
import datetime
import hashlib
import secrets
import urllib.parse
from collections.abc import AsyncIterator, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.datastructures import UploadFile
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from sandboxd.api.e2b import names
from sandboxd.api.e2b.cells import execution_cell, ndjson, restart_cell, split_answer
from sandboxd.api.e2b.envd import CALL_TIMEOUT_S, MALFORMED, READ_CHUNK, Refused, SandboxCalls, connect_apps
from sandboxd.api.e2b.kernels import language_of
from sandboxd.api.e2b.labels import IMAGE_LABEL, LANGUAGE_LABEL, OWN_PREFIX, PARENT_LABEL, TEMPLATE_LABEL
from sandboxd.api.e2b.models import (
    Connect,
    Execute,
    NewContext,
    NewSandbox,
    Refresh,
    Timeout,
)
from sandboxd.api.e2b.names import known_nodes, public_message, sandbox_in_host, sandbox_name, session_of
from sandboxd.api.e2b.paths import CONTROL_HEADS, CONTROL_PREFIXES, DATA_EXACT, DATA_PREFIXES, is_data_plane, is_e2b
from sandboxd.api.surface import Dropped, surface_router, until_disconnected
from sandboxd.cluster.forward import CALLER, FORWARDED_BY, Caller
from sandboxd.constants import SESSION_HOME
from sandboxd.errors import (
    BadRequest,
    NotFound,
    NotServed,
    SandboxdError,
    SessionClosed,
    SessionExpired,
    SessionLost,
    UnknownSession,
)
from sandboxd.front.auth import Auth
from sandboxd.front.gateway import Gateway
from sandboxd.front.surfaces import Surface, json_response, retry_headers
from sandboxd.models import SessionCreate, SessionInfo, StepRequest, _checked_labels

TEMPLATES = ("base", "code-interpreter-v1", "code-interpreter")  # what the SDKs create by default
CONTAINER = "container"  # the kind a custom template's sandbox is: a session of the image the template names
ENVD_VERSION = "0.5.2"  # the envd features served (closing stdin: 0.5.2); not octet-stream uploads (0.5.7)
HOME = SESSION_HOME  # E2B's home: a sandbox's working directory, its /tmp under that name too
MAX_FILES = 1000  # parts of one upload
INTERRUPT_AGAIN_S = 1.0  # a cell whose client left, still queued or ignoring its interrupt: interrupted again
CONNECT_METHODS = {
    "/process.Process/": ("Start", "Connect", "List", "SendSignal", "SendInput", "CloseStdin", "Update", "StreamInput"),
    "/filesystem.Filesystem/": (
        "Stat",
        "MakeDir",
        "Move",
        "ListDir",
        "Remove",
        "WatchDir",
        "CreateWatcher",
        "GetWatcherEvents",
        "RemoveWatcher",
    ),
}


GONE = (UnknownSession, SessionLost, SessionClosed, SessionExpired)


def e2b_error(exc: SandboxdError) -> Response:
    """E2B's error shape, ``{"code": <status>, "message": ...}``, which every SDK parses (a body without ``code``
    crashes the generated client with ``KeyError``). On the control plane a sandbox that is gone, killed or
    timed out is a 404, as E2B's API says of it (``kill`` then returns False, ``connect`` raises
    ``SandboxNotFoundException``); a refusal no retry can change says so (``Should-Retry``: SDK 2.46 on
    retries 429/502/503/504 three times unless told not to)."""
    status = 404 if isinstance(exc, GONE) else exc.status
    headers = retry_headers(exc.retry_after_s) or {}
    if exc.retry_after_s is None and status >= 500:
        headers["Should-Retry"] = "false"
    return json_response({"code": status, "message": public_message(exc.message, exc.session_id)}, status, headers)


def data_error(exc: SandboxdError) -> Response:
    """On a sandbox's data plane, a sandbox that is gone, or was killed or timed out during the call, answers
    502, as E2B's proxy does for an ended sandbox; its message says the sandbox "was not found", the words SDK
    2.46 on read to raise ``SandboxNotRunningException`` (older ones raise a timeout)."""
    if isinstance(exc, GONE):
        body = {"code": 502, "message": f"The sandbox was not found: {public_message(exc.message, exc.session_id)}"}
        return json_response(body, 502)
    return e2b_error(exc)


SANDBOX_ID = b"e2b-sandbox-id"


def _tenant(auth: Auth, headers: Mapping[str, str], path: bytes) -> str:
    return auth.tenant_of_e2b(headers, data_plane=is_data_plane(path))


def _sandbox_of_host(path: bytes, host: bytes, credentials: Mapping[bytes, str]) -> tuple[bytes, bytes] | None:
    """E2B's addressing (e2b 1.x's only one): a data-plane call names its sandbox by its host,
    ``<port>-<sandbox id>.<domain>``; the front door adds it as the header every layer reads."""
    if SANDBOX_ID in credentials or not is_data_plane(path):
        return None
    named = sandbox_in_host(host)
    return (SANDBOX_ID, named[1]) if named is not None else None


SURFACE = Surface(
    "e2b",
    e2b_error,
    prefixes=CONTROL_PREFIXES + DATA_PREFIXES,
    exact=DATA_EXACT,
    owns=is_e2b,
    # its key, a sandbox's access token (either name), and the sandbox a call is for
    credentials=frozenset({b"x-api-key", b"x-access-token", b"e2b-traffic-access-token", SANDBOX_ID}),
    tenant=_tenant,
    host=_sandbox_of_host,
)


def _digest(key: str) -> str:
    """A client's key as the node keeps it: any length the client sent, one length kept."""
    return hashlib.sha256(key.encode()).hexdigest()


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


def _metadata(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if not k.startswith(OWN_PREFIX)}


def router(gateway: Gateway, auth: Auth) -> APIRouter:
    # E2B's contract is E2B's own API document, not ours: these routes stay out of /openapi.json.
    control = surface_router(e2b_error, tags=["e2b"], include_in_schema=False)
    calls = SandboxCalls(gateway, auth)
    data = surface_router(data_error, tags=["e2b"], include_in_schema=False)
    sizes = {kind: gateway.settings.runner_config(kind) for kind in ("python", CONTAINER) if kind in gateway.kinds}

    async def api_key(request: Request) -> str:
        """The control plane's caller: ``X-API-Key`` (or ``Authorization``). A request forwarded to another node
        carries the key as a bearer token, which that node checks itself."""
        tenant = auth.tenant_of_e2b(request.headers, data_plane=False)
        key = request.headers.get("x-api-key")
        authorization = request.headers.get("authorization") or (f"Bearer {key}" if key is not None else None)
        CALLER.set(Caller(authorization, request.headers.get(FORWARDED_BY)))
        return tenant

    async def sandbox_caller(request: Request) -> tuple[str, str]:
        """The data plane's caller and sandbox, as envd's services take them (``SandboxCalls.caller``)."""
        return await calls.caller(request.headers)

    Tenant = Annotated[str, Depends(api_key)]
    Sandbox = Annotated[tuple[str, str], Depends(sandbox_caller)]

    def described(info: SessionInfo, tenant: str, detail: bool = True) -> dict[str, Any]:
        name = sandbox_name(info.session_id)
        token = auth.access_token(tenant, name)
        body: dict[str, Any] = {
            "templateID": info.labels.get(TEMPLATE_LABEL, "base"),
            "sandboxID": name,
            "clientID": info.node_id,
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": token,
            "trafficAccessToken": token,  # what the code interpreter sends: the same token
        }
        if detail:
            size = sizes.get(info.runner)  # its kind's sandbox: a python session's, or a template's container
            cpus = max(1, int(getattr(size, "cpu_cores", 1)))
            body.update(
                startedAt=_iso(info.created_at),
                endAt=_iso(datetime.datetime.now(datetime.UTC).timestamp() + info.expires_in_s),
                cpuCount=cpus,
                memoryMB=int(getattr(size, "memory_mb", 512)),
                diskSizeMB=int(getattr(size, "tmpfs_mb", 64)),
                state="running",
                metadata=_metadata(info.labels),
            )
        return body

    async def settle(session_id: str, tenant: str, env_vars: dict[str, str], runner: str = "python") -> None:
        """A new interpreter as E2B's starts: in the home (its /tmp, bound at /home/user in session jails; a
        container's own /home/user), with HOME and the sandbox's envVars set, and a ``.profile`` there that keeps
        the interpreter's PATH for the login shell every ``commands.run`` is (Debian's /etc/profile would put the
        system's python3 first, and no ``python`` at all; an image's own ``.profile`` is left as it is). A session
        that cannot be settled is closed and the create refused."""
        env = {"HOME": HOME, **env_vars}
        code = (
            f"import os as _o, shlex as _s; _o.chdir({HOME!r}); _o.environ.update({env!r})\n"
            f"if {runner != CONTAINER!r} or not _o.path.exists('.profile'):\n"
            "    with open('.profile', 'w') as _f:\n"
            "        _f.write('# what a login shell reads (commands.run): the sandbox\\'s python first, as "
            "run_code\\'s\\n' 'export PATH=' + _s.quote(_o.environ['PATH']) + '\\n')\n"
            "del _o, _s\nglobals().pop('_f', None)\n"
        )
        step = StepRequest(runner=runner, action={"code": code}, session_id=session_id)
        result = await gateway.step(step, tenant)
        if not result.ok:
            await gateway.close_session(session_id, tenant, "its envVars could not be set")
            why = result.error.message if result.error else ""
            seen = result.observation or {}
            if runner == CONTAINER and seen.get("exit_code") == 127:
                raise BadRequest(
                    "the template's image has no python3 on its PATH: an E2B sandbox here runs its code, commands "
                    "and files through it (the native API's container sessions run images without one)"
                )
            raise BadRequest(f"envVars could not be set: {why}; {str(seen.get('stderr'))[-300:]}")

    def labels_of(metadata: dict[str, str], template: str) -> dict[str, str]:
        if reserved := [k for k in metadata if k.startswith(OWN_PREFIX)]:
            raise BadRequest(f"metadata: {reserved[0]!r}: names under {OWN_PREFIX} are the facade's own")
        try:
            return _checked_labels({**metadata, TEMPLATE_LABEL: template})
        except ValueError as exc:
            raise BadRequest(f"metadata: {exc}") from None

    def session_named(name: str) -> str:
        return names.session_named(gateway, name)

    async def sandbox_info(tenant: str, sandbox_id: str) -> SessionInfo:
        try:
            info = await gateway.session_info(sandbox_id, tenant)
        except SandboxdError as exc:
            exc.session_id = exc.session_id or sandbox_id  # named by its E2B id to the caller
            raise
        if TEMPLATE_LABEL not in info.labels:  # a session of the native API, or a context: not a sandbox
            raise UnknownSession(f"sandbox {sandbox_name(sandbox_id)!r} not found", session_id=sandbox_id)
        return info

    # ------------------------------------------------------------------ control plane

    async def create_sandbox(req: NewSandbox, tenant: str, idempotency_key: str | None) -> Response:
        """A sandbox: a python session with the template's name and the metadata as labels. The same
        ``Idempotency-Key`` again (the SDK's retry of a create whose answer it lost) is the same sandbox."""
        if why := req.refused():
            raise NotServed(why)
        s = gateway.settings
        labels = labels_of(req.metadata or {}, req.template_id)
        options: dict[str, Any]
        if req.template_id in TEMPLATES:
            if "python" not in sizes:
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
        calls.know(info.session_id, runner)
        await settle(info.session_id, tenant, req.env_vars or {}, runner)
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

    # ------------------------------------------------------------------ data plane

    async def context_of(tenant: str, sandbox_id: str, context_id: str | None) -> tuple[str, str]:
        """The session a code context is, and its language: the sandbox's own (its default python context, and
        ``<sandbox>+javascript`` / ``+typescript`` / ``+bash`` / ``+java``: its kernels of those languages), or one
        made by ``POST /contexts``."""
        base, plus, language = (context_id or "").partition("+")
        if not context_id or base in (sandbox_id, sandbox_name(sandbox_id)):
            await sandbox_info(tenant, sandbox_id)
            return sandbox_id, language_named(language) if plus else "python"
        session_id = session_of(context_id, known_nodes(gateway))
        if session_id is None:
            raise NotFound(f"context {context_id[:80]!r} not found")
        try:
            info = await gateway.session_info(session_id, tenant)
        except (UnknownSession, SessionLost, SessionClosed, SessionExpired) as exc:  # the sandbox is fine: a 404
            raise NotFound(f"context {context_id!r} not found: {public_message(exc.message, session_id)}") from None
        if info.labels.get(PARENT_LABEL) != sandbox_id:
            raise NotFound(f"context {context_id!r} is not one of this sandbox's")
        return session_id, info.labels.get(LANGUAGE_LABEL, "python")

    def language_named(language: str | None) -> str:
        """A cell's language, as this node's kernels are named; 422 for one not served."""
        try:
            return language_of(language) or "python"
        except KeyError:
            raise BadRequest(
                f"language {language!r} is not served here: python, javascript (js), typescript (ts), bash and java "
                "contexts are"
            ) from None

    @data.post("/execute")
    async def execute(req: Execute, caller: Sandbox, request: Request) -> Response:
        """One cell in the context's interpreter; its output as NDJSON lines (sent when the cell has ended). A
        client that stops waiting (the SDK's ``timeout``, a closed connection) interrupts the cell, as E2B's
        kernel does: the next ``run_code`` does not queue behind it, and the context keeps its state."""
        tenant, sandbox_id = caller
        session_id, own = await context_of(tenant, sandbox_id, req.context_id)
        language = language_named(req.language) if req.language else own
        cell, marker = execution_cell(req.code, req.env_vars or {}, None if language == "python" else language)
        # After whatever runs there now (a command's output being read): a kernel queues executions too.
        key = secrets.token_hex(16)  # this cell's name: an interrupt reaches it, never another caller's
        limit = gateway.settings.max_timeout_s
        stepping = asyncio.ensure_future(calls.step(tenant, session_id, {"code": cell}, limit, key))
        gone = asyncio.ensure_future(until_disconnected(request.receive))
        try:
            await asyncio.wait({stepping, gone}, return_when=asyncio.FIRST_COMPLETED)
            while not stepping.done():  # nobody reads the answer now; the cell may still be queued behind another
                with contextlib.suppress(SandboxdError):
                    await gateway.interrupt_session(session_id, tenant, key)
                await asyncio.wait({stepping}, timeout=INTERRUPT_AGAIN_S)
            result = stepping.result()
        except GONE:
            # The sandbox ended during the cell (killed, timed out): the connection drops, as E2B's does.
            return Dropped(media_type="application/x-ndjson")
        finally:
            gone.cancel()
            stepping.cancel()
        return Response(ndjson(result, marker), media_type="application/x-ndjson")

    @data.post("/contexts")
    async def new_context(req: NewContext, caller: Sandbox) -> Response:
        """Another interpreter in the sandbox (a python session labelled with it, ending with it)."""
        tenant, sandbox_id = caller
        language = language_named(req.language)
        if req.cwd not in (None, "", "/tmp", HOME):
            raise BadRequest(f"cwd {req.cwd!r}: a context here starts in its own home ({HOME})")
        parent = await sandbox_info(tenant, sandbox_id)
        if IMAGE_LABEL in parent.labels:
            raise NotServed(
                "contexts of a custom template's sandbox are not served: its image's python runs one, the "
                "sandbox's default context (run_code without a context)"
            )
        create = SessionCreate(
            runner="python",
            options={"keep_processes": True},  # its kernel (another language's) lives across its cells
            ttl_s=max(parent.expires_in_s, 1.0),
            labels={
                PARENT_LABEL: sandbox_id,
                **({} if language == "python" else {LANGUAGE_LABEL: language}),
                **_metadata(parent.labels),
            },
        )
        info = await gateway.create_session(create, tenant)
        await settle(info.session_id, tenant, {})
        return json_response({"id": sandbox_name(info.session_id), "language": language, "cwd": HOME})

    @data.get("/contexts")
    async def list_contexts(caller: Sandbox) -> Response:
        tenant, sandbox_id = caller
        await sandbox_info(tenant, sandbox_id)
        extra = await gateway.select_sessions(tenant, {PARENT_LABEL: sandbox_id}, "list")
        name = sandbox_name(sandbox_id)
        contexts = [{"id": name, "language": "python", "cwd": HOME}]
        contexts += [
            {"id": f"{name}+{language}", "language": language, "cwd": HOME}
            for language in ("javascript", "typescript", "bash", "java")
        ]
        contexts += [
            {"id": sandbox_name(s["session_id"]), "language": s["labels"].get(LANGUAGE_LABEL, "python"), "cwd": HOME}
            for s in extra["sessions"]
        ]
        return json_response(contexts)

    @data.delete("/contexts/{context_id}", status_code=204)
    async def remove_context(context_id: str, caller: Sandbox) -> Response:
        tenant, sandbox_id = caller
        if context_id.partition("+")[0] in (sandbox_id, sandbox_name(sandbox_id)):
            raise BadRequest("the sandbox's default contexts end with it")
        session_id, _ = await context_of(tenant, sandbox_id, context_id)
        await gateway.close_session(session_id, tenant)
        return Response(status_code=204)

    @data.post("/contexts/{context_id}/restart")
    async def restart_context(context_id: str, caller: Sandbox) -> Response:
        tenant, sandbox_id = caller
        session_id, language = await context_of(tenant, sandbox_id, context_id)
        # a python context's variables; another language's context: its kernel only
        cell, marker = restart_cell(HOME, None if language == "python" else language)
        result = await calls.step(tenant, session_id, {"code": cell}, CALL_TIMEOUT_S)
        if split_answer(str((result.get("observation") or {}).get("stdout") or ""), marker)[1] is None:
            error = result.get("error") or {}
            raise BadRequest(f"the context could not be restarted: {error.get('message') or 'its program broke it'}")
        return Response(status_code=204)

    @data.get("/health", status_code=204)
    async def health(caller: Sandbox) -> Response:
        """envd's health: 204 while the sandbox runs, 502 once it ended."""
        tenant, sandbox_id = caller
        await sandbox_info(tenant, sandbox_id)
        return Response(status_code=204)

    @data.get("/files")
    async def read_file(request: Request, caller: Sandbox) -> Response:
        """A file's bytes, read from the sandbox in chunks (a whole 10 MB file is ~20 cells)."""
        tenant, sandbox_id = caller
        path = request.query_params.get("path") or ""
        first = await envd_call(tenant, sandbox_id, "read", path=path, offset=0, size=READ_CHUNK)
        try:
            size, data = int(first["size"]), base64.b64decode(first["data"])
        except (KeyError, TypeError, ValueError):
            raise BadRequest(MALFORMED) from None

        async def chunks() -> AsyncIterator[bytes]:
            nonlocal data
            offset = len(data)
            yield data
            while offset < size and data:
                got = await calls.call(tenant, sandbox_id, "read", path=path, offset=offset, size=READ_CHUNK)
                data = base64.b64decode(got["data"])
                offset += len(data)
                yield data

        return StreamingResponse(chunks(), media_type="application/octet-stream")

    @data.post("/files")
    async def write_files(request: Request, caller: Sandbox) -> Response:
        """``files.write``: multipart parts named ``file`` (their file names are the paths when several), put
        into the sandbox's home as one step's files."""
        tenant, sandbox_id = caller
        form = await request.form(max_files=MAX_FILES, max_part_size=gateway.settings.max_body_bytes)
        parts = [p for p in form.getlist("file") if isinstance(p, UploadFile)]
        if not parts:
            raise BadRequest("no file part in the upload")
        single = request.query_params.get("path")
        staged: dict[str, str] = {}
        for part in parts:
            target = single if single and len(parts) == 1 else (part.filename or "")
            relative = await envd_call(tenant, sandbox_id, "writable", path=target)
            if not isinstance(relative, str):
                raise BadRequest(MALFORMED)
            staged[relative] = base64.b64encode(await part.read()).decode()  # the same path twice: the last wins
        written = [
            {"name": r.rsplit("/", 1)[-1], "type": "file", "path": r if r.startswith("/") else f"{HOME}/{r}"}
            for r in staged
        ]
        result = await calls.step(
            tenant, sandbox_id, {"code": "pass", "files": staged, "file_encoding": "base64"}, CALL_TIMEOUT_S
        )
        if result.get("error"):
            raise BadRequest(f"the files could not be written: {result['error'].get('message')}")
        return json_response(written)

    async def envd_call(tenant: str, sandbox_id: str, name: str, **kwargs: Any) -> Any:
        try:
            return await calls.call(tenant, sandbox_id, name, **kwargs)
        except Refused as exc:
            raise exc.as_error() from None

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

    async def no_such_route(request: Request, caller: Sandbox) -> Response:
        raise NotFound(f"{request.method} {request.url.path}: no such route of a sandbox's code interpreter")

    # ... and under a sandbox's data plane (a context id with a path in it, a method not served): E2B's shape
    data.add_api_route("/contexts/{rest:path}", no_such_route, methods=methods, include_in_schema=False)

    api = APIRouter()
    api.include_router(control)
    api.include_router(data)
    for prefix, app in connect_apps(calls).items():  # Connect-RPC, served by the SDK's own generated services
        api.routes.extend(Route(prefix + name, app, methods=["POST"]) for name in CONNECT_METHODS[prefix])
    return api
