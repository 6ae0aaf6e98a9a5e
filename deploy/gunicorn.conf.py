"""gunicorn configuration for a sandboxd node: ``gunicorn -c deploy/gunicorn.conf.py``.

gunicorn's workers are the node's front processes (``SANDBOXD_FRONTS`` of them, default from the vCPU
count): each takes any request on the node's port. Before it starts them, the master starts the node
process (``python -m sandboxd.node``: the sandbox workers, the session ledger, idempotency keys, drain,
readiness) and the fronts join it at its socket; when the master exits, the node process is stopped
(drained first). What gunicorn adds over ``sandboxd serve``: its master, which restarts a front process
that died (only that front's in-flight requests are lost), and the process model operators already run.

The settings are read and validated from SANDBOXD_* here, before anything starts, so a bad value fails
the deployment at once with its message.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sandboxd.config import load_settings

_settings = load_settings()
_node: dict[str, Any] = {}

wsgi_app = "sandboxd.app:create_app()"
worker_class = "sandboxd.serving.SandboxdWorker"  # uvicorn_worker.UvicornWorker with sandboxd's uvicorn options
workers = _settings.front_count()
bind = [f"[{_settings.host}]:{_settings.port}" if ":" in _settings.host else f"{_settings.host}:{_settings.port}"]
# SIGTERM: the fronts finish their requests in flight (shutdown_grace_s), then the node process drains and
# stops its workers. gunicorn must wait at least that long before it kills a front.
graceful_timeout = int(_settings.shutdown_grace_s) + 15
# The master kills a front whose loop did not check in for this long; a request never blocks the loop.
timeout = 120
keepalive = 30
worker_connections = _settings.max_connections
accesslog = None
loglevel = _settings.log_level
proc_name = f"sandboxd-{_settings.node_id}"


def _die_with_master() -> None:
    """The node process is told to stop (SIGTERM: it drains) if the master dies without its on_exit (SIGKILL,
    OOM): nothing of a dead deployment keeps serving on its port. Its fronts end when their node link closes."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def on_starting(server: Any) -> None:
    """Start the node process and wait until it takes its fronts; they find it through SANDBOXD_NODE_SOCKET."""
    runtime = _settings.runtime_dir or tempfile.mkdtemp(prefix=f"sandboxd-{os.getpid()}-")
    settings = _settings.model_copy(update={"runtime_dir": runtime})
    env = {**os.environ, "SANDBOXD_NODE_SETTINGS": settings.model_dump_json()}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandboxd.node"], env=env, stdin=subprocess.DEVNULL, preexec_fn=_die_with_master
    )
    _node["proc"] = proc
    _node["runtime"] = None if _settings.runtime_dir else runtime  # ours to remove at exit
    sock = Path(runtime) / "node.sock"
    deadline = time.monotonic() + 300
    while not sock.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the sandboxd node process did not start (status {proc.poll()}); see its log above")
        time.sleep(0.05)
    os.environ["SANDBOXD_NODE_SOCKET"] = str(sock)
    os.environ["SANDBOXD_RUNTIME_DIR"] = runtime


def on_exit(server: Any) -> None:
    proc = _node.get("proc")
    if proc is not None and proc.poll() is None:
        proc.terminate()  # it drains (its fronts are gone by now), stops its workers, removes what it made
        try:
            proc.wait(_settings.shutdown_grace_s + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
    if _node.get("runtime"):
        shutil.rmtree(_node["runtime"], ignore_errors=True)
