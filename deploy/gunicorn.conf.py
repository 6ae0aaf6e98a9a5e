"""gunicorn configuration for a sandboxd node: ``gunicorn -c deploy/gunicorn.conf.py``.

One gateway process per node, always. The gateway is an event loop that
admits, queues and routes; the sandboxes run in the worker processes it
starts (one per vCPU), and it holds the node's session table and warm pools.
Two gateway processes would each start their own workers (doubling the
processes for the same CPUs) and hold half the sessions each, behind one port
that cannot say which process a request will reach. When one gateway process
is the bound (the light kinds at high concurrency), run two *nodes* per
machine instead, on two ports, with Redis: each is addressable, sessions are
forwarded to their owner, and bench/forwarding.py measures what it buys.

What gunicorn adds over ``sandboxd serve``: a master that restarts a gateway
that died, and the process model operators already run. The settings are
read and validated from SANDBOXD_* here, before anything starts, so a bad
value fails the deployment at once with its message.
"""

from __future__ import annotations

from typing import Any

from sandboxd.config import load_settings

_settings = load_settings()

wsgi_app = "sandboxd.app:create_app()"
worker_class = "sandboxd.serving.SandboxdWorker"  # uvicorn_worker.UvicornWorker with sandboxd's uvicorn options
workers = 1
bind = [f"[{_settings.host}]:{_settings.port}" if ":" in _settings.host else f"{_settings.host}:{_settings.port}"]
# SIGTERM: the gateway stops taking work, the steps in flight finish (shutdown_grace_s), then the workers
# stop. gunicorn must wait at least that long before it kills the process.
graceful_timeout = int(_settings.shutdown_grace_s) + 15
# The master kills a gateway whose loop did not check in for this long; a step never blocks the loop,
# but the start (warm pools, Chromium) can take a while.
timeout = 120
keepalive = 30
worker_connections = _settings.max_connections
accesslog = None
loglevel = _settings.log_level
proc_name = f"sandboxd-{_settings.node_id}"


def on_starting(server: Any) -> None:
    if server.cfg.workers != 1:
        raise SystemExit(
            f"sandboxd runs one gateway process per node (asked for {server.cfg.workers}): see "
            "deploy/gunicorn.conf.py; for more gateway processes run more nodes with SANDBOXD_REDIS_URL"
        )
