"""Machine resources sampled during the measure window only (1 s period).

Host CPU % = 100 x (1 - d_idle / d_total) over /proc/stat's aggregate line
(idle includes iowait), memory = total - available, context switches/s. On a
loopback bench the host value includes the load generator: its own CPU is
reported separately (``client_cpu_cores``) so a saturated client is visible.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from sandboxd.bench.stats import percentile


def _cpu() -> tuple[int, int, int]:
    fields = Path("/proc/stat").read_text().splitlines()
    cpu = [int(x) for x in fields[0].split()[1:]]
    ctxt = next(int(line.split()[1]) for line in fields if line.startswith("ctxt "))
    return sum(cpu), cpu[3] + (cpu[4] if len(cpu) > 4 else 0), ctxt


def cpu_times() -> float:
    """Busy CPU seconds of the whole host so far (all CPUs, idle and iowait excluded)."""
    total, idle, _ = _cpu()
    return (total - idle) / os.sysconf("SC_CLK_TCK")


def _mem_used_gb() -> float:
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info[key] = int(value.split()[0])
    return (info["MemTotal"] - info.get("MemAvailable", info.get("MemFree", 0))) / 2**20


class Sampler:
    def __init__(
        self, period_s: float = 1.0, delay_s: float = 0.0, window_s: float | None = None, node_pid: int | None = None
    ) -> None:
        """Sample from ``delay_s`` after entering (the warm-up) for ``window_s`` (None: until exit); with
        ``node_pid`` (a node on this machine), also the CPU of its processes by role (``proctree.py``)."""
        self.node_pid = node_pid
        self.roles: list[tuple[float, dict[str, float]]] = []  # (monotonic, CPU seconds so far by role)
        self.period_s = min(period_s, window_s / 3) if window_s else period_s
        self.delay_s = delay_s
        self.window_s = window_s
        self.cpu: list[float] = []
        self.ctx: list[float] = []
        self.stamps: list[tuple[float, float]] = []  # monotonic (start, end) of each cpu/ctx sample
        self.mem_peak_gb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        if self._stop.wait(self.delay_s):
            return
        start = time.monotonic()
        prev = _cpu()
        prev_t = start
        self.mem_peak_gb = _mem_used_gb()
        self._sample_roles()
        while not self._stop.wait(self.period_s):
            self._sample_roles()
            cur, now = _cpu(), time.monotonic()
            if self.window_s is not None and now - start > self.window_s + self.period_s / 2:
                return
            d_total, d_idle = cur[0] - prev[0], cur[1] - prev[1]
            if d_total > 0:
                self.cpu.append(100.0 * (1 - d_idle / d_total))
                self.ctx.append((cur[2] - prev[2]) / max(now - prev_t, 1e-9))
                self.stamps.append((prev_t, now))
            self.mem_peak_gb = max(self.mem_peak_gb, _mem_used_gb())
            prev, prev_t = cur, now

    def _sample_roles(self) -> None:
        if self.node_pid is not None:
            from sandboxd.bench.proctree import cpu_by_role

            self.roles.append((time.monotonic(), cpu_by_role(self.node_pid)))

    def cpu_by_role(self, window: tuple[float, float] | None) -> tuple[dict[str, float], float] | None:
        """CPU seconds each role of the node used over the samples inside ``window``, and the seconds covered."""
        if window is None:
            return None
        inside = [(t, r) for t, r in self.roles if window[0] - self.period_s <= t <= window[1] + self.period_s]
        if len(inside) < 2:
            return None
        (t0, a), (t1, b) = inside[0], inside[-1]
        return {k: b[k] - a[k] for k in a}, t1 - t0

    def within(self, window: tuple[float, float] | None) -> Sampler:
        """Only the samples that lie inside a monotonic window (the load generator's measure window)."""
        if window is None:
            return self
        keep = [i for i, (a, b) in enumerate(self.stamps) if a >= window[0] - self.period_s / 2 and b <= window[1]]
        self.cpu = [self.cpu[i] for i in keep]  # none inside: no figure rather than the warm-up's
        self.ctx = [self.ctx[i] for i in keep]
        self.stamps = [self.stamps[i] for i in keep]
        return self

    def result(self, client_cpu_s: float, duration_s: float, ncpu: int) -> dict[str, Any]:
        cpu = sorted(self.cpu)
        client_pct = 100.0 * client_cpu_s / max(duration_s, 1e-9) / ncpu
        return {
            "cpu_util_avg": round(sum(cpu) / len(cpu), 2) if cpu else None,
            "cpu_util_p95": round(percentile(cpu, 95), 2) if cpu else None,
            "orch_cpu_util_avg": round(client_pct, 2),
            "client_cpu_cores": round(client_cpu_s / max(duration_s, 1e-9), 3),
            "mem_peak_gb": round(self.mem_peak_gb, 3),
            "ctx_switch_per_sec_avg": round(sum(self.ctx) / len(self.ctx), 1) if self.ctx else None,
            "host_ncpu": ncpu,
        }
