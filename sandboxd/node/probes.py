"""``/healthz`` and ``/readyz`` on a port of their own (``probe_port``), served by the node process.

Client connections, however many or however slow, are the front processes'; a liveness probe that waited
behind them would restart a pod that is merely busy, and lose every session in it. Here the probes have
a listener nobody else uses, in the process that knows the node's state. One request per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson

from sandboxd.config import NodeSettings
from sandboxd.node.core import NodeCore

PROBE_READ_TIMEOUT_S = 5.0


async def serve_probes(core: NodeCore, settings: NodeSettings) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(PROBE_READ_TIMEOUT_S):
                line = await reader.readline()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
            path = line.split(b" ")[1] if line.count(b" ") >= 2 else b""
            body: dict[str, Any]
            if path.startswith(b"/healthz"):
                status, body = 200, {"ok": True}
            elif path.startswith(b"/readyz"):
                ok, body = await core.status()
                status = 200 if ok else 503
            else:
                status, body = 404, {"ok": False, "error": "only /healthz and /readyz here"}
            data = orjson.dumps(body)
            reason = {200: b"OK", 503: b"Service Unavailable", 404: b"Not Found"}[status]
            writer.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                % (status, reason, len(data), data)
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, IndexError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    return await asyncio.start_server(handle, settings.host, settings.probe_port)
