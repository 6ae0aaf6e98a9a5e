"""Latency summaries from raw samples (never from histogram buckets).

Percentiles interpolate linearly between closest ranks, like numpy's default,
so figures compare with the public suite's. An empty channel gives nulls.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """``q`` in [0, 100]; ``sorted_values`` ascending and non-empty."""
    if len(sorted_values) == 1:
        return float(sorted_values[0])
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac)


def summary(samples_ms: Sequence[float], errors: int | None = None) -> dict[str, float | int | None]:
    vals = sorted(samples_ms)
    out: dict[str, float | int | None] = {"count": len(vals)}
    if errors is not None:
        out["errors"] = errors
    if not vals:
        out.update(p50=None, p95=None, p99=None, mean=None, max=None)
        return out
    out.update(
        p50=round(percentile(vals, 50), 3),
        p95=round(percentile(vals, 95), 3),
        p99=round(percentile(vals, 99), 3),
        mean=round(statistics.fmean(vals), 3),
        max=round(vals[-1], 3),
    )
    return out
