"""Shared fixtures: a real sandboxd node on a free loopback port, one per module."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import httpx
import pytest

from sandboxd.localnode import local_node


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SANDBOXD_"):
            monkeypatch.delenv(key)


def running_node(**settings: object) -> contextlib.AbstractContextManager[str]:
    """A real node as a subprocess; keyword arguments become SANDBOXD_* settings."""
    env = {
        f"SANDBOXD_{key.upper()}": value
        if isinstance(value, str)
        else str(value).lower()
        if isinstance(value, bool)
        else str(value)
        for key, value in settings.items()
    }
    return local_node(env, timeout_s=120)


@pytest.fixture
async def http(node: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=node, timeout=120) as client:
        yield client
