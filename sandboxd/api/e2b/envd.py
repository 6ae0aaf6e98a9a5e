"""envd on a node: an E2B sandbox's processes and filesystem (Connect-RPC, the SDK's own generated services in
``proto/``) and its ``/files`` upload and download, each call a cell of the sandbox's interpreter running
``envd_driver.py``.

A command's output is read from its files by short cells while it runs, so ``commands.run`` streams (a poll
every 20-250 ms, the interval shrinking while output comes) and a background command outlives the request
that started it (the sandbox is a session that keeps its processes). Calls to one sandbox take its turn:
a cell running there (a long ``run_code``) delays the others, which wait for it rather than fail.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import time
from base64 import b64decode
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any, cast

import orjson
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof
from protobuf.wkt import Timestamp

from sandboxd.api.e2b.cells import module_cell, new_marker, split_answer
from sandboxd.api.e2b.labels import OPEN_LABEL, TEMPLATE_LABEL
from sandboxd.api.e2b.names import public_message, session_named
from sandboxd.api.e2b.proto import filesystem_pb as fs
from sandboxd.api.e2b.proto import process_pb as pr
from sandboxd.api.e2b.proto.filesystem_connect import Filesystem, FilesystemASGIApplication
from sandboxd.api.e2b.proto.process_connect import Process, ProcessASGIApplication
from sandboxd.api.e2b.shapes import CONNECT_CODE_OF_STATUS
from sandboxd.errors import (
    AlreadyExists,
    BadRequest,
    Forbidden,
    NotFound,
    SandboxdError,
    SessionBusy,
    SessionLost,
    Unauthorized,
    UnknownSession,
)
from sandboxd.front.auth import BY_SANDBOX_ID, NO_TOKEN, Auth
from sandboxd.front.gateway import Gateway
from sandboxd.models import StepRequest

# envd as the sandbox runs it: a module of its own there (insandbox/envd.py, read once).
ENVD_DRIVER = (Path(__file__).parent / "insandbox" / "envd.py").read_text()

MALFORMED = "the sandbox's answer was not well-formed (was its interpreter changed?)"
MAX_ID = 256  # a session id's longest
CALL_TIMEOUT_S = 30.0  # one envd call's cell (a listing, a stat, a chunk of a file)
BUSY_WAIT_S = 120.0  # how long a call waits for the sandbox's running cell before it gives up
POLL_MIN_S, POLL_MAX_S = 0.02, 0.25
# The first poll waits in the sandbox this long for output or the end: most commands an agent runs are done
# by then and answer at once; later polls do not wait (a cell waiting there holds the sandbox's other calls).
FIRST_POLL_WAIT_MS = 50
OUTPUT_CHUNK = 256 << 10  # bytes of a stream one poll returns (base64 in a cell's stdout: < 1 MiB)
READ_CHUNK = 512 << 10  # bytes of a file one /files read cell returns
# A stream with no event this long sends envd's keep-alive: the write is how a client that went away is noticed
# (a red team left streams polling for 30-40 s after closing them).
KEEPALIVE_S = 3.0
KINDS_KEPT = 1 << 16  # sandboxes whose kind a node remembers (a forgotten one is asked for again: one lookup)
NO_WATCHING = "watching a directory is not served here: list it again (files.list) to see changes"


class Refused(Exception):
    """What envd answers for a path or process that is not there, already there, or not allowed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message

    def as_error(self) -> SandboxdError:
        """The same refusal for ``/files`` (HTTP, E2B's error shape)."""
        cls = {"not_found": NotFound, "exists": AlreadyExists, "permission": Forbidden}.get(self.kind, BadRequest)
        return cls(self.message)


CONNECT_CODES = {
    "not_found": Code.NOT_FOUND,
    "exists": Code.ALREADY_EXISTS,
    "permission": Code.PERMISSION_DENIED,
    "invalid": Code.INVALID_ARGUMENT,
}


class SandboxCalls:
    """Driver calls in a sandbox's interpreter, one cell each, waiting their turn behind a running cell."""

    def __init__(self, gateway: Gateway, auth: Auth) -> None:
        self.gateway = gateway
        self.auth = auth
        # Each sandbox's kind (python; container for a custom template's), learnt at its create or asked once.
        self._kinds: collections.OrderedDict[str, str] = collections.OrderedDict()

    def know(self, session_id: str, runner: str) -> None:
        self._kinds[session_id] = runner
        self._kinds.move_to_end(session_id)
        if len(self._kinds) > KINDS_KEPT:
            self._kinds.popitem(last=False)

    async def kind(self, tenant: str, session_id: str) -> str:
        runner = self._kinds.get(session_id)
        if runner is None:
            runner = (await self.gateway.session_info(session_id, tenant)).runner
            self.know(session_id, runner)
        return runner

    async def caller(self, headers: Mapping[str, str]) -> tuple[str, str]:
        """The tenant and sandbox (its session) of a data-plane call (the routes' and envd's): the sandbox's
        access token (minted for sandboxes only, a MAC of the sandbox's E2B id), or a key, in which case the
        session it names must be one of the key's sandboxes, or nothing, for a sandbox created with ``secure:
        false`` where the operator serves those (its tenant is then the sandbox's)."""
        sandbox_id = headers.get("e2b-sandbox-id") or ""
        if not 0 < len(sandbox_id) <= MAX_ID:
            raise UnknownSession(f"sandbox {sandbox_id[:64]!r} not found")
        tenant = self.auth.tenant_of_e2b(headers, data_plane=True)
        if tenant == BY_SANDBOX_ID:  # no credential, where the operator serves sandboxes reached by their id
            try:
                session_id = session_named(self.gateway, sandbox_id)
                # an open sandbox (a session labelled so but no sandbox, a native one, is not reached)
                owner = await self.gateway.session_owner(session_id, {OPEN_LABEL: "1"}, [TEMPLATE_LABEL])
                return owner, session_id
            except (UnknownSession, SessionLost):  # never issued, ended, of a worker replaced, or secure: one answer
                raise Unauthorized(
                    f"{NO_TOKEN}; sandbox {sandbox_id[:64]!r} is not one created with secure: false (those are "
                    "reached by their id alone here)"
                ) from None
        session_id = session_named(self.gateway, sandbox_id)
        if headers.get("x-access-token") is None and headers.get("e2b-traffic-access-token") is None:
            info = await self.gateway.session_info(session_id, tenant)
            if TEMPLATE_LABEL not in info.labels:
                raise UnknownSession(f"sandbox {sandbox_id!r} not found", session_id=session_id)
        return tenant, session_id

    async def step(
        self, tenant: str, sandbox_id: str, action: dict[str, Any], timeout_s: float, key: str | None = None
    ) -> dict[str, Any]:
        """One step in the sandbox, after whatever runs there now (409 ``session_busy`` is waited out); ``key``
        names it for ``Gateway.interrupt_session``."""
        deadline = time.monotonic() + BUSY_WAIT_S
        pause = 0.005
        runner = await self.kind(tenant, sandbox_id)
        while True:
            req = StepRequest(runner=runner, action=action, session_id=sandbox_id, timeout_s=timeout_s)
            result = await self.gateway.step(req, tenant, step_key=key)
            refused = result.not_the_programs()
            if isinstance(refused, SessionBusy) and time.monotonic() < deadline:
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.1)
                continue
            if refused is not None:
                raise refused
            return result.model_dump()

    async def connect_call(self, ctx: RequestContext[Any, Any], name: str, **kwargs: Any) -> tuple[str, str, Any]:
        """A Connect method's caller, sandbox and driver answer; every failure as Connect's own error."""
        try:
            tenant, sandbox_id = await self.caller(ctx.request_headers)
            return tenant, sandbox_id, await self.call(tenant, sandbox_id, name, **kwargs)
        except ConnectError:
            raise
        except Exception as exc:
            raise connect_error(exc) from None

    async def call(self, tenant: str, sandbox_id: str, name: str, **kwargs: Any) -> Any:
        marker = new_marker()
        cell = module_cell("_sandboxd_envd", ENVD_DRIVER, f"call({name!r}, {kwargs!r}, {marker!r})")
        result = await self.step(tenant, sandbox_id, {"code": cell}, CALL_TIMEOUT_S)
        obs = result.get("observation") or {}
        _, answer = split_answer(str(obs.get("stdout") or ""), marker)
        if answer is None:
            err = result.get("error") or {}
            raise Refused("invalid", f"the sandbox did not answer {name}: {err.get('message') or obs.get('stderr')}")
        try:
            doc = orjson.loads(answer)
            if "err" in doc:
                raise Refused(str(doc["err"][0]), str(doc["err"][1]))
            return doc["ok"]
        except (orjson.JSONDecodeError, TypeError, KeyError, IndexError):
            raise Refused("invalid", MALFORMED) from None


def connect_error(exc: Exception) -> ConnectError:
    if isinstance(exc, Refused):
        return ConnectError(CONNECT_CODES.get(exc.kind, Code.INVALID_ARGUMENT), exc.message)
    if isinstance(exc, UnknownSession | SessionLost):
        return ConnectError(
            Code.UNAVAILABLE, f"the sandbox is not running: {public_message(exc.message, exc.session_id)}"
        )
    if isinstance(exc, SandboxdError):
        message = public_message(exc.message, exc.session_id)
        if exc.status in (401, 403, 429):  # these statuses say more than whose fault it was
            return ConnectError(Code(CONNECT_CODE_OF_STATUS[exc.status]), message)
        return ConnectError(Code.UNAVAILABLE if exc.blame != "client" else Code.INVALID_ARGUMENT, message)
    return ConnectError(Code.INTERNAL, f"internal error: {type(exc).__name__}")


def shaped[T](convert: Callable[[Any], T], answer: Any) -> T:
    """``convert(answer)``, or the client's error when a sandbox that changed its interpreter answered nonsense."""
    try:
        return convert(answer)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        raise ConnectError(Code.INVALID_ARGUMENT, MALFORMED) from None


def entry_info(e: dict[str, Any]) -> fs.EntryInfo:
    kind = {"file": fs.FileType.FILE, "dir": fs.FileType.DIRECTORY, "symlink": fs.FileType.SYMLINK}
    mtime = int(e.get("mtime_ns", 0))
    info = fs.EntryInfo(
        name=e["name"],
        type=kind.get(e["type"], fs.FileType.UNSPECIFIED),
        path=e["path"],
        size=int(e["size"]),
        mode=int(e["mode"]),
        permissions=e["permissions"],
        owner=e["owner"],
        group=e["group"],
        modified_time=Timestamp(seconds=mtime // 1_000_000_000, nanos=mtime % 1_000_000_000),
    )
    if e.get("symlink_target"):
        info.symlink_target = e["symlink_target"]
    return info


class FilesystemService(Filesystem):
    """envd's ``filesystem.Filesystem``: stat, list, make, move, remove (watching is not served: the generated
    defaults answer UNIMPLEMENTED)."""

    def __init__(self, calls: SandboxCalls) -> None:
        self.calls = calls

    async def _call(self, ctx: RequestContext[Any, Any], name: str, **kwargs: Any) -> Any:
        return (await self.calls.connect_call(ctx, name, **kwargs))[2]

    async def _entry(self, ctx: RequestContext[Any, Any], name: str, **kwargs: Any) -> fs.EntryInfo:
        return shaped(entry_info, await self._call(ctx, name, **kwargs))

    async def stat(self, request: fs.StatRequest, ctx: RequestContext[Any, Any]) -> fs.StatResponse:
        return fs.StatResponse(entry=await self._entry(ctx, "stat", path=request.path))

    async def make_dir(self, request: fs.MakeDirRequest, ctx: RequestContext[Any, Any]) -> fs.MakeDirResponse:
        return fs.MakeDirResponse(entry=await self._entry(ctx, "make_dir", path=request.path))

    async def move(self, request: fs.MoveRequest, ctx: RequestContext[Any, Any]) -> fs.MoveResponse:
        return fs.MoveResponse(
            entry=await self._entry(ctx, "move", source=request.source, destination=request.destination)
        )

    async def list_dir(self, request: fs.ListDirRequest, ctx: RequestContext[Any, Any]) -> fs.ListDirResponse:
        found = await self._call(ctx, "list_dir", path=request.path, depth=max(1, int(request.depth or 1)))
        return fs.ListDirResponse(entries=shaped(lambda f: [entry_info(e) for e in f], found))

    async def remove(self, request: fs.RemoveRequest, ctx: RequestContext[Any, Any]) -> fs.RemoveResponse:
        await self._call(ctx, "remove", path=request.path)
        return fs.RemoveResponse()

    async def watch_dir(
        self, request: fs.WatchDirRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[fs.WatchDirResponse]:
        raise ConnectError(Code.UNIMPLEMENTED, NO_WATCHING)
        yield  # an async generator, as the streaming method is called

    async def create_watcher(
        self, request: fs.CreateWatcherRequest, ctx: RequestContext[Any, Any]
    ) -> fs.CreateWatcherResponse:
        raise ConnectError(Code.UNIMPLEMENTED, NO_WATCHING)


def _event(**kind: Any) -> pr.ProcessEvent:
    """A process event of one kind (``start=``, ``data=``, ``end=``, ``keepalive=``): the oneof, named."""
    ((name, value),) = kind.items()
    return pr.ProcessEvent(event=cast(Any, Oneof(name, value)))


def _output(stream: str, data: bytes) -> pr.ProcessEvent.DataEvent:
    return pr.ProcessEvent.DataEvent(output=cast(Any, Oneof(stream, data)))


class ProcessService(Process):
    """envd's ``process.Process``: start (streamed), connect, list, signals, stdin (terminals, ``Update`` and
    ``StreamInput`` are not served: the generated defaults answer UNIMPLEMENTED)."""

    def __init__(self, calls: SandboxCalls) -> None:
        self.calls = calls

    async def _call(self, ctx: RequestContext[Any, Any], name: str, **kwargs: Any) -> tuple[str, str, Any]:
        return await self.calls.connect_call(ctx, name, **kwargs)

    async def _pid(self, ctx: RequestContext[Any, Any], selector: pr.ProcessSelector | None) -> int:
        chosen = selector.selector if selector is not None else None
        if chosen is not None and chosen.field == "pid":
            return int(chosen.value)
        if chosen is not None and chosen.field == "tag":
            _, _, running = await self._call(ctx, "running")
            for p in running:
                if p["tag"] == chosen.value:
                    return int(p["pid"])
            raise ConnectError(Code.NOT_FOUND, f"no process tagged {chosen.value!r}")
        raise ConnectError(Code.INVALID_ARGUMENT, "select a process by pid or tag")

    async def _follow(
        self, tenant: str, sandbox_id: str, pid: int, skip_existing: bool
    ) -> AsyncIterator[pr.ProcessEvent]:
        """The process's output as it comes, then its end; polls the sandbox, faster while output flows."""
        out_off = err_off = 0
        pause = POLL_MIN_S
        last_event = time.monotonic()
        first = True
        while True:
            try:
                got = await self.calls.call(
                    tenant,
                    sandbox_id,
                    "poll",
                    pid=pid,
                    out_off=out_off,
                    err_off=err_off,
                    cap=OUTPUT_CHUNK,
                    wait_ms=FIRST_POLL_WAIT_MS if first else 0,
                )
            except Exception as exc:
                raise connect_error(exc) from None
            out, err, out_off, err_off = shaped(
                lambda g: (b64decode(g["out"]), b64decode(g["err"]), int(g["out_off"]), int(g["err_off"])), got
            )
            if not (first and skip_existing):
                if out:
                    yield _event(data=_output("stdout", out))
                if err:
                    yield _event(data=_output("stderr", err))
            first = False
            ended = got.get("end")
            if isinstance(ended, dict):
                end = pr.ProcessEvent.EndEvent(
                    exit_code=int(ended.get("exit_code", -1)),
                    exited=bool(ended.get("exited")),
                    status=str(ended.get("status", "")),
                    error=str(ended["error"]) if ended.get("error") else None,
                )
                yield _event(end=end)
                return
            if out or err:
                pause = POLL_MIN_S
                last_event = time.monotonic()
            else:
                pause = min(pause * 1.5, POLL_MAX_S)
                if time.monotonic() - last_event > KEEPALIVE_S:
                    last_event = time.monotonic()
                    yield _event(keepalive=pr.ProcessEvent.KeepAlive())
            await asyncio.sleep(pause)

    async def start(self, request: pr.StartRequest, ctx: RequestContext[Any, Any]) -> AsyncIterator[pr.StartResponse]:
        cfg = request.process
        if cfg is None:
            raise ConnectError(Code.INVALID_ARGUMENT, "process: which command to start")
        if request.pty is not None:
            raise ConnectError(Code.UNIMPLEMENTED, "pty: terminals are not served here; run commands without one")
        tenant, sandbox_id, started = await self._call(
            ctx,
            "start",
            cmd=cfg.cmd,
            args=list(cfg.args),
            envs=dict(cfg.envs),
            cwd=cfg.cwd or "",
            tag=request.tag or "",
            stdin=bool(request.stdin),
        )
        pid = int(started["pid"])
        yield pr.StartResponse(event=_event(start=pr.ProcessEvent.StartEvent(pid=pid)))
        async for event in self._follow(tenant, sandbox_id, pid, skip_existing=False):
            yield pr.StartResponse(event=event)

    async def connect(
        self, request: pr.ConnectRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pr.ConnectResponse]:
        pid = await self._pid(ctx, request.process)
        try:
            tenant, sandbox_id = await self.calls.caller(ctx.request_headers)
        except SandboxdError as exc:
            raise connect_error(exc) from None
        yield pr.ConnectResponse(event=_event(start=pr.ProcessEvent.StartEvent(pid=pid)))
        async for event in self._follow(tenant, sandbox_id, pid, skip_existing=True):
            yield pr.ConnectResponse(event=event)

    async def list(self, request: pr.ListRequest, ctx: RequestContext[Any, Any]) -> pr.ListResponse:
        _, _, running = await self._call(ctx, "running")
        return pr.ListResponse(
            processes=[
                pr.ProcessInfo(
                    config=pr.ProcessConfig(cmd=p["cmd"], args=p["args"], envs=p["envs"], cwd=p["cwd"] or None),
                    pid=int(p["pid"]),
                    tag=p["tag"] or None,
                )
                for p in running
            ]
        )

    async def send_signal(self, request: pr.SendSignalRequest, ctx: RequestContext[Any, Any]) -> pr.SendSignalResponse:
        pid = await self._pid(ctx, request.process)
        signum = int(request.signal.value) if request.signal is not None else 0
        if signum not in (9, 15):
            raise ConnectError(Code.INVALID_ARGUMENT, "signal: SIGKILL or SIGTERM")
        await self._call(ctx, "send_signal", pid=pid, signum=signum)
        return pr.SendSignalResponse()

    async def send_input(self, request: pr.SendInputRequest, ctx: RequestContext[Any, Any]) -> pr.SendInputResponse:
        pid = await self._pid(ctx, request.process)
        given = request.input.input if request.input is not None else None
        if given is None or given.field != "stdin":
            raise ConnectError(Code.INVALID_ARGUMENT, "input: stdin bytes (terminals are not served)")
        await self._call(ctx, "send_input", pid=pid, data=base64.b64encode(given.value).decode())
        return pr.SendInputResponse()

    async def update(self, request: pr.UpdateRequest, ctx: RequestContext[Any, Any]) -> pr.UpdateResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "terminals (pty) are not served here: run commands without one")

    async def close_stdin(self, request: pr.CloseStdinRequest, ctx: RequestContext[Any, Any]) -> pr.CloseStdinResponse:
        pid = await self._pid(ctx, request.process)
        await self._call(ctx, "close_stdin", pid=pid)
        return pr.CloseStdinResponse()


class RefuseUndecodable:
    """A Connect request that cannot be decoded (garbage protobuf, broken JSON, wrong types) is the client's
    error: Connect's ``invalid_argument`` (400). The library answers it as ``unknown`` (500), and it is the
    only source of ``unknown`` here (every error the services raise is a ``ConnectError`` with its code)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        held: dict[str, Any] | None = None

        async def sending(message: Any) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and message["status"] == 500:
                held = message  # an unary error: its body decides
                return
            if held is not None and message["type"] == "http.response.body":
                body = message.get("body", b"")
                try:
                    error = orjson.loads(body)
                except orjson.JSONDecodeError:
                    error = None
                status = held["status"]
                if isinstance(error, dict) and error.get("code") == "unknown":
                    status = 400
                    body = orjson.dumps(
                        {
                            "code": "invalid_argument",
                            "message": f"the request could not be decoded: {error.get('message')}",
                        }
                    )
                headers = [(k, v) for k, v in held["headers"] if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(body)).encode()))
                await send({**held, "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, sending)


def connect_apps(calls: SandboxCalls) -> dict[str, Any]:
    """The two Connect services as ASGI apps, by the paths they answer."""
    process = RefuseUndecodable(ProcessASGIApplication(ProcessService(calls)))
    filesystem = RefuseUndecodable(FilesystemASGIApplication(FilesystemService(calls)))
    return {"/process.Process/": process, "/filesystem.Filesystem/": filesystem}
