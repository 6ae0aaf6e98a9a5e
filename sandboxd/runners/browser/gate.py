"""How many trajectories one browser runs at once: at most its slots, fewer while the machine cannot serve them.

Every session and one-shot shares one browser's renderers, and a 2-vCPU machine with eight trajectories in
flight (and python cells beside them) can keep a renderer off the CPU past an action's 500 ms: the action
times out for the node's sake, not the program's (``starvation.CpuPressure`` tells, and the action is run
again once). Admitting work the machine cannot serve only turns it into such timeouts, so the browser
admits fewer instead: an action found starved lowers the limit by one (once per generation of
trajectories: the ones already running were admitted under the old limit and say nothing new), and it
grows back by one after ``CALM`` trajectories in a row without a starved action. A trajectory waits here
before its first action, so its own time limit starts when it gets in; one that cannot get in by its
deadline is the node's 504, never the program's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator

from sandboxd.errors import DeadlineExceeded

CALM = 8  # trajectories in a row without a starved action before the limit grows by one


class Gate:
    def __init__(self, most: int) -> None:
        self.most = most
        self.limit = most
        self.active = 0
        self.generation = 0  # raised by every cut: a starved report of an older generation is not news
        self._calm = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.cuts = 0  # how often the limit was cut (health)

    def free(self) -> int:
        return max(0, self.limit - self.active)

    @contextlib.asynccontextmanager
    async def enter(self, deadline: float) -> AsyncIterator[int]:
        """Hold one place until the block ends; yields the generation it entered in. ``deadline`` is monotonic.
        A place is handed to the oldest waiter when one frees (counted for it at once: nobody overtakes it)."""
        if self.active < self.limit and not self._waiters:
            self.active += 1
        else:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await fut
            except BaseException as exc:
                if fut.done() and not fut.cancelled():  # handed a place just as it gave up: pass it on
                    self.active -= 1
                    self._wake()
                else:
                    fut.cancel()
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(fut)
                if isinstance(exc, TimeoutError):
                    raise DeadlineExceeded(
                        f"the browser ran {self.active} trajectories, as many as the machine serves without "
                        "starving them, until this step's deadline; retry"
                    ) from None
                raise
        try:
            yield self.generation
        finally:
            self.active -= 1
            self._wake()

    def _wake(self) -> None:
        while self._waiters and self.active < self.limit:
            fut = self._waiters.popleft()
            if not fut.done():
                self.active += 1  # the waiter's, from now
                fut.set_result(None)

    def starved(self, generation: int) -> None:
        """An action of a trajectory entered in ``generation`` was starved: admit fewer than run now (once a
        generation). One trajectory alone starved is the machine's other load: admitting fewer cannot help it."""
        self._calm = 0
        if generation == self.generation and self.active > 1:
            self.limit = max(1, min(self.limit, self.active) - 1)
            self.generation += 1
            self.cuts += 1

    def calm(self) -> None:
        """A trajectory ended with no starved action."""
        self._calm += 1
        if self._calm >= CALM and self.limit < self.most:
            self._calm = 0
            self.limit += 1
            self._wake()
