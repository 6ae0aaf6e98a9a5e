"""envd inside an E2B sandbox: files, directories and processes, as the sandbox's own interpreter sees them.

sandboxd's ``api/e2b/envd.py`` sends one cell per call (``call(name, kwargs, marker)``) and reads the answer
after a random marker. Paths: E2B's home (``/home/user``) is the sandbox's working directory: its ``/tmp``
(the only writable place), which session jails also bind at ``/home/user``; relative paths are relative to
it; other absolute paths are the jail's read-only system. Processes started by ``start`` run in a session of
their own with stdout and stderr going to files under ``/tmp/.sandboxd-e2b`` (hidden from listings). Their exit
statuses come from the kernel: ``waitpid`` here, or the statuses the harness keeps when it collects ended
children between cells (the session keeps its processes).
"""

from __future__ import annotations

import base64 as _b64
import contextlib
import grp as _grp
import json as _json
import os as _os
import pwd as _pwd
import signal as _sig
import stat as _st
import subprocess as _sp
import sys as _sys
import time as _time
from typing import Any

E2B_HOME = "/home/user"
# A python session's home is its /tmp (bound at /home/user for commands); a container's kernel (the image's own
# python, cellhost.py) has a real /home/user, and the whole root is its sandbox's to write.
IN_IMAGE = "_sandboxd_cellhost" in _sys.modules
HOME = E2B_HOME if IN_IMAGE else "/tmp"
STATE = HOME + "/.sandboxd-e2b"
procs: dict[int, dict[str, Any]] = {}  # the processes ``start`` started, by pid


class Refused(Exception):
    """A call refused, with the kind envd names it by (not_found, exists, permission, invalid)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def local(path: str) -> str:
    path = path or E2B_HOME
    if path == "~" or path.startswith("~/"):
        path = E2B_HOME + path[1:]
    if not path.startswith("/"):
        path = E2B_HOME + "/" + path
    path = _os.path.normpath(path)
    if path == E2B_HOME or path.startswith(E2B_HOME + "/"):
        path = HOME + path[len(E2B_HOME) :]
    real = _os.path.realpath(path)  # a link a command made to the facade's state is refused as the state is
    if any(p == STATE or p.startswith(STATE + "/") for p in (path, real)):
        raise Refused("not_found", "no such file or directory: " + path)
    return path


def shown(path: str) -> str:
    return E2B_HOME + path[len(HOME) :] if path == HOME or path.startswith(HOME + "/") else path


def _owner(uid: int, gid: int) -> tuple[str, str]:
    try:
        user = _pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    try:
        group = _grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    return user, group


def entry(path: str) -> dict[str, Any]:
    st = _os.lstat(path)
    kind = (
        "dir"
        if _st.S_ISDIR(st.st_mode)
        else "file"
        if _st.S_ISREG(st.st_mode)
        else ("symlink" if _st.S_ISLNK(st.st_mode) else "other")
    )
    user, group = _owner(st.st_uid, st.st_gid)
    out: dict[str, Any] = {
        "name": _os.path.basename(path) or "/",
        "type": kind,
        "path": shown(path),
        "size": st.st_size,
        "mode": _st.S_IMODE(st.st_mode),
        "permissions": _st.filemode(st.st_mode),
        "owner": user,
        "group": group,
        "mtime_ns": st.st_mtime_ns,
    }
    if kind == "symlink":
        out["symlink_target"] = shown(_os.readlink(path))
        if _os.path.isdir(path):
            out["type"] = "dir"
    return out


def stat(path: str) -> dict[str, Any]:
    return entry(local(path))


LIST_MAX = 10000  # entries one listing returns at most: the tree is the sandbox's own to shape


def list_dir(path: str, depth: int) -> list[dict[str, Any]]:
    root = local(path)
    if not _os.path.isdir(root):
        raise Refused("invalid", "not a directory: " + path)
    found: list[dict[str, Any]] = []

    def by_name(e: _os.DirEntry[str]) -> str:
        return e.name

    stack = [(iter(sorted(_os.scandir(root), key=by_name)), 1)]
    while stack:  # iterative, in the order a recursive walk lists them: any depth, no recursion
        it, level = stack[-1]
        e = next(it, None)
        if e is None:
            stack.pop()
            continue
        if e.path == STATE:
            continue
        if len(found) >= LIST_MAX:
            raise Refused("invalid", f"more than {LIST_MAX} entries under {path}: list with a smaller depth")
        found.append(entry(e.path))
        if level < depth and e.is_dir(follow_symlinks=False):
            stack.append((iter(sorted(_os.scandir(e.path), key=by_name)), level + 1))
    return found


def make_dir(path: str) -> dict[str, Any]:
    p = local(path)
    if _os.path.exists(p):
        raise Refused("exists", "already exists: " + path)
    _os.makedirs(p)
    return entry(p)


def move(source: str, destination: str) -> dict[str, Any]:
    src, dst = local(source), local(destination)
    if not _os.path.lexists(src):
        raise Refused("not_found", "no such file or directory: " + source)
    _os.makedirs(_os.path.dirname(dst) or "/", exist_ok=True)
    _os.replace(src, dst)
    return entry(dst)


def remove(path: str) -> None:
    p = local(path)
    if p in (HOME, "/"):
        raise Refused("permission", "the home directory itself cannot be removed: " + path)
    if _os.path.isdir(p) and not _os.path.islink(p):
        _remove_tree(p)
    else:
        _os.unlink(p)


def _remove_tree(top: str) -> None:
    # Iterative, one directory descriptor at a time, by single names (any depth: shutil.rmtree recurses).
    flags = _os.O_RDONLY | _os.O_DIRECTORY | _os.O_NOFOLLOW | _os.O_CLOEXEC
    fd = _os.open(top, flags)
    names: list[str] = []
    pending: list[list[str]] = []
    try:
        while True:
            if len(pending) == len(names):  # entered a directory: clear its files, note its directories
                subdirs: list[str] = []
                with _os.scandir(fd) as it:
                    for e in it:
                        if e.is_dir(follow_symlinks=False):
                            subdirs.append(e.name)
                        else:
                            _os.unlink(e.name, dir_fd=fd)
                pending.append(subdirs)
            if pending[-1]:
                name = pending[-1].pop()
                child = _os.open(name, flags, dir_fd=fd)
                _os.close(fd)
                fd = child
                names.append(name)
                continue
            pending.pop()
            if not names:
                break
            parent = _os.open("..", flags, dir_fd=fd)
            _os.close(fd)
            fd = parent
            _os.rmdir(names.pop(), dir_fd=fd)
    finally:
        _os.close(fd)
    _os.rmdir(top)


def read(path: str, offset: int, size: int) -> dict[str, Any]:
    p = local(path)
    if _os.path.isdir(p):
        raise Refused("invalid", "is a directory: " + path)
    with open(p, "rb") as f:
        total = _os.fstat(f.fileno()).st_size
        f.seek(offset)
        data = f.read(size)
    return {"data": _b64.b64encode(data).decode(), "size": total}


def writable(path: str) -> str:
    p = local(path)
    if IN_IMAGE and not p.startswith(HOME + "/"):
        return p  # absolute: written as the sandbox's user, where its permissions allow
    if not p.startswith(HOME + "/"):
        raise Refused("permission", "only the home directory (" + E2B_HOME + ") is writable: " + path)
    return p[len(HOME) + 1 :]


def start(
    cmd: str, args: list[str], envs: dict[str, str] | None, cwd: str | None, tag: str | None, stdin: bool
) -> dict[str, int]:
    _os.makedirs(STATE, exist_ok=True)
    env = dict(_os.environ, HOME=E2B_HOME, USER="user")
    env.update(envs or {})
    where = local(cwd) if cwd else HOME
    if where == HOME or where.startswith(HOME + "/"):  # the same directory, under the name E2B gives it
        where = E2B_HOME + where[len(HOME) :] if _os.path.isdir(E2B_HOME) else where
    if not _os.path.isdir(where):
        raise Refused("invalid", "cwd is not a directory: " + (cwd or ""))
    base = f"{STATE}/{len(procs) + 1}-{_os.urandom(6).hex()}"
    with open(base + ".out", "wb") as out, open(base + ".err", "wb") as err:
        p = _sp.Popen(
            [cmd, *args],
            cwd=where,
            env=env,
            stdin=_sp.PIPE if stdin else _sp.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    procs[p.pid] = {
        "popen": p,
        "base": base,
        "cmd": cmd,
        "args": list(args),
        "envs": envs or {},
        "cwd": cwd or "",
        "tag": tag or "",
        "status": None,
    }
    return {"pid": p.pid}


def _status(pid: int) -> tuple[dict[str, Any], int | None]:
    # The process's record and its wait status (None while it runs): from the kernel, through waitpid here
    # or the harness's reaping between cells, never from a file the sandbox's processes could write.
    info = procs.get(pid)
    if info is None:
        raise Refused("not_found", f"process {pid} not found")
    if info["status"] is None:
        reaped = getattr(_sys.modules.get("_sandboxd_reaped"), "statuses", {})
        try:
            done, status = _os.waitpid(pid, _os.WNOHANG)
            if done:
                info["status"] = status
        except ChildProcessError:
            info["status"] = reaped.pop(pid, None)
            if info["status"] is None:
                info["status"] = -1  # collected by someone else without a record: ended, status unknown
    return info, info["status"]


def _end(status: int) -> dict[str, Any]:
    if status == -1:
        return {"exit_code": -1, "exited": False, "status": "ended (status unknown)"}
    if _os.WIFSIGNALED(status):
        sig = _os.WTERMSIG(status)
        try:
            name = _sig.Signals(sig).name
        except ValueError:
            name = str(sig)
        return {"exit_code": -1, "exited": False, "status": "signal: " + name, "error": "signal: " + name}
    code = _os.waitstatus_to_exitcode(status)
    return {"exit_code": code, "exited": True, "status": f"exit status {code}"}


def poll(pid: int, out_off: int, err_off: int, cap: int, wait_ms: int = 0) -> dict[str, Any]:
    # With wait_ms, wait here (at most that long) for output or the end: a short command answers at once.
    deadline = _time.monotonic() + wait_ms / 1000
    while True:
        info, status = _status(pid)
        if status is not None or _time.monotonic() >= deadline:
            break
        if _os.path.getsize(info["base"] + ".out") > out_off or _os.path.getsize(info["base"] + ".err") > err_off:
            break
        _time.sleep(0.002)
    chunks: dict[str, Any] = {}
    for name, off in (("out", out_off), ("err", err_off)):
        with open(info["base"] + "." + name, "rb") as f:
            f.seek(off)
            data = f.read(cap)
        chunks[name] = _b64.b64encode(data).decode()
        chunks[name + "_off"] = off + len(data)
    more = (
        _os.path.getsize(info["base"] + ".out") > chunks["out_off"]
        or _os.path.getsize(info["base"] + ".err") > chunks["err_off"]
    )
    if status is not None and not more:
        chunks["end"] = _end(status)
        fs = _os.statvfs(HOME)
        if fs.f_bavail == 0:
            full = "the sandbox's home (its /tmp) is full: the output may be cut"
            chunks["end"]["error"] = "; ".join(filter(None, (chunks["end"].get("error"), full)))
    return chunks


def send_signal(pid: int, signum: int) -> None:
    _status(pid)
    with contextlib.suppress(ProcessLookupError):
        _os.killpg(pid, signum)


def send_input(pid: int, data: str) -> None:
    info, _code = _status(pid)
    p = info["popen"]
    if p.stdin is None or p.stdin.closed:
        raise Refused("invalid", f"process {pid} has no open stdin")
    p.stdin.write(_b64.b64decode(data))
    p.stdin.flush()


def close_stdin(pid: int) -> None:
    info, _ = _status(pid)
    if info["popen"].stdin is not None:
        info["popen"].stdin.close()


def running() -> list[dict[str, Any]]:
    out = []
    for pid, info in list(procs.items()):
        if _status(pid)[1] is None:
            out.append({"pid": pid, **{k: info[k] for k in ("cmd", "args", "envs", "cwd", "tag")}})
    return out


def call(name: str, kwargs: dict[str, Any], marker: str) -> None:
    try:
        answer = {"ok": globals()[name](**kwargs)}
    except Refused as exc:
        answer = {"err": [exc.kind, str(exc)]}
    except FileNotFoundError as exc:
        answer = {"err": ["not_found", "no such file or directory: " + shown(exc.filename or "")]}
    except FileExistsError as exc:
        answer = {"err": ["exists", "already exists: " + shown(exc.filename or "")]}
    except PermissionError as exc:
        answer = {"err": ["permission", "permission denied: " + shown(exc.filename or "")]}
    except (NotADirectoryError, IsADirectoryError, OSError, ValueError) as exc:
        answer = {"err": ["invalid", str(exc)]}
    text = _json.dumps(answer, ensure_ascii=False)
    try:  # a name that is not UTF-8 (its bytes as surrogates) as envd's JSON shows it: U+FFFD, the rest kept
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    out = ("\n" + marker + text + "\n").encode()
    while out:
        out = out[_os.write(1, out) :]
