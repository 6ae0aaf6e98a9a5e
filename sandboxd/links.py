"""Request/answer links between the processes of one node, over Unix stream sockets.

A node is a few kinds of processes that talk all the time: every front process to every worker (each
step), fronts to the node process (sessions' bookkeeping, idempotency, status), the node to the workers
(lifecycle). One framing and one small multiplexed protocol serves them all, lean enough for the hot
path: an asyncio ``Protocol`` (no stream reader per message), a fixed 8-byte prefix, an orjson header and
the body as raw bytes, so a step's request and its answer cross as the bytes the client sent and the
bytes the client gets, never re-encoded on the way.

Frame: ``!II`` (header length, body length), the header (a JSON object), the body. A request's header
has an ``id`` (> 0) and an ``op``; its answer has the same ``id`` and either ``ok: true`` (with any other
fields and a body) or ``error`` (``SandboxdError.to_dict()``: the same error class arrives). A header
with no ``id`` is an event: one-way, nothing answers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import orjson

from sandboxd.errors import InfraError, PayloadTooLarge, SandboxdError, from_dict

log = logging.getLogger("sandboxd.links")

PREFIX = struct.Struct("!II")
MAX_HEADER_BYTES = 1 << 20
MAX_BODY_BYTES = 512 << 20

Header = dict[str, Any]
Handler = Callable[["Channel", Header, bytes], Awaitable[tuple[Header, bytes]]]


class LinkClosed(InfraError):
    """The process at the other end went away (its in-flight calls fail with this, or what the caller maps)."""

    code = "link_closed"
    status = 502


def frame(header: Header, body: bytes = b"") -> bytes:
    head = orjson.dumps(header)
    return PREFIX.pack(len(head), len(body)) + head + body


class Channel(asyncio.Protocol):
    """One connection, either end: parses frames, answers requests with ``handler``, matches answers to calls.

    Requests are served concurrently, each in a task of its own (eager where the loop allows: a handler
    that does not wait finishes inside ``data_received``, with no scheduling round trip).
    """

    def __init__(
        self,
        handler: Handler | None = None,
        on_event: Callable[[Header, bytes], None] | None = None,
        on_close: Callable[[Channel], None] | None = None,
    ) -> None:
        self.handler = handler
        self.on_event = on_event
        self.on_close = on_close
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.pending: dict[int, asyncio.Future[tuple[Header, bytes]]] = {}
        self.ids = itertools.count(1)
        self.closed = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.peer: Header = {}  # what the other end said of itself (its hello), for the server's bookkeeping

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        size = len(buf)
        while size - pos >= 8:
            head_len, body_len = PREFIX.unpack_from(buf, pos)
            if head_len > MAX_HEADER_BYTES or body_len > MAX_BODY_BYTES:
                log.error("a frame of %d+%d bytes on a node link: closing it", head_len, body_len)
                self.close()
                return
            end = pos + 8 + head_len + body_len
            if end > size:
                break
            try:
                header = orjson.loads(memoryview(buf)[pos + 8 : pos + 8 + head_len])
            except orjson.JSONDecodeError:
                log.error("an unreadable frame on a node link: closing it")
                self.close()
                return
            body = bytes(buf[pos + 8 + head_len : end]) if body_len else b""
            pos = end
            self._frame(header, body)
        if pos:
            del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(LinkClosed("the process at the other end of the link went away"))
                fut.exception()
        self.closed.set()
        if self.on_close is not None:
            self.on_close(self)

    # ------------------------------------------------------------------ frames

    def _frame(self, header: Header, body: bytes) -> None:
        msg_id = header.get("id")
        if "op" in header:
            if msg_id is None:
                if self.on_event is not None:
                    self.on_event(header, body)
                return
            task = asyncio.get_running_loop().create_task(self._serve(msg_id, header, body))
            if not task.done():
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            return
        fut = self.pending.pop(msg_id, None) if isinstance(msg_id, int) else None
        if fut is not None and not fut.done():
            fut.set_result((header, body))

    async def _serve(self, msg_id: int, header: Header, body: bytes) -> None:
        assert self.handler is not None
        try:
            answer, out = await self.handler(self, header, body)
            answer["id"] = msg_id
            answer["ok"] = True
        except SandboxdError as exc:
            answer, out = {"id": msg_id, "error": exc.to_dict()}, b""
        except Exception as exc:  # a bug of ours must not take the link down: the caller gets an infra error
            log.exception("node link: %s failed", header.get("op"))
            answer, out = {"id": msg_id, "error": InfraError(f"{type(exc).__name__}: {exc}").to_dict()}, b""
        self.send(answer, out)

    def send(self, header: Header, body: bytes = b"") -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame(header, body))

    # ------------------------------------------------------------------ calls

    def call_nowait(
        self, op: str, fields: Mapping[str, object], body: bytes = b""
    ) -> asyncio.Future[tuple[Header, bytes]]:
        """Send a request (``fields``: the operation's message, ``messages.py``); the future gets the answer's
        (header, body), or the rebuilt error of a refusal via ``answer_of``. Returned as a future so a caller
        can attach a callback instead of awaiting. ``fields`` is the caller's own dict, sent as the frame's
        header without a copy (a step's hot path): it gains ``id`` and ``op``."""
        fut: asyncio.Future[tuple[Header, bytes]] = asyncio.get_running_loop().create_future()
        if self.transport is None or self.transport.is_closing():
            fut.set_exception(LinkClosed("the link is closed"))
            return fut
        msg_id = next(self.ids)
        header = cast(Header, fields)
        header["id"] = msg_id
        header["op"] = op
        data = frame(header, body)
        head_len = len(data) - PREFIX.size - len(body)
        if head_len > MAX_HEADER_BYTES or len(body) > MAX_BODY_BYTES:
            # The other end would close the link on it, failing every call in flight: the request's own error.
            fut.set_exception(PayloadTooLarge(f"{op}: {head_len} bytes of fields; a link carries {MAX_HEADER_BYTES}"))
            return fut
        self.pending[msg_id] = fut
        self.transport.write(data)
        return fut

    async def call(
        self, op: str, fields: Mapping[str, object] | None = None, body: bytes = b""
    ) -> tuple[Header, bytes]:
        """Send a request and wait for its answer; an error answer is raised as the error that was raised."""
        return answer_of(await self.call_nowait(op, dict(fields or {}), body))

    def event(self, op: str, fields: Header | None = None, body: bytes = b"") -> None:
        self.send({**(fields or {}), "op": op}, body)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    @property
    def alive(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()


def answer_of(answer: tuple[Header, bytes]) -> tuple[Header, bytes]:
    header, body = answer
    if "error" in header:
        raise from_dict(header["error"])
    return header, body


async def connect(path: str, handler: Handler | None = None, **callbacks: Any) -> Channel:
    loop = asyncio.get_running_loop()
    _, channel = await loop.create_unix_connection(lambda: Channel(handler, **callbacks), path)
    return channel


async def serve(path: str, make: Callable[[], Channel]) -> asyncio.Server:
    """Listen on ``path`` (owner-only: the node's runtime directory is 0700 anyway)."""
    with contextlib.suppress(FileNotFoundError):
        import os

        os.unlink(path)
    loop = asyncio.get_running_loop()
    return await loop.create_unix_server(make, path)
