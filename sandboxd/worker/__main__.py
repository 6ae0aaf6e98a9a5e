"""A worker process: ``python -m sandboxd.worker --index I --incarnation X`` (the node process starts it).

It warms its runners, then listens on ``<runtime>/w<I>.sock`` for the node and the front processes. It
dies with the node (a parent-death signal): no jail or browser outlives the node that started it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import resource
import signal
import sys
from pathlib import Path

from sandboxd import links
from sandboxd.board import Board
from sandboxd.config import settings_model
from sandboxd.eager import use_eager_tasks
from sandboxd.links import Channel
from sandboxd.node.workers import worker_socket
from sandboxd.spawn import close_inherited
from sandboxd.worker.service import Worker

log = logging.getLogger("sandboxd.worker")
PR_SET_PDEATHSIG = 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sandboxd-worker")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--incarnation", required=True)
    args = parser.parse_args(argv)
    close_inherited()  # a worker holds what it opens itself: its jails and engines inherit none of it
    # Die with the node even if it is SIGKILLed (no orphaned jails).
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    # Each session holds a few descriptors here (its channel, output pipes, pidfd): a worker at its session
    # caps must not meet a soft limit far below what the host allows.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    settings = settings_model().model_validate_json(os.environ["SANDBOXD_WORKER_SETTINGS"])
    logging.basicConfig(
        level=settings.log_level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s worker{args.index} %(levelname)s %(name)s: %(message)s",
    )
    parent = os.getppid()

    async def run() -> None:
        use_eager_tasks()
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def on_signal(sig: int) -> None:
            # SIGTERM/SIGINT to the whole process group (systemd, Ctrl-C, a pod's stop) must not kill running
            # steps: while the node lives it drives the shutdown (drain, then "shutdown"). Once it is gone
            # (the parent-death signal: our parent changed), close everything: no orphaned jails.
            if os.getppid() == parent:
                log.info("worker %d: signal %d ignored; the node drives shutdown", args.index, sig)
                return
            done.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        board = Board(Path(settings.runtime_dir) / "board", settings.worker_count(), list(settings.runners))
        worker = Worker(settings, args.index, args.incarnation, board)
        try:
            await worker.start()
        except Exception:
            log.exception("worker %s failed to start", args.index)
            await worker.close()
            raise SystemExit(1) from None

        def on_event(header: dict[str, object], body: bytes) -> None:
            if header.get("op") == "shutdown":
                done.set()
            elif header.get("op") == "queue" and worker.admission is not None:
                worker.admission.set_queue_max(dict(header["queue_max"]))  # type: ignore[call-overload]

        server = await links.serve(
            worker_socket(settings.runtime_dir, args.index),
            lambda: Channel(worker.handle, on_event=on_event),
        )
        try:
            await done.wait()
        finally:
            server.close()
            await worker.close()

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())


if __name__ == "__main__":
    main()
