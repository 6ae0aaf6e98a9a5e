"""Container images for the tests, built from this host's own programs (``sandboxd.bench.hostimage``: no
registry, no download), as OCI layouts with the tests' own further layers (``tests.test_images.layer``)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sandboxd.bench.hostimage import SHELL_TOOLS, base_entries, write_dir_layer
from sandboxd.images.store import ImageStore
from sandboxd.images.unpack import Limits
from tests.test_images import IDS, Entry, layer, oci_layout


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


SYSTEM_PYTHON = os.path.basename(os.path.realpath("/usr/bin/python3"))  # python3.11 here, 3.13 on trixie
TEMPLATE_TOOLS = ("bash", "sh", "cat", "ls", "echo", "pwd", "sleep", "wc", "id", "env", "mkdir", "rm")


def python_template(root: Path, name: str) -> Path:
    """An E2B custom template's image: bash and coreutils, the system's python3 with its standard library, an
    application module only that interpreter imports (``/opt/app/greeter.py``, on its ``PYTHONPATH``), a
    ``/home/user`` with its own ``.profile``; the user ``agent`` (1000)."""
    ctypes_module = glob.glob(f"/usr/lib/{SYSTEM_PYTHON}/lib-dynload/_ctypes.*.so")  # for its libffi
    base = base_layer(programs=(*TEMPLATE_TOOLS, f"/usr/bin/{SYSTEM_PYTHON}", *ctypes_module))
    app = layer(
        ("dir", "opt/app", 0o755),
        ("file", "opt/app/greeter.py", b"def greet(name):\n    return 'hello ' + name + ' from the image'\n", 0o644),
        ("sym", "usr/bin/python3", SYSTEM_PYTHON),
        ("dir", "home/user", 0o755, 1000),
        ("file", "home/user/.profile", b"export FROM_PROFILE=image\n", 0o644, 1000),
    )
    config: dict[str, Any] = {"Env": ["PATH=/usr/bin:/bin", "PYTHONPATH=/opt/app"], "User": "agent"}
    return host_image(root, name, [dir_layer(f"/usr/lib/{SYSTEM_PYTHON}"), app], base, **config)


STORE_LIMITS = Limits(256 << 20, 100_000)  # the tests' images: a few hundred MiB and files at most


@contextlib.contextmanager
def image_store(prefix: str, limits: Limits = STORE_LIMITS) -> Iterator[tuple[Path, ImageStore]]:
    """A work directory and an empty store in it, removed after. Under /var/tmp, not pytest's ``tmp_path`` (0700):
    the jails bind the store's layers from inside their user namespace, so every directory above it must let
    others pass."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    root.chmod(0o755)
    try:
        yield root, ImageStore(root / "store", limits, IDS)
    finally:
        shutil.rmtree(root, ignore_errors=True)
