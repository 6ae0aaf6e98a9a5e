"""Compile cache: the second request for the same program skips its compilation.

Key: the language, its toolchain's version, the compile command with its flags, the source and the
step's other files (a header like ``testlib.h`` changes what compiles). Entries live on the host, in a
directory no jail mounts (a program can neither read nor plant one); each holds the artifact after its
own SHA-256, checked on every read, so a truncated or altered entry is dropped and the program compiled
again. Shared by the node's workers (written to a temporary name and renamed: a reader sees a whole
entry or none), bounded by ``max_bytes``: the least recently used entries go first.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

DIGEST = 32


def cache_key(
    language: str, version: str, command: list[str], source: bytes, files: list[tuple[str, bytes]], tenant: str = ""
) -> str:
    """The entry of one compilation: its toolchain, command, source and files, and whose it is (a hit is
    faster and says ``cached``: shared, it would tell a tenant that another compiled exactly this source)."""
    h = hashlib.sha256()
    for part in (tenant, language, version, "\0".join(command)):
        h.update(part.encode() + b"\0")
    h.update(hashlib.sha256(source).digest())
    for path, data in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


class CompileCache:
    def __init__(self, directory: str, max_bytes: int) -> None:
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.hits = self.misses = self.rejected = 0
        if max_bytes > 0:
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                os.chmod(self.dir, 0o700)
            except OSError as exc:  # every step compiles; nothing else is lost
                log.warning("compile cache: %s is not usable (%s); compiling every time", self.dir, exc)
                self.max_bytes = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def _path(self, key: str) -> Path:
        return self.dir / f"{key}.bin"

    def get(self, key: str) -> bytes | None:
        if not self.enabled:
            return None
        path = self._path(key)
        try:
            blob = path.read_bytes()
        except OSError:
            self.misses += 1
            return None
        digest, artifact = blob[:DIGEST], blob[DIGEST:]
        if len(blob) < DIGEST or hashlib.sha256(artifact).digest() != digest:
            self.rejected += 1
            self.misses += 1
            log.warning("compile cache: entry %s does not match its digest; dropped", path.name)
            path.unlink(missing_ok=True)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: evicted last
        self.hits += 1
        return artifact

    def put(self, key: str, artifact: bytes) -> None:
        if not self.enabled or len(artifact) + DIGEST > self.max_bytes:
            return
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(hashlib.sha256(artifact).digest() + artifact)
            os.replace(tmp, self._path(key))
        except OSError as exc:
            log.warning("compile cache: cannot store an entry: %s", exc)
            Path(tmp).unlink(missing_ok=True)
            return
        self._evict()

    def _evict(self) -> None:
        entries = []
        total = 0
        for entry in os.scandir(self.dir):
            if entry.name.endswith(".bin"):
                try:
                    st = entry.stat()
                except OSError:
                    continue
                entries.append((st.st_mtime, st.st_size, entry.path))
                total += st.st_size
        entries.sort()
        for _, size, path in entries:
            if total <= self.max_bytes:
                break
            Path(path).unlink(missing_ok=True)
            total -= size
