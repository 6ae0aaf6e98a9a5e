"""Container images for the tests, built from this host's own programs (``sandboxd.bench.hostimage``: no
registry, no download), as OCI layouts with the tests' own further layers (``tests.test_images.layer``)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from sandboxd.bench.hostimage import SHELL_TOOLS, base_entries, write_dir_layer
from tests.test_images import Entry, layer, oci_layout


def base_layer(extra: tuple[Entry, ...] = (), programs: tuple[str, ...] = SHELL_TOOLS) -> bytes:
    """The shell and its tools (and ``programs``) with their libraries, the merged-/usr links, users and groups
    (``hostimage.base_entries``), an agent's home, then ``extra``."""
    return layer(*base_entries(programs), ("dir", "home/agent", 0o755, 1000), *extra)


def dir_layer(directory: str) -> bytes:
    """A host directory as a layer of its own, at its own path."""
    with tempfile.NamedTemporaryFile(dir="/var/tmp") as f:
        write_dir_layer(Path(f.name), directory)
        return Path(f.name).read_bytes()


def host_image(
    root: Path, name: str, layers: list[bytes] | None = None, base: bytes | None = None, **config: Any
) -> Path:
    """An OCI layout at ``root``: the host programs' base layer (or ``base``), then ``layers``; ``config`` as
    Docker's."""
    return oci_layout(root, [base or base_layer(), *(layers or [])], ref=name, compress=False, **config)
