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

import time
from types import FrameType

import uvicorn

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
