"""OpenEnv environments at /envs/<kind> against a real node, driven by the official ``openenv-core`` client."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import running_node

pytestmark = pytest.mark.node


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    with running_node(
        runners='["python", "textgame", "tools"]',
        workers=1,
        textgame__max_sessions_per_worker=2,
    ) as base:
        yield base


def client_class() -> Any:
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server.types import State

    class SandboxdEnv(EnvClient[dict[str, Any], dict[str, Any], State]):  # type: ignore[misc]
        def _step_payload(self, action: dict[str, Any]) -> dict[str, Any]:
            return action

        def _parse_result(self, payload: dict[str, Any]) -> Any:
            return StepResult(
                observation=payload.get("observation", {}),
                reward=payload.get("reward"),
                done=payload.get("done", False),
            )

        def _parse_state(self, payload: dict[str, Any]) -> Any:
            return State(**payload)

    return SandboxdEnv


async def sessions(node: str) -> int:
    metrics = httpx.get(f"{node}/metrics", timeout=10).text
    return sum(int(float(line.split()[-1])) for line in metrics.splitlines() if line.startswith("sandboxd_sessions{"))


async def test_textgame_episode_through_the_official_client(node: str) -> None:
    env_cls = client_class()
    async with env_cls(base_url=f"{node}/envs/textgame") as env, env_cls(base_url=f"{node}/envs/textgame") as twin:
        first = await env.reset(seed=7)
        assert first.observation["text"] and first.done is False
        assert (await twin.reset(seed=7)).observation["text"] == first.observation["text"]  # same seed, same game
        step = await env.step({"command": "look"})
        assert isinstance(step.reward, float) and step.done in (True, False) and "text" in step.observation
        state = await env.state()
        assert state.step_count == 1 and state.episode_id


async def test_python_environment_keeps_state_and_a_program_failure_is_an_observation(node: str) -> None:
    env_cls = client_class()
    async with env_cls(base_url=f"{node}/envs/python") as env:
        ready = await env.reset()
        assert ready.observation["exit_code"] == 0 and ready.observation["metadata"]["session_id"]
        await env.step({"code": "x = 41"})
        got = await env.step({"code": "x += 1; print(x)"})
        assert got.observation["metadata"]["ok"] and got.observation["stdout"] == "42\n"
        bad = await env.step({"code": "1/0"})
        assert bad.observation["exit_code"] == 1 and bad.observation["metadata"]["error"]["blame"] == "program"
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            await env.step({"no_code": 1})


def test_openenv_coding_client_unchanged(node: str) -> None:
    """OpenEnv's own typed client of its coding environment (``CodingEnv``, verbatim in tests/peers): its
    models forbid extra fields and want a flat stdout/stderr/exit_code; it failed on every observation before."""
    from tests.peers.coding_env import CodeAction, CodingEnv

    with CodingEnv(base_url=f"{node}/envs/python").sync() as env:
        first = env.reset()
        assert first.observation.exit_code == 0 and first.observation.stderr == ""
        env.step(CodeAction(code="total = 40"))
        result = env.step(CodeAction(code="total += 2\nprint(total)"))
        assert result.observation.stdout == "42\n" and result.observation.exit_code == 0
        failed = env.step(CodeAction(code="raise SystemExit(3)"))
        assert failed.observation.exit_code == 3 and failed.done is False
        crashed = env.step(CodeAction(code="1/0"))
        assert crashed.observation.exit_code == 1 and "ZeroDivisionError" in crashed.observation.stderr
        state = env.state()
        assert state.step_count == 4 and state.last_exit_code == 1 and state.episode_id


async def test_the_wire_frames_capacity_and_cleanup(node: str) -> None:
    """Raw frames as OpenEnv sends them; capacity errors; the session goes with its connection."""
    import websockets

    url = node.replace("http://", "ws://") + "/envs/textgame/ws"
    before = await sessions(node)
    async with websockets.connect(url) as a, websockets.connect(url) as b:
        await a.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
        frame = json.loads(await a.recv())
        assert frame["type"] == "observation" and set(frame["data"]) == {"observation", "reward", "done"}
        await b.send(json.dumps({"type": "reset", "data": {"seed": 2}}))
        assert json.loads(await b.recv())["type"] == "observation"
        async with websockets.connect(url) as c:  # one worker x 2 sessions: the third has no room
            await c.send(json.dumps({"type": "reset", "data": {}}))
            full = json.loads(await c.recv())
            assert full["type"] == "error" and full["data"]["code"] == "CAPACITY_REACHED", full
            await c.send("{not json")
            assert json.loads(await c.recv())["data"]["code"] == "INVALID_JSON"
            await c.send(b"\x01")  # a binary frame: not JSON, said so, the connection stays
            assert json.loads(await c.recv())["data"]["code"] == "INVALID_JSON"
            await c.send(json.dumps({"type": "dance"}))
            assert json.loads(await c.recv())["data"]["code"] == "UNKNOWN_TYPE"
            await c.send(json.dumps({"type": "step", "data": {"command": "look"}}))
            assert json.loads(await c.recv())["data"]["code"] == "SESSION_ERROR"  # no reset yet
        await a.send(json.dumps({"type": "state"}))
        st = json.loads(await a.recv())
        assert st["type"] == "state" and st["data"]["step_count"] == 0 and st["data"]["session_id"]
        assert await sessions(node) == before + 2
    for _ in range(50):  # both connections dropped without a close message: their sessions are closed
        if await sessions(node) == before:
            break
        await asyncio.sleep(0.1)
    assert await sessions(node) == before


def test_stateless_http_routes(node: str) -> None:
    r = httpx.post(f"{node}/envs/textgame/reset", json={"seed": 5}, timeout=30)
    assert r.status_code == 200 and r.json()["observation"]["text"]
    r = httpx.post(f"{node}/envs/python/step", json={"action": {"code": "print(2 + 2)"}}, timeout=30)
    assert r.status_code == 200 and r.json()["observation"]["stdout"] == "4\n"
    assert httpx.get(f"{node}/envs/tools/health").json() == {"status": "healthy"}
    schema = httpx.get(f"{node}/envs/python/schema").json()
    assert "code" in schema["action"]["properties"] and "stdout" in schema["observation"]["properties"]
    assert httpx.get(f"{node}/envs/python/metadata").json()["name"] == "python"
    with contextlib.ExitStack() as stack:  # the session cap (1 worker x 2 textgame sessions) is a 429, not a 422
        import websockets.sync.client

        socks = [stack.enter_context(websockets.sync.client.connect(node.replace("http", "ws") + "/envs/textgame/ws"))
                 for _ in range(2)]  # fmt: skip
        for ws in socks:
            ws.send(json.dumps({"type": "reset", "data": {}}))
            assert json.loads(ws.recv())["type"] == "observation"
        full = httpx.post(f"{node}/envs/textgame/reset", json={}, timeout=30)
        assert full.status_code == 429 and full.json()["code"] == "CAPACITY_REACHED", full.text
    missing = httpx.get(f"{node}/envs/sql/health")  # a kind this node does not run: no such environment here
    assert missing.status_code == 404 and "not enabled on this node" in missing.json()["detail"], missing.text
    assert httpx.get(f"{node}/envs/nothing-here/schema").status_code == 404
    assert httpx.get(f"{node}/envs/python/nowhere").status_code == 404


def test_a_keyed_node_takes_the_key_from_the_url_the_official_client_is_given() -> None:
    """openenv-core's client takes no headers; the key in the URL's user info travels as a Basic header."""
    key = "openenv-test-key-0123456789"
    with running_node(runners='["textgame"]', workers=1, api_keys=f'["{key}"]') as base:
        env_cls = client_class()
        keyed = base.replace("http://", f"http://key:{key}@") + "/envs/textgame"

        async def episode(url: str) -> Any:
            async with env_cls(base_url=url) as env:
                return await env.reset(seed=3)

        assert asyncio.run(episode(keyed)).observation["text"]
        with pytest.raises(Exception, match=r"needs an API key|1008|received 1008|ConnectionClosed"):
            asyncio.run(episode(base + "/envs/textgame"))
        wrong = base.replace("http://", "http://key:not-the-key-0123456789@") + "/envs/textgame"
        with pytest.raises(Exception, match=r"unknown API key|1008|ConnectionClosed"):
            asyncio.run(episode(wrong))
