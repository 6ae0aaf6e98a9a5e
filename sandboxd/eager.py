"""Eager tasks for the node's processes, on uvloop, at every Python the node runs on.

An eager task runs inside ``create_task`` until its first wait: a step that never waits costs no loop turn
(measured on the hot path). ``asyncio.eager_task_factory`` cannot be the factory before Python 3.14: its
factory takes no ``eager_start``, and uvloop (0.22 on) passes one (None) on Python 3.13, so the first task raised
``TypeError`` and the node died at start (trixie's Python 3.13.5, in the cgroup v2 guest of scripts/vm-test.sh).
This is 3.14's factory, which takes it.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any

_Task = asyncio.Task  # read once: the factory runs for every task of the node


def eager_task_factory(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, Any],
    *,
    name: str | None = None,
    context: contextvars.Context | None = None,
    eager_start: bool | None = None,  # uvloop on 3.13 passes None: "the factory's own way", eager here
) -> asyncio.Task[Any]:
    return _Task(coro, loop=loop, name=name, context=context, eager_start=eager_start is not False)


def use_eager_tasks() -> None:
    """The running loop's tasks start eagerly from now on."""
    asyncio.get_running_loop().set_task_factory(eager_task_factory)
