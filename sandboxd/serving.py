"""uvicorn's server, with a drain before the listeners close.

uvicorn closes its listening sockets on the first SIGTERM, so a client that
connects during the shutdown grace gets "connection refused", which looks
like a dead node rather than one leaving. Here the first SIGTERM or SIGINT
starts a drain: the port stays open, new steps and sessions are answered 503
``shutting_down`` (retryable elsewhere), /readyz turns 503, and the steps in
flight finish. The listeners close once nothing is in flight and at least
``shutdown_drain_s`` has passed, or at ``shutdown_grace_s``; a second signal
skips the rest of the drain.
"""

from __future__ import annotations

import asyncio
import functools
import time
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sandboxd.config import NodeSettings
from sandboxd.gateway import Gateway


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, gateway: Gateway) -> None:
        super().__init__(config)
        self.gateway = gateway
        self.drain_started: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_started is None and self.gateway.started:
            self.drain_started = time.monotonic()  # the drain itself begins on the loop, in on_tick
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if await super().on_tick(counter):
            return True
        if self.drain_started is None:
            return False
        if not self.gateway.draining:
            self.gateway.begin_drain()
        s = self.gateway.settings
        waited = time.monotonic() - self.drain_started
        return waited >= s.shutdown_grace_s or (waited >= s.shutdown_drain_s and self.gateway.inflight == 0)


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol with a deadline for each request's headers.

    uvicorn has none before a connection's first request: 4,200 idle TCP connections (no auth needed)
    filled ``max_connections`` and every request, probes included, got 503 until they went away. Here
    a connection that has not finished a request's headers ``header_timeout_s`` after it opened (or
    after the request began) is closed. Idle keep-alive between requests is uvicorn's own timeout.
    """

    header_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._header_deadline = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def protocol_with_deadline(header_timeout_s: float) -> type[HeaderDeadlineProtocol]:
    return type("HeaderDeadline", (HeaderDeadlineProtocol,), {"header_timeout_s": header_timeout_s})


def uvicorn_options(settings: NodeSettings) -> dict[str, Any]:
    """What ``sandboxd serve`` and the gunicorn worker give uvicorn, in one place.

    ``proxy_headers`` off: nothing here trusts a client's address from a header (``/drain``'s loopback
    check must see the real peer, and no tenant decision depends on an address).
    """
    return {
        "log_level": settings.log_level,
        "access_log": False,
        "loop": "auto",
        "http": protocol_with_deadline(settings.header_timeout_s),
        "proxy_headers": False,
        "timeout_graceful_shutdown": int(settings.shutdown_grace_s) + 1,
        "limit_concurrency": settings.max_connections,
        "timeout_keep_alive": 30,
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
