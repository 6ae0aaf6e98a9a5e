"""A lean HTTP/1.1 keep-alive client: the load generator's loops and node-to-node forwarding.

Why not httpx here: at ~5 ms of client CPU per request it took 0.5-0.9 of this
machine's 2 cores during a benchmark, i.e. the load generator measured itself
(one asyncio process with 16 loops added a second to p99), and as the transport
of a forwarded session step it added 3-4 ms at p50 (bench/forwarding.py). This
client does what both need and nothing else: POST/GET/DELETE a JSON body on one
persistent connection and read the answer however HTTP/1.1 frames it (a
Content-Length, chunked, or until the server closes; 1xx interim answers
skipped; no body for 204 and 304), so a proxy or a server that streams never
leaves a pooled connection mid-answer. Plain ``http://`` only: it speaks no TLS,
and refuses an ``https://`` address rather than sending plaintext to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit

import orjson

MAX_HEADER_LINES = 100
MAX_LINE_BYTES = 64 << 10


class _StaleConnection(Exception):
    pass


class ProtocolError(ValueError):
    """The server's answer is not HTTP/1.1 this client can read; the connection is closed."""


def _header_line(header: str, text: str) -> str:
    if "\r" in text or "\n" in text:
        raise ValueError(f"header {header} carries a line break")
    return f"{header}: {text}\r\n"


class Connection:
    def __init__(self, base_url: str, headers: dict[str, str] | None = None) -> None:
        """``headers``: sent with every request (a bench's API key), before each request's own."""
        parts = urlsplit(base_url)
        if parts.scheme != "http":
            raise ValueError(f"sandboxd.wire speaks plain http:// only, not {parts.scheme}:// ({parts.hostname})")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self._default_headers = "".join(_header_line(k, v) for k, v in (headers or {}).items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    @property
    def connected(self) -> bool:
        return self.writer is not None

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=MAX_LINE_BYTES)

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """Send one request; return (status, decoded JSON body or None). Reconnects once."""
        status, data = await self.request_raw(method, path, orjson.dumps(body) if body is not None else b"", headers)
        return status, orjson.loads(data) if data else None

    async def request_raw(
        self, method: str, path: str, payload: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """Send one request with a JSON body as bytes; return (status, the answer's body as bytes)."""
        extra = self._default_headers + "".join(_header_line(k, v) for k, v in (headers or {}).items())
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{extra}"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode("latin-1")  # header bytes as the server decoded them (ASGI: latin-1), so they arrive unchanged
        for attempt in (0, 1):
            if self.writer is None:
                await self.connect()
            assert self.reader is not None and self.writer is not None
            try:
                self.writer.write(head + payload)
                status, data, close = await self._answer(method)
                if close:
                    await self.close()
                return status, data
            except _StaleConnection:
                await self.close()  # an idle keep-alive connection the server closed: nothing was run
                if attempt:
                    raise ConnectionResetError("server closed the connection twice") from None
            except (ConnectionError, asyncio.IncompleteReadError, ValueError):
                await self.close()  # mid-answer: what is left on this connection is unknown
                raise
        raise AssertionError("unreachable")

    async def _answer(self, method: str) -> tuple[int, bytes, bool]:
        """The next final answer: its status, its body and whether the connection ends with it."""
        assert self.reader is not None
        first = True
        while True:
            status_line = await self._line()
            if not status_line:
                if first:
                    raise _StaleConnection
                raise asyncio.IncompleteReadError(b"", None)
            first = False
            parts = status_line.split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
            status = int(parts[1])
            length: int | None = None
            chunked = False
            close = parts[0] == b"HTTP/1.0"
            for _ in range(MAX_HEADER_LINES):
                line = await self._line()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.partition(b":")
                key, value = name.strip().lower(), value.strip().lower()
                if key == b"content-length":
                    length = int(value)
                elif key == b"transfer-encoding":
                    codings = [c.strip() for c in value.split(b",")]
                    if codings[-1] != b"chunked":
                        raise ProtocolError(f"unsupported transfer-encoding {value!r}")
                    chunked = True
                elif key == b"connection":
                    close = close or b"close" in [t.strip() for t in value.split(b",")]
            else:
                raise ProtocolError(f"more than {MAX_HEADER_LINES} header lines")
            if 100 <= status < 200:
                continue  # an interim answer (100 Continue): the final one follows
            if method == "HEAD" or status in (204, 304):
                return status, b"", close
            if chunked:
                return status, await self._chunked(), close
            if length is not None:
                return status, await self.reader.readexactly(length) if length else b"", close
            return status, await self.reader.read(), True  # delimited by the server closing

    async def _line(self) -> bytes:
        assert self.reader is not None
        try:
            return await self.reader.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:
            return exc.partial
        except asyncio.LimitOverrunError:
            raise ProtocolError(f"a line longer than {MAX_LINE_BYTES} bytes") from None

    async def _chunked(self) -> bytes:
        assert self.reader is not None
        body = bytearray()
        while True:
            size_line = await self._line()
            if not size_line.endswith(b"\n"):
                raise asyncio.IncompleteReadError(bytes(body), None)
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                break
            body += await self.reader.readexactly(size)
            await self.reader.readexactly(2)  # the chunk's CRLF
        while (await self._line()) not in (b"\r\n", b"\n", b""):
            pass  # trailers: read, not used
        return bytes(body)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError):
                await self.writer.wait_closed()
        self.reader = self.writer = None
