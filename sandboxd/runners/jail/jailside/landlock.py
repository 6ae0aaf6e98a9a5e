"""Landlock, for the members of a forked python session (stdlib only: imported inside the jail).

Why Landlock: a copy made by ``fork()`` shares its source's pid, mount, IPC and
network namespaces, and neither may create new ones (the jail's filter forbids
it, so the program cannot either). An unprivileged process can still restrict
*itself* right after ``fork()``: Landlock confines its filesystem access to the
paths it grants, denies TCP bind/connect, and (ABI 6, Linux 6.12) scopes
signals and abstract unix sockets to its own domain. Each member of a fork
takes a domain of its own, so none can signal, connect to, ptrace or read the
files of another, and none can touch the processes or files it came from.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # one numbering on x86_64 and arm64
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5

NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

MIN_ABI = 6  # signal and abstract-socket scoping: without them members could signal each other

# Rights on a file (not a directory): what a rule beneath a regular file or device may grant.
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ = EXECUTE | READ_FILE | READ_DIR
# A member's own directory: everything but device nodes and named sockets (a named socket is the one
# filesystem object another process could reach without rights on its directory: none are made).
OWN = FILE_RIGHTS | READ_DIR | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_FIFO | MAKE_SYM | REFER

_libc = ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is absent or disabled."""
    version = _libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(version))


def _handled_fs(version: int) -> int:
    rights = (1 << 13) - 1
    if version >= 2:
        rights |= REFER
    if version >= 3:
        rights |= TRUNCATE
    if version >= 5:
        rights |= IOCTL_DEV
    return rights


def restrict(read: list[str], own: str, device_files: list[str], listable: list[str] = []) -> None:  # noqa: B006
    """Confine this process (and what it starts) to reading ``read``, everything in ``own`` (bar device
    nodes and named sockets), reading and writing ``device_files``, listing ``listable``; no TCP; signals and abstract sockets
    only within its new domain. The calling process must be single-threaded: Landlock restricts the
    calling thread only, and a thread left unrestricted would keep every right."""
    version = abi()
    if version < MIN_ABI:
        raise OSError(errno.ENOTSUP, f"Landlock ABI {version} < {MIN_ABI}")
    handled = _handled_fs(version)
    attr = struct.pack("=QQQ", handled, NET_BIND_TCP | NET_CONNECT_TCP, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
    ruleset = _libc.syscall(_SYS_CREATE_RULESET, attr, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock_create_ruleset: {os.strerror(err)}")
    try:
        for path in read:
            _allow(ruleset, path, READ & handled, handled)
        for path in device_files:
            _allow(ruleset, path, (READ_FILE | WRITE_FILE | IOCTL_DEV) & handled, handled)
        for path in listable:  # names only, not contents (a directory's listing right covers its subdirectories')
            _allow(ruleset, path, READ_DIR, handled)
        _allow(ruleset, own, OWN & handled, handled)
        if _libc.syscall(_SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_restrict_self: {os.strerror(err)}")
    finally:
        os.close(ruleset)


def _allow(ruleset: int, path: str, rights: int, handled: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # nothing there to grant (a jail without /lib64, say)
    try:
        if not os.path.isdir(path):
            rights &= FILE_RIGHTS
        rule = struct.pack("=Qi", rights & handled, fd)
        if _libc.syscall(_SYS_ADD_RULE, ruleset, ctypes.c_int(_RULE_PATH_BENEATH), rule, ctypes.c_uint32(0)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"landlock_add_rule {path}: {os.strerror(err)}")
    finally:
        os.close(fd)
