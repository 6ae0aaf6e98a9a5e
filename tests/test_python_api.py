"""The Python runner over HTTP, real nsjail: results, sessions, isolation."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import running_node

pytestmark = [pytest.mark.node, pytest.mark.vm]


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    with running_node(
        runners='["python","tools","sql","textgame"]',
        workers=2,
        python__slots_per_worker=2,
        python__tmpfs_mb=2,
        session_idle_s=3,
        reap_interval_s=0.5,
    ) as base:
        yield base


async def step(http: httpx.AsyncClient, code: str, **fields: object) -> dict[str, Any]:
    action: dict[str, Any] = {"code": code}
    for key in ("stdin", "files"):
        if key in fields:
            action[key] = fields.pop(key)
    r = await http.post("/rollout/step", json={"runner": "python", "action": action, **fields})
    return {"http": r.status_code, **r.json()}


async def test_program_output_and_exit_codes(http: httpx.AsyncClient) -> None:
    r = await step(http, "print('hello', 6 * 7)")
    assert r["http"] == 200 and r["ok"] is True and r["error"] is None
    assert r["observation"]["stdout"] == "hello 42\n"
    assert r["observation"]["exit_code"] == 0
    assert isinstance(r["worker"], int)

    r = await step(http, "import sys\nprint('bad', file=sys.stderr)\nsys.exit(3)")
    assert r["http"] == 200 and r["ok"] is False
    assert r["observation"]["exit_code"] == 3 and r["observation"]["stderr"] == "bad\n"
    assert r["error"]["blame"] == "program" and r["error"]["code"] == "program_exit"

    r = await step(http, "assert 1 + 1 == 3")
    assert r["observation"]["exit_code"] == 1
    assert "AssertionError" in r["observation"]["stderr"]
    assert 'File "<program>", line 1' in r["observation"]["stderr"]


async def test_programs_start_as_under_cpython(http: httpx.AsyncClient) -> None:
    """What SandboxFusion's and verl's programs rely on: the step's files import as modules, ``exit()`` and
    ``quit()`` exist, a script knows its ``__file__``; and nothing of the harness is importable."""
    helper = {"helper.py": "def f():\n    return 42\n"}
    r = await step(http, "import helper, sys\nprint(helper.f(), sys.argv, sys.path[0] == '')", files=helper)
    assert r["ok"] and r["observation"]["stdout"] == "42 ['-c'] True\n", r
    r = await step(http, "print(1); exit()")
    assert r["ok"] and r["observation"]["stdout"] == "1\n", r
    r = await step(http, "print(2); quit(4)")
    assert r["observation"]["exit_code"] == 4 and r["observation"]["stdout"] == "2\n", r
    r = await step(http, "print(callable(help), 'Python' in str(copyright))")
    assert r["observation"]["stdout"] == "True True\n", r
    r = await step(http, "print(__file__)")
    assert r["observation"]["exit_code"] == 1 and "NameError" in r["observation"]["stderr"], r  # as python -c
    harness = ("wire", "seccomp", "zygote", "bound", "executor", "session", "program", "staging", "namespaces")
    for name in harness:
        r = await step(http, f"import {name}")
        assert "ModuleNotFoundError" in r["observation"]["stderr"], (name, r)
    # A step's own modules named like the harness's are the step's (jailside/bound.HARNESS_MODULES).
    own = {f"{name}.py": f"WHO = 'mine:{name}'\n" for name in harness}
    r = await step(
        http, f"import {', '.join(harness)}\nprint(' '.join(m.WHO for m in ({', '.join(harness)})))", files=own
    )
    assert r["ok"] and r["observation"]["stdout"] == " ".join(f"mine:{n}" for n in harness) + "\n", r

    code = (
        "import os, shutil, sys, helper\n"
        "shutil.copy(__file__, 'copy.py')\n"
        "print(os.path.basename(__file__), sys.argv[0] == __file__, sys.path[0], open('copy.py').read()[:10])\n"
        "assert False"
    )
    action = {"code": code, "files": helper, "script": "main_1.py"}
    r = (await http.post("/rollout/step", json={"runner": "python", "action": action})).json()
    assert r["observation"]["stdout"] == "main_1.py True /tmp import os,\n", r
    assert 'File "/tmp/main_1.py", line 4' in r["observation"]["stderr"], r
    for bad in ("../x.py", "a/b.py", "x.txt", "helper.py"):
        action = {"code": "pass", "files": helper, "script": bad}
        r2 = await http.post("/rollout/step", json={"runner": "python", "action": action})
        assert r2.status_code == 422 and "script" in r2.text, (bad, r2.text)


async def test_stdin_files_and_main_module(http: httpx.AsyncClient) -> None:
    code = "import sys\nif __name__ == '__main__':\n    print(sys.stdin.read()[::-1], open('d/in.txt').read())"
    r = await step(http, code, stdin="abc", files={"d/in.txt": "file!"})
    assert r["ok"], r
    assert r["observation"]["stdout"] == "cba file!\n"


async def test_one_shot_executions_share_nothing(http: httpx.AsyncClient) -> None:
    marker = "/tmp/left-behind.txt"
    r = await step(http, f"open({marker!r}, 'w').write('x')\nimport random\nprint(random.random())")
    first = r["observation"]["stdout"]
    results = await asyncio.gather(
        *(step(http, f"import os, random\nprint(os.path.exists({marker!r}), random.random())") for _ in range(8))
    )
    outs = [res["observation"]["stdout"].split() for res in results]
    assert all(o[0] == "False" for o in outs), outs
    assert len({o[1] for o in outs} | {first.strip()}) == 9, "random state must not be shared between executions"


async def test_session_files_persist_and_a_failing_cell_keeps_state(http: httpx.AsyncClient) -> None:
    # Isolation between sessions, TTL, delete and unknown ids: tests/test_contract.py, for every kind.
    sid = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    try:
        r = await step(http, "x = 41\nopen('state.txt', 'w').write('from a')", session_id=sid)
        assert r["ok"], r
        r = await step(http, "x += 1\nprint(x, open('state.txt').read())", session_id=sid)
        assert r["observation"]["stdout"] == "42 from a\n"
        r = await step(http, "raise ValueError('oops')", session_id=sid)
        assert r["observation"]["exit_code"] == 1 and "ValueError: oops" in r["observation"]["stderr"]
        assert r["error"]["code"] == "program_exit" and r["observation"]["session_alive"] is True
        r = await step(http, "print(x)", session_id=sid)
        assert r["observation"]["stdout"] == "42\n"
    finally:
        assert (await http.delete(f"/sessions/{sid}")).status_code == 204


async def test_session_timeout_interrupts_and_keeps_state(http: httpx.AsyncClient) -> None:
    sid = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    await step(http, "y = 7", session_id=sid)
    r = await step(http, "import time\ntime.sleep(30)", session_id=sid, timeout_s=1)
    assert r["observation"]["timed_out"] is True and r["error"]["code"] == "program_timeout"
    assert "KeyboardInterrupt" in r["observation"]["stderr"]
    r = await step(http, "print(y)", session_id=sid)
    assert r["observation"]["stdout"] == "7\n"
    await http.delete(f"/sessions/{sid}")


async def test_idle_sessions_are_reaped(http: httpx.AsyncClient) -> None:
    sid = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    assert (await http.get(f"/sessions/{sid}")).status_code == 200
    for _ in range(60):
        await asyncio.sleep(0.25)
        if (await http.get(f"/sessions/{sid}")).status_code == 404:
            break
    r = await http.get(f"/sessions/{sid}")
    assert r.status_code == 404 and "idle" in r.json()["error"]["message"]


async def test_batch_runs_concurrently_in_order(http: httpx.AsyncClient) -> None:
    steps = [{"runner": "python", "action": {"code": f"import time\ntime.sleep(0.3)\nprint({i})"}} for i in range(4)]
    steps.append({"runner": "python", "action": {"nope": 1}})
    r = await http.post("/rollout/steps", json={"steps": steps})
    assert r.status_code == 200
    results = r.json()["results"]
    assert [x["observation"]["stdout"] for x in results[:4]] == ["0\n", "1\n", "2\n", "3\n"]
    assert results[4]["status"] == 422 and "action.code" in results[4]["error"]["message"]
    # 4 x 0.3 s on 4 slots: concurrent, not one after another
    assert max(x["latency_ms"] for x in results[:4]) < 1200


async def test_idempotent_step_runs_once(http: httpx.AsyncClient) -> None:
    body = {"runner": "python", "action": {"code": "import random\nprint(random.random())"}, "idempotency_key": "k-123"}
    first, second = await asyncio.gather(http.post("/rollout/step", json=body), http.post("/rollout/step", json=body))
    third = await http.post("/rollout/step", json=body)
    outs = {x.json()["observation"]["stdout"] for x in (first, second, third)}
    assert len(outs) == 1
    other = dict(body, action={"code": "print(2)"})
    r = await http.post("/rollout/step", json=other)
    assert r.status_code == 422 and "idempotency_key" in r.json()["error"]["message"]


async def test_bad_input_is_named(http: httpx.AsyncClient) -> None:
    r = await http.post("/rollout/step", json={"runner": "python"})
    assert r.status_code == 422 and "action" in r.json()["error"]["message"]
    r = await http.post("/rollout/step", json={"runner": "python", "action": {"code": 5}})
    assert r.status_code == 422 and "action.code" in r.json()["error"]["message"]
    r = await http.post("/rollout/step", json={"runner": "cobol", "action": {}})
    assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_runner"
    r = await http.post("/rollout/step", json={"runner": "python", "action": {"code": "1", "files": {"../x": "y"}}})
    assert r.status_code == 422 and "workdir" in r.json()["error"]["message"]
    r = await http.post("/rollout/step", json={"runner": "python", "action": {"code": "1"}, "timeout_s": 100000})
    assert r.status_code == 422 and "max_timeout_s" in r.json()["error"]["message"]
    r = await http.post("/rollout/step", json={"runner": "python", "action": {"code": "#" * (2 << 20)}})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    r = await http.post("/rollout/step", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    r = await http.get("/sessions/nope")
    assert r.status_code == 404


async def test_files_that_cannot_all_be_made_are_the_clients_422(http: httpx.AsyncClient) -> None:
    """They ended as exit 125 ``program_exit``: a client's mistake scored as the program's failure."""
    for files, names in (
        ({"data": "x", "data/in.txt": "y"}, ("'data' is a file", "'data/in.txt'")),
        ({"a/b": "1", "a/b/c/d.txt": "2"}, ("'a/b' is a file", "'a/b/c/d.txt'")),
        ({"b": "1", "a/../b": "2"}, ("same file", "'a/../b'")),
    ):
        r = await step(http, "print(1)", files=files)
        assert r["http"] == 422 and r["error"]["blame"] == "client", r
        assert all(n in r["error"]["message"] for n in names), r["error"]["message"]
    sid = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    try:
        # Files larger than the sandbox's disk (a 2 MiB /tmp here): the program never ran, and says so as a 422.
        big = {"blob": "x" * (3 << 20)}
        for session_id in (None, sid):
            r = await step(http, "print('ran')", files=big, session_id=session_id)
            assert r["http"] == 422 and r["error"]["blame"] == "client", r
            assert "could not be written" in r["error"]["message"], r
        again = await step(http, "print('still here')", session_id=sid)  # the session is unharmed
        assert again["observation"]["stdout"] == "still here\n", again
    finally:
        await http.delete(f"/sessions/{sid}")


async def test_health_ready_and_metrics(http: httpx.AsyncClient) -> None:
    assert (await http.get("/healthz")).status_code == 200
    ready = (await http.get("/readyz")).json()
    assert ready["ready"] is True and len(ready["workers"]) == 2
    await step(http, "print(1)")
    text = (await http.get("/metrics")).text
    assert 'sandboxd_step_latency_seconds_bucket{le="0.005",outcome="ok",runner="python"}' in text
    assert "sandboxd_pool_slots" in text and "sandboxd_queue_depth" in text
    assert "sandboxd_sandbox_starts_total" in text


async def test_fetched_files_larger_than_the_channel_buffer_come_back(http: httpx.AsyncClient) -> None:
    """The harness sends the files while the worker reads them (before: the worker waited for the harness to
    exit first, and a frame larger than the socket's buffer held both until the step's timeout)."""
    code = "open('big.bin', 'wb').write(bytes(range(256)) * 6000)"
    r = await http.post(
        "/rollout/step",
        json={"runner": "python", "action": {"code": code, "fetch_files": ["big.bin"]}, "timeout_s": 5},
    )
    body = r.json()
    assert body["ok"], body  # before: killed at its timeout, the files lost
    assert base64.b64decode(body["observation"]["files"]["big.bin"]) == bytes(range(256)) * 6000


async def test_fetch_files_return_the_sandboxs_files_not_the_harness_proc(http: httpx.AsyncClient) -> None:
    """The process that reads ``fetch_files`` is the namespace's init, whose /proc entries the program may not
    read: a link the program leaves there is refused (found by a red team)."""
    code = "import os\nos.symlink('/proc/1/environ', 'env.txt')\nopen('..notes', 'w').write('dots')"
    fields = {"fetch_files": ["env.txt", "/proc/1/maps", "..notes"], "files": {"..data": "x"}}
    r = await http.post("/rollout/step", json={"runner": "python", "action": {"code": code, **fields}})
    body = r.json()
    assert body["ok"], body
    missing = body["observation"]["files_missing"]
    assert "env.txt" in missing and "(/proc)" in missing["/proc/1/maps"], missing
    assert base64.b64decode(body["observation"]["files"]["..notes"]) == b"dots"
