"""What machine was measured: stated in every result so figures stay comparable.

The instance type cannot be discovered here (no metadata service on loopback
machines), so it comes from ``--instance-type`` / ``SANDBOXD_BENCH_INSTANCE_TYPE``,
else ``"unknown"`` (then no cost is computed, rather than a wrong one).
"""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "CPU part"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def describe(instance_type: str | None = None) -> dict[str, Any]:
    return {
        "instance_type": instance_type or os.environ.get("SANDBOXD_BENCH_INSTANCE_TYPE") or "unknown",
        "instance_id": socket.gethostname(),
        "arch": platform.machine(),
        "vcpus": len(os.sched_getaffinity(0)),
        "cpu_model": cpu_model(),
        "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
    }
