"""Shared fixtures: a real sandboxd node on a free loopback port, one per module."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from sandboxd.cli import free_port, wait_ready


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SANDBOXD_"):
            monkeypatch.delenv(key)


@contextlib.contextmanager
def running_node(**settings: object) -> Iterator[str]:
    """Start ``sandboxd serve`` as a subprocess with SANDBOXD_* settings; yield its URL."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXD_")}
    env.update({"SANDBOXD_HOST": "127.0.0.1", "SANDBOXD_PORT": str(port), "SANDBOXD_LOG_LEVEL": "warning"})
    for key, value in settings.items():
        env[f"SANDBOXD_{key.upper()}"] = (
            value if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
        )
    proc = subprocess.Popen([sys.executable, "-m", "sandboxd", "serve"], env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_ready(base, timeout_s=120, proc=proc):
            raise RuntimeError(f"sandboxd did not become ready (exit {proc.poll()})")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
async def http(node: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=node, timeout=120) as client:
        yield client
