"""Where an image comes from: an OCI image layout (a directory, or a tar of one: ``skopeo copy oci:`` and
``oci-archive:``) or a ``docker save`` archive. Either gives the image's config and its layers' blobs, each
checked against its digest as it is read; a digest is a name in the source, never a path to follow."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import stat
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sandboxd.errors import BadRequest

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
INDEX_TYPES = {
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
}
MAX_ARCHIVE_MEMBERS = 100_000  # files in an image archive: an image has a handful per layer
MAX_JSON_BYTES = 16 << 20  # a manifest, an index or a config larger than this is not one
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())


class ImageRefused(BadRequest):
    """An image source that is not one, or not one this node can run: named by what is wrong with it."""


@dataclass(frozen=True)
class LayerBlob:
    path: str  # inside the source
    digest: str | None  # the blob's own digest (OCI); docker save's layers are checked by their diff id only


@dataclass(frozen=True)
class ImageSource:
    config: dict[str, Any]
    config_digest: str
    layers: list[LayerBlob]
    names: list[str]  # what the source calls it (RepoTags; the ref.name annotation)
    files: Files


class Files:
    """Read-only access to the source's files by their paths inside it (a directory, or a tar archive)."""

    def __init__(self, path: Path, archive: tarfile.TarFile | None) -> None:
        self.path, self.archive = path, archive
        self.members = {m.name.removeprefix("./"): m for m in archive.getmembers()} if archive else {}
        if len(self.members) > MAX_ARCHIVE_MEMBERS:
            raise ImageRefused(f"{path} holds more than {MAX_ARCHIVE_MEMBERS} files: not an image archive")

    def exists(self, rel: str) -> bool:
        if self.archive is not None:
            return rel in self.members
        return self._local(rel).is_file()

    def _local(self, rel: str) -> Path:
        full = Path(os.path.realpath(self.path / rel))
        if not full.is_relative_to(Path(os.path.realpath(self.path))):
            raise ImageRefused(f"{rel!r} leads out of the image source {self.path}")
        return full

    @contextlib.contextmanager
    def open(self, rel: str) -> Iterator[IO[bytes]]:
        if self.archive is not None:
            member = self.members.get(rel)
            stream = self.archive.extractfile(member) if member is not None and member.isfile() else None
            if stream is None:
                raise ImageRefused(f"the image archive has no file {rel!r}")
            with stream:
                yield stream
            return
        try:
            # Non-blocking: a FIFO planted as a blob must not hang the import; only a regular file is read.
            fd = os.open(self._local(rel), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ImageRefused(f"the image layout has no file {rel!r}") from None
        except (OSError, ValueError) as exc:
            raise ImageRefused(f"the image layout's {rel!r} cannot be read: {exc}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ImageRefused(f"the image layout's {rel!r} is not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            yield f

    def json(self, rel: str, digest: str | None = None) -> Any:
        with self.open(rel) as f:
            data = f.read(MAX_JSON_BYTES + 1)
        if len(data) > MAX_JSON_BYTES:
            raise ImageRefused(f"{rel!r} is larger than {MAX_JSON_BYTES} bytes")
        if digest is not None and "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise ImageRefused(f"{rel!r} does not match its digest {digest}")
        try:
            return json.loads(data)
        except ValueError as exc:
            raise ImageRefused(f"{rel!r} is not JSON: {exc}") from None


def blob(digest: Any) -> str:
    if not isinstance(digest, str) or not DIGEST.match(digest):
        raise ImageRefused(f"{digest!r} is not a sha256 digest")
    return "blobs/sha256/" + digest.removeprefix("sha256:")


@contextlib.contextmanager
def open_source(path: Path) -> Iterator[ImageSource]:
    """The image at ``path``: an OCI layout directory, or a tar of one or of ``docker save``."""
    if path.is_dir():
        yield _read(Files(path, None))
        return
    if not path.is_file():
        raise ImageRefused(f"{path}: no such directory or archive")
    try:
        archive = tarfile.open(path, "r:*")  # noqa: SIM115  # closed below, once the caller is done with it
    except (tarfile.TarError, EOFError, zlib.error, RecursionError, MemoryError) as exc:
        raise ImageRefused(f"{path}: not an OCI layout or a docker save archive ({type(exc).__name__})") from None
    with archive:
        try:
            files = Files(path, archive)
        except (tarfile.TarError, EOFError, zlib.error, RecursionError, MemoryError) as exc:
            raise ImageRefused(f"{path}: a broken archive ({type(exc).__name__}: {exc})") from None
        yield _read(files)


def _read(files: Files) -> ImageSource:
    """The source's image; metadata of the wrong shape (JSON that is not what the spec says) refused by name."""
    try:
        return _shaped(files)
    except (TypeError, AttributeError, KeyError, ValueError, RecursionError) as exc:
        raise ImageRefused(f"{files.path}: malformed image metadata ({type(exc).__name__}: {exc})") from None


def _shaped(files: Files) -> ImageSource:
    if files.exists("manifest.json") and not files.exists("index.json"):
        return _docker_save(files)
    if files.exists("index.json"):
        return _oci(files)
    raise ImageRefused(f"{files.path}: neither an OCI layout (index.json) nor a docker save archive (manifest.json)")


def _oci(files: Files) -> ImageSource:
    index = files.json("index.json")
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list) or not manifests:
        raise ImageRefused("index.json lists no manifest")
    if len(manifests) > 1:  # one image per import: the one for this node's platform
        manifests = [m for m in manifests if _ours(m)] or manifests[:0]
        if len(manifests) != 1:
            raise ImageRefused(f"index.json lists several images and not exactly one for linux/{ARCH}")
    entry = manifests[0]
    names = [n for n in [entry.get("annotations", {}).get("org.opencontainers.image.ref.name")] if n]
    manifest = files.json(blob(entry.get("digest")), entry.get("digest"))
    for _ in range(2):  # an index of platforms inside the layout: pick ours
        if manifest.get("mediaType") not in INDEX_TYPES and "manifests" not in manifest:
            break
        ours = [m for m in manifest.get("manifests", []) if _ours(m)]
        if not ours:
            raise ImageRefused(f"the image has no manifest for linux/{ARCH}")
        manifest = files.json(blob(ours[0].get("digest")), ours[0].get("digest"))
    config_desc, layers = manifest.get("config"), manifest.get("layers")
    if not isinstance(config_desc, dict) or not isinstance(layers, list):
        raise ImageRefused("the manifest has no config or no layers")
    digest = config_desc.get("digest")
    config = files.json(blob(digest), digest)
    blobs = [LayerBlob(blob(d.get("digest")), d.get("digest")) for d in layers if isinstance(d, dict)]
    return ImageSource(_checked(config, len(blobs)), str(digest), blobs, names, files)


def _ours(desc: dict[str, Any]) -> bool:
    plat = desc.get("platform") or {}
    return bool(plat.get("os") == "linux" and plat.get("architecture") == ARCH)


def _docker_save(files: Files) -> ImageSource:
    manifest = files.json("manifest.json")
    if not isinstance(manifest, list) or len(manifest) != 1 or not isinstance(manifest[0], dict):
        raise ImageRefused("manifest.json must describe exactly one image (docker save one image at a time)")
    entry = manifest[0]
    config_path, layers = entry.get("Config"), entry.get("Layers")
    if not isinstance(config_path, str) or not isinstance(layers, list):
        raise ImageRefused("manifest.json has no Config or no Layers")
    hexname = config_path.removeprefix("blobs/sha256/").removesuffix(".json")
    digest = "sha256:" + hexname if re.fullmatch(r"[0-9a-f]{64}", hexname) else None
    config = files.json(config_path, digest)
    if digest is None:
        with files.open(config_path) as f:
            digest = "sha256:" + hashlib.sha256(f.read(MAX_JSON_BYTES)).hexdigest()
    names = [t for t in entry.get("RepoTags") or [] if isinstance(t, str)]
    blobs = [LayerBlob(str(p), None) for p in layers]
    return ImageSource(_checked(config, len(blobs)), digest, blobs, names, files)


def _checked(config: Any, layers: int) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise ImageRefused("the image's config is not an object")
    if config.get("os") != "linux":
        raise ImageRefused(f"the image is for {config.get('os')!r}, not linux")
    if config.get("architecture") != ARCH:
        raise ImageRefused(f"the image is for {config.get('architecture')!r}; this node runs {ARCH}")
    diff_ids = (config.get("rootfs") or {}).get("diff_ids")
    if not isinstance(diff_ids, list) or len(diff_ids) != layers or not all(DIGEST.match(str(d)) for d in diff_ids):
        raise ImageRefused(f"the image's config lists {len(diff_ids or [])} layer diff ids for {layers} layers")
    return config
