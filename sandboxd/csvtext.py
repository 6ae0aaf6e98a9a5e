"""Rows as CSV text with a header line: what text-only clients read (SandboxFusion's stdout, Gymnasium).

Standard library only: the Gymnasium environments (client side) use it too.
"""

from __future__ import annotations

import csv
import io
from typing import Any


def as_csv(columns: list[str], rows: list[list[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return buf.getvalue()
