"""Which paths belong to an E2B sandbox's data plane: the only ones its access token opens."""

from __future__ import annotations

# The code interpreter (port 49999) and envd (port 49983) paths the SDK calls on E2B_SANDBOX_URL.
DATA_EXACT = frozenset({b"/execute", b"/contexts", b"/health", b"/files"})
DATA_PREFIXES = (b"/contexts/", b"/process.Process/", b"/filesystem.Filesystem/")


def is_data_plane(path: bytes) -> bool:
    return path in DATA_EXACT or path.startswith(DATA_PREFIXES)
