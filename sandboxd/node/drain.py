"""The node's drain token: who may take a node out of service (``POST /drain``, ``sandboxd drain``)."""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
from pathlib import Path

DRAIN_TOKEN_HEADER = "x-sandboxd-drain-token"


def drain_token_path(port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"sandboxd-drain-{port}.token"


class DrainToken:
    """A random token only processes on this machine (in this container) can read: the key to ``/drain``.

    A peer address of 127.0.0.1 is not proof enough: a service-mesh sidecar relays every remote client
    from loopback. The node process writes it (0600, in the node's own temp dir: an emptyDir no sidecar
    mounts) and tells its front processes; ``sandboxd drain`` reads it.
    """

    def __init__(self, port: int) -> None:
        self.value = secrets.token_urlsafe(32)
        self.path = drain_token_path(port) if port else None

    def write(self) -> None:
        if self.path is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a token left by a node killed on this port
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.value)

    def remove(self) -> None:
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                if self.path.read_text() == self.value:
                    self.path.unlink()
