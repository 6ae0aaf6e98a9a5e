"""How old each rollout is, for scheduling the oldest rollout's steps first.

Synchronous RL waits for the slowest rollout of a batch, so under contention a
step of a rollout that started long ago should not queue behind a step of one
that started a moment ago. A step's priority is when its rollout was first
seen (per tenant: rollout ids are the client's names), or, without a rollout
id, its own arrival: FIFO among those. The advantage is capped at
``max_boost_s``: a step can be overtaken only by steps of rollouts that started
at most that long before it arrived, so its wait stays bounded (a 300 s cap
starved young rollouts past the 30 s queue timeout at saturation), and an id
kept alive for hours cannot put a client ahead of everyone. Ids idle for
``idle_s`` are forgotten, and at most ``max_rollouts`` are remembered (the
least recently used go first).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass


@dataclass
class _Seen:
    first: float
    last: float


class RolloutClock:
    def __init__(self, max_boost_s: float = 10.0, idle_s: float = 600.0, max_rollouts: int = 100_000) -> None:
        self.max_boost_s = max_boost_s
        self.idle_s = idle_s
        self.max_rollouts = max_rollouts
        self._seen: collections.OrderedDict[tuple[str, str], _Seen] = collections.OrderedDict()

    def priority(self, tenant: str, rollout_id: str | None, now: float) -> float:
        """Lower runs first: the rollout's start (capped), or ``now`` for a step of no rollout."""
        if rollout_id is None:
            return now
        key = (tenant, rollout_id)
        seen = self._seen.get(key)
        if seen is None or now - seen.last > self.idle_s:
            seen = self._seen[key] = _Seen(now, now)
        seen.last = now
        self._seen.move_to_end(key)
        self._forget(now)
        return max(seen.first, now - self.max_boost_s)

    def _forget(self, now: float) -> None:
        while self._seen:
            key, oldest = next(iter(self._seen.items()))
            if len(self._seen) <= self.max_rollouts and now - oldest.last <= self.idle_s:
                return
            del self._seen[key]

    def __len__(self) -> int:
        return len(self._seen)
