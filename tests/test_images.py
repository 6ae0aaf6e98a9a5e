"""The node's image store: OCI layouts and docker save archives imported, layers unpacked once and shared, the
layers stacked by the kernel's overlayfs as a sandbox's root would be, and hostile archives refused without a
byte written outside the store. Images are built here, entry by entry, with tarfile."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxd.errors import BadRequest, NotFound
from sandboxd.images.sources import ARCH
from sandboxd.images.store import ImageStore
from sandboxd.images.unpack import IdRange, Limits, remove_tree

LIMITS = Limits(max_bytes=8 << 20, max_entries=1000)
IDS = IdRange(2_000_000_000)
Entry = tuple[Any, ...]


def layer(*entries: Entry) -> bytes:
    """A layer's tar: ("file", name, data[, mode]), ("dir", name[, mode]), ("sym", name, target),
    ("link", name, target), ("chr", name), ("fifo", name)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for kind, name, *rest in entries:
            info = tarfile.TarInfo(name)
            info.mtime, info.uid, info.gid = 1_700_000_000, 0, 0
            data = None
            if kind == "file":
                data = rest[0]
                info.size, info.mode = len(data), rest[1] if len(rest) > 1 else 0o644
                info.uid = info.gid = rest[2] if len(rest) > 2 else 0
            elif kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, rest[0] if rest else 0o755
                info.uid = info.gid = rest[1] if len(rest) > 1 else 0
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, rest[0]
            elif kind == "link":
                info.type, info.linkname = tarfile.LNKTYPE, rest[0]
            elif kind == "chr":
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def chained_pax_headers(n: int) -> bytes:
    """``n`` PAX extended headers in a row before one file: Python's tarfile reads each by calling itself."""
    record = b"20 comment=xxxxxxxx\n"
    head = tarfile.TarInfo("PaxHeader")
    head.type, head.size = tarfile.XHDTYPE, len(record)
    block = head.tobuf(tarfile.USTAR_FORMAT) + record.ljust(512, b"\0")
    return block * n + layer(("file", "f", b"x"))


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def config_of(layers: list[bytes], arch: str = ARCH, **run: Any) -> dict[str, Any]:
    return {
        "architecture": arch,
        "os": "linux",
        "config": run,
        "rootfs": {"type": "layers", "diff_ids": [sha(x) for x in layers]},
    }


def oci_layout(
    root: Path, layers: list[bytes], ref: str | None = "demo:1", compress: bool = True, arch: str = ARCH, **run: Any
) -> Path:
    """An OCI image layout as ``skopeo copy ... oci:DIR`` writes it."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        (blobs / sha(data).removeprefix("sha256:")).write_bytes(data)
        return sha(data)

    config = json.dumps(config_of(layers, arch, **run)).encode()
    stored = [gzip.compress(x, mtime=0) if compress else x for x in layers]
    media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compress else "")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": put(config), "size": len(config)},
        "layers": [{"mediaType": media, "digest": put(x), "size": len(x)} for x in stored],
    }
    data = json.dumps(manifest).encode()
    desc: dict[str, Any] = {"mediaType": manifest["mediaType"], "digest": put(data), "size": len(data)}
    if ref:
        desc["annotations"] = {"org.opencontainers.image.ref.name": ref}
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root


def docker_save(path: Path, layers: list[bytes], tag: str = "saved/app:latest") -> Path:
    """An archive as ``docker save`` (before Docker 25) writes it: a directory per layer, the config by digest."""
    config = json.dumps(config_of(layers, Cmd=["/bin/sh"])).encode()
    files = {f"{sha(config).removeprefix('sha256:')}.json": config}
    names = []
    for i, x in enumerate(layers):
        files[f"l{i}/layer.tar"] = x
        names.append(f"l{i}/layer.tar")
    files["manifest.json"] = json.dumps([{"Config": next(iter(files)), "RepoTags": [tag], "Layers": names}]).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


BASE = layer(
    ("dir", "etc"),
    ("file", "etc/a", b"alpha\n"),
    ("file", "etc/b", b"beta\n"),
    ("dir", "usr/bin"),
    ("file", "usr/bin/tool", b"#!/bin/sh\necho tool\n", 0o755),
    ("sym", "bin", "usr/bin"),
    ("link", "usr/bin/tool2", "usr/bin/tool"),
    ("dir", "data"),
    ("file", "data/old", b"old\n"),
    ("fifo", "run.pipe"),
    ("dir", "ro", 0o555),
    ("file", "ro/inside", b"x"),
)
TOP = layer(
    ("file", "etc/.wh.b", b""),
    ("file", "data/.wh..wh..opq", b""),
    ("file", "data/new", b"new\n"),
    ("file", "etc/a", b"alpha, again\n"),
)


@pytest.fixture
def store(tmp_path: Path) -> ImageStore:
    return ImageStore(tmp_path / "store", LIMITS, IDS)


@contextlib.contextmanager
def overlay(store: ImageStore, layers: list[str], at: Path) -> Iterator[Path]:
    """The image's layers stacked read-only by the kernel's overlayfs, as a sandbox's root would be."""
    at.mkdir()
    lower = ":".join(str(store.layer_dir(d)) for d in reversed(layers))
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"userxattr,lowerdir={lower}", str(at)], check=True)
    try:
        yield at
    finally:
        subprocess.run(["umount", str(at)], check=True)


def test_an_oci_layout_imports_and_its_layers_stack_under_overlayfs(store: ImageStore, tmp_path: Path) -> None:
    src = oci_layout(
        tmp_path / "oci", [BASE, TOP], Env=["PATH=/usr/bin", "A=1"], WorkingDir="/data", User="1000:1000",
        Entrypoint=["/bin/tool"], Cmd=["--help"],
    )  # fmt: skip
    image = store.import_image(src)
    assert image.name == "demo:1" and image.layers == [sha(BASE), sha(TOP)] and image.architecture == ARCH
    assert image.run.env == ["PATH=/usr/bin", "A=1"] and image.run.working_dir == "/data"
    assert image.run.user == "1000:1000" and image.run.entrypoint == ["/bin/tool"] and image.run.cmd == ["--help"]
    assert [i.name for i in store.images()] == ["demo:1"] and store.get("demo:1") == image
    base, top = store.layer_dir(sha(BASE)), store.layer_dir(sha(TOP))
    whiteout = os.lstat(top / "etc" / "b")
    assert stat.S_ISCHR(whiteout.st_mode) and whiteout.st_rdev == os.makedev(0, 0)
    assert os.getxattr(top / "data", "user.overlay.opaque") == b"y"
    assert os.readlink(base / "bin") == "usr/bin" and stat.S_ISFIFO(os.lstat(base / "run.pipe").st_mode)
    tool = os.lstat(base / "usr/bin/tool")
    assert tool.st_mode & 0o7777 == 0o755 and tool.st_nlink == 2 and tool.st_mtime == 1_700_000_000
    # Owners shifted to the range a container maps; the layer's root and unlisted parents are the image's root.
    assert (tool.st_uid, tool.st_gid) == (IDS.base, IDS.base) and os.stat(base).st_uid == IDS.base
    assert os.stat(store.root / "layers").st_mode & 0o777 == 0o711 and os.stat(base.parent).st_mode & 0o777 == 0o711
    assert os.lstat(base / "ro").st_mode & 0o7777 == 0o555 and (base / "ro" / "inside").read_bytes() == b"x"
    with overlay(store, image.layers, tmp_path / "merged") as root:
        assert not (root / "etc" / "b").exists() and (root / "etc" / "a").read_text() == "alpha, again\n"
        assert sorted(os.listdir(root / "data")) == ["new"]  # opaque: the lower layer's old is hidden
        assert (root / "bin" / "tool").read_text() == "#!/bin/sh\necho tool\n"


def test_layers_are_shared_and_collected_with_the_last_image_that_has_them(store: ImageStore, tmp_path: Path) -> None:
    first = store.import_image(oci_layout(tmp_path / "a", [BASE, TOP], ref="first:1"))
    inode = os.stat(store.layer_dir(sha(BASE))).st_ino
    other_top = layer(("file", "only-in-second", b"2"))
    second = store.import_image(oci_layout(tmp_path / "b", [BASE, other_top], ref=None), name="second:1")
    assert os.stat(store.layer_dir(sha(BASE))).st_ino == inode  # not unpacked again
    assert first.layers[0] == second.layers[0] and second.size == len(b"2") + first.size - len(b"new\n") - len(
        b"alpha, again\n"
    )
    store.remove("first:1")
    assert not store.layer_dir(sha(TOP)).exists() and store.layer_dir(sha(BASE)).is_dir()
    with pytest.raises(NotFound, match="no image 'first:1'"):
        store.get("first:1")
    store.remove("second:1")
    assert not any((store.root / "layers").iterdir()) and store.images() == []
    with pytest.raises(NotFound):
        store.remove("second:1")


def test_a_docker_save_archive_imports_under_its_tag(store: ImageStore, tmp_path: Path) -> None:
    image = store.import_image(docker_save(tmp_path / "saved.tar", [BASE, TOP]))
    assert image.name == "saved/app:latest" and image.run.cmd == ["/bin/sh"] and len(image.layers) == 2
    # An OCI layout inside a tar (skopeo's oci-archive:) is the same image.
    layout = oci_layout(tmp_path / "oci", [BASE], ref="archived:1", compress=False)
    with tarfile.open(tmp_path / "oci.tar", "w") as tar:
        tar.add(layout, arcname=".")
    assert store.import_image(tmp_path / "oci.tar").layers == [sha(BASE)]


HOSTILE = {
    "climbs out": (layer(("file", "../escaped", b"x")), "climbs out"),
    "climbs out deeper": (layer(("dir", "a"), ("file", "a/../../escaped", b"x")), "climbs out"),
    "writes through its own link": (
        layer(("sym", "etc", "OUTSIDE"), ("file", "etc/pwned", b"x")),
        "goes through a link",
    ),
    "hard link to the host": (layer(("link", "passwd", "/etc/passwd")), "which this layer does not hold"),
    "hard link out": (layer(("link", "x", "../../../etc/passwd")), "climbs out"),
    "device node": (layer(("chr", "etc/mem")), "device node, outside /dev: refused.*tar --delete"),
    "device node beside dev": (layer(("dir", "devices"), ("chr", "devices/mem")), "device node, outside /dev"),
    "too many entries": (layer(*[("file", f"f{i}", b"") for i in range(1001)]), "more than 1000 entries"),
    "not a tar": (b"just some bytes that are no archive at all" * 20, "not a tar|broken layer"),
    # Found by a red team: each escaped as another exception (a 500), or ran without bound.
    "chained headers": (chained_pax_headers(3000), "chain without end"),
    "too deep": (layer(("file", "d/" * 300 + "f", b"x")), "256 levels"),
    "owner out of range": (layer(("file", "f", b"x", 0o644, 1 << 40)), "outside the 0..65535"),
    "owner no container maps": (layer(("file", "f", b"x", 0o644, 65536)), "outside the 0..65535 a container maps"),
    "hard link to a directory": (layer(("dir", "d"), ("link", "x", "d")), "hard link to a directory"),
    "runs on past its end": (layer(("file", "f", b"x")) + bytes(2 << 20), "past its end"),
}


def test_a_root_file_systems_own_dev_is_skipped_and_said(store: ImageStore, tmp_path: Path) -> None:
    """mmdebstrap, debootstrap, ``docker``/``podman import`` tarballs carry /dev's nodes: skipped and counted (every
    sandbox has its own /dev), each layer said as it goes."""
    rootfs = layer(("dir", "dev"), ("chr", "dev/console"), ("chr", "dev/null"), ("file", "etc/hostname", b"x\n"))
    said: list[str] = []
    image = store.import_image(oci_layout(tmp_path / "oci", [rootfs], ref="base:1"), progress=said.append)
    layer_dir = store.root / "layers" / image.layers[0].removeprefix("sha256:")
    assert not (layer_dir / "fs" / "dev" / "console").exists() and (layer_dir / "fs" / "etc" / "hostname").exists()
    assert len(said) == 1 and "2 device nodes of its /dev skipped" in said[0] and said[0].startswith("layer 1/1"), said
    again: list[str] = []
    store.import_image(oci_layout(tmp_path / "oci2", [rootfs], ref="base:2"), progress=again.append)
    assert again and "held" in again[0], again


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_layer_is_refused_and_writes_nothing_outside(store: ImageStore, tmp_path: Path, case: str) -> None:
    data, why = HOSTILE[case]
    outside = tmp_path / "OUTSIDE"
    outside.mkdir()
    src = oci_layout(tmp_path / "oci", [data])
    if case == "writes through its own link":  # the link's target, absolute: where a naive unpacker writes
        data = layer(("sym", "etc", str(outside)), ("file", "etc/pwned", b"x"))
        src = oci_layout(tmp_path / "oci2", [data])
    with pytest.raises(BadRequest, match=why):
        store.import_image(src)
    assert list(outside.iterdir()) == [] and not (tmp_path / "escaped").exists()
    assert store.images() == [] and not any((store.root / "layers").iterdir())
    assert not any((store.root / "tmp").iterdir())


def test_a_layer_that_inflates_past_its_limit_is_stopped_there(store: ImageStore, tmp_path: Path) -> None:
    bomb = layer(("file", "zeros", bytes(64 << 20)))  # 64 MiB of zeros: ~64 KiB gzipped
    src = oci_layout(tmp_path / "oci", [bomb])
    assert sum(f.stat().st_size for f in (src / "blobs" / "sha256").iterdir()) < 1 << 20
    with pytest.raises(BadRequest, match="limit at 'zeros'"):
        store.import_image(src)
    assert not any((store.root / "layers").iterdir())


def test_a_tampered_or_foreign_image_is_refused_by_name(store: ImageStore, tmp_path: Path) -> None:
    src = oci_layout(tmp_path / "oci", [BASE])
    blob = next(p for p in (src / "blobs" / "sha256").iterdir() if p.read_bytes()[:2] == b"\x1f\x8b")
    blob.write_bytes(gzip.compress(layer(("file", "swapped", b"!")), mtime=0))
    with pytest.raises(BadRequest, match="does not match its digest"):
        store.import_image(src)
    other = "arm64" if ARCH == "amd64" else "amd64"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    with pytest.raises(BadRequest, match=f"for '{other}'; this node runs {ARCH}"):
        store.import_image(oci_layout(tmp_path / "oci-foreign", [BASE], arch=other))
    with pytest.raises(BadRequest, match="neither an OCI layout"):
        store.import_image(foreign)
    with pytest.raises(BadRequest, match="no such directory"):
        store.import_image(tmp_path / "nothing-here")
    with pytest.raises(BadRequest, match="image name"):
        store.import_image(oci_layout(tmp_path / "named", [BASE]), name="Not A Name")
    with pytest.raises(BadRequest, match="carries no name"):
        store.import_image(oci_layout(tmp_path / "unnamed", [BASE], ref=None))


def test_the_cli_imports_lists_and_removes(tmp_path: Path) -> None:
    env = {**os.environ, "SANDBOXD_IMAGES_DIR": str(tmp_path / "store")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "sandboxd", "image", *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)

    src = oci_layout(tmp_path / "oci", [BASE, TOP])
    r = cli("import", str(src), "--name", "tools/demo:2")
    assert r.returncode == 0 and "tools/demo:2: 2 layers" in r.stdout, r.stderr
    r = cli("list")
    assert r.returncode == 0 and r.stdout.startswith("tools/demo:2\tsha256:") and "2 layers" in r.stdout
    r = cli("import", str(tmp_path / "missing"))
    assert r.returncode == 1 and "image import:" in r.stderr and "no such directory" in r.stderr
    assert cli("rm", "tools/demo:2").returncode == 0
    r = cli("rm", "tools/demo:2")
    assert r.returncode == 1 and "no image 'tools/demo:2'" in r.stderr
    assert "no images" in cli("list").stdout
    root = os.stat(tmp_path / "store")  # the host's other users may not pass; the containers' group may
    assert stat.S_IMODE(root.st_mode) == 0o710 and (root.st_uid, root.st_gid) == (0, IDS.base)


def test_a_layer_may_replace_its_own_directory_and_the_store_removes_any_depth(
    store: ImageStore, tmp_path: Path
) -> None:
    """Tar's rule, a later entry of a path replaces an earlier one, holds for a directory replaced by a link or
    a file; and a tree thousands of levels deep (what a refused import could leave) is removed without
    recursion."""
    replaced = layer(
        ("dir", "d", 0o500), ("file", "d/f", b"x"), ("sym", "d", "elsewhere"), ("dir", "e"), ("file", "e", b"!")
    )
    image = store.import_image(oci_layout(tmp_path / "oci", [replaced]))
    fs = store.layer_dir(image.layers[0])
    assert os.readlink(fs / "d") == "elsewhere" and (fs / "e").read_bytes() == b"!"
    deep = tmp_path / "deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):  # past PATH_MAX: made one level at a time
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    parent = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        remove_tree(parent, "deep")
    finally:
        os.close(parent)
    assert not deep.exists()


def test_a_source_of_the_wrong_shape_is_refused_by_name(store: ImageStore, tmp_path: Path) -> None:
    """Found by a red team: JSON of the wrong shape, a blob that is a directory or a FIFO (which hung the import),
    a tampered blob of a layer the store already holds."""
    src = oci_layout(tmp_path / "oci", [BASE])
    (src / "index.json").write_text(json.dumps({"manifests": [5]}))
    with pytest.raises(BadRequest, match="malformed image metadata"):
        store.import_image(src)
    for kind in ("dir", "fifo"):
        src = oci_layout(tmp_path / kind, [BASE])
        blob = next(p for p in (src / "blobs" / "sha256").iterdir() if p.read_bytes()[:2] == b"\x1f\x8b")
        blob.unlink()
        blob.mkdir() if kind == "dir" else os.mkfifo(blob)
        with pytest.raises(BadRequest, match="not a regular file"):
            store.import_image(src)
    store.import_image(oci_layout(tmp_path / "good", [BASE], ref="good:1"))
    src = oci_layout(tmp_path / "tampered", [BASE], ref="tampered:1")
    blob = next(p for p in (src / "blobs" / "sha256").iterdir() if p.read_bytes()[:2] == b"\x1f\x8b")
    blob.write_bytes(gzip.compress(layer(("file", "other", b"?")), mtime=0))
    with pytest.raises(BadRequest, match="does not match its digest"):
        store.import_image(src)
    assert [i.name for i in store.images()] == ["good:1"]
