"""``sandboxd.wire`` (the forwarding and load-generation client) against real servers on loopback.

It read Content-Length only: a chunked answer (a proxy, a streaming server) left the rest of the body
on a pooled connection, and the next request on it read garbage. It also took ``https://`` addresses
and spoke plaintext to them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from sandboxd.wire import Connection, ProtocolError

Start = Callable[..., Awaitable[str]]


@pytest.fixture
async def scripted() -> AsyncIterator[Start]:
    """A raw TCP server answering each request on a connection with the next scripted answer."""
    servers: list[asyncio.Server] = []

    async def start(answers: list[bytes], close_after: bool = False) -> str:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for answer in answers:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                length = next((int(ln.split(b":")[1]) for ln in lines if ln.lower().startswith(b"content-length")), 0)
                await reader.readexactly(length)
                writer.write(answer)
                await writer.drain()
            if not close_after:
                await reader.read()  # until the client is done with the connection
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


def body(obj: object) -> bytes:
    return json.dumps(obj).encode()


async def test_content_length_chunked_and_interim_answers_share_one_connection(
    scripted: Start,
) -> None:
    chunked = body({"streamed": True, "n": list(range(50))})
    parts = [chunked[:7], chunked[7:40], chunked[40:]]
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body({"a": 1})), body({"a": 1})),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts)
        + b"0\r\nX-Trailer: t\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body([1, 2])), body([1, 2])),
    ]
    conn = Connection(await scripted(answers))
    try:
        assert await conn.request("GET", "/a") == (200, {"a": 1})
        assert await conn.request("POST", "/b", {"x": 1}) == (200, {"streamed": True, "n": list(range(50))})
        assert await conn.request("POST", "/c") == (201, {})
        assert await conn.request("DELETE", "/d") == (204, None)
        assert await conn.request("GET", "/e") == (200, [1, 2])  # the same connection, still in step
        assert conn.connected
    finally:
        await conn.close()


async def test_an_answer_delimited_by_close_and_connection_close(scripted: Start) -> None:
    conn = Connection(await scripted([b"HTTP/1.0 200 OK\r\n\r\n" + body({"until": "close"})], True))
    assert await conn.request("GET", "/") == (200, {"until": "close"})
    assert not conn.connected  # the server ended it: never reused
    conn = Connection(await scripted([b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"], True))
    assert await conn.request("GET", "/") == (200, {})
    assert not conn.connected


async def test_what_it_cannot_read_is_an_error_and_the_connection_goes(
    scripted: Start,
) -> None:
    for answer in (
        b"SSH-2.0-OpenSSH\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}",  # the server closes mid-body
    ):
        conn = Connection(await scripted([answer], True))
        with pytest.raises((ProtocolError, asyncio.IncompleteReadError, ConnectionError)):
            await conn.request("GET", "/")
        assert not conn.connected


def test_https_is_refused_not_spoken_in_plaintext() -> None:
    with pytest.raises(ValueError, match="plain http"):
        Connection("https://node:8443")


def test_node_url_must_be_plain_http() -> None:
    from pydantic import ValidationError

    from sandboxd.config import load_settings

    with pytest.raises(ValidationError, match="node_url must be http://"):
        load_settings(node_url="https://node:8443", redis_url="redis://127.0.0.1:1/0")
