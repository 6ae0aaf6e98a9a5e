"""Eager tasks for the node's processes, where the running loop takes them.

An eager task runs inside ``create_task`` until its first wait: a step that never waits costs no loop turn
(measured on the hot path). The factory is the standard library's own, for anyio's sake: anyio recognises it
(by its code object) and starts its task groups' children lazily, as its cancel scopes need; a factory of our
own made every anyio task group (httpx's connects, the MCP server) fail "to exit a cancel scope".

On Python 3.13 uvloop (0.22 on) calls the task factory with ``eager_start``, which the standard library's
factory takes only from 3.14: the first task raised ``TypeError`` and every node process died at start
(trixie's Python 3.13.5, in scripts/vm-test.sh's guest). There, tasks stay lazy.
"""

from __future__ import annotations

import asyncio


async def _nothing() -> None:
    return None


def use_eager_tasks(loop: asyncio.AbstractEventLoop | None = None) -> bool:
    """The loop's tasks start eagerly from now on, if the loop can call the eager factory; whether they do."""
    loop = loop or asyncio.get_running_loop()
    loop.set_task_factory(asyncio.eager_task_factory)
    probe = _nothing()
    try:
        loop.create_task(probe)  # eager: done before it returns
    except TypeError:  # the loop passes what this Python's factory does not take
        probe.close()
        loop.set_task_factory(None)
        return False
    return True
