"""POST /sessions/{id}/fork against a real node: a prepared state copied into a GRPO group.

Per kind: the prepared state is visible in every copy; a write in one copy is invisible to the other
copies and to the source; the group is all or none (quotas, caps); a session mid-step is refused (409);
kinds that cannot be forked say why (422); nothing is left after the copies are closed. The browser's
fork is tested with the browser runner's own node (tests/test_browser.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sandboxd.client import SandboxClient
from sandboxd.runners.tools.data import build
from tests.conftest import running_node, step_ok

pytestmark = pytest.mark.node

DB = build()
KEY_A = "fork-key-a-0123456789"
KEY_B = "fork-key-b-0123456789"


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    with running_node(
        runners='["tools", "textgame", "python", "sql"]',
        workers=1,
        tenant_max_sessions=24,
        textgame__max_sessions_per_worker=12,
        fork_max_copies=16,
        api_keys=f'["{KEY_A}", "{KEY_B}"]',
    ) as base:
        yield base


@pytest.fixture
async def http(node: str) -> Any:
    async with httpx.AsyncClient(base_url=node, timeout=60, headers={"authorization": f"Bearer {KEY_A}"}) as c:
        yield c


async def sessions_held(http: httpx.AsyncClient) -> int:
    return int((await http.get("/readyz")).json()["sessions"])


async def tool(http: httpx.AsyncClient, sid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return await step_ok(http, "tools", {"tool": name, "args": args}, sid)


async def test_tools_fork_copies_the_overlay_and_keeps_copies_apart(http: httpx.AsyncClient) -> None:
    held = await sessions_held(http)
    user = next(iter(DB.users.values()))
    items = [v for p in DB.products.values() for v in p["variants"].values() if v["available"]][:3]
    src = (await http.post("/sessions", json={"runner": "tools"})).json()["session_id"]
    await tool(http, src, "add_to_cart", {"user_id": user["user_id"], "item_id": items[0]["item_id"]})
    r = await http.post(f"/sessions/{src}/fork", json={"n": 4})
    assert r.status_code == 201, r.text
    body = r.json()
    copies = [s["session_id"] for s in body["sessions"]]
    assert body["source_id"] == src and len(set(copies)) == 4 and src not in copies and body["notes"] == []
    assert all(s["runner"] == "tools" and s["steps"] == 0 for s in body["sessions"])
    assert await sessions_held(http) == held + 5
    # The prepared state in every copy.
    for sid in copies:
        cart = (await tool(http, sid, "view_cart", {"user_id": user["user_id"]}))["observation"]["result"]
        assert [i["item_id"] for i in cart["items"]] == [items[0]["item_id"]]
    # A write in one copy: nowhere else.
    await tool(http, copies[0], "add_to_cart", {"user_id": user["user_id"], "item_id": items[1]["item_id"]})
    await tool(http, src, "add_to_cart", {"user_id": user["user_id"], "item_id": items[2]["item_id"]})
    seen = {}
    for sid in [src, *copies]:
        cart = (await tool(http, sid, "view_cart", {"user_id": user["user_id"]}))["observation"]["result"]
        seen[sid] = sorted(i["item_id"] for i in cart["items"])
    assert seen[copies[0]] == sorted([items[0]["item_id"], items[1]["item_id"]])
    assert seen[src] == sorted([items[0]["item_id"], items[2]["item_id"]])
    assert all(seen[c] == [items[0]["item_id"]] for c in copies[1:])
    # Nothing left once all are closed.
    for sid in [src, *copies]:
        assert (await http.delete(f"/sessions/{sid}")).status_code == 204
    assert await sessions_held(http) == held


async def test_textgame_fork_copies_world_and_rng(http: httpx.AsyncClient) -> None:
    src = (await http.post("/sessions", json={"runner": "textgame"})).json()["session_id"]
    first = await step_ok(http, "textgame", {"op": "reset", "seed": 11}, src)
    command = first["observation"]["valid_actions"][0]
    await step_ok(http, "textgame", {"op": "step", "command": command}, src)
    copies = [s["session_id"] for s in (await http.post(f"/sessions/{src}/fork", json={"n": 3})).json()["sessions"]]
    # Every copy continues exactly as the source would: same world, same RNG.
    nxt = (await step_ok(http, "textgame", {"op": "step", "command": "look"}, src))["observation"]
    for sid in copies:
        assert (await step_ok(http, "textgame", {"op": "step", "command": "look"}, sid))["observation"] == nxt
    # Diverge one copy; the others still match the source.
    other = next(a for a in nxt["valid_actions"] if a != "look")
    moved = (await step_ok(http, "textgame", {"op": "step", "command": other}, copies[0]))["observation"]
    again = [
        (await step_ok(http, "textgame", {"op": "step", "command": "look"}, s))["observation"] for s in (src, copies[1])
    ]
    assert again[0] == again[1] and moved["steps"] == again[0]["steps"]
    for sid in [src, *copies]:
        await http.delete(f"/sessions/{sid}")


async def test_a_group_is_all_or_none(http: httpx.AsyncClient) -> None:
    held = await sessions_held(http)
    src = (await http.post("/sessions", json={"runner": "textgame"})).json()["session_id"]
    # The worker's textgame cap is 12: 1 + 12 copies do not fit, and no copy is made.
    r = await http.post(f"/sessions/{src}/fork", json={"n": 12})
    assert r.status_code == 429 and r.json()["error"]["blame"] == "infra" and r.headers["retry-after"], r.text
    assert "cap" in r.json()["error"]["message"]
    assert await sessions_held(http) == held + 1
    # The tenant's quota is 24: fill it to 20, then 5 copies are refused whole.
    fillers = [(await http.post("/sessions", json={"runner": "tools"})).json()["session_id"] for _ in range(19)]
    r = await http.post(f"/sessions/{src}/fork", json={"n": 5})
    assert r.status_code == 429 and "tenant_max_sessions" in r.json()["error"]["message"], r.text
    assert await sessions_held(http) == held + 20
    # Another tenant's quota is its own.
    async with httpx.AsyncClient(base_url=str(http.base_url), headers={"authorization": f"Bearer {KEY_B}"}) as b:
        own = (await b.post("/sessions", json={"runner": "textgame"})).json()["session_id"]
        assert (await b.post(f"/sessions/{own}/fork", json={"n": 2})).status_code == 201
        # ... and it cannot fork, see or count A's session.
        r = await b.post(f"/sessions/{src}/fork", json={"n": 1})
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_session"
    for sid in fillers:
        await http.delete(f"/sessions/{sid}")
    await http.delete(f"/sessions/{src}")


async def test_bad_forks_are_the_clients_errors(http: httpx.AsyncClient) -> None:
    src = (await http.post("/sessions", json={"runner": "tools"})).json()["session_id"]
    for body, status in (({"n": 0}, 422), ({"n": 17}, 422), ({"n": "x"}, 422), ({}, 422), ({"n": 1, "x": 1}, 422)):
        r = await http.post(f"/sessions/{src}/fork", json=body)
        assert r.status_code == status and r.json()["error"]["blame"] == "client", (body, r.text)
    assert "fork_max_copies" in (await http.post(f"/sessions/{src}/fork", json={"n": 17})).json()["error"]["message"]
    r = await http.post("/sessions/s_nothing.nowhere/fork", json={"n": 1})
    assert r.status_code == 404
    await http.delete(f"/sessions/{src}")
    r = await http.post(f"/sessions/{src}/fork", json={"n": 1})
    assert r.status_code == 404 and "ended" in r.json()["error"]["message"]


async def test_client_group_prepare_fork_step_collect(node: str) -> None:
    user = next(iter(DB.users.values()))
    item = next(v for p in DB.products.values() for v in p["variants"].values() if v["available"])
    async with SandboxClient(node, api_key=KEY_A, timeout_s=60) as c:
        setup = [{"tool": "add_to_cart", "args": {"user_id": user["user_id"], "item_id": item["item_id"]}}]
        async with await c.group("tools", 6, setup=setup) as g:
            assert len(g.sessions) == 6
            results = await g.step([{"tool": "view_cart", "args": {"user_id": user["user_id"]}}] * 6)
            assert all(
                [i["item_id"] for i in r["observation"]["result"]["items"]] == [item["item_id"]] for r in results
            )
            ids = [s.session_id for s in g.sessions]
        # Closed with the group; the prepared session too.
        async with httpx.AsyncClient(base_url=node, headers={"authorization": f"Bearer {KEY_A}"}) as h:
            assert [(await h.get(f"/sessions/{sid}")).status_code for sid in ids] == [404] * 6
            # Forks run concurrently with other work on the node.
            src = (await h.post("/sessions", json={"runner": "textgame"})).json()["session_id"]
            forks = await asyncio.gather(*(h.post(f"/sessions/{src}/fork", json={"n": 2}) for _ in range(3)))
            assert all(f.status_code == 201 for f in forks)
            for f in forks:
                for s in f.json()["sessions"]:
                    await h.delete(f"/sessions/{s['session_id']}")
            await h.delete(f"/sessions/{src}")


async def sql(http: httpx.AsyncClient, sid: str, query: str) -> dict[str, Any]:
    r = await step_ok(http, "sql", {"query": query}, sid)
    assert r["observation"]["error"] is None, r
    obs: dict[str, Any] = r["observation"]
    return obs


SQL_SETUP = [
    "CREATE TEMP TABLE t(id INTEGER PRIMARY KEY, price DECIMAL(10,2), day DATE, tags VARCHAR[], "
    "info STRUCT(k VARCHAR, v DOUBLE), raw BLOB, stamp TIMESTAMPTZ, big HUGEINT, u UUID, x DOUBLE)",
    "INSERT INTO t VALUES (1, 9.99, DATE '2024-02-29', ['a', 'b'], {'k': 'q', 'v': 1.5}, '\\xDE\\xAD'::BLOB, "
    "TIMESTAMPTZ '2024-01-01 10:00:00+00', 170141183460469231731687303715884105727, "
    "'6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9', 'inf'), (2, NULL, NULL, [], NULL, NULL, NULL, -1, NULL, 'nan')",
    "CREATE TEMP TABLE cheap AS SELECT n_name FROM nation WHERE n_regionkey = 1",
    "CREATE TEMP MACRO twice(x) AS x * 2",
    "CREATE TEMP MACRO firsts(n) AS TABLE SELECT * FROM range(n)",
    "CREATE TEMP VIEW doubled AS SELECT id, twice(id) AS d FROM t",
    "CREATE TEMP SEQUENCE ticket START 100",
    "SELECT nextval('ticket')",
    "CREATE INDEX t_day ON t(day)",
    "SET VARIABLE answer = 42",
]
SQL_PROBE = (
    "SELECT (SELECT list(t ORDER BY id)::VARCHAR FROM t) AS t, (SELECT count(*) FROM cheap) AS cheap, "
    "(SELECT list(d ORDER BY id) FROM doubled) AS d, (SELECT sum(range) FROM firsts(4)) AS f, "
    "nextval('ticket') AS ticket, getvariable('answer') AS answer"
)


async def test_sql_fork_makes_the_sessions_objects_again_in_each_copy(http: httpx.AsyncClient) -> None:
    src = (await http.post("/sessions", json={"runner": "sql"})).json()["session_id"]
    for q in SQL_SETUP:
        await sql(http, src, q)
    r = await http.post(f"/sessions/{src}/fork", json={"n": 2})
    assert r.status_code == 201, r.text
    copies = [s["session_id"] for s in r.json()["sessions"]]
    notes = r.json()["notes"]
    assert any("default parameter" in n for n in notes) and any("PREPARE" in n for n in notes), notes
    probes = {sid: (await sql(http, sid, SQL_PROBE))["rows"][0] for sid in [src, *copies]}
    assert probes[copies[0]] == probes[copies[1]] == probes[src], probes  # every value, type and counter
    assert probes[src][4] == 101 and probes[src][5] == 42 and probes[src][1] == 5
    # Apart from now on.
    await sql(http, copies[0], "INSERT INTO t (id) VALUES (3)")
    await sql(http, src, "DROP VIEW doubled")
    counts = [(await sql(http, sid, "SELECT count(*) FROM t"))["rows"][0][0] for sid in [src, *copies]]
    assert counts == [2, 3, 2]
    assert (await sql(http, copies[1], "SELECT count(*) FROM doubled"))["rows"][0][0] == 2
    # Too much state is the client's error, naming the table; the source is unchanged by it.
    await sql(http, src, "CREATE TEMP TABLE huge AS SELECT repeat('x', 1000) AS s FROM range(20000)")
    r = await http.post(f"/sessions/{src}/fork", json={"n": 1})
    assert r.status_code == 422 and "huge" in r.json()["error"]["message"], r.text
    assert (await sql(http, src, "SELECT count(*) FROM huge"))["rows"][0][0] == 20000
    for sid in [src, *copies]:
        await http.delete(f"/sessions/{sid}")
