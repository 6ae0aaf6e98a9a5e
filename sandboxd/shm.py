"""A file of int32 cells mapped into every process that opens it: the load board's and the tenant tally's
storage (each cell has one writer; readers take what is there, no lock)."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

CELL = 4  # int32


class SharedInts:
    """``count`` int32 cells in ``path``; ``create``: made (or emptied) here, by the node, before anyone opens it."""

    def __init__(self, path: Path, count: int, create: bool = False) -> None:
        size = max(1, count) * CELL
        if create:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(fd, size)
        else:
            fd = os.open(path, os.O_RDWR)
        try:
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.cells = memoryview(self.map).cast("i")

    def close(self) -> None:
        self.cells.release()
        self.map.close()
