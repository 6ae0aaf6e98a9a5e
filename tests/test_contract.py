"""The session contract every runner kind keeps, over HTTP against one real node with every kind.

For each kind: a session is created, keeps its state between steps, shares
nothing with a sibling session or with one-shot steps, ends at its TTL, is
deleted cleanly, and unknown ids are a clear 404. At its session cap a kind's
refusal is a 429 with Retry-After (blame infra), and the capacity comes back
when a session closes. One worker, so the caps are the node's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from sandboxd.registry import kinds
from sandboxd.runners.tools import data
from tests.conftest import running_node

pytestmark = pytest.mark.node

CAP = 2
PENDING = next(o["order_id"] for o in data.build().orders.values() if o["status"] == "pending")


@dataclass(frozen=True)
class Probe:
    """How to write state into a session, read it back, and tell the written value apart."""

    write: dict[str, Any]
    read: dict[str, Any]
    value: Callable[[dict[str, Any]], Any]  # from a read step's whole result
    written: Any
    options: dict[str, Any] = field(default_factory=dict)  # what a session of the kind is opened with


PROBES: dict[str, Probe] = {
    "python": Probe(
        {"code": "secret = 'A'"},
        {"code": "print(globals().get('secret'))"},
        lambda r: r["observation"]["stdout"],
        "A\n",
    ),
    "tools": Probe(
        {"tool": "cancel_pending_order", "args": {"order_id": PENDING, "reason": "no longer needed"}},
        {"tool": "get_order_details", "args": {"order_id": PENDING}},
        lambda r: r["observation"]["result"]["status"],
        "cancelled",
    ),
    "sql": Probe(
        {"query": "CREATE TEMP TABLE mine AS SELECT 42 AS v"},
        {"query": "SELECT v FROM mine"},
        lambda r: r["observation"]["rows"],
        [[42]],
    ),
    "textgame": Probe(
        {"op": "reset", "seed": 7},
        {"op": "step", "command": "look"},
        lambda r: r["observation"].get("steps"),
        1,
    ),
    "fake": Probe({"set": {"secret": "A"}}, {"get": "secret"}, lambda r: r["observation"]["value"], "A"),
    "container": Probe(
        {"cmd": "export SECRET=A"},
        {"cmd": "echo ${SECRET:-none}"},
        lambda r: r["observation"]["stdout"],
        "A\n",
        {"image": "contract/shell:1"},
    ),
    "browser": Probe(
        {
            "actions": [
                {"action": "goto", "path": "/"},
                {"action": "click", "selector": "button.add-to-cart[data-id='3']"},
                # The write checks its own effect: a lost click is the write step's failure, said there.
                {"action": "wait_for", "selector": "button.add-to-cart[data-id='3']:has-text('Added')"},
            ]
        },
        {"actions": [{"action": "goto", "path": "/cart.html"}, {"action": "text", "selector": "#cart-rows"}]},
        lambda r: "camera max 3" in (r["observation"]["results"][-1]["value"] or ""),
        True,
    ),
}
KINDS = sorted(PROBES)


def test_every_registered_kind_resolves_and_has_a_probe() -> None:
    registry = kinds()
    with_sessions = {name for name, kind in registry.items() if not kind.no_sessions}
    assert with_sessions == set(PROBES), "a new kind with sessions needs a probe in the contract suite"
    for name, kind in registry.items():
        assert kind.name == name
        assert callable(kind.runner_class())
        if name in PROBES:
            kind.action.model_validate(PROBES[name].write)
            kind.action.model_validate(PROBES[name].read)


@pytest.fixture(scope="module")
def images() -> Iterator[str]:
    """An image store with a shell image (the container kind's sessions); under /var/tmp: the jails pass its
    parents."""
    from tests.imagebuild import host_image, image_store

    with image_store("sandboxd-contract-") as (root, store):
        store.import_image(host_image(root / "oci", "contract/shell:1", Env=["PATH=/usr/bin:/bin"]))
        yield str(store.root)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, images: str) -> Iterator[str]:
    settings: dict[str, object] = {
        "images_dir": images,
        "runners": '["' + '","'.join(KINDS) + '"]',
        "workers": 1,
        "reap_interval_s": 0.2,
        "sql__scale_factor": 0.01,
        "sql__data_dir": str(tmp_path_factory.mktemp("tpch")),
        "python__slots_per_worker": 1,
        "browser__instances_per_node": 1,
        "python__warm_sessions_per_jail": 1,
    }
    for kind in KINDS:
        settings[f"{kind}__max_sessions_per_worker"] = CAP
    with running_node(**settings) as base:
        yield base


async def open_session(http: httpx.AsyncClient, kind: str, **fields: Any) -> str:
    options = PROBES[kind].options if kind in PROBES else {}
    r = await http.post("/sessions", json={"runner": kind, "options": options, **fields})
    assert r.status_code == 201, r.text
    sid: str = r.json()["session_id"]
    return sid


async def run(http: httpx.AsyncClient, kind: str, action: dict[str, Any], sid: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"runner": kind, "action": action}
    if sid is not None:
        body["session_id"] = sid
    r = await http.post("/rollout/step", json=body)
    return {"http": r.status_code, **r.json()}


@pytest.mark.parametrize("kind", KINDS)
async def test_state_persists_and_is_shared_with_nobody(http: httpx.AsyncClient, kind: str) -> None:
    probe = PROBES[kind]
    a, b = await open_session(http, kind), await open_session(http, kind)
    try:
        info = (await http.get(f"/sessions/{a}")).json()
        assert info["runner"] == kind and a.endswith("." + info["node_id"]) and info["steps"] == 0
        w = await run(http, kind, probe.write, a)
        assert w["http"] == 200 and w["ok"] and w["session_id"] == a, w
        mine = await run(http, kind, probe.read, a)
        assert probe.value(mine) == probe.written, mine
        assert (await http.get(f"/sessions/{a}")).json()["steps"] == 2
        theirs = await run(http, kind, probe.read, b)
        assert theirs["http"] == 200
        assert theirs["ok"] is False or probe.value(theirs) != probe.written, theirs
        if kind != "textgame":  # textgame's step op needs a session by design
            one_shot = await run(http, kind, probe.read)
            assert one_shot["ok"] is False or probe.value(one_shot) != probe.written, one_shot
    finally:
        for sid in (a, b):
            assert (await http.delete(f"/sessions/{sid}")).status_code == 204


@pytest.mark.parametrize("kind", KINDS)
async def test_deleted_and_unknown_sessions_are_404(http: httpx.AsyncClient, kind: str) -> None:
    sid = await open_session(http, kind)
    assert (await http.delete(f"/sessions/{sid}")).status_code == 204
    gone = await run(http, kind, PROBES[kind].read, sid)
    assert gone["http"] == 404 and gone["error"]["code"] == "unknown_session", gone
    assert "closed by the client" in gone["error"]["message"]
    assert (await http.delete(f"/sessions/{sid}")).status_code == 404
    for bogus in ("s_nope.elsewhere", "not-a-session"):
        r = await run(http, kind, PROBES[kind].read, bogus)
        assert r["http"] == 404 and r["error"]["blame"] == "client"
        got = await http.get(f"/sessions/{bogus}")
        assert got.status_code == 404 and got.json()["error"]["code"] == "unknown_session"


@pytest.mark.parametrize("kind", KINDS)
async def test_sessions_end_at_their_ttl(http: httpx.AsyncClient, kind: str) -> None:
    # Long enough for a first step (a browser's page) on a machine the parallel suite keeps busy: at 0.5 s
    # it once came after the session's end, answered 410 "reaped (ttl)", right but not what is tested here.
    sid = await open_session(http, kind, ttl_s=3.0)
    assert (await run(http, kind, PROBES[kind].write, sid))["http"] == 200
    for _ in range(150):
        await asyncio.sleep(0.1)
        if (await http.get(f"/sessions/{sid}")).status_code == 404:
            break
    r = await run(http, kind, PROBES[kind].read, sid)
    assert r["http"] == 404 and "reaped (ttl)" in r["error"]["message"], r


LONG_STEPS: dict[str, dict[str, Any]] = {
    "python": {"code": "import time\nprint('begun', flush=True)\ntime.sleep(4)\nprint('never')"},
    "browser": {"actions": [{"action": "goto", "path": "/"}, {"action": "wait_for", "ms": 4000, "timeout_ms": 5000}]},
    "fake": {"sleep_s": 4},
}


@pytest.mark.parametrize("kind", sorted(LONG_STEPS))
async def test_a_step_cut_by_its_sessions_ttl_is_the_sessions_end_not_the_programs(
    http: httpx.AsyncClient, kind: str
) -> None:
    """It came back ``program_exit`` status 137 (browser: ``action_error``): the service's own decision scored
    as the program's failure. Now: 410 ``session_expired``, not the program's, with what the step did so far."""
    sid = await open_session(http, kind, ttl_s=1.0)
    r = await run(http, kind, LONG_STEPS[kind], sid)
    assert r["http"] == 410 and r["ok"] is False, r
    assert r["error"]["code"] == "session_expired" and r["error"]["blame"] == "client", r
    assert "TTL" in r["error"]["message"] and r["session_id"] == sid
    if kind == "python":
        assert r["observation"]["stdout"] == "begun\n", r  # the partial output, said as such
    gone = await run(http, kind, PROBES[kind].read, sid)
    assert gone["http"] == 404 and "reaped (ttl)" in gone["error"]["message"], gone


async def test_a_step_longer_than_the_idle_timeout_is_not_reaped_mid_step(http: httpx.AsyncClient) -> None:
    """Found by the red team: a 65 s program in a session with a 60 s idle timeout was killed by the reaper."""
    sid = await open_session(http, "python", idle_timeout_s=0.5)
    try:
        r = await run(http, "python", {"code": "import time; time.sleep(1.5); print('done')"}, sid)
        assert r["http"] == 200 and r["observation"]["stdout"] == "done\n", r
    finally:
        await http.delete(f"/sessions/{sid}")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_step_for_another_kind_is_refused(http: httpx.AsyncClient, kind: str) -> None:
    other = next(k for k in KINDS if k != kind)
    sid = await open_session(http, kind)
    try:
        r = await run(http, other, PROBES[other].read, sid)
        assert r["http"] == 422 and r["error"]["code"] == "bad_request" and kind in r["error"]["message"]
        assert (await run(http, kind, PROBES[kind].write, sid))["http"] == 200  # the session is unharmed
    finally:
        await http.delete(f"/sessions/{sid}")


@pytest.mark.parametrize("kind", KINDS)
async def test_the_session_cap_is_a_429_with_retry_after(http: httpx.AsyncClient, kind: str) -> None:
    held = [await open_session(http, kind) for _ in range(CAP)]
    try:
        r = await http.post("/sessions", json={"runner": kind, "options": PROBES[kind].options})
        assert r.status_code == 429, r.text
        assert int(r.headers["Retry-After"]) >= 1
        err = r.json()["error"]
        assert err["code"] == "saturated" and err["blame"] == "infra" and err["retry_after_s"] >= 1
        assert "max_sessions_per_worker" in err["message"]
        # the held sessions still work, and a closed one frees its place
        assert (await run(http, kind, PROBES[kind].write, held[0]))["http"] == 200
        assert (await http.delete(f"/sessions/{held.pop()}")).status_code == 204
        held.append(await open_session(http, kind))
    finally:
        for sid in held:
            await http.delete(f"/sessions/{sid}")


async def test_a_kind_from_a_package_of_its_own_is_served_by_every_surface(http: httpx.AsyncClient) -> None:
    """The test-only ``fake`` kind is registered by an entry point of a distribution of its own
    (tests/conftest.py), and no module of sandboxd names it: GET /runners, OpenEnv and MCP serve it from its
    declaration (its action model's fields become its MCP tool's parameters)."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    assert "fake" in (await http.get("/runners")).json()["runners"]
    described = (await http.get("/runners/fake")).json()
    assert "echo" in described["action_schema"]["properties"] and described["fork"] is False
    reset = await http.post("/envs/fake/reset", json={})
    assert reset.status_code == 200, reset.text
    stepped = await http.post("/envs/fake/step", json={"action": {"echo": "via openenv"}})
    assert stepped.status_code == 200, stepped.text  # a kind without a shape of its own: the step result, whole
    assert stepped.json()["observation"]["observation"]["echo"] == "via openenv", stepped.text
    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as client,
        streamable_http_client(str(http.base_url).rstrip("/") + "/mcp", http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        tools = {t.name: t for t in (await session.list_tools()).tools}
        schema = tools["run_fake"].input_schema["properties"]
        assert {"echo", "sleep_s", "fail", "session_id", "timeout_s"} <= set(schema) and "ctx" not in schema
        assert schema["sleep_s"]["description"] == "How long the step takes."
        said = await session.call_tool("run_fake", {"echo": {"n": 1}})
        assert not said.is_error and said.structured_content["observation"]["echo"] == {"n": 1}, said
        failed = await session.call_tool("run_fake", {"fail": True})  # the program's own failure: a result
        assert not failed.is_error and failed.structured_content["error"]["blame"] == "program", failed
        refused = await session.call_tool("run_fake", {"sleep_s": 1e6})  # not the program's: a tool error
        assert refused.is_error and "sleep_s" in str(refused.content[0]), refused
