"""The gateway's routing over its links, in-process: a real ``Gateway`` joined to a fake node process and fake
workers over real Unix-socket links (``sandboxd.links``) in a temporary runtime directory. No jail and no
subprocess: what is checked is where each request goes and what a lost link becomes (tests/test_gateway.py
checks the same rules end to end on a real node)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from sandboxd import links
from sandboxd.board import Board
from sandboxd.config import load_settings
from sandboxd.front.gateway import Gateway
from sandboxd.ids import new_session_id
from sandboxd.links import Channel, Header

NODE = "fakenode"


@dataclass
class FakeWorker:
    """A worker's end of the front's link: answers each step with its own index, or holds it until released."""

    index: int
    incarnation: str
    steps: list[Header] = field(default_factory=list)
    hold: asyncio.Event | None = None
    channels: list[Channel] = field(default_factory=list)
    server: asyncio.Server | None = None

    async def handle(self, ch: Channel, h: Header, body: bytes) -> tuple[Header, bytes]:
        if h["op"] == "hello":
            self.channels.append(ch)
            return {"incarnation": self.incarnation}, b""
        assert h["op"] == "step", h
        self.steps.append({**h, "body": orjson.loads(body)})
        if self.hold is not None:
            await self.hold.wait()
        return {"status": 200}, orjson.dumps({"ok": True, "worker": self.index})

    async def listen(self, runtime: Path) -> None:
        self.server = await links.serve(str(runtime / f"w{self.index}.sock"), lambda: Channel(self.handle))

    async def die(self) -> None:
        """The process is gone: its socket stops listening and every link it had closes."""
        assert self.server is not None
        self.server.close()
        for ch in self.channels:
            ch.close()
        self.channels.clear()


@dataclass
class FakeNode:
    runtime: Path
    workers: list[FakeWorker]
    fronts: list[Channel] = field(default_factory=list)
    draining: bool = False

    def topology(self) -> Header:
        return {
            "node_id": NODE,
            "incarnation": "n1",
            "runtime_dir": str(self.runtime),
            "draining": self.draining,
            "workers": [
                {"index": w.index, "incarnation": w.incarnation, "alive": True, "capacity": {"tools": 2}}
                for w in self.workers
            ],
        }

    async def handle(self, ch: Channel, h: Header, body: bytes) -> tuple[Header, bytes]:
        if h["op"] == "hello":
            self.fronts.append(ch)
            return {**self.topology(), "tally_row": -1, "tally_rows": 0}, b""
        raise AssertionError(f"the gateway asked the node for {h['op']!r}")

    def tell(self) -> None:
        for ch in self.fronts:
            ch.event("topology", self.topology())


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[tuple[Gateway, FakeNode, Board]]:
    workers = [FakeWorker(0, "a0"), FakeWorker(1, "b0")]
    node = FakeNode(tmp_path, workers)
    board = Board(tmp_path / "board", len(workers), ["tools"], create=True)
    for w in workers:
        await w.listen(tmp_path)
        board.set(w.index, "tools", free=2, queued=0)
    server = await links.serve(str(tmp_path / "node.sock"), lambda: Channel(node.handle))
    settings = load_settings(node_id=NODE, runners=["tools"], runtime_dir=str(tmp_path))
    gw = Gateway(settings, index=0, node_socket=str(tmp_path / "node.sock"))
    await gw.start()
    try:
        yield gw, node, board
    finally:
        await gw.stop()
        server.close()
        for w in workers:
            with contextlib.suppress(AssertionError):
                await w.die()
        board.close()


async def one_shot(gw: Gateway) -> tuple[int, dict[str, Any]]:
    doc = {"runner": "tools", "action": {"tool": "echo"}}
    stored = await gw.step_raw(orjson.dumps(doc), doc, "tenant-a", time.monotonic())
    return stored.status, orjson.loads(stored.body)


async def session_step(gw: Gateway, session_id: str) -> tuple[int, dict[str, Any]]:
    doc = {"runner": "tools", "action": {"tool": "echo"}, "session_id": session_id}
    stored = await gw.step_raw(orjson.dumps(doc), doc, "tenant-a", time.monotonic())
    return stored.status, orjson.loads(stored.body)


async def test_a_one_shot_goes_to_the_worker_the_board_shows_free(rig: tuple[Gateway, FakeNode, Board]) -> None:
    gw, node, board = rig
    board.set(0, "tools", free=0, queued=3)  # worker 0 is full and has a queue: every one-shot goes to 1
    answers = [await one_shot(gw) for _ in range(6)]
    assert {a[1]["worker"] for a in answers} == {1} and {a[0] for a in answers} == {200}
    board.set(0, "tools", free=2, queued=0)
    board.set(1, "tools", free=0, queued=3)
    assert (await one_shot(gw))[1]["worker"] == 0
    step = node.workers[0].steps[-1]
    assert step["tenant"] == "tenant-a" and step["body"]["action"] == {"tool": "echo"} and step["deadline"] > 0


async def test_a_session_step_goes_to_the_worker_its_id_names(rig: tuple[Gateway, FakeNode, Board]) -> None:
    gw, node, _ = rig
    for index, w in enumerate(node.workers):
        status, body = await session_step(gw, new_session_id(NODE, index, w.incarnation))
        assert status == 200 and body["worker"] == index
    # Another node's id, an id of no node, a worker index the node does not have: unknown, the client's.
    for sid in (new_session_id("othernode", 0, "a0"), "s_nope", new_session_id(NODE, 7, "a0")):
        status, body = await session_step(gw, sid)
        assert status == 404 and body["error"]["code"] == "unknown_session", (sid, body)
    # A session of an earlier start of its worker: lost with it (410), never run on the new one.
    status, body = await session_step(gw, new_session_id(NODE, 0, "old"))
    assert status == 410 and body["error"]["blame"] == "infra" and "replaced" in body["error"]["message"]
    assert len(node.workers[0].steps) == 1


async def test_a_worker_that_dies_mid_step_fails_only_its_own_steps(rig: tuple[Gateway, FakeNode, Board]) -> None:
    gw, node, board = rig
    dying, other = node.workers
    dying.hold = asyncio.Event()
    board.set(1, "tools", free=0, queued=3)
    held_one_shot = asyncio.ensure_future(one_shot(gw))
    held_session = asyncio.ensure_future(session_step(gw, new_session_id(NODE, 0, dying.incarnation)))
    while len(dying.steps) < 2:
        await asyncio.sleep(0.01)
    await dying.die()
    status, body = await held_one_shot
    assert status == 502 and body["error"]["code"] == "worker_died" and body["error"]["blame"] == "infra", body
    status, body = await held_session
    assert (
        status == 410 and body["error"]["code"] == "session_lost" and "died during a step" in body["error"]["message"]
    )
    # The other worker was never touched, and takes the next one-shots; the dead one's sessions stay lost.
    board.set(1, "tools", free=2, queued=0)
    assert (await one_shot(gw)) == (200, {"ok": True, "worker": 1})
    status, body = await session_step(gw, new_session_id(NODE, 0, dying.incarnation))
    assert status == 410 and "worker 0 died" in body["error"]["message"]
    assert other.steps and all(s["body"].get("session_id") is None for s in other.steps)


async def test_the_node_says_a_worker_was_replaced_and_the_front_reconnects(
    rig: tuple[Gateway, FakeNode, Board],
) -> None:
    gw, node, board = rig
    old = node.workers[0]
    await old.die()
    new = FakeWorker(0, "a1")
    node.workers[0] = new
    await new.listen(node.runtime)
    node.tell()
    for _ in range(200):
        if gw.links.workers[0].up and gw.links.workers[0].incarnation == "a1":
            break
        await asyncio.sleep(0.01)
    board.set(1, "tools", free=0, queued=3)
    assert (await one_shot(gw)) == (200, {"ok": True, "worker": 0})
    assert (await session_step(gw, new_session_id(NODE, 0, "a1")))[0] == 200
    status, body = await session_step(gw, new_session_id(NODE, 0, "a0"))
    assert status == 410 and "replaced" in body["error"]["message"]
    assert not old.steps and len(new.steps) == 2


async def test_a_draining_node_refuses_new_one_shots_but_serves_its_sessions(
    rig: tuple[Gateway, FakeNode, Board],
) -> None:
    gw, node, _ = rig
    node.draining = True
    node.tell()
    for _ in range(200):
        if gw.draining:
            break
        await asyncio.sleep(0.01)
    status, body = await one_shot(gw)
    assert status == 503 and body["error"]["code"] == "shutting_down" and body["error"]["blame"] == "infra"
    assert (await session_step(gw, new_session_id(NODE, 1, "b0")))[0] == 200
