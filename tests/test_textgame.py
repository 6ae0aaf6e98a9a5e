"""The text-game runner over HTTP: episodes replay by seed, sessions are isolated, bad input is clear."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sandboxd.runners.textgame.world import TEMPLATES, World, heuristic_action, play_batch
from tests.conftest import running_node

pytestmark = pytest.mark.node


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    with running_node(runners='["textgame"]', workers=2) as base:
        yield base


async def tg(http: httpx.AsyncClient, action: dict[str, Any], session_id: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {"runner": "textgame", "action": action}
    if session_id:
        body["session_id"] = session_id
    return await http.post("/rollout/step", json=body)


def test_world_goals_are_all_templates_and_achievable() -> None:
    seen = set()
    for seed in range(300):
        w = World.new(seed, max_steps=60)
        seen.add(w.goal.template)
        while not w.done:
            w.step(heuristic_action(w))
        assert w.won, (seed, w.goal)
    assert seen == set(TEMPLATES)
    assert play_batch(7, 40, 10) == play_batch(7, 40, 10)


async def test_interactive_episode_replays_by_seed_and_pays_on_the_goal(http: httpx.AsyncClient) -> None:
    sid = (await http.post("/sessions", json={"runner": "textgame"})).json()["session_id"]
    try:
        first = (await tg(http, {"op": "reset", "seed": 42, "max_steps": 80}, sid)).json()["observation"]
        again = (await tg(http, {"op": "reset", "seed": 42, "max_steps": 80}, sid)).json()["observation"]
        assert first == again and first["done"] is False and "go" in " ".join(first["valid_actions"])
        # play it with the scripted agent, on a local replica of the same seed
        replica = World.new(42, 80)
        obs = again
        while not obs["done"]:
            command = heuristic_action(replica)
            replica.step(command)
            r = await tg(http, {"op": "step", "command": command}, sid)
            assert r.status_code == 200
            obs = r.json()["observation"]
            assert command.split()[0] in obs["text"].lower() or obs["valid"], obs
        assert obs["won"] is True and obs["total_reward"] >= 1.0 and obs["valid_actions"] == []
        r = await tg(http, {"op": "step", "command": "dance wildly"}, sid)
        assert r.json()["observation"]["valid"] is False
    finally:
        await http.delete(f"/sessions/{sid}")


async def test_episode_batches_one_shot(http: httpx.AsyncClient) -> None:
    r = await tg(http, {"op": "episodes", "seed": 3, "steps": 40, "batch": 10})
    assert r.status_code == 200 and r.json()["ok"] is True
    obs = r.json()["observation"]
    assert obs["episodes"] == 10 and obs["steps_done"] == 400 and obs["goals_met"] >= 9
    assert obs == play_batch(3, 40, 10)


async def test_bad_textgame_input(http: httpx.AsyncClient) -> None:
    r = await tg(http, {"op": "fly"})
    assert r.status_code == 422 and "action" in r.json()["error"]["message"]
    r = await tg(http, {"op": "episodes", "batch": 100000})
    assert r.status_code == 422 and "batch" in r.json()["error"]["message"]
    r = await tg(http, {"op": "step", "command": "look"})
    assert r.status_code == 422 and "needs a session" in r.json()["error"]["message"]
    sid = (await http.post("/sessions", json={"runner": "textgame"})).json()["session_id"]
    r = await tg(http, {"op": "step", "command": "look"}, sid)
    assert r.status_code == 200 and "reset" in r.json()["observation"]["error"]
    assert r.json()["error"]["blame"] == "program"
    await http.delete(f"/sessions/{sid}")
