"""Which paths are the E2B API's: the control plane's (its error shape for every refusal, served or not) and a
sandbox's data plane (the only ones its access token opens)."""

from __future__ import annotations

# The code interpreter (port 49999) and envd (port 49983) paths the SDK calls on E2B_SANDBOX_URL.
DATA_EXACT = frozenset({b"/execute", b"/contexts", b"/health", b"/files"})
DATA_PREFIXES = (b"/contexts/", b"/process.Process/", b"/filesystem.Filesystem/")
# The first segment of every path of E2B's API document (sandboxes, their v2/v3 revisions, templates,
# snapshots, volumes, secrets, teams, keys): served or not, a refusal there has E2B's shape.
CONTROL_HEADS = ("sandboxes", "v2", "v3", "templates", "snapshots", "volumes", "volumecontent", "secrets", "teams")
CONTROL_PREFIXES = tuple(f"/{head}".encode() for head in CONTROL_HEADS)


def is_data_plane(path: bytes) -> bool:
    return path in DATA_EXACT or path.startswith(DATA_PREFIXES)


def is_e2b(path: bytes) -> bool:
    """A path of the E2B API (control or data plane)."""
    if is_data_plane(path):
        return True
    if not path.startswith(CONTROL_PREFIXES):
        return False
    head = path[1:].split(b"/", 1)[0]
    return head.decode("latin-1") in CONTROL_HEADS
