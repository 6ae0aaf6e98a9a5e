"""The node's image store: layers unpacked once, by content, shared by every image that has them.

    <root>/layers/<diff id hex>/fs      a layer's tree, as overlayfs stacks it (``unpack.py``)
    <root>/layers/<diff id hex>/layer.json
    <root>/images/<quoted name>.json    an image: its layers (lowest first) and the config a sandbox runs with
    <root>/tmp/                         layers being unpacked (published by rename, never seen half-made)
    <root>/store.json                   the store's format and the host uids its owners are shifted to

The root is the node's own (root, group the uid base's gid, 0710): nothing of an image (set-user-id files,
devices a layer is refused for anyway) is reachable from the host's other users. A container's jail binds
``layers/`` from inside its user namespace, as its root (the base uid and gid on the host): the group lets it
through the root, and ``layers/`` and each layer's directory are 0711, so it passes to the layer trees (owned
by the shifted ids, ``unpack.IdRange``) and never lists them. One import or removal at
a time (a lock file): a layer another image still names is never collected.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sandboxd.errors import BadRequest, NotFound
from sandboxd.images.sources import ImageRefused, ImageSource, open_source
from sandboxd.images.unpack import IdRange, Limits, remove_tree, unpack

FORMAT = 2  # 1: owners as the image gave them (before containers ran); 2: shifted by the uid base
NAME = re.compile(r"[a-z0-9][a-z0-9._\-/:@]{0,254}")  # matched whole (fullmatch): no trailing newline


@dataclass(frozen=True)
class RunConfig:
    """What a sandbox of the image starts with (the image config's ``config``)."""

    env: list[str] = field(default_factory=list)
    working_dir: str = "/"
    user: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, config: dict[str, Any]) -> RunConfig:
        c = config.get("config") or {}

        def strings(name: str) -> list[str]:
            value = c.get(name) or []
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{name} must be a list of strings, not {type(value).__name__}")
            return value

        return cls(
            env=strings("Env"),
            working_dir=str(c.get("WorkingDir") or "/"),
            user=str(c.get("User") or ""),
            entrypoint=strings("Entrypoint"),
            cmd=strings("Cmd"),
        )


@dataclass(frozen=True)
class Image:
    name: str
    id: str  # the config's digest: two names of one image have one id
    architecture: str
    layers: list[str]  # diff ids, lowest first
    size: int  # bytes of file contents in its layers
    run: RunConfig
    imported_at: float

    def describe(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def load(cls, path: Path) -> Image:
        doc = json.loads(path.read_text())
        return cls(**{**doc, "run": RunConfig(**doc["run"])})


Progress = Callable[[str], None]


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


class ImageStore:
    def __init__(self, root: Path, limits: Limits, ids: IdRange) -> None:
        self.root, self.limits, self.ids = root, limits, ids

    @classmethod
    def of(cls, settings: Any) -> ImageStore:
        """The node's store, as its settings say (``SANDBOXD_IMAGES_DIR``, ``SANDBOXD_IMAGE_*``)."""
        limits = Limits(settings.image_max_layer_bytes, settings.image_max_layer_entries)
        return cls(Path(settings.images_dir), limits, IdRange(settings.image_uid_base))

    def check(self) -> None:
        """The store was made for this node's uid base (owners are shifted on disk): a store made with another
        base would give every container files owned by nobody it maps."""
        meta = self.root / "store.json"
        try:
            doc = json.loads(meta.read_text())
        except FileNotFoundError:
            if (self.root / "images").is_dir() and any((self.root / "images").iterdir()):
                raise BadRequest(
                    f"the image store {self.root} predates containers (its owners are not shifted): remove its "
                    "images (sandboxd image rm) and import them again"
                ) from None
            return
        except (OSError, ValueError) as exc:
            raise BadRequest(f"the image store's {meta} is unreadable: {exc}") from None
        if doc != {"format": FORMAT, "uid_base": self.ids.base}:
            raise BadRequest(
                f"the image store {self.root} was made with uid base {doc.get('uid_base')} (format "
                f"{doc.get('format')}), this node has SANDBOXD_IMAGE_UID_BASE={self.ids.base}: use that base, or "
                "another SANDBOXD_IMAGES_DIR"
            )

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Only the containers' group may pass (nsjail binds layers/ from inside the jail's user namespace,
        # where its root's group is the base gid); the host's other users may not even look up a name here.
        os.chown(self.root, 0, self.ids.base)
        os.chmod(self.root, 0o710)
        self.check()
        for sub in ("layers", "images", "tmp"):
            (self.root / sub).mkdir(exist_ok=True, mode=0o700)
        os.chmod(self.root / "layers", 0o711)
        if not (self.root / "store.json").is_file():
            self._write(self.root / "store.json", {"format": FORMAT, "uid_base": self.ids.base})

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.prepare()
        with open(self.root / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def layer_dir(self, diff_id: str) -> Path:
        return self.root / "layers" / diff_id.removeprefix("sha256:") / "fs"

    def record_path(self, name: str) -> Path:
        """Its file, by a digest of the name: any name fits a file name (the record holds the name itself)."""
        return self.root / "images" / (hashlib.sha256(name.encode(errors="surrogateescape")).hexdigest() + ".json")

    def import_image(self, source: Path, name: str | None = None, progress: Progress | None = None) -> Image:
        """Import the image at ``source`` (``sources.py``) as ``name`` (default: the name it carries); ``progress``
        gets a line per layer (real task images are GBs: minutes of silence otherwise)."""
        with open_source(source) as src, self._locked():
            chosen = name or (src.names[0] if src.names else "")
            if not chosen:
                raise BadRequest(f"{source} carries no name: give one (sandboxd image import SRC --name NAME)")
            if not isinstance(chosen, str) or not NAME.fullmatch(chosen):
                raise BadRequest(f"image name {chosen!r}: lowercase letters, digits and . _ - / : @, at most 255")
            try:
                run = RunConfig.of(src.config)
            except (TypeError, AttributeError, ValueError) as exc:
                raise ImageRefused(f"{source}: the image's run configuration is malformed ({exc})") from None
            diff_ids = [str(d) for d in src.config["rootfs"]["diff_ids"]]
            try:
                size = 0
                for i, diff_id in enumerate(diff_ids):
                    t0 = time.monotonic()
                    got, note = self._layer(src, i, diff_id)
                    size += got
                    if progress is not None:
                        took = f" in {time.monotonic() - t0:.1f} s" if note != "held" else ""
                        progress(f"layer {i + 1}/{len(diff_ids)} {diff_id[7:19]}: {_size(got)} {note}{took}")
                image = Image(
                    chosen, src.config_digest, str(src.config["architecture"]), diff_ids, size, run, time.time()
                )
                self._write(self.record_path(chosen), image.describe())
            finally:
                self._collect()  # layers this import made that no image names (it failed), or a replaced image's
            return image

    def _layer(self, src: ImageSource, i: int, diff_id: str) -> tuple[int, str]:
        """The layer's bytes, and how it came: ``held`` (the store has it, from this image or another) or
        unpacked now (with what was skipped)."""
        home = self.root / "layers" / diff_id.removeprefix("sha256:")
        blob = src.layers[i]
        if (home / "layer.json").is_file():
            if blob.digest is not None:  # the store has it; the source's blob must still be what it says
                with src.files.open(blob.path) as raw:
                    hashed = _Digesting(raw)
                    while hashed.read(1 << 20):
                        pass
                if hashed.digest() != blob.digest:
                    raise ImageRefused(f"layer {i} ({blob.path}) does not match its digest {blob.digest}")
            return int(json.loads((home / "layer.json").read_text())["bytes"]), "held"
        work = Path(tempfile.mkdtemp(dir=self.root / "tmp"))
        try:
            (work / "fs").mkdir()
            with src.files.open(blob.path) as raw:
                hashed = _Digesting(raw)
                got = unpack(hashed, work / "fs", self.limits, self.ids)  # type: ignore[arg-type]
                while hashed.read(1 << 20):
                    pass
            if blob.digest is not None and hashed.digest() != blob.digest:
                raise ImageRefused(f"layer {i} ({blob.path}) does not match its digest {blob.digest}")
            if got.diff_id != diff_id:
                raise ImageRefused(f"layer {i} ({blob.path}) is {got.diff_id}, not {diff_id} as the config says")
            record = {"diff_id": diff_id, "entries": got.entries, "bytes": got.bytes}
            if got.skipped_devices:
                record["skipped_devices"] = got.skipped_devices
            self._write(work / "layer.json", record)
            os.chmod(work, 0o711)
            os.rename(work, home)
            skipped = got.skipped_devices
            note = f"unpacked, {skipped} device nodes of its /dev skipped (a sandbox has its own)" if skipped else ""
            return got.bytes, note or "unpacked"
        finally:
            if work.exists():
                _remove(work)

    @staticmethod
    def _write(path: Path, doc: dict[str, Any]) -> None:
        """Whole or not at all, and a name of its own while written: every worker of a node prepares the store
        at once (``store.json``)."""
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(doc, indent=1, sort_keys=True))
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def images(self) -> list[Image]:
        images = self.root / "images"
        return [Image.load(path) for path in sorted(images.glob("*.json"))] if images.is_dir() else []

    def get(self, name: str) -> Image:
        path = self.record_path(name)
        if not path.is_file():
            raise NotFound(f"no image {name!r} on this node (sandboxd image list)")
        return Image.load(path)

    def remove(self, name: str) -> list[str]:
        """The image gone: new sandboxes of it are refused at once; its layers no other image names are removed,
        but for those a running sandbox still stacks (returned: removed by a later ``remove`` or import once
        free, so a running sandbox never loses its root's files)."""
        with self._locked():
            path = self.record_path(name)
            if not path.is_file():
                raise NotFound(f"no image {name!r} on this node (sandboxd image list)")
            path.unlink()
            return self._collect()

    def _collect(self) -> list[str]:
        """Remove the layers no image names any more and no sandbox has mounted, and what an interrupted import
        left in tmp/; the layers kept for their sandboxes."""
        kept = {d.removeprefix("sha256:") for image in self.images() for d in image.layers}
        unnamed = [layer for layer in (self.root / "layers").iterdir() if layer.name not in kept]
        busy = mounted_layers() if unnamed else set()
        for layer in unnamed:
            if layer.name not in busy:
                _remove(layer)
        for left in (self.root / "tmp").iterdir():
            _remove(left)
        return sorted(layer.name for layer in unnamed if layer.name in busy)


LAYER_ID = re.compile(rb"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")


def mounted_layers(proc: Path = Path("/proc")) -> set[str]:
    """The layer ids an overlay mount of any mount namespace on this host names (the sandboxes' roots: their
    executors mount ``<layer id>/fs`` lower directories), each namespace read once."""
    seen: set[str] = set()
    found: set[str] = set()
    for pid in proc.iterdir():
        if not pid.name.isdecimal():
            continue
        try:
            ns = os.readlink(pid / "ns" / "mnt")
            if ns in seen:
                continue
            seen.add(ns)
            text = (pid / "mountinfo").read_bytes()
        except OSError:  # it ended, or is not ours to read
            continue
        for line in text.splitlines():
            if b" - overlay " in line:
                found.update(m.decode() for m in LAYER_ID.findall(line))
    return found


class _Digesting:
    """The blob's bytes as read, hashed (its digest in the manifest)."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.hash = raw, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.raw.read(n)
        self.hash.update(data)
        return data

    def digest(self) -> str:
        return "sha256:" + self.hash.hexdigest()


def _remove(path: Path) -> None:
    """Remove a tree the store made (read-only directories, any depth, links left unfollowed)."""
    if path.is_dir() and not path.is_symlink():
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            remove_tree(parent, path.name)
        finally:
            os.close(parent)
    else:
        path.unlink(missing_ok=True)
