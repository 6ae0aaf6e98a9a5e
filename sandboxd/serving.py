"""How a front process runs uvicorn: its options, in one place, for ``sandboxd serve`` and for gunicorn.

The HTTP protocol is sandboxd's front door (``front/protocol.py``: header and body deadlines, the key
checked before a body is read, connection limits, the hot routes). ``proxy_headers`` is off: nothing
here trusts a client's address from a header (``/drain``'s loopback check and the per-address connection
limit must see the real peer). WebSockets (OpenEnv) are pinged and closed when the peer stops answering,
so a half-open connection does not hold its session and its place.
"""

from __future__ import annotations

import functools
from typing import Any

from sandboxd.config import NodeSettings
from sandboxd.front.protocol import protocol_class


def uvicorn_options(settings: NodeSettings) -> dict[str, Any]:
    return {
        "log_level": settings.log_level,
        "access_log": False,
        "loop": "auto",
        "http": protocol_class(settings),
        "proxy_headers": False,
        "timeout_graceful_shutdown": int(settings.shutdown_grace_s) + 1,
        "limit_concurrency": settings.max_connections,
        "timeout_keep_alive": 30,
        "ws_ping_interval": settings.ws_ping_interval_s,
        "ws_ping_timeout": settings.ws_ping_interval_s,
        "ws_max_size": 16 << 20,
    }


@functools.cache
def gunicorn_worker_class() -> type:
    """gunicorn's uvicorn worker with sandboxd's uvicorn options, from the settings of this process."""
    from uvicorn_worker import UvicornWorker  # type: ignore[import-untyped]

    from sandboxd.config import load_settings

    options = uvicorn_options(load_settings())
    for gunicorn_owns in ("timeout_graceful_shutdown", "timeout_keep_alive", "log_level", "access_log"):
        options.pop(gunicorn_owns)  # set from gunicorn's own config (graceful_timeout, keepalive, loglevel)
    return type("SandboxdWorker", (UvicornWorker,), {"CONFIG_KWARGS": options})


def __getattr__(name: str) -> Any:
    """``worker_class = "sandboxd.serving.SandboxdWorker"``: built when gunicorn imports it (``sandboxd serve``
    never does, and needs neither uvicorn_worker nor gunicorn)."""
    if name == "SandboxdWorker":
        return gunicorn_worker_class()
    raise AttributeError(name)
