"""The sites pages may visit, served over HTTP on the browser jail's own loopback.

The browser runs in an empty network namespace of its own (see ``jail.py``):
only its loopback exists there, and nothing of the host's. The worker opens a
listening socket *inside* that namespace (``listen_in_netns``: a thread enters
it, binds ``127.0.0.1:80``, and comes back) and serves the sites on it from
memory; Chromium maps every ``<site>.sandboxd`` name to that address
(``--host-resolver-rules``) and every other name to nothing. So a page reaches
the runner's sites and nothing else, whatever it asks for: the host's
loopback, the gateway, another node, a cloud metadata address and the internet
are not in its namespace at all.

Why not Playwright's request interception (what this replaced): every request
then makes a round trip Chromium -> Playwright's driver -> the worker and
back, and Playwright turns the HTTP cache off; measured on the public suite's
worker, routing cost ~0.3-0.5 s of CPU per B4 trajectory (1.3-1.6 -> 1.8-1.9 s)
and 15-25% of its throughput.

The bundled "Bench Shop" is ``shop``; operators add static site directories by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import mimetypes
import os
import posixpath
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

SITE_SUFFIX = ".sandboxd"
BUNDLED = {"shop": Path(__file__).parent / "sites" / "shop"}
MAX_FILE_BYTES = 16 << 20
BLANK_PATH = "/__sandboxd_blank__"  # an empty page on every site, for resetting a context between trajectories
SITE_PORT = 80
HEAD_LIMIT = 16 << 10  # request line and headers
BODY_LIMIT = 1 << 20  # a form post's body, read and dropped
IDLE_TIMEOUT_S = 30.0  # a keep-alive connection with no next request
READ_TIMEOUT_S = 10.0  # a request that arrives too slowly
RESOLVER_RULES = f"MAP *{SITE_SUFFIX} 127.0.0.1, MAP * ~NOTFOUND"  # for Chromium's --host-resolver-rules
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 421: "Misdirected Request"}


@dataclass
class Sites:
    roots: dict[str, Path]
    _cache: dict[tuple[str, str], tuple[bytes, str] | None] = field(default_factory=dict)
    blocked: int = 0
    served: int = 0

    @classmethod
    def configured(cls, extra: dict[str, str]) -> Sites:
        roots = dict(BUNDLED)
        roots.update({name: Path(path) for name, path in extra.items()})
        for name, root in roots.items():
            if not root.is_dir():
                raise ValueError(f"site {name!r}: {root} is not a directory")
        return cls(roots)

    def site_of(self, host: str) -> str | None:
        """The site a host name (no port) names, if it is one of ours: ``shop.sandboxd`` -> ``shop``."""
        name = host.lower()
        site = name[: -len(SITE_SUFFIX)] if name.endswith(SITE_SUFFIX) else None
        return site if site in self.roots else None

    def origin_of(self, url: str) -> str | None:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        return f"http://{host}" if parts.scheme == "http" and self.site_of(host) else None

    def url(self, site: str, path: str) -> str:
        if site not in self.roots:
            raise KeyError(site)
        return f"http://{site}{SITE_SUFFIX}{path if path.startswith('/') else '/' + path}"

    def _file(self, site: str, path: str) -> tuple[bytes, str] | None:
        key = (site, path)
        if key not in self._cache:
            rel = posixpath.normpath("/" + path).lstrip("/") or "index.html"
            root = self.roots[site].resolve()
            target = (root / rel).resolve()
            if target.is_dir():
                target = target / "index.html"
            found = None
            if target.is_relative_to(root) and target.is_file() and target.stat().st_size <= MAX_FILE_BYTES:
                kind = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
                found = (target.read_bytes(), kind)
            if len(self._cache) < 4096:  # misses are cached too; a page asking for endless names is not
                self._cache[key] = found
            return found
        return self._cache[key]

    def lookup(self, host: str, target: str) -> tuple[int, bytes, str]:
        """Status, body and content type for a request to ``host`` (its Host header) for ``target``."""
        name = host.split(":", 1)[0].lower()
        site = self.site_of(name)
        if site is None or host.lower() not in (name, f"{name}:{SITE_PORT}"):
            self.blocked += 1
            return 421, b"not a site of this runner", "text/plain"
        path = unquote(urlsplit(target).path or "/")
        if path == BLANK_PATH:
            return 200, b"<!doctype html><title></title>", "text/html"
        self.served += 1
        found = self._file(site, path)
        if found is None:
            return 404, b"not found", "text/plain"
        return 200, found[0], found[1]

    # ------------------------------------------------------------------ HTTP/1.1, just enough for a browser

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection from the browser: requests in turn (keep-alive), each answered from memory."""
        try:
            first = True
            while True:
                wait = READ_TIMEOUT_S if first else IDLE_TIMEOUT_S
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), wait)
                first = False
                keep = await self._answer(head, reader, writer)
                await writer.drain()
                if not keep:
                    return
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError, ValueError):
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self._respond(writer, 400, b"bad request", "text/plain", "GET", keep=False)
            return False
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            key, sep, value = line.partition(":")
            if sep:
                headers[key.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0") or "0")
        if length < 0 or length > BODY_LIMIT or "transfer-encoding" in headers:
            self._respond(writer, 400, b"body too large or chunked", "text/plain", method, keep=False)
            return False
        if length:
            await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT_S)
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if headers.get("upgrade"):  # WebSockets: nothing here speaks them
            self.blocked += 1
            self._respond(writer, 404, b"no upgrades here", "text/plain", method, keep=False)
            return False
        if method not in ("GET", "HEAD", "POST"):
            self._respond(writer, 405, b"method not allowed", "text/plain", method, keep)
            return keep
        status, body, kind = self.lookup(headers.get("host", ""), target)
        self._respond(writer, status, body, kind, method, keep)
        return keep

    @staticmethod
    def _respond(writer: asyncio.StreamWriter, status: int, body: bytes, kind: str, method: str, keep: bool) -> None:
        head = (
            f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
            "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
            f"Connection: {'keep-alive' if keep else 'close'}\r\n\r\n"
        )
        writer.write(head.encode() + (b"" if method == "HEAD" else body))


def listen_in_netns(netns_fd: int, port: int = SITE_PORT) -> socket.socket:
    """A listening socket on ``127.0.0.1:port`` inside the network namespace ``netns_fd`` refers to.

    ``setns`` moves only the calling thread, so a short-lived thread of its
    own enters the namespace, binds, and goes back; the socket stays where it
    was bound. (As root of the parent user namespace we may bind port 80 in
    the jail's.)
    """
    result: list[socket.socket | BaseException] = []

    def work() -> None:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            os.setns(netns_fd, os.CLONE_NEWNET)
            try:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", port))
                sock.listen(256)
                sock.setblocking(False)
                result.append(sock)
            finally:
                os.setns(own, os.CLONE_NEWNET)
        except BaseException as exc:  # handed to the caller's thread
            result.append(exc)
        finally:
            os.close(own)

    t = threading.Thread(target=work, name="netns-listen")
    t.start()
    t.join()
    out = result[0]
    if isinstance(out, BaseException):
        raise out
    return out


def browser_netns(procs_file: Path) -> int:
    """An fd of the jail's network namespace, from a process of the browser's cgroup that is in it.

    nsjail itself stays in ours; every Chromium process is in the jail's. The
    pidfd pins the process while its namespace is opened and its cgroup
    checked again, so a reused pid number cannot hand us someone else's.
    """
    own = os.stat("/proc/self/ns/net").st_ino
    for pid in [int(p) for p in procs_file.read_text().split()]:
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            if os.fstat(fd).st_ino != own and _still_member(pid, procs_file):
                return fd
            os.close(fd)
        except OSError:
            continue
        finally:
            os.close(pidfd)
    raise OSError("no process of the browser is in a network namespace of its own")


def _still_member(pid: int, procs_file: Path) -> bool:
    return str(pid) in procs_file.read_text().split()
