"""One execution's exchange with its executor, on the worker's side: the executor's handle (its sockets, its
pidfd), the request written, its output read with caps, its deadline kept and its exit status taken from the
zygote's report, never from the program.

The zygote hands the worker, per executor, its request socket and its stdout/stderr pipes; the worker greets
the executor (to learn its pid through SO_PASSCRED, and open a pidfd on it: kills are race-free), writes the
request, reads the output with caps, kills at the deadline. A session's steps are frames on the same socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import signal
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sandboxd.errors import PayloadTooLarge
from sandboxd.runners.jail.jailside import wire
from sandboxd.runners.starvation import STARVED_MIN_S, Starvation

log = logging.getLogger(__name__)

SANDBOX_READY_TIMEOUT_S = 10.0


def wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


@dataclass
class Executor:
    """A namespaced, locked-down process waiting for its request (or its session's steps)."""

    ex_id: int
    sock: socket.socket
    out_r: int
    err_r: int
    pidfd: int
    host_pid: int
    exit: asyncio.Future[dict[str, Any]]
    flavor: int | None = None  # the environment whose template it was forked from (its preloads); None: lean
    users: int = 0  # steps, forks and readers working on its descriptors now (``in_use``)
    pending: bytearray = field(default_factory=bytearray)  # a session channel's bytes read past its last frame
    last_tag: object = None  # the tag of a session's last request
    closing: bool = False  # closed while in use: its descriptors go when the last user lets go

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self.pidfd, sig)

    def alive(self) -> bool:
        """Still running: judged by its pidfd (readable once the process exited), never by a pid number."""
        if self.pidfd < 0 or self.exit.done():
            return False
        poller = select.poll()
        poller.register(self.pidfd, select.POLLIN)
        return not poller.poll(0)

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """While a step, a fork or a reader works on its descriptors (the loop watches them): ``close`` then
        only kills, and they are released when the last user lets go. A descriptor closed under the loop's
        watch leaves it polling whatever gets that number next."""
        self.users += 1
        try:
            yield
        finally:
            self.users -= 1
            if self.closing and self.users == 0:
                self._release()

    def close(self) -> None:
        """Kill (a no-op once it has exited) and release every descriptor (see ``in_use``)."""
        self.kill()
        if self.users:
            self.closing = True
            return
        self._release()

    def _release(self) -> None:
        for fd in (self.out_r, self.err_r, self.pidfd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.out_r = self.err_r = self.pidfd = -1
        self.sock.close()


@dataclass
class Output:
    """What one step wrote to stdout and stderr, capped, with the totals."""

    cap: int
    kill_at: int
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)
    out_total: int = 0
    err_total: int = 0

    def add(self, which: int, chunk: bytes) -> bool:
        """Keep what fits; return True when the stream went past ``kill_at``."""
        buf = self.out if which == 1 else self.err
        room = self.cap - len(buf)
        if room > 0:
            buf += chunk[:room]
        if which == 1:
            self.out_total += len(chunk)
            return self.out_total > self.kill_at
        self.err_total += len(chunk)
        return self.err_total > self.kill_at


# What a session's process may send back after a step: {"op": "done", "exit_code": N}, nothing more.
# User code runs in that process and can write to the channel: anything larger is a broken sandbox.
SESSION_REPLY_MAX_HEADER_BYTES = 4096


class ChannelGarbage(wire.WireError):
    """A frame that is too large or unreadable (not a channel that closed because its process died)."""


async def recv_frame(
    sock: socket.socket,
    max_header: int = wire.MAX_HEADER_BYTES,
    max_body: int = wire.MAX_BODY_BYTES,
    pending: bytearray | None = None,
) -> tuple[dict[str, Any], bytes]:
    """One frame. Bytes after it are garbage (the harness writes one frame per request), unless ``pending``
    is given: what was read past one frame stays there, the start of the next read (a session's channel, where
    a skipped frame may come with the reply behind it)."""
    loop = asyncio.get_running_loop()
    buf = pending if pending is not None else bytearray()
    while len(buf) < wire.PREFIX.size:
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            raise wire.WireError("sandbox closed its channel")
        buf += chunk
    try:
        head_len, body_len = wire.decode_prefix(bytes(buf[: wire.PREFIX.size]))
    except wire.WireError as exc:
        raise ChannelGarbage(str(exc)) from exc
    if head_len > max_header or body_len > max_body:
        raise ChannelGarbage(f"frame of {head_len}+{body_len} bytes where at most {max_header}+{max_body} fit")
    total = wire.PREFIX.size + head_len + body_len
    while len(buf) < total:
        chunk = await loop.sock_recv(sock, max(65536, total - len(buf)))
        if not chunk:
            raise wire.WireError("sandbox closed its channel")
        buf += chunk
    if len(buf) > total and pending is None:  # one frame per request: more is the program writing on the channel
        raise ChannelGarbage(f"{len(buf) - total} bytes after the frame")
    frame = bytes(buf[:total])
    del buf[:total]
    try:
        header = json.loads(frame[wire.PREFIX.size : wire.PREFIX.size + head_len])
    except ValueError as exc:
        raise ChannelGarbage(f"unreadable frame header: {exc}") from exc
    if not isinstance(header, dict):
        raise ChannelGarbage("frame header is not an object")
    return header, frame[wire.PREFIX.size + head_len :]


async def recvmsg(sock: socket.socket, bufsize: int, ancsize: int) -> tuple[bytes, list[tuple[int, int, bytes]]]:
    """``recvmsg`` for a non-blocking socket (asyncio has no ancillary-data API). Descriptors arrive
    close-on-exec: a process the worker starts later (a jail, an SQL engine) must never hold a sandbox's
    pipe, or closing it here would leave the worker's loop polling a file that is still open elsewhere."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data, anc, _flags, _addr = sock.recvmsg(bufsize, ancsize, socket.MSG_CMSG_CLOEXEC)
            return data, anc
        except BlockingIOError:
            fut: asyncio.Future[None] = loop.create_future()
            loop.add_reader(sock.fileno(), wake, fut)
            try:
                await fut
            finally:
                loop.remove_reader(sock.fileno())


async def introduction(sock: socket.socket, max_bytes: int) -> tuple[dict[str, Any], int]:
    """Greet a process on its channel (SO_PASSCRED set) and read its first frame: (frame, its host pid, 0
    when the kernel attached none). An executor and a fork's member introduce themselves this way."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(BrokenPipeError):  # it failed early; its error frame waits below
        await loop.sock_sendall(sock, wire.encode({"op": "hello"}))
    data, anc = await recvmsg(sock, max_bytes, socket.CMSG_SPACE(12))
    host_pid = 0
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            host_pid = int.from_bytes(payload[:4], "little", signed=True)
    if len(data) < wire.PREFIX.size:
        raise wire.WireError(f"sent {len(data)} bytes instead of its first frame")
    head_len, _ = wire.decode_prefix(data[: wire.PREFIX.size])
    first: dict[str, Any] = json.loads(data[wire.PREFIX.size : wire.PREFIX.size + head_len])
    return first, host_pid


CHANNEL_CLOSED_GRACE_S = 1.0  # a session channel at EOF: how long its executor's exit report may lag
STAGE_FAILED = 125  # a one-shot executor's status when the step's files could not be written (it said why)
HARNESS_FRAME_TIMEOUT_S = 2.0  # the executor has exited: its last frame is already in the socket
# A step's first look at its own time comes this share of its limit (at most EARLY_LOOK_MAX_S) before the
# limit: a busy worker's loop can see the end of a program it kept waiting before its deadline's wake-up, and a
# late end is judged on the time it was kept from as of the last look (``_judge_late_end``), never on none.
EARLY_LOOK_SHARE, EARLY_LOOK_MAX_S = 0.2, 1.0


def _exit_code(ex: Executor) -> int | None:
    if ex.exit.done() and ex.exit.exception() is None:
        code = ex.exit.result().get("exit_code")
        return code if isinstance(code, int) else None
    return None


async def _harness_frame(
    sock: socket.socket, max_body: int, reading: asyncio.Future[tuple[dict[str, Any], bytes]] | None = None
) -> tuple[dict[str, Any], bytes] | None:
    """The one-shot harness's last word (files it fetched, or why it could not stage the step), if it sent
    one. Only the harness ever holds a one-shot's channel: the program runs after it is closed, or in a
    child that closed it first. ``reading``: the read, started when the request went out (a frame larger
    than the socket's buffer is only sent whole while someone reads it, and the harness exits after)."""
    try:
        async with asyncio.timeout(HARNESS_FRAME_TIMEOUT_S):
            return await (reading if reading is not None else recv_frame(sock, wire.MAX_HEADER_BYTES, max_body))
    except (TimeoutError, wire.WireError, OSError):
        return None


@dataclass(frozen=True)
class StepRequest:
    """One execution as the exchange runs it: the request, its output caps, its deadline and, given
    ``account``, the step's account of its own time, opened when the request goes out: time the program was
    kept off the CPU by others is given back at the deadline (``starvation.py``)."""

    header: dict[str, Any]
    body: bytes
    timeout_s: float
    cap: int  # output bytes kept per stream
    kill_at: int  # output bytes per stream past which the program is killed
    session: bool  # a session's cell: its reply frame ends it, and the deadline interrupts before it kills
    grace_s: float = 0.0  # a session cell's time between the interrupt and the kill
    account: Callable[[], Starvation] | None = None


async def run_step(ex: Executor, req: StepRequest) -> tuple[dict[str, Any], Output]:
    """Feed one request to ``ex``; collect output; enforce the wall clock and the output cap."""
    with ex.in_use():
        return await _Exchange(ex, req).run()


def request_frame(header: dict[str, Any], body: bytes = b"") -> bytes:
    """A request as the executor receives it, encoded once. Its header (a command, an environment, paths: JSON
    escapes control characters sixfold) past what the executor reads would make it drop its channel, and the
    step would read as the node's failure: the step's own error instead, before anything is sent."""
    frame = wire.encode(header, body)
    size = len(frame) - wire.PREFIX.size - len(body)
    if size > wire.MAX_HEADER_BYTES:
        raise PayloadTooLarge(
            f"the step's command, environment and paths are {size} bytes as the sandbox receives them "
            f"(JSON); a step carries at most {wire.MAX_HEADER_BYTES}"
        )
    return frame


class _Exchange:
    """One execution's exchange, from the request written to the result dict (``run_step``)."""

    def __init__(self, ex: Executor, req: StepRequest) -> None:
        self.ex, self.req = ex, req
        self.loop = asyncio.get_running_loop()
        self.out = Output(req.cap, req.kill_at)
        self.done: asyncio.Future[None] = self.loop.create_future()  # a one-shot's pipes have both closed
        self.open_fds = {ex.out_r: 1, ex.err_r: 2}
        self.killed_by: str | None = None
        self.timed_out = False
        self.step_exit: dict[str, Any] | None = None  # a session's reply frame, when it was its own
        self.harness: tuple[dict[str, Any], bytes] | None = None
        self.reading: asyncio.Future[tuple[dict[str, Any], bytes]] | None = None  # a one-shot's fetched files
        self.starvation: Starvation | None = None
        self.t0 = 0.0  # when the request went out
        # A session's last cell's tag (``_session_reply``); this cell's is the next one's.
        self.stale_tag, ex.last_tag = ex.last_tag, req.header.get("tag")
        self.waiter: asyncio.Future[Any] | None = None

    def _readable(self, fd: int) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.loop.remove_reader(fd)
            self.open_fds.pop(fd, None)
            if not self.open_fds and not self.req.session and not self.done.done():
                self.done.set_result(None)
            return
        if self.out.add(self.open_fds[fd], chunk) and self.killed_by is None:
            self.killed_by = "output"
            self.ex.kill()

    async def run(self) -> tuple[dict[str, Any], Output]:
        ex, req = self.ex, self.req
        request = request_frame(req.header, req.body)
        for fd in self.open_fds:
            self.loop.add_reader(fd, self._readable, fd)
        try:
            await self.loop.sock_sendall(ex.sock, request)
            if not req.session and "fetch" in req.header:
                self.reading = asyncio.ensure_future(
                    recv_frame(ex.sock, wire.MAX_HEADER_BYTES, req.header.get("fetch_max_bytes", 0))
                )
            self.t0 = time.monotonic()
            self.starvation = req.account() if req.account is not None else None
            # One-shot: the program is done when its executor (init of its pid namespace) exits, not when
            # its pipes close: a program that closes stdout and stderr and sleeps is still running.
            self.waiter = self._next_reply() if req.session else ex.exit
            await self._until_done()
            await self._after()
        finally:
            self._release()
        return self._result(), self.out

    def _next_reply(self) -> asyncio.Future[tuple[dict[str, Any], bytes]]:
        return asyncio.ensure_future(recv_frame(self.ex.sock, SESSION_REPLY_MAX_HEADER_BYTES, 0, self.ex.pending))

    async def _until_done(self) -> None:
        """Wait for the step's end (its reply, or its executor's exit) or its deadline, kept on its own time."""
        ex, req, loop = self.ex, self.req, self.loop
        assert self.waiter is not None
        waiter = self.waiter
        start = loop.time()
        deadline = start + req.timeout_s
        if self.starvation is not None:
            deadline -= min(req.timeout_s * EARLY_LOOK_SHARE, EARLY_LOOK_MAX_S)
        interrupted = False
        while True:
            finished, _ = await asyncio.wait(
                {waiter, ex.exit}, timeout=max(0.0, deadline - loop.time()), return_when=asyncio.FIRST_COMPLETED
            )
            if waiter in finished and (not req.session or waiter.exception() is None):
                if req.session and self._session_reply(waiter.result()[0]):
                    waiter = self.waiter = self._next_reply()
                    continue
                if self.killed_by is None and not self.timed_out and loop.time() > deadline + STARVED_MIN_S:
                    self._judge_late_end(deadline - start)
                return
            if ex.exit in finished or (req.session and waiter in finished):
                if req.session and not ex.exit.done():
                    if not isinstance(waiter.exception(), ChannelGarbage):
                        # The channel closed: its executor dying (its exit report follows at once), or the
                        # program closing the descriptor itself (it runs in that process; nothing else holds it).
                        await asyncio.wait({ex.exit}, timeout=CHANNEL_CLOSED_GRACE_S)
                    if not ex.exit.done():
                        self.killed_by = self.killed_by or "protocol"  # garbage on, or a close of, its own channel
                        ex.kill()
                return  # the executor died (killed at a limit, or its kernel crashed)
            if self.starvation is not None and not interrupted:
                more = self.starvation.more_s()
                if more > 0:
                    deadline = loop.time() + more
                    continue
            self.timed_out = True
            if req.session and not interrupted:
                ex.kill(signal.SIGINT)  # like a notebook: interrupt first, state survives
                interrupted = True
                deadline = loop.time() + req.grace_s
                continue
            self.killed_by = self.killed_by or "time"
            ex.kill()
            await asyncio.wait({ex.exit}, timeout=SANDBOX_READY_TIMEOUT_S)
            return

    def _judge_late_end(self, given_s: float) -> None:
        """A step that ended by itself, seen after its deadline (``given_s`` after its request: its limit, or
        more for time it was kept from): this loop was late, or the end came after it. When it ended is the
        zygote's word for a one-shot (its reap) and the session's executor's for a cell (its reply's ``t``),
        on the same clock, else now; past its deadline then, it is a success only if it was within its own
        time at its end (``starvation.ended_late``), else the program's timeout. A python cell's ``t`` comes
        from the interpreter it shares with the program, which could only claim an earlier end for itself
        (within its wall cap): its own step's verdict, never another's."""
        now = time.monotonic()
        if self.req.session:
            said = (self.step_exit or {}).get("t")
        else:
            said = self.ex.exit.result().get("t") if self.ex.exit.done() and not self.ex.exit.exception() else None
        end = said if isinstance(said, float) and self.t0 <= said <= now else now
        elapsed = end - self.t0
        if elapsed <= given_s + STARVED_MIN_S:
            return  # it ended in time; this loop saw it late
        s = self.starvation
        if s is not None and self.req.session:
            s.read()  # a cell's kernel outlives it: what it was kept from, up to now
        if s.ended_late(elapsed) if s is not None else elapsed > self.req.timeout_s + STARVED_MIN_S:
            self.timed_out = True

    def _session_reply(self, frame: dict[str, Any]) -> bool:
        """A session's reply: its own (``done``, or ``stage_error`` when the cell never ran); the last cell's
        own end, come after a reply that cell forged (it can read its tag: it shares the interpreter), which
        is skipped once (True: wait on) so that it never answers this cell; or any other frame the program
        wrote itself, which ends the session (every later reply would answer the wrong cell)."""
        code = frame.get("exit_code")
        tag = frame.get("tag")
        if self.stale_tag is not None and tag == self.stale_tag and frame.get("op") == "done":
            self.stale_tag = None
            return True
        ours = tag == self.req.header.get("tag") and not self.ex.pending  # nothing may follow its reply
        if ours and frame.get("op") == "stage_error":
            self.step_exit = frame
        elif not ours or frame.get("op") != "done" or not isinstance(code, int) or isinstance(code, bool):
            self.killed_by = self.killed_by or "protocol"
            self.ex.kill()
        else:
            self.step_exit = frame
        return False

    async def _after(self) -> None:
        """What follows the step's end: its exit report, its output drained, a one-shot harness's last frame."""
        ex, req, waiter = self.ex, self.req, self.waiter
        assert waiter is not None
        if req.session and self.step_exit is None and not ex.exit.done():
            await asyncio.wait({ex.exit}, timeout=SANDBOX_READY_TIMEOUT_S)
        if not req.session:
            await asyncio.wait({ex.exit}, timeout=SANDBOX_READY_TIMEOUT_S)  # the zygote's report
            # Everything in its pid namespace died with it, so the pipes close at once.
            await asyncio.wait({self.done}, timeout=SANDBOX_READY_TIMEOUT_S)
            staged = "fetch" in req.header or _exit_code(ex) == STAGE_FAILED
            if self.killed_by is None and not self.timed_out and staged:
                self.harness = await _harness_frame(ex.sock, req.header.get("fetch_max_bytes", 0), self.reading)
        if req.session and not waiter.done():
            waiter.cancel()
        elif req.session and not waiter.cancelled():
            waiter.exception()  # retrieved: a channel that closed with its executor is not worth a log line

    def _release(self) -> None:
        if self.reading is not None:
            if not self.reading.done():
                self.reading.cancel()
            elif not self.reading.cancelled():
                self.reading.exception()  # retrieved: a channel that closed with its executor says nothing more
        for fd in list(self.open_fds):
            self.loop.remove_reader(fd)
            while True:  # drain what was written before the step ended
                try:
                    chunk = os.read(fd, 1 << 16)
                except OSError:
                    break
                if not chunk:
                    break
                self.out.add(self.open_fds[fd], chunk)

    def _result(self) -> dict[str, Any]:
        ex, header, step_exit, starvation = self.ex, self.req.header, self.step_exit, self.starvation
        result: dict[str, Any] = {"timed_out": self.timed_out, "killed_by": self.killed_by}
        if self.timed_out and starvation is not None and starvation.starved:
            result.update(starved=True, kept_s=starvation.kept_s, wall_s=starvation.wall_cap_s)
        if step_exit is not None and step_exit.get("op") == "stage_error":
            result.update(stage_error=str(step_exit.get("error")), exit_code=None, signal=None, alive=True)
        elif step_exit is not None:
            sig = step_exit.get("signal")  # a container session's: what ended its command, in its shell's word
            sig = sig if type(sig) is int and 1 <= sig <= 64 else None
            result.update(exit_code=int(step_exit["exit_code"]), signal=sig, alive=True)
        elif ex.exit.done() and ex.exit.exception() is None:
            result.update(ex.exit.result(), alive=False)
        else:
            result.update(exit_code=None, signal=None, alive=False, lost=True)
        if self.harness is not None:
            head, files = self.harness
            if head.get("op") == "stage_error":
                result["stage_error"] = str(head.get("error"))
            elif head.get("op") == "enter_error":  # a container's root (``jailside/container.py``): whose, it says
                result["enter_error"] = str(head.get("error"))
                result["enter_node"] = head.get("node") is True
            elif head.get("op") == "fetched":
                # The program's own status, as the process that ran nothing of it saw it end, and its files.
                result.update(exit_code=head.get("exit_code"), signal=head.get("signal"), fetched=(head, files))
        elif "fetch" in header:
            result["fetched"] = None  # the sandbox ended before the files could be read
        if "fetch" in header:
            result["fetch_paths"] = header["fetch"]
        return result
