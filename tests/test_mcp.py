"""The MCP surface at /mcp against a real node, driven by the official MCP SDK's client."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.conftest import running_node

pytestmark = [pytest.mark.node, pytest.mark.browser]

KEY, OTHER = "mcp-test-key-0123456789", "mcp-other-tenant-0123456789"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_node(
        runners='["python", "sql", "tools", "textgame", "browser"]',
        workers=2,
        sql__scale_factor=0.01,
        sql__data_dir=str(tmp_path_factory.mktemp("tpch")),
        browser__instances_per_node=1,
        api_keys=f'["{KEY}", "{OTHER}"]',
    ) as base:
        yield base


@contextlib.asynccontextmanager
async def mcp_session(node: str, key: str | None = KEY) -> AsyncIterator[Any]:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
        streamable_http_client(f"{node}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def payload(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        data: dict[str, Any] = result.structured_content
        return data
    loaded: dict[str, Any] = json.loads(result.content[0].text)
    return loaded


async def test_tools_are_listed_with_their_schemas(node: str) -> None:
    async with mcp_session(node) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
    for name in ("open_session", "close_session", "run_python", "run_sql", "textgame", "browser"):
        assert name in tools, sorted(tools)
    assert tools["run_python"].input_schema["required"] == ["code"]
    retail = tools["retail_find_user_id_by_email"]
    assert retail.input_schema["properties"]["args"]["required"] == ["email"]  # the retail tool's own schema
    assert len([t for t in tools if t.startswith("retail_")]) == 14


async def test_server_says_its_version_and_get_is_405(node: str) -> None:
    """A stateless server offers no SSE stream: GET /mcp is 405 at once (it answered 200 and dropped the
    connection ~30 s later), and the server's version is sandboxd's (it was an empty string)."""
    import httpx

    from sandboxd import __version__

    async with mcp_session(node) as s:
        init = await s.initialize()
    assert init.server_info.name == "sandboxd" and init.server_info.version == __version__ != ""
    headers = {"Authorization": f"Bearer {KEY}", "Accept": "text/event-stream"}
    async with httpx.AsyncClient(timeout=5) as http:
        r = await http.get(f"{node}/mcp", headers=headers)
    assert r.status_code == 405 and "POST" in r.headers["allow"], r.text


async def test_one_shots_sessions_and_the_blame_rule(node: str) -> None:
    async with mcp_session(node) as s:
        ok = payload(await s.call_tool("run_python", {"code": "print(6 * 7)"}))
        assert ok["ok"] and ok["observation"]["stdout"] == "42\n"

        crash = payload(await s.call_tool("run_python", {"code": "1/0"}))  # the program's failure: a result
        assert not crash["ok"] and crash["error"]["blame"] == "program"
        assert "ZeroDivisionError" in crash["observation"]["stderr"]

        sid = payload(await s.call_tool("open_session", {"runner": "python"}))["session_id"]
        payload(await s.call_tool("run_python", {"code": "x = 41", "session_id": sid}))
        again = payload(await s.call_tool("run_python", {"code": "x += 1; print(x)", "session_id": sid}))
        assert again["observation"]["stdout"] == "42\n" and again["session_id"] == sid
        assert payload(await s.call_tool("close_session", {"session_id": sid})) == {"closed": sid}

        gone = await s.call_tool("run_python", {"code": "print(x)", "session_id": sid})  # not the program's
        assert gone.is_error and ": unknown_session: unknown session" in gone.content[0].text

        bad = await s.call_tool("run_python", {"code": "print(1)", "timeout_s": 1e9})
        assert bad.is_error and "bad_request:" in bad.content[0].text and "max_timeout_s" in bad.content[0].text


async def test_sql_retail_textgame_and_browser_tools(node: str) -> None:
    async with mcp_session(node) as s:
        q = payload(await s.call_tool("run_sql", {"query": "SELECT 40 + 2 AS answer"}))
        assert q["ok"] and q["observation"]["columns"] == ["answer"] and q["observation"]["rows"] == [[42]]
        bad_sql = payload(await s.call_tool("run_sql", {"query": "SELEC"}))
        assert not bad_sql["ok"] and bad_sql["error"]["blame"] == "program"

        sid = payload(await s.call_tool("open_session", {"runner": "tools"}))["session_id"]
        found = payload(
            await s.call_tool("retail_find_user_id_by_name_zip", {"args": {"first_name": "x", "last_name": "y",
                                                                           "zip": "00000"}, "session_id": sid})
        )  # fmt: skip
        assert found["observation"]["error"] is not None  # no such user: the tool's answer, an observation
        await s.call_tool("close_session", {"session_id": sid})

        game = payload(await s.call_tool("open_session", {"runner": "textgame"}))["session_id"]
        first = payload(await s.call_tool("textgame", {"action": {"op": "reset", "seed": 3}, "session_id": game}))
        assert first["ok"] and first["observation"]["text"]
        step = payload(await s.call_tool("textgame", {"action": {"op": "step", "command": "look"}, "session_id": game}))
        assert step["ok"] and "text" in step["observation"]
        await s.call_tool("close_session", {"session_id": game})

        page = payload(
            await s.call_tool(
                "browser", {"actions": [{"action": "goto", "path": "/"}, {"action": "text", "selector": "h1"}]}
            )
        )
        assert page["ok"] and page["observation"]["results"][1]["ok"], page


async def test_a_key_is_needed_and_picks_the_tenant(node: str) -> None:
    async with mcp_session(node) as s:
        sid = payload(await s.call_tool("open_session", {"runner": "python"}))["session_id"]
    # Without a (known) key nothing is read at all: the front door answers 401 before the body.
    import httpx

    for key, why in ((None, "this node needs an API key"), ("not-a-key", "unknown API key")):
        with pytest.raises(BaseException):  # noqa: B017  (the SDK wraps the 401 in task-group errors)
            async with mcp_session(node, key=key):
                pass
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = httpx.post(f"{node}/mcp", content=b"x" * 100_000, headers=headers, timeout=10)
        assert r.status_code == 401 and why in r.json()["error"]["message"], r.text
    async with mcp_session(node, key=OTHER) as other:  # another tenant cannot reach, or learn of, the session
        denied = await other.call_tool("run_python", {"code": "print(1)", "session_id": sid})
        assert denied.is_error and ": unknown_session: " in denied.content[0].text
    async with mcp_session(node) as s:
        await s.call_tool("close_session", {"session_id": sid})
