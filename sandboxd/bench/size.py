"""``sandboxd size``: instances and $/1M units per instance type, from measured results.

For each results directory (one per measured machine) and workload: take the
highest-throughput level whose p99 meets the target, divide its throughput by
the measured machine's vCPUs, and scale that per-vCPU figure to every type in
the price table. That assumes throughput scales with vCPUs within an
architecture family, which is what the public suite's own charts show (it
levels off at about one concurrent execution per vCPU); a type of another
architecture than the measured one is marked as extrapolated, since Graviton
and Intel differ per vCPU: measure both and pass both directories.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxd.bench import pricing


@dataclass(frozen=True)
class Capacity:
    machine: str
    arch: str
    vcpus: int
    workload: str
    concurrency: int
    throughput: float
    p99_ms: float
    unit: str

    @property
    def per_vcpu(self) -> float:
        return self.throughput / self.vcpus


def _runs(results_dir: Path) -> list[dict[str, Any]]:
    summaries = sorted(results_dir.rglob("summary.json"))
    if not summaries:
        raise FileNotFoundError(f"no summary.json under {results_dir}")
    doc = json.loads(summaries[-1].read_text())  # the newest run in that directory
    return [r for runs in doc["benchmarks"].values() for r in runs]


def best_capacity(results_dir: Path, workload: str, p99_ms: float) -> Capacity | None:
    best: Capacity | None = None
    for r in _runs(results_dir):
        if r["benchmark"] != workload:
            continue
        key, tput = next(iter(r["throughput"].items()))
        p99 = r["latency_ms"].get("p99")
        if (
            p99 is None
            or p99 > p99_ms
            or (r["latency_ms"].get("errors") or 0) > 0.01 * max(r["latency_ms"]["count"], 1)
        ):
            continue
        inst = r["instance"]
        cap = Capacity(
            inst["instance_type"],
            inst["arch"],
            int(inst["vcpus"]),
            workload,
            r["concurrency"],
            float(tput),
            float(p99),
            key,
        )
        if best is None or cap.throughput > best.throughput:
            best = cap
    return best


def size(results_dirs: list[Path], workload: str, target_per_s: float, p99_ms: float) -> list[dict[str, Any]]:
    table = pricing.load_table()
    rows: list[dict[str, Any]] = []
    for d in results_dirs:
        cap = best_capacity(d, workload, p99_ms)
        if cap is None:
            rows.append(
                {"results": str(d), "workload": workload, "error": f"no level of {workload} meets p99 <= {p99_ms} ms"}
            )
            continue
        for it in sorted(table.values(), key=lambda t: (t.name.split(".")[0], t.vcpus)):
            per_instance = cap.per_vcpu * it.vcpus
            n = math.ceil(target_per_s / per_instance) if per_instance > 0 else None
            row: dict[str, Any] = {
                "results": str(d),
                "measured_on": (
                    f"{cap.machine} ({cap.arch}, {cap.vcpus} vCPU) at c={cap.concurrency}, p99 {cap.p99_ms:.0f} ms"
                ),
                "workload": workload,
                "instance_type": it.name,
                "vcpus": it.vcpus,
                "hourly_usd": it.hourly_usd,
                "units_per_s_per_instance": round(per_instance, 2),
                "instances": n,
                "fleet_hourly_usd": round(n * it.hourly_usd, 4) if n else None,
                "usd_per_1m_units": round(it.hourly_usd * 1e6 / (3600 * per_instance), 4) if per_instance else None,
                "extrapolated_arch": it.arch != cap.arch,
            }
            rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]], target_per_s: float, p99_ms: float, sizes: set[str] | None = None) -> None:
    print(f"fleet for {target_per_s:g} units/s at p99 <= {p99_ms:g} ms (per-vCPU throughput scaled to each type)")
    seen: set[str] = set()
    for r in rows:
        if "error" in r:
            print(f"  {r['results']}: {r['error']}")
            continue
        if r["measured_on"] not in seen:
            seen.add(r["measured_on"])
            print(f"\nmeasured: {r['measured_on']}  [{r['results']}]")
            print(
                f"  {'type':<14}{'vCPU':>5}{'$/h':>9}{'units/s each':>14}"
                f"{'instances':>11}{'fleet $/h':>11}{'$/1M units':>12}"
            )
        if sizes and r["instance_type"].split(".")[1] not in sizes:
            continue
        mark = " *" if r["extrapolated_arch"] else ""
        print(
            f"  {r['instance_type']:<14}{r['vcpus']:>5}{r['hourly_usd']:>9.4f}{r['units_per_s_per_instance']:>14.1f}"
            f"{r['instances']:>11}{r['fleet_hourly_usd']:>11.2f}{r['usd_per_1m_units']:>12.4f}{mark}"
        )
    if any(r.get("extrapolated_arch") for r in rows):
        print("\n* other architecture than the measured machine: extrapolated; measure it and pass its results too")
