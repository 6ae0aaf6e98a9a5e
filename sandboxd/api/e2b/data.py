"""A sandbox's data plane (``E2b-Sandbox-Id`` with ``X-Access-Token``, or the code interpreter's
``E2B-Traffic-Access-Token``, the same token): the code interpreter's ``/execute`` and ``/contexts``, and
envd's ``/health`` and ``/files`` (envd's processes and filesystem are Connect-RPC: ``envd.py``).

No ``from __future__ import annotations`` here: FastAPI reads the routes' ``Annotated[..., Depends()]``
signatures at run time.
"""

import asyncio
import base64
import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from starlette.datastructures import UploadFile
from starlette.responses import Response, StreamingResponse

from sandboxd.api.e2b.cells import execution_cell, ndjson, restart_cell, split_answer
from sandboxd.api.e2b.envd import CALL_TIMEOUT_S, MALFORMED, READ_CHUNK, Refused
from sandboxd.api.e2b.kernels import language_of
from sandboxd.api.e2b.labels import IMAGE_LABEL, LANGUAGE_LABEL, PARENT_LABEL
from sandboxd.api.e2b.models import Execute, NewContext
from sandboxd.api.e2b.names import known_nodes, public_message, sandbox_name, session_of
from sandboxd.api.e2b.sandboxes import HOME, Sandboxes, metadata_of
from sandboxd.api.e2b.shapes import GONE, data_error
from sandboxd.api.surface import Dropped, surface_router, until_disconnected
from sandboxd.errors import BadRequest, NotFound, NotServed, SandboxdError, Saturated
from sandboxd.front.surfaces import json_response
from sandboxd.models import SessionCreate

MAX_FILES = 1000  # parts of one upload
# Extra contexts one sandbox may hold: each is a python session of the tenant's (its quota, the node's memory
# budget), and a sandbox reached by its id alone lets whoever knows the id make them.
MAX_CONTEXTS = 16
INTERRUPT_AGAIN_S = 1.0  # a cell whose client left, still queued or ignoring its interrupt: interrupted again
LANGUAGES = ("javascript", "typescript", "bash", "java")  # a sandbox's own kernels besides python


def router(sandboxes: Sandboxes) -> APIRouter:
    data = surface_router(data_error, tags=["e2b"], include_in_schema=False)
    gateway, calls, sandbox_info = sandboxes.gateway, sandboxes.calls, sandboxes.info

    async def sandbox_caller(request: Request) -> tuple[str, str]:
        """The data plane's caller and sandbox, as envd's services take them (``SandboxCalls.caller``)."""
        return await calls.caller(request.headers)

    Sandbox = Annotated[tuple[str, str], Depends(sandbox_caller)]

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
        except GONE as exc:  # the sandbox is fine: a 404
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
        held = len((await gateway.select_sessions(tenant, {PARENT_LABEL: sandbox_id}, "list"))["sessions"])
        if held >= MAX_CONTEXTS:
            raise Saturated(
                f"this sandbox holds {held} code contexts, the most one may: remove one first (DELETE /contexts/<id>)",
                retry_after_s=5.0,
            )
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
                **metadata_of(parent.labels),
            },
        )
        info = await gateway.create_session(create, tenant)
        await sandboxes.settle(info.session_id, tenant, {})
        return json_response({"id": sandbox_name(info.session_id), "language": language, "cwd": HOME})

    @data.get("/contexts")
    async def list_contexts(caller: Sandbox) -> Response:
        tenant, sandbox_id = caller
        await sandbox_info(tenant, sandbox_id)
        extra = await gateway.select_sessions(tenant, {PARENT_LABEL: sandbox_id}, "list")
        name = sandbox_name(sandbox_id)
        contexts = [{"id": name, "language": "python", "cwd": HOME}]
        contexts += [{"id": f"{name}+{language}", "language": language, "cwd": HOME} for language in LANGUAGES]
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

    async def no_such_route(request: Request, caller: Sandbox) -> Response:
        raise NotFound(f"{request.method} {request.url.path}: no such route of a sandbox's code interpreter")

    # Last, under a sandbox's data plane (a context id with a path in it, a method not served): E2B's shape
    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    data.add_api_route("/contexts/{rest:path}", no_such_route, methods=methods, include_in_schema=False)
    return data
