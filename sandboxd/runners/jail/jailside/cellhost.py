"""A container session's python kernel: the image's own interpreter, keeping its globals between cells.

The session's executor (``container.py``) starts it on the first python cell with ``python3 -u -c`` this
source, as the session's user, in the session's environment and directory: what a cell imports is what the
image installed. Cells come on fd 3 (a length-prefixed source and stdin each, and a nonce); after each the
kernel writes the nonce and the cell's exit status on fd 4 (a status the executor did not ask for, a cell's
own forgery, ends the kernel). Output goes where the session's commands write theirs. A cell runs as a
python session's does: an uncaught exception prints its traceback and is status 1, ``SystemExit`` its code,
the deadline's SIGINT a ``KeyboardInterrupt``. Stdlib only, and Python 3.8 and later (the images' own).
"""

from __future__ import annotations

import io
import os
import signal
import struct
import sys
import traceback
from typing import Any

HEAD = struct.Struct(">II8s")  # container.py's CELL_HEAD: the source's and stdin's lengths, the cell's nonce
STATUS = struct.Struct(">8si")  # container.py's CELL_STATUS: the nonce back, and the status


def _read(n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = os.read(3, n - len(out))
        if not chunk:
            return b""
        out += chunk
    return out


def _status(exc: BaseException) -> int:
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        print(code, file=sys.stderr)
        return 1
    tb = exc.__traceback__
    traceback.print_exception(type(exc), exc, tb.tb_next if tb is not None else None)  # without this frame
    return 1


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass


def serve() -> None:
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    sys.modules["_sandboxd_cellhost"] = type(sys)("_sandboxd_cellhost")  # what the E2B driver looks for
    cell = 0
    while True:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt meant for a cell that has ended
        head = _read(HEAD.size)
        if not head:
            return
        source_len, stdin_len, nonce = HEAD.unpack(head)
        source, stdin = _read(source_len), _read(stdin_len)
        cell += 1
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
        try:
            try:
                signal.signal(signal.SIGINT, signal.default_int_handler)
                exec(compile(source, f"<cell {cell}>", "exec"), namespace)
                rc = 0
            finally:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
        except BaseException as exc:
            try:
                rc = _status(exc)
            except BaseException:
                rc = 1
        _flush()
        os.write(4, STATUS.pack(nonce, rc))


if __name__ == "__main__":
    serve()
