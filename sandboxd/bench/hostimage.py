"""An image made of this host's own programs and directories, imported into the node's store: what ``sandboxd
bench B8 --image`` starts where no registry is reachable, and what the tests' images are built from.

    python -m sandboxd.bench.hostimage --name bench/host:1 [--dirs /usr/lib/jvm /usr/lib/go-1.19 ...]

The base layer holds a shell and the usual tools with every library they load (``ldd``) and the loader, at
the paths this merged-/usr Debian has them (``bin``, ``lib``, ``lib64`` and ``sbin`` as links to ``usr``),
an ``/etc/passwd`` and ``/etc/group``; each ``--dirs`` directory is a layer of its own, as it is on the host
(its files read as they are, owned by the image's root). Layers are written uncompressed to a temporary OCI
layout and imported as ``sandboxd image import`` would.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandboxd.images.store import Image, ImageStore

SHELL_TOOLS = (
    "sh", "cat", "ls", "id", "env", "sleep", "echo", "pwd", "touch", "rm", "mkdir", "head", "tail", "grep", "cut",
    "stat", "kill", "wc",
)  # fmt: skip
PASSWD = "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n"
GROUP = "root:x:0:\nagent:x:1000:\nwheel:x:10:agent\nnogroup:x:65534:\n"
Member = tuple[Any, ...]  # ("file", host path, mode) or ("sym", target), by path in the image


def program_members(programs: tuple[str, ...] = SHELL_TOOLS) -> dict[str, Member]:
    """The programs and every library they load, by their path in the image (a link's target kept too)."""
    paths: set[str] = set()
    for name in programs:
        path = shutil.which(name) or name
        paths.add(path)
        out = subprocess.run(["ldd", path], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            m = re.search(r"(/\S+)", line.split("=>")[-1])
            if m:
                paths.add(m.group(1))
    seen: dict[str, Member] = {}
    for path in sorted(paths):
        _member(path, seen)
    return seen


def _member(path: str, seen: dict[str, Member]) -> None:
    directory = os.path.realpath(os.path.dirname(path))
    entry = f"{directory}/{os.path.basename(path)}"
    rel = entry.lstrip("/")
    if rel in seen:
        return
    if os.path.islink(entry):
        target = os.readlink(entry)
        seen[rel] = ("sym", target)
        _member(os.path.join(directory, target), seen)
    else:
        seen[rel] = ("file", entry, os.stat(entry).st_mode & 0o777)


def root_links() -> dict[str, str]:
    """The merged-/usr links of this host's root (``bin -> usr/bin``...)."""
    return {link: os.readlink(f"/{link}") for link in ("bin", "lib", "lib64", "sbin") if os.path.islink(f"/{link}")}


def parents(paths: list[str]) -> list[str]:
    dirs = {os.path.dirname(rel) for rel in paths} - {""}
    return sorted({"/".join(d.split("/")[:i]) for d in dirs for i in range(1, d.count("/") + 2)})


def _add(
    tar: tarfile.TarFile, name: str, kind: str, data: bytes = b"", mode: int = 0o755, link: str = "", owner: int = 0
) -> None:
    info = tarfile.TarInfo(name)
    info.mtime, info.mode = 1_700_000_000, mode
    info.uid = info.gid = owner
    if kind == "dir":
        info.type = tarfile.DIRTYPE
    elif kind == "sym":
        info.type, info.linkname = tarfile.SYMTYPE, link
    else:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if kind == "file" else None)


def base_entries(programs: tuple[str, ...] = SHELL_TOOLS) -> list[tuple[Any, ...]]:
    """The base layer's entries, in order: ``("dir", name, mode)``, ``("sym", name, target)``, ``("file", name,
    data, mode)``: the root's directories and merged-/usr links, the programs with their libraries, the users."""
    members = program_members(programs)
    entries: list[tuple[Any, ...]] = [("dir", "etc", 0o755), ("dir", "tmp", 0o1777), ("dir", "root", 0o700)]
    entries.append(("dir", "home", 0o755))
    entries += [("sym", link, target) for link, target in root_links().items()]
    entries += [("dir", d, 0o755) for d in parents(list(members))]
    for rel, (kind, *rest) in sorted(members.items()):
        entries.append(("sym", rel, rest[0]) if kind == "sym" else ("file", rel, Path(rest[0]).read_bytes(), rest[1]))
    entries += [("file", "etc/passwd", PASSWD.encode(), 0o644), ("file", "etc/group", GROUP.encode(), 0o644)]
    return entries


def write_layer(path: Path, entries: list[tuple[Any, ...]]) -> None:
    """A layer of ``base_entries``-shaped entries; a ``dir`` or ``file`` may end with its owner's id (root's
    otherwise)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for kind, name, *rest in entries:
            if kind == "dir":
                _add(tar, name, "dir", mode=rest[0], owner=rest[1] if len(rest) > 1 else 0)
            elif kind == "sym":
                _add(tar, name, "sym", link=rest[0])
            else:
                _add(tar, name, "file", rest[0], rest[1], owner=rest[2] if len(rest) > 2 else 0)


def write_base_layer(path: Path, programs: tuple[str, ...] = SHELL_TOOLS) -> None:
    write_layer(path, base_entries(programs))


def write_dir_layer(path: Path, directory: str) -> None:
    """``directory`` as it is on the host, at its own path, owned by the image's root."""

    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if not (info.isfile() or info.isdir() or info.issym() or info.islnk()):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    real = os.path.realpath(directory)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for d in parents([real.lstrip("/") + "/x"]):
            _add(tar, d, "dir")
        tar.add(real, arcname=real.lstrip("/"), filter=owned)


def oci_layout(root: Path, layers: list[Path], name: str, config: dict[str, Any]) -> Path:
    """An OCI image layout of uncompressed layers (the files are moved into its blobs)."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put_file(path: Path) -> tuple[str, int]:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        size = path.stat().st_size
        path.rename(blobs / digest.hexdigest())
        return "sha256:" + digest.hexdigest(), size

    def put(data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return "sha256:" + digest

    stored = [put_file(p) for p in layers]
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    image_config = {
        "architecture": arch,
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [d for d, _ in stored]},
    }
    cfg = json.dumps(image_config).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": put(cfg), "size": len(cfg)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": n} for d, n in stored],
    }
    data = json.dumps(manifest).encode()
    desc = {
        "mediaType": manifest["mediaType"],
        "digest": put(data),
        "size": len(data),
        "annotations": {"org.opencontainers.image.ref.name": name},
    }
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root


def import_layers(store: ImageStore, name: str, writers: list[Callable[[Path], None]], config: dict[str, Any]) -> Image:
    """An image of the layers ``writers`` write (each given its file, lowest first) and Docker's ``config``,
    imported into ``store`` through a temporary OCI layout."""
    with tempfile.TemporaryDirectory(dir="/var/tmp") as work:
        paths = [Path(work) / f"layer{i}.tar" for i in range(len(writers))]
        for write, path in zip(writers, paths, strict=True):
            write(path)
        return store.import_image(oci_layout(Path(work) / "oci", paths, name, config))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True, help="the image's name in the store")
    ap.add_argument("--dirs", nargs="*", default=[], help="host directories, a layer each")
    args = ap.parse_args()
    from sandboxd.config import load_settings
    from sandboxd.images.store import ImageStore

    writers: list[Callable[[Path], None]] = [write_base_layer]
    writers += [functools.partial(write_dir_layer, directory=d) for d in args.dirs]
    config = {"Env": ["PATH=/usr/bin:/bin"], "Cmd": ["sh"]}
    image = import_layers(ImageStore.of(load_settings()), args.name, writers, config)
    print(f"{image.name}: {len(image.layers)} layers, {image.size} bytes, id {image.id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
