"""A node's start under load and without what it needs: late rather than dead, unready and saying why.

Seen on a machine at load 38: a node exited because the SQL fork server did not answer in time, another
because a worker's jails took longer than its start timeout. A node keeps starting what is slow (each attempt
waits longer), says which kind of which worker is still starting and why (``/readyz`` 503, the log), serves
the kinds that run, answers the others' steps 503 ``starting`` with Retry-After, and never exits for it.
"""

from __future__ import annotations

import errno
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandboxd.localnode import NodeProcess
from sandboxd.worker.starting import start_failure

pytestmark = pytest.mark.node


def _node(**settings: str) -> NodeProcess:
    return NodeProcess({f"SANDBOXD_{k.upper()}": v for k, v in settings.items()})


def test_a_kind_too_slow_for_its_start_timeout_starts_late_and_the_node_says_so() -> None:
    """The SQL fork server cannot start in 0.05 s; each attempt waits twice as long, and the node is ready
    once one succeeds, having said meanwhile that SQL was still starting and why."""
    node = _node(runners='["sql", "textgame"]', workers="1", sql__engine_start_timeout_s="0.05")
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert node.proc.poll() is None, "the node exited instead of starting late"
            try:
                r = httpx.get(f"{node.url}/readyz", timeout=2)
            except httpx.HTTPError:
                time.sleep(0.1)
                continue
            if r.status_code == 200:
                break
            seen += r.json().get("starting", [])
            time.sleep(0.2)
        else:
            raise AssertionError(f"never ready; said {seen[-3:]}")
        assert any("sql" in line and "attempt" in line for line in seen), seen
        step = {"runner": "sql", "action": {"tpch": 6}}
        r = httpx.post(f"{node.url}/rollout/step", json=step, timeout=60)
        assert r.status_code == 200 and r.json()["ok"], r.text
    finally:
        node.stop()


def test_a_kind_that_cannot_start_leaves_the_node_up_unready_naming_it() -> None:
    """A kind whose cgroups cannot be made (here: its cgroup mount is a file) is retried and named; the node
    stays up and unready, its other kinds serve, and its own steps are 503 ``starting`` with Retry-After."""
    with tempfile.TemporaryDirectory() as tmp:
        blocker = Path(tmp) / "not-a-cgroup-tree"
        blocker.write_text("")
        node = _node(runners='["textgame", "code"]', workers="1", code__cgroup_mount=str(blocker))
        try:
            deadline = time.monotonic() + 60
            body: dict[str, Any] = {}
            while time.monotonic() < deadline:
                try:
                    r = httpx.get(f"{node.url}/readyz", timeout=2)
                    body = r.json()
                    if r.status_code == 503 and any("code" in line for line in body.get("starting", [])):
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            assert r.status_code == 503, body
            assert any(str(blocker) in line for line in body["starting"]), body
            step = {"runner": "textgame", "action": {"op": "episodes", "seed": 1, "steps": 5, "batch": 1}}
            assert httpx.post(f"{node.url}/rollout/step", json=step, timeout=30).json()["ok"]
            r = httpx.post(
                f"{node.url}/rollout/step", json={"runner": "code", "action": {"language": "bash", "code": "echo"}}
            )
            assert r.status_code == 503 and r.json()["error"]["code"] == "starting", r.text
            assert r.json()["error"]["blame"] == "infra" and r.headers.get("retry-after"), r.text
            time.sleep(3)  # a retry or two later: still up, still saying why
            assert node.proc.poll() is None
            assert httpx.get(f"{node.url}/readyz", timeout=5).status_code == 503
        finally:
            node.stop()


def test_a_missing_privilege_is_named_as_one() -> None:
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system", "/sys/fs/cgroup/memory/x")
        except OSError as exc:
            raise RuntimeError("cannot create cgroup x") from exc
    except RuntimeError as exc:
        why = start_failure(exc)
    assert why.startswith("missing privilege: read-only file system on /sys/fs/cgroup/memory/x") and "doctor" in why
    assert start_failure(TimeoutError("the SQL fork server does not answer: timed out")).startswith("the SQL fork")
