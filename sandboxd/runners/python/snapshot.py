"""A copy of a session's working directory, read from outside the sandbox, for a grade step.

The worker reads the files through ``/proc/<executor>/root``: the session's own view (its tmpfs at
``/tmp``), without entering it. Everything below that directory is the program's to shape, so every
name is resolved with ``openat2(RESOLVE_IN_ROOT)`` from a descriptor on it: a symlink (``/etc/shadow``,
``../../proc/1/root``) resolves inside the session's directory, never in the host's tree, and magic
links are refused. Only regular files are copied, opened without blocking (a FIFO cannot hang the
worker), within a count and a byte budget; what is skipped is said.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import stat
import struct
from dataclasses import dataclass, field

from sandboxd.errors import SessionLost

SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
_libc = ctypes.CDLL(None, use_errno=True)
WORKDIR = "tmp"  # the session's working directory, relative to its root


@dataclass
class Snapshot:
    files: dict[str, bytes] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # path -> why it was not copied
    total: int = 0


def _openat2(dirfd: int, path: str, flags: int) -> int:
    how = struct.pack("QQQ", flags | os.O_CLOEXEC, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(SYS_OPENAT2, dirfd, path.encode(), how, len(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def read_workdir(pid: int, max_files: int, max_bytes: int, workdir: str = WORKDIR) -> Snapshot:
    """The regular files under the session's ``/tmp`` (relative paths), at most ``max_files`` and
    ``max_bytes`` in all; ``SessionLost`` when its process is gone."""
    if platform.system() != "Linux":
        raise SessionLost("a session's files can only be read on Linux")
    try:
        root = os.open(f"/proc/{pid}/root/{workdir}", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise SessionLost(f"the session's sandbox is gone ({exc.strerror})") from None
    snap = Snapshot()
    try:
        _walk(root, "", snap, max_files, max_bytes)
    finally:
        os.close(root)
    return snap


def _walk(root: int, rel: str, snap: Snapshot, max_files: int, max_bytes: int) -> None:
    try:
        d = _openat2(root, rel or ".", os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        snap.skipped[rel or "."] = exc.strerror or "unreadable"
        return
    try:
        names = sorted(os.listdir(d))
    finally:
        os.close(d)
    for name in names:
        path = f"{rel}/{name}" if rel else name
        if len(snap.files) >= max_files:
            snap.skipped[path] = f"more than {max_files} files"
            continue
        try:
            fd = _openat2(root, path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY)
        except OSError as exc:
            snap.skipped[path] = "a symbolic link" if exc.errno == 40 else (exc.strerror or "unreadable")  # ELOOP
            continue
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                os.close(fd)
                fd = -1
                _walk(root, path, snap, max_files, max_bytes)
                continue
            if not stat.S_ISREG(mode):
                snap.skipped[path] = "not a regular file"
                continue
            data = bytearray()
            room = max_bytes - snap.total
            while len(data) <= room:
                chunk = os.read(fd, min(room + 1 - len(data), 1 << 20))
                if not chunk:
                    break
                data += chunk
            if len(data) > room:
                snap.skipped[path] = f"the session's files pass {max_bytes} bytes in all"
                continue
            snap.files[path] = bytes(data)
            snap.total += len(data)
        finally:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
