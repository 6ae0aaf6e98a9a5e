"""The SQL engine process: a fork server whose children each run DuckDB for one slot or one session.

Runs as ``python -m sandboxd.runners.sql.engine CONFIG_JSON CONTROL_FD``,
started by the worker's SQL runner. Imports only the standard library, DuckDB,
orjson and sandboxd's stdlib-only modules (a fork's state, the starvation rule).

Why processes: a statement that ignores DuckDB's interrupt (``levenshtein`` on
huge strings) cannot be stopped inside a process that must go on serving, and
memory DuckDB does not account (``len(range(10**9))``) grew the whole worker.
A child can be killed, and lives in a cgroup of its own with memory, pids and
CPU limits, so the worst a statement does is end its own slot or session.

Why a fork server: importing DuckDB costs ~100 ms; a fork of a process that has
imported it (and opened nothing) costs ~2 ms, and opening the read-only
database ~20 ms, so a session starts in tens of milliseconds. The fork server
never opens the database itself: DuckDB's threads start with the first
connection, in each child, after the fork. (The import starts one idle
allocator thread; jemalloc's fork handlers make forking after it safe.)

Each child, before it runs anything it was sent: joins its cgroup, dies with
its parent, gets network and IPC namespaces of its own (nothing to reach, no
SysV objects shared), opens the database read-only with external access off
and its configuration locked, then drops to an unprivileged uid with
no_new_privs. It serves one statement at a time on its own socket: frames of
a 4-byte big-endian length and a JSON body.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import decimal
import os
import queue
import signal
import socket
import struct
import sys
import threading
import time
import warnings
from typing import Any

import orjson

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
FETCH_CHUNK = 64  # rows fetched at a time, so the byte cap stops a huge result early
MAX_REQUEST_BYTES = 1 << 20
SPILL_DIR = "spill"  # relative to the engine's private working directory
LEFT_BEHIND_CHECK_BYTES = 96 << 20  # below this much anonymous memory nothing is worth asking about
MAX_ERROR_CHARS = 4096  # of an error message (DuckDB quotes the offending value, whatever its size)


def _prctl(option: int, arg: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def send_frame(sock: socket.socket, body: dict[str, Any]) -> None:
    data = orjson.dumps(body, default=str)
    sock.sendall(struct.pack(">I", len(data)) + data)


def recv_frame(sock: socket.socket, limit: int) -> dict[str, Any] | None:
    """The next frame, or None when the peer closed the socket."""
    head = _recv_exactly(sock, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > limit:
        raise ValueError(f"frame of {n} bytes exceeds {limit}")
    body = _recv_exactly(sock, n)
    if body is None:
        return None
    out: dict[str, Any] = orjson.loads(body)
    return out


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def jsonable(v: Any) -> Any:
    if isinstance(v, decimal.Decimal):
        return float(v)
    if isinstance(v, (datetime.date, datetime.datetime, datetime.time)):
        return v.isoformat()
    if isinstance(v, datetime.timedelta):
        return str(v)
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    return v


class ResultRefused(Exception):
    """A result too large to return even truncated: the statement's own error."""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"


class Statement:
    """One statement on a connection and what it returned (rows capped in count and in bytes)."""

    def __init__(self, con: Any, sql: str, max_rows: int, max_bytes: int) -> None:
        self.con, self.sql, self.max_rows, self.max_bytes = con, sql, max_rows, max_bytes
        self.columns: list[str] = []
        self.rows: list[list[Any]] = []
        self.truncated = False
        self.error: str | None = None
        self.done = threading.Event()

    def __call__(self) -> None:
        try:
            cur = self.con.execute(self.sql)
            if cur.description:
                self.columns = [str(d[0]) for d in cur.description]
                if len(orjson.dumps(self.columns)) > self.max_bytes // 2:
                    raise ResultRefused(
                        f"the result's {len(self.columns)} column names alone exceed {self.max_bytes // 2} bytes"
                    )
                self._fetch(cur)
        except Exception as exc:  # every DuckDB error is the statement's own result
            self.error = _cut(f"{type(exc).__name__}: {exc}", MAX_ERROR_CHARS)
            self.columns, self.rows = [], []
        finally:
            self.done.set()

    def _fetch(self, cur: Any) -> None:
        size = len(orjson.dumps(self.columns))
        while len(self.rows) <= self.max_rows:
            chunk = cur.fetchmany(FETCH_CHUNK)
            if not chunk:
                return
            for raw in chunk:
                if len(self.rows) == self.max_rows:
                    self.truncated = True
                    return
                row = [jsonable(v) for v in raw]
                size += len(orjson.dumps(row, default=str))
                if size > self.max_bytes:
                    self.truncated = True
                    return
                self.rows.append(row)


class Executor:
    """One long-lived thread that runs the statements, so the main thread can interrupt them.

    Long-lived on purpose: DuckDB and its allocator keep per-thread caches, and
    a thread per statement made TPC-H queries ~30% slower (measured).
    """

    def __init__(self) -> None:
        self.todo: queue.SimpleQueue[Statement] = queue.SimpleQueue()
        threading.Thread(target=self._loop, daemon=True, name="statement").start()

    def _loop(self) -> None:
        while True:
            self.todo.get()()

    def run(self, con: Any, req: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
        """Run one request; a statement that ignores its interrupt is answered ``stuck`` (the engine then ends)."""
        cur = con.cursor() if req.get("fresh") else con  # one-shots get a connection of their own
        max_rows = min(int(req.get("max_rows", cfg["max_rows"])), int(cfg["max_rows"]))
        stmt = Statement(cur, str(req["sql"]), max_rows, int(cfg["max_result_bytes"]))
        timeout_s = float(req["timeout_s"])
        t0 = time.perf_counter()
        # The statement is timed on its own time, as every kind's step is (``runners/starvation.py``): the
        # worker gives the wall cap its density allows; time other sandboxes kept this engine off the CPU is
        # given back, and past the cap the statement was starved (the node's), not slow (its own).
        from sandboxd.runners.starvation import Starvation

        account = Starvation(
            os.getpid(), timeout_s, time.process_time, float(cfg["cores"]), float(req.get("wall_cap_s") or timeout_s)
        )
        self.todo.put(stmt)
        timed_out = False
        wait = timeout_s
        while not stmt.done.wait(wait):
            wait = account.more_s()
            if wait <= 0:
                timed_out = True
                break
        if timed_out:
            cur.interrupt()
            if not stmt.done.wait(float(cfg["grace_s"])):
                return {"timed_out": True, "stuck": True, "elapsed_ms": (time.perf_counter() - t0) * 1000}
        if cur is not con:
            cur.close()
        if timed_out and account.starved:
            return {"starved": True, "kept_s": account.kept_s, "wall_s": account.wall_cap_s}
        return {
            "columns": [] if timed_out else stmt.columns,
            "rows": [] if timed_out else stmt.rows,
            "truncated": stmt.truncated,
            "timed_out": timed_out,
            "error": f"statement interrupted at its {timeout_s:g}s timeout" if timed_out else stmt.error,
            "elapsed_ms": round((time.perf_counter() - t0) * 1000, 3),
            "recycle": bool(req.get("fresh")) and left_behind(con) > int(cfg["recycle_bytes"]),
        }


def left_behind(con: Any) -> int:
    """Memory this process holds that DuckDB does not account for (freed but kept by the allocator).

    A slot engine serves one-shots of many clients in turn: if one leaves a
    lot behind, the next would start near the cgroup limit and be killed for
    it. Cheap when small (one read of /proc); DuckDB's own figure is asked
    only when the process holds much at all.
    """
    anon = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
                break
    if anon < LEFT_BEHIND_CHECK_BYTES:
        return 0
    try:
        (tracked,) = con.execute("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()").fetchone()
    except Exception:
        return anon
    return max(0, anon - int(tracked))


def child_main(sock: socket.socket, cfg: dict[str, Any], req: dict[str, Any]) -> None:
    """One engine: confine this process, open the database, serve statements until the socket closes."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the fork server died before we set the signal
        return
    os.unshare(os.CLONE_NEWNET | os.CLONE_NEWIPC)
    uid = int(cfg["uid"])
    # The engine's own directory is its working directory, so DuckDB can create its spill directory
    # there lazily, after the privilege drop, whatever the (root-only) directories above it allow.
    home = str(req["temp_dir"])
    os.makedirs(home, mode=0o700, exist_ok=True)
    os.chown(home, uid, uid)
    os.chdir(home)
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    # DuckDB 1.5 does not hold temp tables to max_temp_directory_size (seen: 3.2 GB spilled under a 48 MB
    # setting). No spill file may outgrow the budget (a write past it fails with EFBIG, an error of the
    # statement's own), and the worker kills an engine whose spill directory as a whole outgrows it.
    temp_bytes = int(cfg["temp_mb"]) << 20
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (temp_bytes, temp_bytes))
    import duckdb

    con = duckdb.connect(
        str(cfg["db"]),
        read_only=True,
        config={
            "enable_external_access": False,
            "autoload_known_extensions": False,
            "autoinstall_known_extensions": False,
            "threads": int(cfg["threads"]),
            "memory_limit": f"{int(req['duckdb_memory_mb'])}MB",
            "temp_directory": SPILL_DIR if temp_bytes else "",
            "max_temp_directory_size": f"{int(cfg['temp_mb'])}MB",
        },
    )
    con.execute("SET lock_configuration = true")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    executor = Executor()
    from sandboxd.runners.sql import state  # a fork's export and restore (stdlib only)

    send_frame(sock, {"ready": True, "pid": os.getpid()})
    limit = MAX_REQUEST_BYTES + 2 * int(cfg.get("fork_max_state_bytes", 0))  # a restore carries the state
    while True:
        request = recv_frame(sock, limit)
        if request is None:
            return
        op = request.get("op")
        if op == "export":
            answer = state.export(con, int(request["max_bytes"]))
        elif op == "restore":
            answer = state.restore(con, request["state"])
        else:
            answer = executor.run(con, request, cfg)
        send_frame(sock, answer)
        if answer.get("stuck"):
            return  # the statement's thread cannot be stopped: end the process (os._exit below)


def _join(procs_files: list[str]) -> None:
    """Move this process into the group whose ``cgroup.procs`` files these are."""
    me = str(os.getpid()).encode()
    for procs in procs_files:
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, me)
        finally:
            os.close(fd)


def fork_server(ctl: socket.socket, cfg: dict[str, Any]) -> None:
    """Fork one engine per request; send back its pid and a pidfd (a pid number alone can be reused)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    import duckdb  # noqa: F401  (preloaded once for every child)

    # Forking after the import is deliberate (see the module's docstring): no warning per engine.
    warnings.filterwarnings("ignore", message=".*use of fork\\(\\) may lead to deadlocks", category=DeprecationWarning)

    def reap(*_: object) -> None:
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    signal.signal(signal.SIGCHLD, reap)
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(ctl, 1 << 16, 1)
        except OSError:
            return
        if not msg:
            return  # the worker is gone
        req = orjson.loads(msg)
        if not fds:
            continue
        # The child must not be reaped before its pidfd exists, or its number could be someone else's.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        # Born in its own cgroup: what the kernel charges for a new process stays where it was made, so the
        # fork server visits the engine's group for the fork (an engine that moved itself later left its
        # fork-time charges on the worker's group, one lot per engine the worker ever made).
        try:
            _join(req["cgroup_procs"])
            pid = os.fork()
        except OSError as exc:
            with contextlib.suppress(OSError):
                _join(cfg["home_procs"])
            os.close(fds[0])
            ctl.send(orjson.dumps({"id": req["id"], "error": f"fork into its cgroup: {exc}"}))
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            continue
        if pid != 0:
            _join(cfg["home_procs"])  # back home (root, in a leaf of its own: this cannot fail but by a bug)
        if pid == 0:
            code = 0
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
                ctl.close()
                child_main(socket.socket(fileno=fds[0]), cfg, req)
            except BaseException as exc:  # report how the engine failed to start, then go
                code = 1
                print(f"sandboxd sql engine {os.getpid()}: {type(exc).__name__}: {exc}", file=sys.stderr)
            finally:
                os._exit(code)
        os.close(fds[0])
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            ctl.send(orjson.dumps({"id": req["id"], "error": f"pidfd_open: {exc}"}))
        else:
            socket.send_fds(ctl, [orjson.dumps({"id": req["id"], "pid": pid})], [pidfd])
            os.close(pidfd)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})


def main() -> None:
    cfg = orjson.loads(sys.argv[1])
    fd = int(sys.argv[2])
    # Every engine forked from here holds what this process holds: only the worker's channel (and 0, 1, 2)
    # pass, whatever the worker's process manager left open (sandboxd.spawn.close_inherited, inlined: this
    # module imports nothing of sandboxd).
    os.closerange(3, fd)
    os.closerange(fd + 1, 1 << 16)
    ctl = socket.socket(fileno=fd)
    ctl.set_inheritable(False)
    fork_server(ctl, cfg)


if __name__ == "__main__":
    main()
