"""deploy/gunicorn.conf.py runs a real node under gunicorn; the preStop drain (``sandboxd drain``) lets steps finish."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sandboxd.localnode import free_port, wait_ready

pytestmark = [pytest.mark.node, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[1]


def gunicorn(port: int, *extra: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    env.update(
        SANDBOXD_PORT=str(port),
        SANDBOXD_WORKERS="1",
        SANDBOXD_RUNNERS='["python"]',
        SANDBOXD_LOG_LEVEL="warning",
        SANDBOXD_HEADER_TIMEOUT_S="2",
    )
    out = log.open("wb") if log else None
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "deploy/gunicorn.conf.py"), *extra],
            env=env,
            cwd=ROOT,
            stdout=out or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
    finally:
        if out is not None:
            out.close()  # the child has its own copy


async def test_node_under_gunicorn_serves_drains_and_stops(tmp_path: Path) -> None:
    port = free_port()
    proc = gunicorn(port, log=tmp_path / "gunicorn.log")
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_ready(base, timeout_s=120, proc=proc), (tmp_path / "gunicorn.log").read_text()
        # The image's HEALTHCHECK, as Docker runs it, against this node.
        found = re.search(r"HEALTHCHECK [^\n]*\n\s*CMD (\[[^\n]*\])", (ROOT / "Dockerfile").read_text())
        assert found is not None
        check = json.loads(found.group(1))
        assert check[0] == "python"
        env = {**os.environ, "SANDBOXD_PORT": str(port)}
        assert subprocess.run([sys.executable, *check[1:]], env=env, timeout=30).returncode == 0
        env["SANDBOXD_PORT"] = str(free_port())  # and it fails when nothing answers
        assert subprocess.run([sys.executable, *check[1:]], env=env, timeout=30, capture_output=True).returncode != 0
        async with httpx.AsyncClient(base_url=base, timeout=60) as c:
            r = await c.post("/rollout/step", json={"runner": "python", "action": {"code": "print(6*7)"}})
            assert r.json()["observation"]["stdout"] == "42\n"
            sid = (await c.post("/sessions", json={"runner": "python"})).json()["session_id"]
            assert (
                await c.post("/rollout/step", json={"runner": "python", "session_id": sid, "action": {"code": "k = 1"}})
            ).json()["ok"]
            # The preStop hook: a step in flight finishes, new work is refused (retry elsewhere), the session's
            # next step still runs.
            slow = asyncio.create_task(
                c.post(
                    "/rollout/step",
                    json={"runner": "python", "action": {"code": "import time; time.sleep(2); print('done')"}},
                )
            )
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            drain = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "sandboxd", "drain", "--url", base, "--timeout", "30"
            )
            assert await drain.wait() == 0
            assert time.monotonic() - t0 >= 1.0  # it waited for the step
            assert (await slow).json()["observation"]["stdout"] == "done\n"
            refused = await c.post("/rollout/step", json={"runner": "python", "action": {"code": "print(1)"}})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
            assert (await c.post("/sessions", json={"runner": "python"})).status_code == 503
            assert (await c.get("/readyz")).status_code == 503
            r = await c.post(
                "/rollout/step", json={"runner": "python", "session_id": sid, "action": {"code": "print(k)"}}
            )
            assert r.json()["observation"]["stdout"] == "1\n", r.text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_two_front_processes_under_gunicorn_share_the_node(tmp_path: Path) -> None:
    """gunicorn's workers are the node's front processes: two of them, one node process, one set of workers."""
    port = free_port()
    proc = gunicorn(port, "--workers", "2", log=tmp_path / "g.log")
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_ready(base, timeout_s=120, proc=proc), (tmp_path / "g.log").read_text()
        deadline = time.monotonic() + 60
        while len((status := httpx.get(f"{base}/readyz", timeout=10).json())["fronts"]) < 2:
            assert time.monotonic() < deadline, status  # the second gunicorn worker joins the node soon after
            time.sleep(0.2)
        assert len(status["workers"]) == 1, status
        async with httpx.AsyncClient(base_url=base, timeout=60) as c:
            sid = (await c.post("/sessions", json={"runner": "python"})).json()["session_id"]
            steps = [c.post("/rollout/step", json={"runner": "python", "session_id": sid, "action": {"code": "v = 1"}})]
            assert (await steps[0]).json()["ok"]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert "Traceback" not in (tmp_path / "g.log").read_text()


def test_drain_is_refused_from_off_the_node() -> None:
    from fastapi.testclient import TestClient

    from sandboxd.app import create_app
    from sandboxd.config import load_settings

    app = create_app(load_settings(workers=1, runners=["textgame"]))
    with TestClient(app, client=("10.1.2.3", 5000)) as c:
        r = c.post("/drain")
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        assert c.get("/readyz").status_code == 200


async def test_drain_needs_the_token_even_from_loopback(tmp_path: Path) -> None:
    """A sidecar relays remote clients from 127.0.0.1: loopback alone must not drain a node."""
    port = free_port()
    proc = gunicorn(port, log=tmp_path / "g.log")
    base = f"http://127.0.0.1:{port}"
    try:
        assert wait_ready(base, timeout_s=120, proc=proc)
        async with httpx.AsyncClient(base_url=base, timeout=30) as c:
            for headers in ({}, {"x-sandboxd-drain-token": "guess"}, {"x-forwarded-for": "127.0.0.1"}):
                r = await c.post("/drain", headers=headers)
                assert r.status_code == 403, r.text
            assert (await c.get("/readyz")).status_code == 200
            # Idle connections are closed at the header deadline, not kept until max_connections is full.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                data = await asyncio.wait_for(reader.read(), 30)  # EOF when the node closes it
                assert data == b""
            finally:
                writer.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX"
    except FileNotFoundError:
        return True


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in pids if not _gone(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


def test_nothing_keeps_serving_when_the_master_or_the_node_dies(tmp_path: Path) -> None:
    """A SIGKILLed gunicorn master leaves no node process and no front behind on the port; a node process that
    dies takes its deployment down (the master halts, non-zero) instead of leaving fronts that refuse all."""
    for victim in ("master", "node"):
        port = free_port()
        proc = gunicorn(port, "--workers", "2", log=tmp_path / f"{victim}.log")
        base = f"http://127.0.0.1:{port}"
        try:
            assert wait_ready(base, timeout_s=120, proc=proc), (tmp_path / f"{victim}.log").read_text()
            deadline = time.monotonic() + 60
            while len((status := httpx.get(f"{base}/readyz", timeout=10).json())["fronts"]) < 2:
                assert time.monotonic() < deadline, status
                time.sleep(0.2)
            node, fronts = int(status["pid"]), [int(p) for p in status["fronts"]]
            os.kill(proc.pid if victim == "master" else node, signal.SIGKILL)
            assert _wait_gone([node, *fronts], 90) == [], victim
            if victim == "node":
                assert proc.wait(90) != 0  # the master halts: the deployment is seen to be down
            with pytest.raises(httpx.TransportError):
                httpx.get(f"{base}/healthz", timeout=5)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
