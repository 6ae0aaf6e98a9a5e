"""Framing shared by the worker and the code inside the jail (stdlib only).

A frame is ``!II`` (header length, body length), a JSON header, then raw body
bytes. Program output travels as body bytes so that 1 MiB of stdout costs a
memcpy, not a base64 round trip.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from typing import Any

PREFIX = struct.Struct("!II")
MAX_HEADER_BYTES = 1 << 20
MAX_BODY_BYTES = 256 << 20
# The worker asks a zygote for executors one byte each: SPAWN_LEAN for one forked from the zygote itself,
# SPAWN_ENV + i for one forked from environment i's template (its preloads imported; a lean one while it
# has none). START_TEMPLATE + i starts that template (the worker has the zygote in the template's own
# cgroup meanwhile) and is answered by a "template" frame. At most MAX_ENVS environments.
SPAWN_LEAN = ord("f")
MAX_ENVS = 0x40
SPAWN_ENV = 0x80
START_TEMPLATE = 0xC0


def exit_report(status: int, ru: Any) -> dict[str, Any]:
    """How a child ended, from ``wait4``: the frame the zygote sends for an executor and a fork's holder for
    a member (the kernel's word: nothing the program ran can write it)."""
    # ``t``: when it was reaped, on the monotonic clock the worker reads too (a jail has no time namespace):
    # how the worker knows a one-shot it saw end late ended in time or not (``exchange._judge_late_end``).
    msg: dict[str, Any] = {
        "op": "exit",
        "cpu_s": ru.ru_utime + ru.ru_stime,
        "max_rss_kb": ru.ru_maxrss,
        "t": time.monotonic(),
    }
    if os.WIFSIGNALED(status):
        msg["signal"] = os.WTERMSIG(status)
        msg["exit_code"] = 128 + os.WTERMSIG(status)
    else:
        msg["signal"] = None
        msg["exit_code"] = os.WEXITSTATUS(status)
    return msg


class WireError(Exception):
    """The peer closed the stream or sent something that is not a frame."""


def encode(header: dict[str, Any], body: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return PREFIX.pack(len(head), len(body)) + head + body


def decode_prefix(prefix: bytes) -> tuple[int, int]:
    head_len, body_len = PREFIX.unpack(prefix)
    if head_len > MAX_HEADER_BYTES or body_len > MAX_BODY_BYTES:
        raise WireError(f"frame too large: header {head_len} B, body {body_len} B")
    return head_len, body_len


def pop_header(buf: bytearray) -> dict[str, Any] | None:
    """The header of the first whole frame in ``buf``, taken off it with its body (control frames carry
    none); None while the frame is still incomplete."""
    if len(buf) < PREFIX.size:
        return None
    head_len, body_len = decode_prefix(bytes(buf[: PREFIX.size]))
    total = PREFIX.size + head_len + body_len
    if len(buf) < total:
        return None
    header = json.loads(bytes(buf[PREFIX.size : PREFIX.size + head_len]))
    del buf[:total]
    return dict(header)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise WireError("peer closed the stream")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    """Blocking read of one frame (used inside the jail)."""
    head_len, body_len = decode_prefix(_recv_exact(sock, PREFIX.size))
    header = json.loads(_recv_exact(sock, head_len))
    body = _recv_exact(sock, body_len) if body_len else b""
    return header, body
