"""A front process's links: one to the node process, one to each worker.

The node says at once (its ``hello`` answer) and whenever it changes (``topology`` events) which workers
there are, which incarnation each is, and what they host; the front keeps one connection to each live
worker. A worker that dies closes its connection: its in-flight steps fail at once (502, or 410 for a
session's step), and the front reconnects to its replacement when the node says it is up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxd import links
from sandboxd.errors import SandboxSetupError
from sandboxd.links import Channel, Header

log = logging.getLogger("sandboxd.front")
REFUSED_FOR_S = 3.0


@dataclass
class WorkerLink:
    index: int
    incarnation: str = ""
    capacity: dict[str, int] = field(default_factory=dict)
    channel: Channel | None = None
    connecting: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def up(self) -> bool:
        return self.channel is not None and self.channel.alive


class NodeLinks:
    def __init__(
        self,
        node_socket: str,
        index: int,
        handler: Callable[[Channel, Header, bytes], Any],
        on_event: Callable[[Header], None],
        on_gone: Callable[[], None] = lambda: None,
    ) -> None:
        self.node_socket = node_socket
        self.on_gone = on_gone
        self.index = index
        self.handler = handler
        self.on_event = on_event
        self.node: Channel | None = None
        self.workers: list[WorkerLink] = []
        self.topology: Header = {}
        self.tally_row = -1  # this front's row of the node's tally (``sandboxd.tally``), from the node's hello
        self.tally_rows = 0
        self.runtime_dir = ""
        self.by_kind: dict[str, list[int]] = {}
        self.closing = False

    async def connect(self, timeout_s: float, alive: Callable[[], bool] = lambda: True) -> None:
        """Connect to the node (retrying while it starts) and to every worker it names."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        refused_since = 0.0
        while True:
            try:
                self.node = await links.connect(
                    self.node_socket, self.handler, on_event=self._node_event, on_close=self._node_gone
                )
                break
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                # No socket yet: the node is starting. A socket nobody listens on for long: it is dead (a
                # front restarted after its node died must fail at once, not wait out the start timeout).
                now = loop.time()
                refused_since = (refused_since or now) if isinstance(exc, ConnectionRefusedError) else 0.0
                if not alive() or now > deadline or (refused_since and now - refused_since > REFUSED_FOR_S):
                    raise SandboxSetupError(f"the node process did not answer at {self.node_socket}") from exc
                await asyncio.sleep(0.05)
        topology, _ = await self.node.call("hello", {"index": self.index, "pid": os.getpid()})
        self.tally_row, self.tally_rows = int(topology.get("tally_row", -1)), int(topology.get("tally_rows", 0))
        await self._apply(topology, wait=True)

    def _node_event(self, header: Header, body: bytes) -> None:
        if header.get("op") == "topology":
            asyncio.get_running_loop().create_task(self._apply(header, wait=False))
        self.on_event(header)

    def _node_gone(self, _: Channel) -> None:
        if not self.closing:
            log.error("front %d: the node process went away; this front stops", self.index)
            self.on_gone()

    async def _apply(self, topology: Header, wait: bool) -> None:
        self.topology = topology
        self.runtime_dir = str(topology["runtime_dir"])
        described = topology["workers"]
        while len(self.workers) < len(described):
            self.workers.append(WorkerLink(len(self.workers)))
        jobs = []
        for d in described:
            w = self.workers[d["index"]]
            w.capacity = dict(d["capacity"])
            if not d["alive"]:
                continue
            if w.incarnation != d["incarnation"] or not w.up:
                w.incarnation = d["incarnation"]
                if w.channel is not None:
                    w.channel.close()
                    w.channel = None
                if w.connecting is None or w.connecting.done():
                    w.connecting = asyncio.get_running_loop().create_task(self._connect_worker(w))
                jobs.append(w.connecting)
        by_kind: dict[str, list[int]] = {}
        for w in self.workers:
            for k in w.capacity:
                by_kind.setdefault(k, []).append(w.index)
        self.by_kind = by_kind
        if wait and jobs:
            await asyncio.gather(*jobs, return_exceptions=True)

    async def _connect_worker(self, w: WorkerLink) -> None:
        path = str(Path(self.runtime_dir) / f"w{w.index}.sock")
        want = w.incarnation
        for _ in range(100):
            if self.closing or w.incarnation != want:
                return
            try:
                ch = await links.connect(path)
                hello, _ = await ch.call("hello", {"role": "front", "index": self.index})
            except (OSError, links.LinkClosed):
                await asyncio.sleep(0.05)
                continue
            if hello.get("incarnation") != want:  # an older or newer start answered: the node will say
                ch.close()
                await asyncio.sleep(0.05)
                continue
            w.channel = ch
            return
        log.error("front %d could not reach worker %d (%s)", self.index, w.index, path)

    def up(self, kind: str) -> list[int]:
        """The workers hosting ``kind`` that this front can reach now."""
        return [i for i in self.by_kind.get(kind, ()) if self.workers[i].up]

    async def close(self) -> None:
        self.closing = True
        for w in self.workers:
            if w.connecting is not None:
                w.connecting.cancel()
            if w.channel is not None:
                w.channel.close()
        if self.node is not None:
            self.node.close()
        with contextlib.suppress(Exception):
            await asyncio.sleep(0)


class NodeKV:
    """Idempotency keys kept by the node process, for all of its front processes."""

    def __init__(self, links: NodeLinks) -> None:
        self.links = links

    async def _call(self, fields: Header) -> Header:
        assert self.links.node is not None
        answer, _ = await self.links.node.call("kv", fields)
        return answer

    async def claim(self, key: str, value: bytes, ttl_ms: int) -> bool:
        return bool(
            (await self._call({"what": "claim", "key": key, "value": value.decode(), "ttl_ms": ttl_ms}))["claimed"]
        )

    async def get(self, key: str) -> bytes | None:
        value = (await self._call({"what": "get", "key": key}))["value"]
        return None if value is None else str(value).encode()

    async def put(self, key: str, value: bytes, ttl_ms: int) -> None:
        await self._call({"what": "put", "key": key, "value": value.decode(), "ttl_ms": ttl_ms})

    async def delete(self, key: str) -> None:
        await self._call({"what": "delete", "key": key})
