"""Removing a directory tree a sandbox made, whatever its shape.

A program shapes its own tree: a ``mkdir`` loop makes it thousands of levels deep, past ``PATH_MAX`` and
past any recursion limit (``shutil.rmtree`` raised ``RecursionError`` on one, and the fork group it
belonged to outlived all its sessions). ``remove_tree`` walks it iteratively from one directory
descriptor at a time, by single names relative to it (no path ever grows with the depth), never follows a
symbolic link, and goes back up only to the directory it came from (checked by device and inode: a
directory moved meanwhile is not followed). Memory grows with the number of directories still to visit,
never with the tree's depth in descriptors.
"""

from __future__ import annotations

import contextlib
import errno
import os

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _scan(fd: int) -> tuple[list[str], int]:
    """Unlink everything in the directory but its subdirectories; their names, and what could not go."""
    subdirs: list[str] = []
    failed = 0
    with os.scandir(fd) as it:
        for entry in it:
            try:
                if entry.is_dir(follow_symlinks=False):
                    subdirs.append(entry.name)
                else:
                    os.unlink(entry.name, dir_fd=fd)
            except FileNotFoundError:
                continue
            except OSError:
                failed += 1
    return subdirs, failed


def remove_tree(top: str) -> bool:
    """Delete ``top`` and everything below it; True when it is gone (or was never there). Errors are
    counted, not raised: what could not be deleted stays, and the caller may try again."""
    try:
        fd = os.open(top, _DIR_FLAGS)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # a file or a link where the directory was: unlink it
            with contextlib.suppress(OSError):
                os.unlink(top)
            return not os.path.lexists(top)
        return False
    failed = 0
    names: list[str] = []  # from top down to the directory ``fd`` is on
    above: list[tuple[int, int]] = []  # (device, inode) of each directory above it
    pending: list[list[str]] = []  # subdirectories still to visit, per level
    try:
        subdirs, bad = _scan(fd)
        pending.append(subdirs)
        failed += bad
        while True:
            if pending[-1]:
                name = pending[-1].pop()
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=fd)  # no longer a directory: whatever it is now goes
                    continue
                st = os.fstat(fd)
                above.append((st.st_dev, st.st_ino))
                os.close(fd)
                fd = child
                names.append(name)
                subdirs, bad = _scan(fd)
                pending.append(subdirs)
                failed += bad
                continue
            if not names:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != above.pop():
                return False  # moved under the walk: stop rather than delete anywhere else
            pending.pop()
            try:
                os.rmdir(names.pop(), dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError:
                failed += 1
    finally:
        os.close(fd)
    if failed:
        return False
    try:
        os.rmdir(top)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True
