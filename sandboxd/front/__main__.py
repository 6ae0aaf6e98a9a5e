"""A front process: ``python -m sandboxd.front --index J --fd N`` (``sandboxd serve`` starts K of them).

It serves HTTP on the node's listening socket (inherited: every front accepts from the same queue, so a
busy front simply accepts less) and joins the node process at its socket. The node drives its life: it
ignores SIGTERM and SIGINT (a signal to the whole process group must not cut its requests short), stops
when the node says ``stop`` (after the drain), and dies with the node (a parent-death signal).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
from collections.abc import Iterator

import uvicorn

from sandboxd.app import create_app
from sandboxd.config import settings_model
from sandboxd.eager import use_eager_tasks
from sandboxd.serving import uvicorn_options
from sandboxd.spawn import close_inherited

PR_SET_PDEATHSIG = 1


class NodeDrivenServer(uvicorn.Server):
    """uvicorn without its signal handlers: the node process says when to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sandboxd-front")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args(argv)
    close_inherited(keep=(args.fd,))  # the port, and nothing else the node's process held
    os.set_inheritable(args.fd, False)
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    settings = settings_model().model_validate_json(os.environ["SANDBOXD_NODE_SETTINGS"])
    logging.basicConfig(
        level=settings.log_level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s front{args.index} %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    sock = socket.socket(fileno=args.fd)
    app = create_app(settings, index=args.index)
    config = uvicorn.Config(app, **uvicorn_options(settings))
    server = NodeDrivenServer(config)
    gateway = app.state.gateway

    def on_event(header: dict[str, object]) -> None:
        if header.get("op") == "stop":
            server.should_exit = True

    gateway.on_node_event = on_event
    gateway.on_node_lost = lambda: setattr(server, "should_exit", True)

    async def run() -> None:
        use_eager_tasks()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # the node drives shutdown
        await server.serve(sockets=[sock])

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())


if __name__ == "__main__":
    main()
