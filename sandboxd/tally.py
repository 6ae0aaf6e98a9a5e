"""Per-tenant counts of the whole node (connections, steps in flight), in shared memory.

A node runs K front processes, and each used to count a tenant's connections and steps on its own: the
caps held per front, K times the setting node-wide. Here every front owns one row (the node process hands
rows out when a front joins and zeroes a row when its front is gone: gunicorn gives all its workers the
same index, and a front that died leaves its counts behind), writes only its own cells, and sums a
tenant's column over every row when it checks a cap: a few int32 reads, no lock. Two fronts admitting at
the same instant can each see the other's count one step late, so a cap holds within one per front.

Tenants are the configured API keys' (fixed for the node's life), in one order every process computes.
"""

from __future__ import annotations

from pathlib import Path

from sandboxd.shm import SharedInts

FIELDS = 2  # connections, steps in flight
CONNECTIONS, INFLIGHT = 0, 1


def rows_for(fronts: int) -> int:
    """Rows enough for every front and for replacements that join before the old one's row is freed."""
    return 2 * fronts + 4


class Tally:
    def __init__(self, path: Path, rows: int, tenants: list[str], create: bool = False) -> None:
        self.columns = {t: i for i, t in enumerate(sorted(set(tenants)))}
        self.rows = rows
        self.stride = max(1, len(self.columns)) * FIELDS
        self.shared = SharedInts(path, rows * self.stride, create)
        self.cells = self.shared.cells

    def add(self, row: int, tenant: str, field: int, delta: int) -> int:
        """Change this front's count of ``tenant``; the tenant's count over the whole node after it (a tenant
        the table does not know, as with auth off, counts 0)."""
        col = self.columns.get(tenant)
        if col is None:
            return 0
        cells, stride = self.cells, self.stride
        offset = col * FIELDS + field
        cells[row * stride + offset] += delta
        return sum(cells[r * stride + offset] for r in range(self.rows))

    def clear(self, row: int) -> None:
        """A front that is gone holds nothing."""
        base = row * self.stride
        for i in range(self.stride):
            self.cells[base + i] = 0

    def close(self) -> None:
        self.shared.close()
