"""Inside a worker process: hosts runners and answers the gateway over one socket.

One worker per vCPU; which runner kinds a worker hosts follows each kind's
placement (every worker, or the first N of a node). A worker owns its runners'
sandboxes (jails, sessions); if it dies, only its own in-flight steps and
sessions are lost, and the supervisor (``supervisor.py``, the gateway's side)
starts a new one. Requests are handled concurrently (one task each); the
runners bound their own concurrency. Actions arrive validated by the gateway
and are rebuilt here with the kind's model, so a runner gets its typed action
(a few microseconds; the gateway already turned bad input into a 422).
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
import socket
import sys
from pathlib import Path
from typing import Any, cast

from sandboxd import ipc
from sandboxd.config import NodeSettings, settings_model
from sandboxd.errors import BadRequest, InfraError, SandboxdError, UnknownRunner
from sandboxd.registry import kinds
from sandboxd.runners.base import ForkingRunner, Runner, RunnerContext, RunnerKind, StepLimits, can_fork

log = logging.getLogger("sandboxd.worker")

PR_SET_PDEATHSIG = 1


def hosted_kinds(settings: NodeSettings, index: int) -> list[RunnerKind]:
    """The enabled kinds whose placement puts an instance in worker ``index``."""
    registry = kinds()
    return [registry[k] for k in settings.runners if registry[k].hosted_by(index, settings.runner_config(k))]


class Worker:
    def __init__(self, settings: NodeSettings, index: int) -> None:
        self.settings = settings
        self.index = index
        self.ctx = RunnerContext(Path(settings.runtime_dir), f"{settings.node_id}-{os.getppid()}-w{index}", index)
        self.kinds = {k.name: k for k in hosted_kinds(settings, index)}
        self.runners: dict[str, Runner] = {}
        self.writer: asyncio.StreamWriter | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        for name, kind in self.kinds.items():
            self.runners[name] = kind.runner_class()(self.settings.runner_config(name), self.ctx)
        await asyncio.gather(*(r.start() for r in self.runners.values()))

    async def serve(self, sock: socket.socket) -> None:
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=64 << 20)
        self.writer = writer
        try:
            await self.start()
        except Exception as exc:
            log.exception("worker %s failed to start", self.index)
            writer.write(ipc.pack({"op": "hello", "ok": False, "error": repr(exc)}))
            await writer.drain()
            await self.close()
            return
        capacity = {k: r.capacity() for k, r in self.runners.items()}
        writer.write(ipc.pack({"op": "hello", "ok": True, "pid": os.getpid(), "capacity": capacity}))
        await writer.drain()
        while True:
            msg = await ipc.read(reader)
            if msg is None or msg.get("op") == "shutdown":
                break
            task = asyncio.create_task(self.handle(msg))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        await self.close()

    async def handle(self, msg: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"id": msg.get("id")}
        try:
            reply["result"] = await self.dispatch(msg)
            reply["ok"] = True
        except SandboxdError as exc:
            if exc.worker is None:
                exc.worker = self.index
            reply.update(ok=False, error=exc.to_dict())
        except Exception as exc:  # a runner bug must not take the worker down
            log.exception("worker %s: %s failed", self.index, msg.get("op"))
            err = InfraError(f"{type(exc).__name__}: {exc}", worker=self.index, session_id=msg.get("session_id"))
            reply.update(ok=False, error=err.to_dict())
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(ipc.pack(reply))
            with contextlib.suppress(ConnectionError):
                await self.writer.drain()

    def runner(self, kind: str) -> Runner:
        try:
            return self.runners[kind]
        except KeyError:
            raise UnknownRunner(f"runner {kind!r} is not enabled on this node") from None

    async def dispatch(self, msg: dict[str, Any]) -> Any:
        op = msg.get("op")
        if op == "step":
            runner = self.runner(msg["runner"])
            # Validated at the gateway; rebuilt here from its own (trusted) dump.
            action = self.kinds[msg["runner"]].action.model_validate(msg["action"])
            limits = StepLimits(**msg["limits"])
            outcome = await runner.step(action, msg.get("session_id"), limits)
            return outcome.to_wire()
        if op == "open":
            await self.runner(msg["runner"]).open_session(msg["session_id"], msg.get("options") or {})
            return None
        if op == "close":
            await self.runner(msg["runner"]).close_session(msg["session_id"])
            return None
        if op == "fork":
            runner = self.runner(msg["runner"])
            if not can_fork(runner):
                raise BadRequest(f"{msg['runner']} sessions cannot be forked")
            notes: list[str] = await cast(ForkingRunner, runner).fork_session(msg["session_id"], msg["new_ids"])
            return {"notes": notes}
        if op == "ping":
            return {"pid": os.getpid(), "runners": {k: await r.health() for k, r in self.runners.items()}}
        raise InfraError(f"unknown worker op {op!r}")

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*(r.close() for r in self.runners.values()), return_exceptions=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sandboxd-worker")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args(argv)
    # Die with the gateway even if it is SIGKILLed (no orphaned jails).
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
    sock = socket.socket(fileno=args.fd)
    worker = Worker(settings, args.index)
    parent = os.getppid()

    async def run() -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def on_signal(sig: int) -> None:
            # SIGTERM/SIGINT to the whole process group (systemd, Ctrl-C) must not kill running steps:
            # while the gateway lives it drives the shutdown (drain, then "shutdown"). Once it is gone
            # (PDEATHSIG: our parent changed), close everything: no orphaned jails.
            if os.getppid() == parent:
                log.info("worker %d: signal %d ignored; the gateway drives shutdown", args.index, sig)
                return
            done.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        serve = asyncio.create_task(worker.serve(sock))
        stop = asyncio.create_task(done.wait())
        await asyncio.wait([serve, stop], return_when=asyncio.FIRST_COMPLETED)
        if not serve.done():
            serve.cancel()
            await worker.close()

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())


if __name__ == "__main__":
    main()
