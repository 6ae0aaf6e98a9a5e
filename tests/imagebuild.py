"""Container images for the tests, built from this host's own programs (no registry, no download).

``host_image`` makes an OCI image layout whose base layer holds the named programs with every library they
load (``ldd``) and the dynamic loader, at the paths this merged-/usr Debian has them (``bin``, ``lib``,
``lib64`` and ``sbin`` links to ``usr``), an ``/etc/passwd`` and ``/etc/group``; further layers are given as
entries (``tests/test_images.layer``). The programs run in the image as they run here.
"""

from __future__ import annotations

import functools
import io
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from tests.test_images import Entry, layer, oci_layout

PASSWD = "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n"
GROUP = "root:x:0:\nagent:x:1000:\nwheel:x:10:agent\nnogroup:x:65534:\n"
SHELL_TOOLS = (
    "sh",
    "cat",
    "ls",
    "id",
    "env",
    "sleep",
    "echo",
    "pwd",
    "touch",
    "rm",
    "mkdir",
    "head",
    "tail",
    "grep",
    "cut",
    "stat",
    "kill",
)


@functools.cache
def _closure(programs: tuple[str, ...]) -> tuple[str, ...]:
    """The programs' host paths and every library they load (with the loader)."""
    paths: set[str] = set()
    for name in programs:
        path = shutil.which(name) or name
        paths.add(path)
        out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.search(r"(/\S+)", line.split("=>")[-1])
            if m:
                paths.add(m.group(1))
    return tuple(sorted(paths))


def _members(path: str, seen: dict[str, tuple[Any, ...]]) -> None:
    """``path`` as the image holds it: its real directory's entry (a link's target followed, and kept too)."""
    directory = os.path.realpath(os.path.dirname(path))
    entry = f"{directory}/{os.path.basename(path)}"
    rel = entry.lstrip("/")
    if rel in seen:
        return
    if os.path.islink(entry):
        target = os.readlink(entry)
        seen[rel] = ("sym", target)
        _members(os.path.join(directory, target), seen)
    else:
        seen[rel] = ("file", Path(entry).read_bytes(), os.stat(entry).st_mode & 0o777)


def base_layer(programs: tuple[str, ...] = SHELL_TOOLS, extra: tuple[Entry, ...] = ()) -> bytes:
    seen: dict[str, tuple[Any, ...]] = {}
    for path in _closure(tuple(programs)):
        _members(path, seen)
    entries: list[Entry] = [("dir", "etc"), ("dir", "tmp", 0o1777), ("dir", "root", 0o700), ("dir", "home")]
    for link in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{link}"):
            entries.append(("sym", link, os.readlink(f"/{link}")))
    dirs = {os.path.dirname(rel) for rel in seen} - {""}
    parents = {"/".join(d.split("/")[:i]) for d in dirs for i in range(1, d.count("/") + 2)}
    entries += [("dir", d) for d in sorted(parents)]
    for rel, (kind, *rest) in sorted(seen.items()):
        entries.append((kind, rel, *rest))
    entries += [
        ("file", "etc/passwd", PASSWD.encode()),
        ("file", "etc/group", GROUP.encode()),
        ("dir", "home/agent", 0o755, 1000),
        *extra,
    ]
    return layer(*entries)


def host_image(root: Path, name: str, layers: list[bytes] | None = None, **config: Any) -> Path:
    """An OCI layout at ``root``: the host programs' base layer, then ``layers``; ``config`` as Docker's."""
    return oci_layout(root, [base_layer(), *(layers or [])], ref=name, **config)


def tar_bytes(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path, data in members.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()
