"""A container's root: an image's layers under a writable layer of its own, entered by one executor (stdlib
only; runs inside a container jail, as its executor).

The jail's user namespace maps the image's ids 0..65535 onto the host range its layers are owned by
(``images/unpack.py``: ``IdRange``), so its root is an unprivileged host uid, and the executor, uid 0 there
with the jail's capabilities, builds the root itself, after its request names the image:

    /tmp (the executor's own tmpfs, its size the writable layer's limit)
      ├─ upper, work    the sandbox's writes (copy-up), charged to its cgroup as tmpfs pages
      └─ root           overlayfs: ``userxattr``, the layers read-only from the store (bound at LAYERS)
            ├─ proc     this pid namespace's
            ├─ dev      null, zero, full, random, urandom bound, fd links, its own shm; read-only
            └─ ...      the image's files

then ``pivot_root`` into it (the jail's own tree is detached: nothing of the host's ``/usr`` nor the
harness is reachable), takes the image's user (its ``/etc/passwd`` and ``/etc/group``), keeps for root only
what Docker's root keeps that matters here (owners and modes of its own files, its own processes' signals),
installs the per-execution seccomp filter and no-new-privileges, and only then runs anything of the image.
"""

from __future__ import annotations

import ctypes
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # inside the jail these are plain modules beside the zygote (no sandboxd package there)
    from sandboxd.runners.jail.jailside import namespaces, seccomp
else:
    import namespaces
    import seccomp

LAYERS = "/opt/sandboxd/layers"  # the store's layers/ (runners/container/runner.py binds it there)
SCRATCH = "/tmp"
ROOT = SCRATCH + "/root"
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, PR_SET_DUMPABLE = 24, 28, 47, 4, 4
# Root's capabilities in a container: CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID,
# NET_BIND_SERVICE (Docker's set without MKNOD, NET_RAW, SETPCAP, SETFCAP, SYS_CHROOT, AUDIT_WRITE).
# They act in the jail's user namespace only: on the sandbox's own files and processes.
ROOT_CAPS = (0, 1, 3, 4, 5, 6, 7, 10)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOSTS = b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


class ImageFault(Exception):
    """The image cannot be run as asked (no such user, a working directory that is a file...): the
    client's image, never the node."""


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter(spec: dict[str, Any]) -> tuple[dict[str, str], str, int]:
    """Build the root and enter it as the image's user; the environment, working directory and uid the
    program starts with. Capabilities and seccomp come after, in ``lock``. Once in the image's root, whatever
    fails is the image's or the step's (its user, its working directory, what its files are): ``ImageFault``."""
    _mount_root([str(layer) for layer in spec["layers"]])
    _pivot()
    try:
        return _settle(spec)
    except OSError as exc:
        raise ImageFault(f"{exc.strerror or exc}{f': {exc.filename!r}' if exc.filename else ''}") from None
    except (ValueError, OverflowError) as exc:
        raise ImageFault(str(exc)) from None


def _settle(spec: dict[str, Any]) -> tuple[dict[str, str], str, int]:
    _hosts()
    uid, gid, groups, home = _user(str(spec.get("user") or ""))
    env = _environment(list(spec.get("env") or []), home)
    cwd = os.path.normpath("/" + str(spec.get("workdir") or "/").lstrip("/"))
    made = not os.path.lexists(cwd)
    try:
        os.makedirs(cwd, mode=0o755, exist_ok=True)
        os.chdir(cwd)
    except (NotADirectoryError, FileExistsError):
        raise ImageFault(f"the working directory {cwd!r} is not a directory in the image") from None
    except OSError as exc:
        raise ImageFault(f"the working directory {cwd!r}: {exc.strerror}") from None
    if made and uid != 0:
        os.chown(cwd, uid, gid)  # made here for the user, as Docker makes a missing WorkingDir
    _become(uid, gid, groups)
    return env, cwd, uid


def lock(filter_program: bytes, uid: int) -> None:
    """What the image's programs keep: root its few capabilities (``ROOT_CAPS``), others none; then the
    per-execution filter, which also sets no-new-privileges (an exec never gains a capability back)."""
    seccomp.drop_capabilities(sum(1 << cap for cap in ROOT_CAPS) if uid == 0 else 0)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # a change of user resets it: /proc/1 stays the harness's
    seccomp.install(filter_program)


def _mount_root(layers: list[str]) -> None:
    for name in ("upper", "work"):
        os.mkdir(f"{SCRATCH}/{name}", 0o755)
    os.mkdir(ROOT, 0o755)
    # Relative to the store: each layer's path is 68 bytes, where the mount's options must fit a page.
    lower = ":".join(f"{layer}/fs" for layer in reversed(layers))
    os.chdir(LAYERS)
    options = f"userxattr,lowerdir={lower},upperdir={SCRATCH}/upper,workdir={SCRATCH}/work"
    namespaces.mount("overlay", ROOT, "overlay", namespaces.MS_NOSUID | namespaces.MS_NODEV, options)
    os.chdir(ROOT)
    for where, mode in (("proc", 0o555), ("dev", 0o755), ("tmp", 0o1777)):
        _directory(where, mode)
    namespaces.mount("proc", f"{ROOT}/proc", "proc", namespaces.MS_NOSUID | namespaces.MS_NODEV | namespaces.MS_NOEXEC)
    dev = f"{ROOT}/dev"
    namespaces.mount("tmpfs", dev, "tmpfs", namespaces.MS_NOSUID | namespaces.MS_NOEXEC, "size=64k,mode=0755")
    for name in namespaces.DEVICES:
        os.close(os.open(f"{dev}/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
        namespaces.mount(f"/dev/{name}", f"{dev}/{name}", "", namespaces.MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ):
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm", 0o1777)
    namespaces.mount("tmpfs", f"{dev}/shm", "tmpfs", namespaces.MS_NOSUID | namespaces.MS_NODEV, "size=16m,mode=1777")
    namespaces.mount(
        "none", dev, "", namespaces.MS_REMOUNT | namespaces.MS_RDONLY | namespaces.MS_NOSUID | namespaces.MS_NOEXEC
    )


def _hosts() -> None:
    """What a container runtime writes, so that localhost resolves. After the pivot only: the image's links
    (an ``/etc`` that points anywhere) resolve in its own root then, never in the jail's."""
    etc = os.lstat("/etc") if os.path.lexists("/etc") else None
    if etc is not None and etc.st_mode & 0o170000 == 0o040000 and not os.path.lexists("/etc/hosts"):
        with open("/etc/hosts", "wb") as f:
            f.write(HOSTS)


def _directory(rel: str, mode: int) -> None:
    """``rel`` under the root as a real directory (made in the writable layer when the image has none)."""
    try:
        st = os.lstat(rel)
    except FileNotFoundError:
        os.mkdir(rel, mode)
        os.chmod(rel, mode)
        return
    if not (st.st_mode & 0o170000 == 0o040000):
        raise ImageFault(f"/{rel} is not a directory in the image")


def _pivot() -> None:
    """The root becomes the container's; the jail's tree is detached (``pivot_root(".", ".")``, as runc)."""
    os.chdir(ROOT)
    _check(libc.syscall(seccomp.syscall_number("pivot_root"), b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount the jail's root")
    os.chdir("/")


ACCOUNTS_MAX_BYTES = 4 << 20  # the image's /etc/passwd or /etc/group, read before anything of it runs


def _entries(path: str) -> list[list[str]]:
    """The lines of an accounts file: a regular file of bounded size (a FIFO, a device or an endless link is
    the image's fault, refused at once, not a hang or a sandbox's memory)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000) or st.st_size > ACCOUNTS_MAX_BYTES:
            raise ImageFault(f"the image's {path} is not a regular file of at most {ACCOUNTS_MAX_BYTES} bytes")
        data = os.read(fd, ACCOUNTS_MAX_BYTES + 1)
    finally:
        os.close(fd)
    text = data[:ACCOUNTS_MAX_BYTES].decode("utf-8", errors="replace")
    return [line.split(":") for line in text.split("\n") if line.strip() and not line.startswith("#")]


def _number(text: str) -> bool:
    """A decimal number as an id is written (``"²".isdigit()`` is true, and ``int`` refuses it)."""
    return text.isascii() and text.isdecimal() and len(text) <= 10


def _user(spec: str) -> tuple[int, int, list[int], str]:
    """Docker's ``User``: ``name``, ``uid``, ``name:group``, ``uid:gid``; default root. A name must be in the
    image's ``/etc/passwd``; a uid need not (its gid is then 0, its home /)."""
    user, _, group = spec.partition(":")
    user = user or "0"
    passwd = _entries("/etc/passwd")
    entry = next((e for e in passwd if len(e) >= 7 and (e[0] == user or (_number(user) and e[2] == user))), None)
    if entry is None and not _number(user):
        raise ImageFault(f"user {user!r} is not in the image's /etc/passwd")
    if entry is not None and not _number(entry[2]):
        raise ImageFault(f"user {user!r} has no number in the image's /etc/passwd ({entry[2][:20]!r})")
    uid = int(user) if _number(user) else int(entry[2])  # type: ignore[index]
    gid = int(entry[3]) if entry is not None and _number(entry[3]) else 0
    home = entry[5] if entry is not None and entry[5] else "/"
    groups_db = _entries("/etc/group")
    if group:
        if _number(group):
            gid = int(group)
        else:
            found = next((g for g in groups_db if len(g) >= 3 and g[0] == group), None)
            if found is None or not _number(found[2]):
                raise ImageFault(f"group {group!r} is not in the image's /etc/group")
            gid = int(found[2])
    if not (0 <= uid < 65536 and 0 <= gid < 65536):
        raise ImageFault(f"user {spec!r} is {uid}:{gid}, outside the 0..65535 a container maps")
    name = entry[0] if entry is not None else None
    extra = sorted(
        {int(g[2]) for g in groups_db if len(g) >= 4 and _number(g[2]) and name and name in g[3].split(",")} - {gid}
    )
    return uid, gid, [gid, *(g for g in extra if g < 65536)], home


def _become(uid: int, gid: int, groups: list[int]) -> None:
    if uid == 0:  # root keeps ROOT_CAPS through any exec: the rest leave the bounding set now
        for cap in range(64):
            if cap not in ROOT_CAPS and libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                break  # past the last capability this kernel has
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # a uid other than 0 loses every capability here


def _environment(image_env: list[str], home: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in image_env:
        key, sep, value = item.partition("=")
        if sep and key:
            env[key] = value
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("HOME", home)
    env.setdefault("HOSTNAME", "sandbox")
    return env


def stage(req: dict[str, Any], body: bytes, cwd: str) -> bytes:
    """The step's files (relative to the working directory, or absolute: the whole root is the sandbox's),
    written as its user; what follows them in the body is stdin. A path that reaches this process's own
    ``/proc`` entries (it is the sandbox's pid 1) is refused before a byte is written."""
    view = memoryview(body)
    pos = 0
    for path, size in req.get("files", []):
        full = os.path.normpath(path if path.startswith("/") else f"{cwd}/{path}")
        os.makedirs(os.path.dirname(full) or "/", exist_ok=True)
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, 0o644)
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/proc/") or not _regular(fd):
                raise ValueError(f"{path!r} is not a file of the sandbox's own file systems")
            os.ftruncate(fd, 0)
            chunk = view[pos : pos + size]
            while chunk:
                chunk = chunk[os.write(fd, chunk) :]
        finally:
            os.close(fd)
        pos += size
    return bytes(view[pos : pos + int(req.get("stdin_len", 0))])


def _regular(fd: int) -> bool:
    return os.fstat(fd).st_mode & 0o170000 == 0o100000
