"""The node's load board: free slots and queued steps per worker and kind, in shared memory.

Each worker owns its slots and its queue (it admits, queues and refuses its own one-shot steps); the
front processes only choose where to send a one-shot, and choose well only if they see every worker's
load, whichever front sent it. Each worker writes its own row here whenever its slots or queue change;
fronts read every row for each one-shot (a few int32 reads, no lock: each cell has one writer, and a
stale read only makes a choice slightly worse, never wrong: the worker still decides), together with
what they sent themselves that has not come back yet.
"""

from __future__ import annotations

from pathlib import Path

from sandboxd.shm import SharedInts

FIELDS = 2  # free slots, queued steps


class Board:
    def __init__(self, path: Path, workers: int, kinds: list[str], create: bool = False) -> None:
        self.kinds = {k: i for i, k in enumerate(kinds)}
        self.workers = workers
        self.stride = len(kinds) * FIELDS
        self.shared = SharedInts(path, workers * self.stride, create)
        self.cells = self.shared.cells

    def set(self, worker: int, kind: str, free: int, queued: int) -> None:
        base = worker * self.stride + self.kinds[kind] * FIELDS
        self.cells[base] = free
        self.cells[base + 1] = queued

    def clear(self, worker: int) -> None:
        """A worker that died or is restarting takes nothing until it writes its row again."""
        for kind in self.kinds:
            self.set(worker, kind, 0, 1 << 30)

    def pick(self, kind: str, candidates: list[tuple[int, int, int]], start: int) -> int:
        """The least loaded worker for one more step of ``kind``; ``candidates`` are (worker, its slots of the
        kind, steps this front has sent it that are not answered yet).

        A worker's load is what it holds (running and queued, from its row) or, when more, what this front
        alone knows it has sent: a burst of steps leaves the front before any worker has written its row
        again, and a choice made on the stale rows alone sent the whole burst to the same worker. Relative to
        its slots; ties go round-robin from ``start`` so fronts do not all pile onto worker 0."""
        offset = self.kinds[kind] * FIELDS
        cells, stride = self.cells, self.stride
        n = len(candidates)
        best, best_load = candidates[start % n][0], float("inf")
        for j in range(n):
            w, slots, sent = candidates[(start + j) % n]
            base = w * stride + offset
            held = slots - cells[base] + cells[base + 1]
            load = max(held, sent) / max(slots, 1)
            if load < best_load:
                best, best_load = w, load
        return best

    def queued(self, kind: str, workers: list[int]) -> tuple[int, int]:
        """Free slots and queued steps of ``kind`` over ``workers``."""
        offset = self.kinds[kind] * FIELDS
        free = queued = 0
        for w in workers:
            base = w * self.stride + offset
            free += max(0, self.cells[base])
            queued += max(0, self.cells[base + 1])
        return free, queued

    def close(self) -> None:
        self.shared.close()
