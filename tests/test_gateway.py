"""Gateway behaviour over HTTP with the fake runner: admission, supervision, sessions."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import running_node

pytestmark = pytest.mark.node


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    with running_node(
        runners='["fake"]',
        workers=2,
        fake__slots_per_worker=2,
        queue_max=4,
        queue_timeout_s=1.0,
        worker_ping_interval_s=0.5,
    ) as base:
        yield base


def fake(action: dict[str, Any], **fields: object) -> dict[str, Any]:
    return {"runner": "fake", "action": action, **fields}


async def wait_ready(http: httpx.AsyncClient) -> None:
    for _ in range(200):
        if (await http.get("/readyz")).status_code == 200:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("node did not become ready again")


async def test_saturation_answers_429_with_retry_after(http: httpx.AsyncClient) -> None:
    # 4 slots run, 4 wait (queue_max), the rest are refused at once, not left to time out.
    reqs = [http.post("/rollout/step", json=fake({"sleep_s": 0.8})) for _ in range(12)]
    results = await asyncio.gather(*reqs)
    codes = sorted(r.status_code for r in results)
    assert codes.count(200) == 8 and codes.count(429) == 4, codes
    refused = next(r for r in results if r.status_code == 429)
    assert int(refused.headers["Retry-After"]) >= 1
    body = refused.json()
    assert body["error"]["blame"] == "infra" and body["error"]["code"] == "saturated"


async def test_queue_deadline_is_504_infra(http: httpx.AsyncClient) -> None:
    async def late_step() -> httpx.Response:
        await asyncio.sleep(0.3)  # after the four slow steps hold every slot
        return await http.post("/rollout/step", json=fake({"echo": 1}))

    hold = [http.post("/rollout/step", json=fake({"sleep_s": 2.5})) for _ in range(4)]
    results = await asyncio.gather(*hold, late_step())
    late = results[-1]
    assert late.status_code == 504, late.text
    assert late.json()["error"]["code"] == "deadline_exceeded" and late.json()["error"]["blame"] == "infra"


def restarts(metrics: str) -> float:
    (line,) = [ln for ln in metrics.splitlines() if ln.startswith("sandboxd_worker_restarts_total ")]
    return float(line.split()[-1])


async def test_worker_crash_fails_only_its_own_steps(http: httpx.AsyncClient) -> None:
    await wait_ready(http)
    before = restarts((await http.get("/metrics")).text)
    crash = http.post("/rollout/step", json=fake({"crash_worker": True, "sleep_s": 0}))
    others = [http.post("/rollout/step", json=fake({"echo": i, "sleep_s": 0.05})) for i in range(6)]
    results = await asyncio.gather(crash, *others)
    assert results[0].status_code == 502
    died = results[0].json()
    assert died["error"] == {
        "blame": "infra",
        "code": "worker_died",
        "message": died["error"]["message"],
        "retry_after_s": None,
    }
    assert isinstance(died["worker"], int) and f"worker {died['worker']}" in died["error"]["message"]
    for i, r in enumerate(results[1:]):
        body = r.json()
        if r.status_code == 502:  # only steps that were on the worker that died
            assert body["error"]["code"] == "worker_died" and body["worker"] == died["worker"], body
        elif r.status_code == 429:  # placed after the death, on the half of the node's slots and queue left
            assert body["error"]["code"] == "saturated" and body["error"]["blame"] == "infra", body
            assert body["error"]["retry_after_s"] is not None, body
        else:
            assert r.status_code == 200 and body["observation"]["echo"] == i, body
    assert any(r.status_code == 200 for r in results[1:]), "the other worker's steps must be untouched"
    await wait_ready(http)
    # 4 concurrent slow steps need all 4 slots: both workers, the new one included
    after = await asyncio.gather(
        *(http.post("/rollout/step", json=fake({"echo": i, "sleep_s": 0.3})) for i in range(4))
    )
    assert all(r.status_code == 200 for r in after)
    assert len({r.json()["worker"] for r in after}) == 2
    assert restarts((await http.get("/metrics")).text) == before + 1  # the one that died, once


async def test_session_lost_with_its_worker_is_410(http: httpx.AsyncClient) -> None:
    await wait_ready(http)
    sid = (await http.post("/sessions", json={"runner": "fake"})).json()["session_id"]
    r = await http.post("/rollout/step", json=fake({"echo": "a"}, session_id=sid))
    assert r.json()["observation"]["session_steps"] == 1
    worker = r.json()["worker"]
    # crash that worker through the session itself
    r = await http.post("/rollout/step", json=fake({"crash_worker": True}, session_id=sid))
    assert r.status_code == 410 and r.json()["error"]["code"] == "session_lost"  # its state went with the worker
    r = await http.post("/rollout/step", json=fake({"echo": "b"}, session_id=sid))
    assert r.status_code == 410 and r.json()["error"]["code"] == "session_lost", r.text
    assert r.json()["error"]["blame"] == "infra" and f"worker {worker}" in r.json()["error"]["message"], r.text
    await wait_ready(http)
    # The replacement worker serves new sessions; the lost one stays lost (never a fresh, empty sandbox).
    again = (await http.post("/sessions", json={"runner": "fake"})).json()["session_id"]
    assert (await http.post("/rollout/step", json=fake({"echo": "c"}, session_id=again))).status_code == 200
    assert (await http.post("/rollout/step", json=fake({"echo": "d"}, session_id=sid))).status_code == 410


async def test_session_steps_are_pinned_and_counted(http: httpx.AsyncClient) -> None:
    await wait_ready(http)
    sid = (await http.post("/sessions", json={"runner": "fake"})).json()["session_id"]
    results = [await http.post("/rollout/step", json=fake({"echo": i}, session_id=sid)) for i in range(5)]
    assert [r.json()["observation"]["session_steps"] for r in results] == [1, 2, 3, 4, 5]
    assert len({r.json()["observation"]["pid"] for r in results}) == 1
    assert (await http.delete(f"/sessions/{sid}")).status_code == 204
    assert (await http.delete(f"/sessions/{sid}")).status_code == 404


async def test_idempotent_session_creation(http: httpx.AsyncClient) -> None:
    body = {"runner": "fake", "idempotency_key": "sess-1"}
    a, b = await asyncio.gather(http.post("/sessions", json=body), http.post("/sessions", json=body))
    assert a.status_code == b.status_code == 201
    assert a.json()["session_id"] == b.json()["session_id"]


async def test_program_timeout_is_the_programs_failure(http: httpx.AsyncClient) -> None:
    r = await http.post("/rollout/step", json=fake({"sleep_s": 5}, timeout_s=0.2))
    assert r.status_code == 200
    assert r.json()["error"]["blame"] == "program" and r.json()["error"]["code"] == "program_timeout"


async def test_sigterm_to_every_process_drains_running_steps() -> None:
    """What systemd or Ctrl-C does (SIGTERM to the gateway and each worker): running steps still finish."""
    with running_node(runners='["fake"]', workers=1, shutdown_grace_s=10) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as c:
            ready = (await c.get("/readyz")).json()
            step = asyncio.ensure_future(c.post("/rollout/step", json=fake({"sleep_s": 1.5, "echo": "finished"})))
            await asyncio.sleep(0.5)
            for pid in [ready["pid"], *(w["pid"] for w in ready["workers"])]:
                os.kill(pid, signal.SIGTERM)
            await asyncio.sleep(0.3)
            # Draining: the port stays open; new work is told to go elsewhere, not refused a connection.
            async with httpx.AsyncClient(base_url=base, timeout=30) as fresh:
                late = await fresh.post("/rollout/step", json=fake({"echo": "late"}))
                assert late.status_code == 503 and late.json()["error"]["code"] == "shutting_down", late.text
                assert late.json()["error"]["blame"] == "infra"
                made = await fresh.post("/sessions", json={"runner": "fake"})
                assert made.status_code == 503 and made.json()["error"]["code"] == "shutting_down", made.text
                probe = await fresh.get("/readyz")
                assert probe.status_code == 503 and probe.json()["draining"] is True
            r = await step
            assert r.status_code == 200 and r.json()["observation"]["echo"] == "finished", r.text


async def test_clients_cannot_mint_metric_labels(http: httpx.AsyncClient) -> None:
    for name in ("zz-label-1", "zz-label-2"):
        r = await http.post("/rollout/step", json={"runner": name, "action": {}})
        assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_runner"
    text = (await http.get("/metrics")).text
    assert "zz-label" not in text and 'runner="unknown"' in text


async def test_steps_may_name_their_rollout(http: httpx.AsyncClient) -> None:
    r = await http.post("/rollout/step", json=fake({"echo": "x"}, rollout_id="rollout-7"))
    assert r.status_code == 200 and r.json()["observation"]["echo"] == "x", r.text
    bad = await http.post("/rollout/step", json=fake({"echo": "x"}, rollout_id="r" * 200))
    assert bad.status_code == 422 and "rollout_id" in bad.json()["error"]["message"], bad.text
