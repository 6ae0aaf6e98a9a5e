"""One image layer (a tar stream, plain or compressed) unpacked into a directory of its own, safely.

The layer is written as overlayfs reads a lower layer (what containerd's overlay snapshotter keeps): a
whiteout ``.wh.NAME`` becomes a 0:0 character device at ``NAME``, an opaque marker ``.wh..wh..opq`` the
``user.overlay.opaque`` attribute on its directory (the attribute overlayfs reads when a user namespace mounts
it, ``userxattr``: a container's root is mounted inside its jail), so the layers of an image stack as they
are, and one layer directory serves every image that has it.

Owners are shifted: the image's uid or gid N is ``ids.base + N`` on the host, N below ``ids.count``. A
container's user namespace maps its 0..count-1 onto exactly that range, so inside it the files have the
owners the image gave them, and the image's root is an unprivileged uid of the host.

Whatever the archive holds, nothing is written outside ``dest``: every path is resolved one component at a
time with ``O_NOFOLLOW`` under ``dest`` (a link the layer made earlier is never followed, so ``etc -> /etc``
then ``etc/passwd`` is refused, not written through), ``..`` that climbs out is refused, a hard link must
name a file this layer holds, and device nodes are refused (those of a root file system's own ``/dev``, as
``mmdebstrap`` and ``docker import`` tarballs have, are skipped and counted: every sandbox has its own). The
bytes written and the entries made are counted against limits as they arrive (a small archive that inflates
without end is stopped there).
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import io
import lzma
import os
import posixpath
import stat
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sandboxd.errors import BadRequest

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
OPAQUE_XATTR = "user.overlay.opaque"
CHUNK = 1 << 20
MAX_PATH_BYTES = 4095  # PATH_MAX, less its NUL
MAX_DEPTH = 256  # levels of one path
ID_COUNT = 1 << 16  # uids and gids an image may use: 0..65535, what a container's user namespace maps
MAX_MTIME = 1 << 40  # seconds: past any real date, within what utime takes
MAX_TRAILING_BYTES = 1 << 20  # after the end-of-archive blocks: padding, not a second payload
# What an unpacking may fail with that is the node's, not the layer's: passed on as it is.
NODE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.ENOMEM, errno.EMFILE, errno.ENFILE}
GZIP_MAGIC, XZ_MAGIC, ZSTD_MAGIC = b"\x1f\x8b", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd"


class LayerRefused(BadRequest):
    """A layer that cannot be unpacked safely or within its limits: the image's fault, named by its entry."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int  # file contents written for one layer
    max_entries: int  # entries (files, directories, links...) of one layer


@dataclass(frozen=True)
class IdRange:
    """Where an image's owners 0..count-1 are on the host (``base + N``): a container's user namespace maps
    its own 0..count-1 onto this range (``runners/container``)."""

    base: int
    count: int = ID_COUNT

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.base + self.count < (1 << 32) - 1):
            raise ValueError(
                f"uid base {self.base}: the range {self.base}..{self.base + self.count - 1} must fit uid_t"
            )


@dataclass(frozen=True)
class Unpacked:
    diff_id: str  # sha256 of the uncompressed tar stream, as an image's config lists its layers
    entries: int
    bytes: int
    skipped_devices: int = 0  # device nodes under dev/ not made (a root file system's own /dev)


class _Hashing(io.RawIOBase):
    """Reads ``inner`` and hashes what it read (the layer's uncompressed stream: its diff id)."""

    def __init__(self, inner: BinaryIO) -> None:
        self.inner = inner
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buf: memoryview) -> int:  # type: ignore[override]
        data = self.inner.read(len(buf))
        n = len(data)
        buf[:n] = data
        self.digest.update(data)
        return n


def _decompressed(stream: BinaryIO) -> BinaryIO:
    head = stream.read(6)
    raw = io.BufferedReader(_Prefixed(head, stream), CHUNK)
    if head.startswith(GZIP_MAGIC):
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if head.startswith(XZ_MAGIC):
        return lzma.LZMAFile(raw, "rb")  # type: ignore[return-value]
    if head.startswith(ZSTD_MAGIC):
        raise LayerRefused("a zstd-compressed layer: not supported (gzip, xz and plain tar layers are)")
    return raw


class _Prefixed(io.RawIOBase):
    """``head`` (bytes already read to sniff the compression), then the rest of ``stream``."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        self.head, self.stream = head, stream

    def readable(self) -> bool:
        return True

    def readinto(self, buf: memoryview) -> int:  # type: ignore[override]
        if self.head:
            n = min(len(buf), len(self.head))
            buf[:n], self.head = self.head[:n], self.head[n:]
            return n
        data = self.stream.read(len(buf))
        buf[: len(data)] = data
        return len(data)


def _relative(name: str) -> str:
    """The entry's path inside the layer ("" for its root); refused when it climbs out with ``..``, or is
    longer or deeper than a path may be (each entry is resolved component by component: depth is work)."""
    path = posixpath.normpath(name.lstrip("/"))  # "/a", "./a", "a/./b": inside the layer
    if path == ".." or path.startswith("../"):
        raise LayerRefused(f"entry {name[:200]!r} climbs out of the layer (..)")
    if len(path.encode(errors="surrogateescape")) > MAX_PATH_BYTES or path.count("/") >= MAX_DEPTH:
        raise LayerRefused(f"entry {name[:200]!r}... is longer than {MAX_PATH_BYTES} bytes or {MAX_DEPTH} levels")
    return "" if path == "." else path


class _Tree:
    """``dest``, opened once; every path under it resolved component by component without following links."""

    def __init__(self, dest: Path, root_id: int) -> None:
        self.root = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.root_id = root_id  # the image's root on the host: the owner of what the layer did not list
        os.fchown(self.root, root_id, root_id)
        self.dirs: list[tuple[str, int, int]] = []  # (path, mode, mtime): set once every entry is in
        self.made = 0  # directories made for entries whose parents the layer did not list: entries too
        self.skipped_devices = 0  # device nodes of the layer's /dev, not made (``_entry``)

    def close(self) -> None:
        os.close(self.root)

    def parent(self, rel: str, entry: str) -> tuple[int, str]:
        """An open descriptor of ``rel``'s directory (made as needed) and ``rel``'s last component."""
        parts = rel.split("/")
        fd = os.dup(self.root)
        try:
            for part in parts[:-1]:
                try:
                    nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except FileNotFoundError:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    os.chown(part, self.root_id, self.root_id, dir_fd=fd, follow_symlinks=False)
                    self.made += 1
                    nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise LayerRefused(f"entry {entry!r} goes through a link or a file ({part!r})") from None
                    raise
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        return fd, parts[-1]

    def open_dir(self, rel: str) -> int:
        """An open descriptor of the directory ``rel`` ("" for the root), reached without following links."""
        if not rel:
            return os.dup(self.root)
        fd, name = self.parent(rel, rel)
        try:
            return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        finally:
            os.close(fd)

    @staticmethod
    def clear(fd: int, name: str, keep_dir: bool = False) -> None:
        """Make room for an entry: a later entry of the same path replaces an earlier one, as tar does."""
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return
            remove_tree(fd, name)
        else:
            os.unlink(name, dir_fd=fd)


DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tree(parent_fd: int, name: str) -> None:
    """Remove the directory ``name`` under ``parent_fd`` and all it holds, following no link, with no recursion
    and one descriptor at a time: a layer may nest ten thousand levels in a few hundred bytes."""
    names = [name]
    cur = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    try:
        while True:
            child = None
            with os.scandir(cur) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        child = entry.name
                        break
                    os.unlink(entry.name, dir_fd=cur)
            if child is not None:
                nxt = os.open(child, DIR_FLAGS, dir_fd=cur)
                os.close(cur)
                cur = nxt
                names.append(child)
                continue
            done = names.pop()
            if not names:
                os.close(cur)
                cur = -1
                os.rmdir(done, dir_fd=parent_fd)
                return
            up = os.open("..", DIR_FLAGS, dir_fd=cur)  # ".." is never a link
            os.close(cur)
            cur = up
            os.rmdir(done, dir_fd=cur)
    finally:
        if cur >= 0:
            os.close(cur)


def unpack(stream: BinaryIO, dest: Path, limits: Limits, ids: IdRange) -> Unpacked:
    """Unpack the layer in ``stream`` into the empty directory ``dest``; its diff id and size."""
    hashing = _Hashing(_decompressed(stream))
    tree = _Tree(dest, ids.base)
    entries = written = 0
    member: tarfile.TarInfo | None = None
    try:
        with tarfile.open(fileobj=io.BufferedReader(hashing, CHUNK), mode="r|") as archive:
            for member in archive:
                archive.members.clear()  # type: ignore[attr-defined]  # a stream keeps no entries: many would pile up
                entries += 1
                if entries + tree.made > limits.max_entries:
                    raise LayerRefused(f"the layer has more than {limits.max_entries} entries (its limit)")
                written += _entry(archive, member, tree, limits.max_bytes - written, ids)
        member = None
        trailing = 0
        while chunk := hashing.read(CHUNK):  # the end-of-archive padding is part of the diff id too
            trailing += len(chunk)
            if trailing > MAX_TRAILING_BYTES:
                raise LayerRefused(f"the layer goes on for more than {MAX_TRAILING_BYTES} bytes past its end")
        for rel, mode, mtime in reversed(tree.dirs):  # children before parents: a read-only parent last
            try:
                fd = tree.open_dir(rel)
            except (LayerRefused, NotADirectoryError, FileNotFoundError):
                continue  # replaced later in the layer by a file, a link or a whiteout: that one stands
            try:
                os.fchmod(fd, mode)
                os.utime(fd, (mtime, mtime))
            finally:
                os.close(fd)
    except (EOFError, tarfile.TarError, zlib.error, lzma.LZMAError, gzip.BadGzipFile) as exc:
        raise LayerRefused(f"a broken layer: {exc}") from None
    except RecursionError:
        raise LayerRefused("a layer whose tar headers chain without end") from None
    except MemoryError:
        raise LayerRefused("a layer whose tar headers do not fit in memory") from None
    except (ValueError, OverflowError) as exc:
        where = f"entry {member.name[:200]!r}: " if member is not None else ""
        raise LayerRefused(f"{where}{exc}") from None
    except OSError as exc:
        if exc.errno in NODE_ERRNOS:
            raise
        where = f"entry {member.name[:200]!r}: " if member is not None else ""
        raise LayerRefused(f"{where}{exc.strerror or exc}") from None
    finally:
        tree.close()
    return Unpacked("sha256:" + hashing.digest.hexdigest(), entries, written, tree.skipped_devices)


def _entry(archive: tarfile.TarFile, m: tarfile.TarInfo, tree: _Tree, room: int, ids: IdRange) -> int:
    """Write one entry; the bytes it wrote."""
    rel = _relative(m.name)
    if not (0 <= m.uid < ids.count and 0 <= m.gid < ids.count):
        raise LayerRefused(
            f"entry {m.name[:200]!r} has owner {m.uid}:{m.gid}, outside the 0..{ids.count - 1} a container maps"
        )
    m.uid, m.gid = ids.base + m.uid, ids.base + m.gid
    if not (isinstance(m.mtime, int | float) and 0 <= m.mtime < MAX_MTIME):  # nan fails both comparisons
        m.mtime = 0
    if not rel:  # the layer's root itself ("./"): only its mode and time
        if m.isdir():
            tree.dirs.append(("", m.mode & 0o7777, int(m.mtime)))
        return 0
    if (m.ischr() or m.isblk()) and not rel.rsplit("/", 1)[-1].startswith(WHITEOUT):
        if rel.startswith("dev/"):
            # A root file system's own /dev (mmdebstrap, debootstrap, docker or podman import): skipped, said
            # in the import's notes. Every sandbox gets a /dev of its own; a node made from the image never.
            tree.skipped_devices += 1
            return 0
        raise LayerRefused(
            f"entry {m.name!r} is a device node, outside /dev: refused (a layer may not make devices). Strip it: "
            f"tar --delete -f LAYER.tar {m.name!r}, or rebuild without it"
        )
    fd, name = tree.parent(rel, m.name)
    try:
        if name == OPAQUE:  # its directory hides what lower layers have there
            os.setxattr(fd, OPAQUE_XATTR, b"y")
            return 0
        if name.startswith(WHITEOUT):  # NAME is deleted: overlayfs's whiteout, a 0:0 character device
            hidden = name[len(WHITEOUT) :]
            if hidden in ("", ".", ".."):
                raise LayerRefused(f"entry {m.name!r} is a whiteout of nothing")
            tree.clear(fd, hidden)
            os.mknod(hidden, stat.S_IFCHR, os.makedev(0, 0), dir_fd=fd)
            return 0
        if m.isdir():
            tree.clear(fd, name, keep_dir=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=fd)
            os.chown(name, m.uid, m.gid, dir_fd=fd, follow_symlinks=False)
            tree.dirs.append((rel, m.mode & 0o7777, int(m.mtime)))  # set once its entries are in
            return 0
        tree.clear(fd, name)
        if m.isfile():
            return _write(archive, m, fd, name, room)
        if m.issym():
            os.symlink(m.linkname, name, dir_fd=fd)  # its target is only text here: nothing follows it
        elif m.islnk():
            _hard_link(m, tree, fd, name)
            return 0
        elif m.isfifo():
            os.mkfifo(name, 0o600, dir_fd=fd)
            node = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            try:
                os.fchmod(node, m.mode & 0o7777)
            finally:
                os.close(node)
        elif m.ischr() or m.isblk():
            raise LayerRefused(f"entry {m.name!r} is a device node: refused")
        else:
            raise LayerRefused(f"entry {m.name!r} is of a kind a layer may not hold (tar type {m.type!r})")
        os.chown(name, m.uid, m.gid, dir_fd=fd, follow_symlinks=False)
        os.utime(name, (int(m.mtime), int(m.mtime)), dir_fd=fd, follow_symlinks=False)
        return 0
    finally:
        os.close(fd)


def _write(archive: tarfile.TarFile, m: tarfile.TarInfo, fd: int, name: str, room: int) -> int:
    """A regular file's contents, counted against what the layer may still write."""
    if m.size > room:
        raise LayerRefused(f"the layer's files pass their limit at {m.name!r} ({m.size} bytes, {room} left)")
    source = archive.extractfile(m)
    assert source is not None
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
    size = 0
    try:
        while chunk := source.read(CHUNK):
            size += len(chunk)
            if size > room:
                raise LayerRefused(f"the layer's files pass their limit at {m.name!r}")
            os.write(out, chunk)
        os.fchown(out, m.uid, m.gid)
        os.fchmod(out, m.mode & 0o7777)  # after chown, which clears set-user-id bits
        os.utime(out, (int(m.mtime), int(m.mtime)))
    finally:
        os.close(out)
    return size


def _hard_link(m: tarfile.TarInfo, tree: _Tree, fd: int, name: str) -> None:
    """A hard link to a file this layer already holds (found without following any link)."""
    src = _relative(m.linkname)
    if not src:
        raise LayerRefused(f"entry {m.name!r} is a hard link to the layer's root")
    sfd, sname = tree.parent(src, m.name)
    try:
        os.link(sname, name, src_dir_fd=sfd, dst_dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        raise LayerRefused(
            f"entry {m.name!r} is a hard link to {m.linkname!r}, which this layer does not hold"
        ) from None
    except (IsADirectoryError, PermissionError):
        raise LayerRefused(f"entry {m.name!r} is a hard link to a directory") from None
    finally:
        os.close(sfd)
