"""The tools runner over HTTP: real data, per-session writes, tool errors as observations."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sandboxd.bench.trajectories import build_pool
from sandboxd.runners.tools import data
from tests.conftest import running_node, step_ok

pytestmark = pytest.mark.node

DB = data.build()


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    with running_node(runners='["tools"]', workers=2, tools__max_session_records=20) as base:
        yield base


async def call(
    http: httpx.AsyncClient, tool: str, args: dict[str, Any], session_id: str | None = None
) -> dict[str, Any]:
    return await step_ok(http, "tools", {"tool": tool, "args": args}, session_id)


def pending_order() -> dict[str, Any]:
    return next(o for o in DB.orders.values() if o["status"] == "pending")


async def test_tool_listing_is_openai_shaped(http: httpx.AsyncClient) -> None:
    r = await http.get("/runners/tools")
    assert r.status_code == 200
    tools = {t["function"]["name"]: t for t in r.json()["tools"]}
    assert {
        "find_user_id_by_email",
        "cancel_pending_order",
        "exchange_delivered_order_items",
        "search_products",
    } <= tools.keys()
    fn = tools["find_user_id_by_name_zip"]
    assert fn["type"] == "function" and fn["function"]["parameters"]["required"] == ["first_name", "last_name", "zip"]
    assert (r.json()["sessions"], r.json()["fork"], r.json()["interrupt"]) == (True, True, False)  # as declared
    assert (await http.get("/runners/nope")).status_code == 422


async def test_lookups_find_real_data(http: httpx.AsyncClient) -> None:
    user = next(iter(DB.users.values()))
    r = await call(http, "find_user_id_by_email", {"email": user["email"]})
    assert r["ok"] and r["observation"]["result"] == user["user_id"]
    r = await call(http, "search_products", {"query": "keyboard"})
    assert [p["name"] for p in r["observation"]["result"]] == ["mechanical keyboard"]
    r = await call(http, "get_order_details", {"order_id": user["orders"][0]})
    assert r["observation"]["result"]["user_id"] == user["user_id"]


async def test_a_second_write_sees_the_first_and_reset_restores_the_seed(http: httpx.AsyncClient) -> None:
    # Isolation from other sessions and one-shot calls: tests/test_contract.py, for every kind.
    order = pending_order()
    a = (await http.post("/sessions", json={"runner": "tools"})).json()["session_id"]
    try:
        r = await call(http, "cancel_pending_order", {"order_id": order["order_id"], "reason": "ordered by mistake"}, a)
        assert r["ok"] and r["observation"]["result"]["status"] == "cancelled"
        again = await call(
            http, "cancel_pending_order", {"order_id": order["order_id"], "reason": "ordered by mistake"}, a
        )
        assert again["ok"] is False and "only pending orders" in again["observation"]["error"]
        assert again["error"]["blame"] == "program" and again["error"]["code"] == "action_error"
        await call(http, "reset", {}, a)
        after_reset = await call(http, "get_order_details", {"order_id": order["order_id"]}, a)
        assert after_reset["observation"]["result"]["status"] == "pending"
    finally:
        await http.delete(f"/sessions/{a}")


async def test_buying_places_an_order_in_the_session(http: httpx.AsyncClient) -> None:
    user = next(iter(DB.users.values()))
    item = next(v for p in DB.products.values() for v in p["variants"].values() if v["available"])
    sid = (await http.post("/sessions", json={"runner": "tools"})).json()["session_id"]
    try:
        await call(http, "add_to_cart", {"user_id": user["user_id"], "item_id": item["item_id"], "quantity": 2}, sid)
        placed = await call(
            http, "place_order", {"user_id": user["user_id"], "payment_method_id": user["payment_methods"][0]}, sid
        )
        order = placed["observation"]["result"]
        assert order["status"] == "pending" and order["total"] == round(2 * item["price"], 2)
        details = await call(http, "get_user_details", {"user_id": user["user_id"]}, sid)
        assert order["order_id"] in details["observation"]["result"]["orders"]
        cart = await call(http, "view_cart", {"user_id": user["user_id"]}, sid)
        assert cart["observation"]["result"]["items"] == []
    finally:
        await http.delete(f"/sessions/{sid}")


async def test_a_session_cannot_grow_without_bound(http: httpx.AsyncClient) -> None:
    """What a session writes stays in the worker for its lifetime: records, quantities and strings are capped."""
    user = next(iter(DB.users.values()))
    item = next(v for p in DB.products.values() for v in p["variants"].values() if v["available"])
    sid = (await http.post("/sessions", json={"runner": "tools"})).json()["session_id"]
    try:
        add = {"user_id": user["user_id"], "item_id": item["item_id"], "quantity": 10}
        assert (await call(http, "add_to_cart", add, sid))["ok"]
        again = await call(http, "add_to_cart", add, sid)
        assert again["ok"] is False and "at most 10" in again["observation"]["error"]
        pay = {"user_id": user["user_id"], "payment_method_id": user["payment_methods"][0]}
        assert (await call(http, "place_order", pay, sid))["ok"]
        placed = 1
        for _ in range(25):  # each order is a record of the session's own; the node allows 20
            if not (await call(http, "add_to_cart", {**add, "quantity": 1}, sid))["ok"]:
                break
            r = await call(http, "place_order", pay, sid)
            if not r["ok"]:
                assert r["error"]["blame"] == "program" and "maximum" in r["observation"]["error"], r
                break
            placed += 1
        assert 10 <= placed < 20, placed
        long = await call(http, "find_user_id_by_email", {"email": "x" * 600}, sid)
        assert long["ok"] is False and "at most 512" in long["observation"]["error"]
        assert (await call(http, "reset", {}, sid))["ok"]  # a reset gives the room back
        assert (await call(http, "add_to_cart", {**add, "quantity": 1}, sid))["ok"]
    finally:
        await http.delete(f"/sessions/{sid}")


async def test_every_b3_trajectory_succeeds_on_a_fresh_session(http: httpx.AsyncClient) -> None:
    pool = build_pool(42)
    seen = set()
    for name, steps in pool:
        if name in seen:
            continue
        seen.add(name)
        sid = (await http.post("/sessions", json={"runner": "tools"})).json()["session_id"]
        for tool, args in steps:
            r = await call(http, tool, args, sid)
            assert r["observation"]["error"] is None, (name, tool, r["observation"])
        await http.delete(f"/sessions/{sid}")
    assert len(seen) == 7


async def test_bad_tool_calls_are_observations(http: httpx.AsyncClient) -> None:
    r = await call(http, "launch_rockets", {})
    assert r["ok"] is False and "unknown tool" in r["observation"]["error"]
    r = await call(http, "find_user_id_by_email", {})
    assert "missing arguments" in r["observation"]["error"]
    r = await call(http, "add_to_cart", {"user_id": "nobody_1", "item_id": "1"})
    assert "user not found" in r["observation"]["error"]
    r = await call(http, "search_products", {"query": 5})
    assert "must be a string" in r["observation"]["error"]
    bad = await http.post("/rollout/step", json={"runner": "tools", "action": {"args": {}}})
    assert bad.status_code == 422 and "action.tool" in bad.json()["error"]["message"]
    assert (await call(http, "list_all_product_types", {}))["ok"] is True  # the worker keeps serving
