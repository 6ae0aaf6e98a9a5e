"""Gateway <-> worker and worker <-> SQL engine messages: 4-byte length + orjson, over a Unix socket."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import orjson

from sandboxd.constants import IPC_MAX_FRAME_BYTES

_LEN = struct.Struct("!I")


def pack(msg: dict[str, Any]) -> bytes:
    data = orjson.dumps(msg)
    return _LEN.pack(len(data)) + data


async def read(reader: asyncio.StreamReader, limit: int = IPC_MAX_FRAME_BYTES) -> dict[str, Any] | None:
    """Next message, or None when the peer closed the stream; ValueError for a frame over ``limit``
    or one that is not JSON."""
    try:
        (size,) = _LEN.unpack(await reader.readexactly(_LEN.size))
        if size > limit:
            raise ValueError(f"IPC frame of {size} bytes exceeds {limit}")
        msg: dict[str, Any] = orjson.loads(await reader.readexactly(size))
        return msg
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
