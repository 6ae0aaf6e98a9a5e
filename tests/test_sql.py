"""The SQL runner over HTTP with real DuckDB and TPC-H data (sf 0.01 for speed)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import running_node, step_ok


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("tpch")
    with running_node(runners='["sql"]', workers=2, sql__scale_factor=0.01, sql__data_dir=str(data_dir)) as base:
        yield base


async def sql(
    http: httpx.AsyncClient, action: dict[str, Any], session_id: str | None = None, **fields: object
) -> dict[str, Any]:
    return await step_ok(http, "sql", action, session_id, **fields)


async def test_all_22_tpch_queries_run(http: httpx.AsyncClient) -> None:
    for n in range(1, 23):
        r = await sql(http, {"tpch": n})
        assert r["ok"], (n, r["observation"]["error"])
    q1 = (await sql(http, {"tpch": 1}))["observation"]
    assert q1["columns"][:2] == ["l_returnflag", "l_linestatus"] and q1["row_count"] == 4


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM read_text('/etc/hostname')",
        "COPY (SELECT 1) TO '/tmp/sandboxd-leak.csv'",
        "ATTACH '/tmp/sandboxd-other.duckdb' AS other",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET enable_external_access = true",
        "SET threads = 8",
        "CREATE TABLE evil AS SELECT 1",
        "DELETE FROM lineitem",
    ],
)
async def test_forbidden_statements_fail_cleanly(http: httpx.AsyncClient, statement: str) -> None:
    r = await sql(http, {"query": statement})
    assert r["ok"] is False and r["observation"]["error"], r
    assert r["error"]["blame"] == "program"
    assert not Path("/tmp/sandboxd-leak.csv").exists()
    assert (await sql(http, {"query": "SELECT 1"}))["observation"]["rows"] == [[1]]


async def test_a_query_past_its_timeout_is_interrupted(http: httpx.AsyncClient) -> None:
    t = time.monotonic()
    r = await sql(http, {"query": "SELECT sum(a.range * b.range) FROM range(200000) a, range(200000) b"}, timeout_s=1)
    assert time.monotonic() - t < 8
    assert r["observation"]["timed_out"] is True and r["error"]["code"] == "program_timeout"
    assert (await sql(http, {"tpch": 6}))["ok"] is True  # the worker keeps serving


async def test_rows_are_capped_and_errors_are_observations(http: httpx.AsyncClient) -> None:
    r = (await sql(http, {"query": "SELECT * FROM range(5000)"}))["observation"]
    assert r["row_count"] == 1000 and r["truncated"] is True
    r = (await sql(http, {"query": "SELECT * FROM range(5000)", "max_rows": 10}))["observation"]
    assert len(r["rows"]) == 10 and r["truncated"] is True
    r = await sql(http, {"query": "SELEC nonsense"})
    assert r["ok"] is False and "syntax" in r["observation"]["error"].lower()
    bad = await http.post("/rollout/step", json={"runner": "sql", "action": {"query": "SELECT 1", "tpch": 3}})
    assert bad.status_code == 422 and "exactly one" in bad.json()["error"]["message"]
    bad = await http.post("/rollout/step", json={"runner": "sql", "action": {"tpch": 23}})
    assert bad.status_code == 422 and "action.tpch" in bad.json()["error"]["message"]
