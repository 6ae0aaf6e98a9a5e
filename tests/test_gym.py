"""sandboxd.gym against a real node: Gymnasium's own env checker, each kind's text mapping, the async variant."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import running_node

pytestmark = pytest.mark.node


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    with running_node(runners='["python", "textgame", "tools"]', workers=1) as base:
        yield base


def live_sessions(node: str) -> int:
    text = httpx.get(f"{node}/metrics", timeout=10).text
    return sum(int(float(line.split()[-1])) for line in text.splitlines() if line.startswith("sandboxd_sessions{"))


def test_gymnasium_env_checker_passes(node: str) -> None:
    from gymnasium.utils.env_checker import check_env

    from sandboxd.gym import SandboxdEnv

    before = live_sessions(node)
    for runner in ("textgame", "python"):
        env = SandboxdEnv(node, runner=runner)
        try:
            check_env(env, skip_render_check=True)
        finally:
            env.close()
    assert live_sessions(node) == before  # every reset's session was closed


def test_a_textgame_episode(node: str) -> None:
    from sandboxd.gym import SandboxdEnv

    env = SandboxdEnv(node, runner="textgame", max_steps=3)
    try:
        obs, info = env.reset(seed=11)
        twin = SandboxdEnv(node, runner="textgame")
        try:
            assert twin.reset(seed=11)[0] == obs and obs and env.observation_space.contains(obs)  # seeded: the same
        finally:
            twin.close()
        total, steps, truncated, terminated = 0.0, 0, False, False
        while not (terminated or truncated):
            obs, reward, terminated, truncated, info = env.step("look")
            total, steps = total + reward, steps + 1
        assert steps <= 3 and (truncated or terminated) and info["ok"] in (True, False)
    finally:
        env.close()


def test_python_and_tools_and_the_blame_rule(node: str) -> None:
    from sandboxd.gym import SandboxdEnv, SandboxdEnvError

    py = SandboxdEnv(node, runner="python")
    try:
        assert py.reset() == ("", {"session_id": py.session_id})
        py.step("x = 20")
        obs, *_ = py.step("print(x + 22)")
        assert obs == "42\n"
        obs, _, terminated, _, info = py.step("1/0")  # the program's failure: an observation
        assert "ZeroDivisionError" in obs and not terminated and info["ok"] is False
        sid = py.session_id
        httpx.delete(f"{node}/sessions/{sid}")
        with pytest.raises(SandboxdEnvError, match="unknown_session"):  # not the program's: raised, never a reward
            py.step("print(1)")
    finally:
        py.close()

    tools = SandboxdEnv(node, runner="tools")
    try:
        tools.reset()
        obs, *_ = tools.step(json.dumps({"tool": "find_user_id_by_email", "args": {"email": "nobody@example.com"}}))
        assert json.loads(obs)["error"]
        with pytest.raises(ValueError, match="JSON"):
            tools.step("not json")
    finally:
        tools.close()


async def test_the_async_variant_steps_many_at_once(node: str) -> None:
    from sandboxd.gym import AsyncSandboxdEnv

    envs = [AsyncSandboxdEnv(node, runner="textgame", max_steps=5) for _ in range(8)]
    try:
        firsts = await asyncio.gather(*(e.reset(seed=i) for i, e in enumerate(envs)))
        assert len({obs for obs, _ in firsts}) >= 2  # different seeds, different games
        results = await asyncio.gather(*(e.step("look") for e in envs))
        assert all(isinstance(r[1], float) for r in results)
    finally:
        await asyncio.gather(*(e.close() for e in envs))
