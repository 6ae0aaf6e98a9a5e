"""A copy of a session's working directory, read from outside the sandbox, for a grade step.

The worker reads the files through ``/proc/<executor>/root``: the session's own view (its tmpfs at
``/tmp``), without entering it. Everything below that directory is the program's to shape, so every
name is resolved with ``openat2(RESOLVE_IN_ROOT)`` from a descriptor on it: a symlink (``/etc/shadow``,
``../../proc/1/root``) resolves inside the session's directory, never in the host's tree, and magic
links are refused. Only regular files are copied, opened without blocking (a FIFO cannot hang the
worker), within a count and a byte budget; what is skipped is said.

The tree is the program's too, so the walk is iterative and bounded: paths longer than a step's own file
paths may be (``MAX_PATH_BYTES``, which also bounds the depth) are not entered, at most ``MAX_ENTRIES``
entries are read (400,000 empty files cost the worker nothing past that), and the skipped paths are listed
up to ``SKIPPED_LISTED``, with how many more.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import stat
import struct
from dataclasses import dataclass, field

from sandboxd.errors import SessionLost
from sandboxd.runners.jail.models import MAX_PATH_BYTES

SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
_libc = ctypes.CDLL(None, use_errno=True)
WORKDIR = "tmp"  # the session's working directory, relative to its root
MAX_ENTRIES = 20_000  # directory entries one walk reads at most (files, directories, links, anything)
SKIPPED_LISTED = 100  # skipped paths named one by one; the rest are counted


@dataclass
class Snapshot:
    files: dict[str, bytes] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # path -> why it was not copied
    total: int = 0


def _openat2(dirfd: int, path: str, flags: int) -> int:
    how = struct.pack("QQQ", flags | os.O_CLOEXEC, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(SYS_OPENAT2, dirfd, os.fsencode(path), how, len(how))
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
    walk = _Walk(root, max_files, max_bytes)
    try:
        walk.run()
    finally:
        os.close(root)
    return walk.snap


class _Walk:
    """One bounded, iterative walk of a session's directory (depth-first, names in order)."""

    def __init__(self, root: int, max_files: int, max_bytes: int) -> None:
        self.root, self.max_files, self.max_bytes = root, max_files, max_bytes
        self.snap = Snapshot()
        self.entries = 0
        self.unlisted = 0  # skipped paths past SKIPPED_LISTED

    def skip(self, path: str, why: str) -> None:
        if len(self.snap.skipped) < SKIPPED_LISTED:
            self.snap.skipped[path] = why
        else:
            self.unlisted += 1

    def run(self) -> None:
        stack = [""]
        while stack:
            rel = stack.pop()
            names = self._names(rel)
            if names is None:
                break
            dirs = []
            for name in names:
                path = f"{rel}/{name}" if rel else name
                if self._visit(path):
                    dirs.append(path)
            stack.extend(reversed(dirs))
        if self.unlisted:
            self.snap.skipped["..."] = f"and {self.unlisted} more paths skipped"

    def _names(self, rel: str) -> list[str] | None:
        """The directory's names, sorted; None once the walk has read ``MAX_ENTRIES`` (it stops there)."""
        try:
            d = _openat2(self.root, rel or ".", os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            self.skip(rel or ".", exc.strerror or "unreadable")
            return []
        names = []
        try:
            with os.scandir(d) as it:
                for entry in it:
                    self.entries += 1
                    if self.entries > MAX_ENTRIES:
                        self.skip(
                            rel or ".", f"the session holds more than {MAX_ENTRIES} entries: the rest was not read"
                        )
                        return None
                    names.append(entry.name)
        finally:
            os.close(d)
        return sorted(names)

    def _visit(self, path: str) -> bool:
        """Copy ``path`` if it is a regular file that fits; True when it is a directory to enter."""
        try:
            path.encode()
        except UnicodeEncodeError:  # a name that is not UTF-8 cannot be a key of the JSON answer: said, not sent
            shown = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            self.skip(shown[:200], "a name that is not UTF-8")
            return False
        if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
            self.skip(path[:200] + "...", f"a path longer than {MAX_PATH_BYTES} bytes")
            return False
        if len(self.snap.files) >= self.max_files:
            self.skip(path, f"more than {self.max_files} files")
            return False
        try:
            fd = _openat2(self.root, path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY)
        except OSError as exc:
            self.skip(path, "a symbolic link" if exc.errno == errno.ELOOP else (exc.strerror or "unreadable"))
            return False
        try:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                return True
            if not stat.S_ISREG(mode):
                self.skip(path, "not a regular file")
                return False
            data = bytearray()
            room = self.max_bytes - self.snap.total
            while len(data) <= room:
                chunk = os.read(fd, min(room + 1 - len(data), 1 << 20))
                if not chunk:
                    break
                data += chunk
            if len(data) > room:
                self.skip(path, f"the session's files pass {self.max_bytes} bytes in all")
                return False
            self.snap.files[path] = bytes(data)
            self.snap.total += len(data)
            return False
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
