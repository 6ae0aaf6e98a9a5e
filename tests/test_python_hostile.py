"""Hostile programs are contained, and the node keeps serving (real nsjail)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import running_node

pytestmark = pytest.mark.nsjail


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    with running_node(runners='["python"]', workers=1, python__slots_per_worker=3) as base:
        yield base


async def run(http: httpx.AsyncClient, code: str, **fields: object) -> dict[str, Any]:
    r = await http.post("/rollout/step", json={"runner": "python", "action": {"code": code}, **fields})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def still_healthy(http: httpx.AsyncClient) -> None:
    r = await run(http, "print('still here')")
    assert r["ok"] and r["observation"]["stdout"] == "still here\n"
    assert (await http.get("/readyz")).status_code == 200


def host_processes_with(marker: str) -> list[int]:
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if marker in (p / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(p.name))
            except OSError:
                pass
    return found


async def test_infinite_loop_is_killed_at_the_time_limit(http: httpx.AsyncClient) -> None:
    t = time.monotonic()
    r = await run(http, "while True:\n    pass", timeout_s=1)
    assert time.monotonic() - t < 5
    obs = r["observation"]
    assert obs["timed_out"] is True and obs["killed_by"] == "time" and r["error"]["code"] == "program_timeout"
    assert r["error"]["blame"] == "program"
    await still_healthy(http)


async def test_memory_bomb_is_killed_at_the_memory_limit(http: httpx.AsyncClient) -> None:
    r = await run(http, "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))", limits={"memory_mb": 64})
    obs = r["observation"]
    assert obs["killed_by"] == "memory" and "memory" in obs["limits_hit"], obs
    assert r["error"]["code"] == "program_killed" and r["error"]["blame"] == "program"
    await still_healthy(http)


async def test_fork_bomb_hits_the_pids_limit(http: httpx.AsyncClient) -> None:
    code = "import os\nfor _ in range(10000):\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r = await run(http, code, timeout_s=3)
    assert "pids" in r["observation"]["limits_hit"], r["observation"]
    await still_healthy(http)


async def test_huge_output_is_truncated(http: httpx.AsyncClient) -> None:
    t = time.monotonic()
    r = await run(http, "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))")
    assert time.monotonic() - t < 10
    obs = r["observation"]
    assert obs["stdout_truncated"] is True
    assert 0 < len(obs["stdout"]) <= 1 << 20
    assert obs["killed_by"] == "output"
    await still_healthy(http)


async def test_writes_outside_the_workdir_fail(http: httpx.AsyncClient) -> None:
    code = (
        "import os\n"
        "for path in ['/etc/passwd', '/usr/evil', '/evil', '/opt/sandboxd/jailside/zygote.py']:\n"
        "    try:\n"
        "        open(path, 'a').write('x')\n"
        "        print('WROTE', path)\n"
        "    except OSError as e:\n"
        "        print('refused', path, e.errno)\n"
        "open('ok.txt', 'w').write('fine')\n"
        "print(os.getcwd(), os.getuid())"
    )
    r = await run(http, code)
    out = r["observation"]["stdout"]
    assert "WROTE" not in out, out
    assert out.count("refused") == 4
    assert out.strip().endswith("/tmp 65534")


async def test_other_sessions_files_are_invisible(http: httpx.AsyncClient) -> None:
    a = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    b = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    try:
        await run(http, "open('secret-of-a.txt', 'w').write('s3cret')", session_id=a)
        code = (
            "import glob, os\n"
            "hits = glob.glob('/tmp/**/secret-of-a.txt', recursive=True) + glob.glob('/proc/*/root/tmp/secret-of-a.txt')\n"
            "hits += glob.glob('/proc/*/cwd/secret-of-a.txt')\n"
            "print(hits, sorted(os.listdir('/proc'))[:3])"
        )
        r = await run(http, code, session_id=b)
        assert r["observation"]["stdout"].startswith("[] "), r["observation"]
        r = await run(http, "print(open('secret-of-a.txt').read())", session_id=a)
        assert r["observation"]["stdout"] == "s3cret\n"
    finally:
        await http.delete(f"/sessions/{a}")
        await http.delete(f"/sessions/{b}")


async def test_network_to_the_host_is_cut_off(http: httpx.AsyncClient, node: str) -> None:
    port = int(node.rsplit(":", 1)[1])
    code = (
        "import socket\n"
        f"for host in ['127.0.0.1', '::1', '10.0.0.1', '8.8.8.8']:\n"
        "    try:\n"
        f"        socket.create_connection((host, {port}), timeout=1)\n"
        "        print('CONNECTED', host)\n"
        "    except OSError as e:\n"
        "        print('blocked', host, type(e).__name__)"
    )
    r = await run(http, code, timeout_s=8)
    out = r["observation"]["stdout"]
    assert "CONNECTED" not in out and out.count("blocked") == 4, out


async def test_signals_cannot_reach_other_processes(http: httpx.AsyncClient) -> None:
    gateway_pid = os.getppid()  # any host pid will do: none is visible inside
    code = (
        "import os, signal\n"
        f"for pid in [{gateway_pid}, {os.getpid()}, 2, 3]:\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "        print('KILLED', pid)\n"
        "    except OSError as e:\n"
        "        print('no', pid, type(e).__name__)\n"
        "try:\n"
        "    os.kill(-1, signal.SIGKILL)\n"
        "except OSError as e:\n"
        "    print('no -1', type(e).__name__)\n"
        "print('done')"
    )
    r = await run(http, code)
    assert "KILLED" not in r["observation"]["stdout"], r["observation"]
    await still_healthy(http)


async def test_host_proc_is_not_visible(http: httpx.AsyncClient) -> None:
    code = (
        "import os\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print(pids, os.getpid(), open('/proc/1/cmdline').read().split(chr(0))[0])\n"
        "print(os.path.exists('/run'), os.path.exists('/var/run'), os.path.exists('/root'), os.path.exists('/home'))"
    )
    r = await run(http, code)
    lines = r["observation"]["stdout"].splitlines()
    assert lines[0].startswith("[1] 1 "), lines
    assert lines[1] == "False False False False"


async def test_background_processes_are_reaped(http: httpx.AsyncClient) -> None:
    marker = "987.654321"
    code = (
        "import subprocess, os\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execvp('sleep', ['sleep', '{marker}'])\n"
        "print('left two behind')"
    )
    r = await run(http, code)
    assert r["ok"], r
    for _ in range(50):
        if not host_processes_with(marker):
            break
        await asyncio.sleep(0.1)
    assert host_processes_with(marker) == []
    sid = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    try:
        r = await run(http, code, session_id=sid)
        assert r["ok"], r
        await asyncio.sleep(0.2)
        assert host_processes_with(marker) == []
    finally:
        await http.delete(f"/sessions/{sid}")


async def test_session_killed_by_memory_ends_only_that_session(http: httpx.AsyncClient) -> None:
    bomb = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    calm = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    await run(http, "z = 5", session_id=calm)
    r = await run(
        http, "b = []\nwhile True:\n    b.append(bytearray(32 << 20))", session_id=bomb, limits={"memory_mb": 64}
    )
    assert r["observation"]["killed_by"] == "memory" and r["observation"]["session_alive"] is False
    gone = await http.post("/rollout/step", json={"runner": "python", "action": {"code": "1"}, "session_id": bomb})
    assert gone.status_code == 404 and "killed" in gone.json()["error"]["message"]
    r = await run(http, "print(z)", session_id=calm)
    assert r["observation"]["stdout"] == "5\n"
    await http.delete(f"/sessions/{calm}")


async def test_program_has_no_capabilities_and_is_filtered(http: httpx.AsyncClient) -> None:
    code = (
        "status = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
        "print(*(status[k].strip() for k in ('CapEff', 'CapPrm', 'CapAmb', 'NoNewPrivs', 'Seccomp')))\n"
        "import os\n"
        "for flag in ('CLONE_NEWUSER', 'CLONE_NEWNS', 'CLONE_NEWNET'):\n"
        "    try:\n"
        "        os.unshare(getattr(os, flag))\n"
        "        print('UNSHARED', flag)\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)"
    )
    r = await run(http, code)
    lines = r["observation"]["stdout"].splitlines()
    assert lines[0] == "0000000000000000 0000000000000000 0000000000000000 1 2", lines
    assert lines[1:] == ["refused 1"] * 3
