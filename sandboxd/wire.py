"""A lean HTTP/1.1 keep-alive client: the load generator's loops and node-to-node forwarding.

Why not httpx here: at ~5 ms of client CPU per request it took 0.5-0.9 of this
machine's 2 cores during a benchmark, i.e. the load generator measured itself
(one asyncio process with 16 loops added a second to p99), and as the transport
of a forwarded session step it added 3-4 ms at p50 (bench/forwarding.py). This
client does what both need and nothing else: POST/GET/DELETE a JSON body on one
persistent connection, read a Content-Length response. It speaks only to
sandboxd nodes, which always answer with a Content-Length.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit

import orjson


class HTTPError(Exception):
    pass


class _StaleConnection(Exception):
    pass


class Connection:
    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    @property
    def connected(self) -> bool:
        return self.writer is not None

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """Send one request; return (status, decoded JSON body or None). Reconnects once."""
        payload = orjson.dumps(body) if body is not None else b""
        extra = ""
        for header, text in (headers or {}).items():
            if "\r" in text or "\n" in text:
                raise ValueError(f"header {header} carries a line break")
            extra += f"{header}: {text}\r\n"
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
                status_line = await self.reader.readline()
                if not status_line:
                    raise _StaleConnection
                status = int(status_line.split(b" ", 2)[1])
                length = 0
                close = False
                while True:
                    line = await self.reader.readline()
                    if line in (b"\r\n", b""):
                        break
                    name, _, value = line.partition(b":")
                    key = name.strip().lower()
                    if key == b"content-length":
                        length = int(value)
                    elif key == b"connection" and value.strip().lower() == b"close":
                        close = True
                data = await self.reader.readexactly(length) if length else b""
                if close:
                    await self.close()
                return status, orjson.loads(data) if data else None
            except _StaleConnection:
                await self.close()  # an idle keep-alive connection the server closed: nothing was run
                if attempt:
                    raise ConnectionResetError("server closed the connection twice") from None
            except (ConnectionError, asyncio.IncompleteReadError):
                await self.close()
                raise
        raise HTTPError("unreachable")

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError):
                await self.writer.wait_closed()
        self.reader = self.writer = None
