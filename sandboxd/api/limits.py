"""Request bodies are bounded while they are read: in size (413) and in time between chunks (408).

Pydantic's limits apply only once a body is parsed; by then a 300 MB body has
been buffered in the gateway, and a client that sends headers and then
nothing holds a connection and its memory forever. This pure ASGI middleware
refuses both early, in sandboxd's error shape, before any route runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, stall_timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.stall_timeout_s = stall_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None and length > self.max_bytes:
            await _refuse(send, _too_large(length, self.max_bytes))
            return
        seen = 0
        started = refused = complete = False

        async def bounded_receive() -> Message:
            nonlocal seen, refused, complete
            if refused:
                return {"type": "http.disconnect"}
            if complete:  # the body is whole: what comes now is the client's disconnect, whenever it comes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.stall_timeout_s)
            except TimeoutError:
                message, why = (
                    {},
                    _Refused(408, "request_timeout", f"the request body stalled for {self.stall_timeout_s:g}s"),
                )
            else:
                if message["type"] != "http.request":
                    return message
                seen += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if seen <= self.max_bytes:
                    return message
                why = _too_large(seen, self.max_bytes)
            # Answer now, in our shape; the app sees the client gone and whatever it sends is dropped.
            refused = True
            if not started:
                await _refuse(send, why)
            return {"type": "http.disconnect"}

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, bounded_receive, tracked_send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _too_large(size: int, cap: int) -> _Refused:
    return _Refused(413, "payload_too_large", f"request body of {size}+ bytes; this node takes at most {cap}")


async def _refuse(send: Send, exc: _Refused) -> None:
    body: dict[str, Any] = {
        "ok": False,
        "status": exc.status,
        "error": {"blame": "client", "code": exc.code, "message": exc.message, "retry_after_s": None},
    }
    data = orjson.dumps(body)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
