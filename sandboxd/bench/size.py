"""``sandboxd size``: instances and $/1M units per instance type, from results of several machines.

For each machine and workload: the highest-throughput level whose p99 meets
the target (and whose errors stay under 1%) gives a per-vCPU throughput. Each
type of the price table then takes its figure from, in this order:

1. **measured**: a machine of exactly that type;
2. **scaled**: a measured machine of the same family, another size (per-vCPU
   scaling within one CPU design, which is what the public suite's own charts
   show: throughput levels off at about one concurrent unit per vCPU);
3. **extrapolated**: a measured machine of the same architecture, another
   family: the least per-vCPU throughput among them (the cautious guess), named;
4. left out: no machine of its architecture measured. Graviton and Intel differ
   per vCPU by tens of percent; one is never priced with the other's figures.

Per-vCPU scaling holds for the workers, not for what takes HTTP: a node's
front processes carry at most 1 / (front CPU per unit) units/s each, and a node
of V vCPUs runs ``ceil(V / VCPUS_PER_FRONT)`` of them by default. A result that
recorded its front processes' CPU per unit (``extra.node.cpu_ms_per_unit``)
caps every node priced from it at that ceiling, and the ``bound`` column says
which one holds ("vcpus", or "fronts K x N/s"); a figure without it is marked
"front unmeasured".

Cost is the study's: $/1M units = price_h x 10^6 / (3600 x units/s per
instance), compared with the reference type's (e.g. m7i) as "-30%".
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from sandboxd.bench import pricing
from sandboxd.bench.results import Machine, MachineResults
from sandboxd.bench.workloads import WORKLOADS

MAX_ERROR_SHARE = 0.01


@dataclass(frozen=True)
class Capacity:
    machine: Machine
    workload: str
    concurrency: int
    throughput: float
    p99_ms: float
    source: str
    front_ms_per_unit: float | None = None  # CPU of the node's front processes per unit, when recorded

    @property
    def per_vcpu(self) -> float:
        return self.throughput / self.machine.vcpus

    def describe(self) -> str:
        return f"{self.machine.describe()} at c={self.concurrency}, p99 {self.p99_ms:.0f} ms"


@dataclass(frozen=True)
class Row:
    workload: str
    unit: str
    instance_type: str
    arch: str
    vcpus: int
    hourly_usd: float
    price_basis: str
    basis: str  # measured | scaled | extrapolated
    measured_on: str
    source: str
    units_per_s_per_vcpu: float
    bound: str  # "vcpus", "fronts K x N/s" (the front processes carry no more), or "front unmeasured"
    units_per_s_per_instance: float
    instances: int
    fleet_hourly_usd: float
    usd_per_1k_units: float
    usd_per_1m_units: float
    vs_reference: float | None  # -0.30 = 30% cheaper per unit than the reference type


@dataclass
class Fleet:
    target_units_per_s: float
    p99_ms: float
    reference: str
    rows: list[Row]
    notes: list[str]  # what was left out and why

    def to_json(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "rows"}, "rows": [asdict(r) for r in self.rows]}


def best_capacity(mr: MachineResults, workload: str, p99_ms: float) -> Capacity | None:
    best: Capacity | None = None
    for r in mr.runs.get(workload, []):
        try:  # results come from other machines: anything not a finite, positive figure is not a capacity
            lat = r["latency_ms"]
            p99 = float(lat["p99"])
            tput = float(r["throughput"][WORKLOADS[workload].throughput_key])
            errors, count = float(lat.get("errors") or 0), float(lat.get("count") or 0)
        except (KeyError, TypeError, ValueError):
            continue
        if not (math.isfinite(p99) and math.isfinite(tput) and tput > 0) or p99 > p99_ms:
            continue
        if errors > MAX_ERROR_SHARE * max(count, 1):
            continue
        front = ((r.get("extra") or {}).get("node") or {}).get("cpu_ms_per_unit", {}).get("front")
        front_ms = float(front) if isinstance(front, int | float) and front > 0 else None
        cap = Capacity(mr.machine, workload, r["concurrency"], tput, float(p99), mr.sources[workload], front_ms)
        if best is None or cap.throughput > best.throughput:
            best = cap
    return best


def sizable(machines: list[MachineResults]) -> list[str]:
    """Workloads measured somewhere that are a sustained load (B8 counts trial starts, not capacity); B9 first."""
    seen = {wl for mr in machines for wl in mr.runs}
    found = [wl for wl in WORKLOADS if wl in seen and WORKLOADS[wl].mode != "trials"]
    return sorted(found, key=lambda w: (w != "B9", w))


def _pick(it: pricing.InstanceType, caps: list[Capacity]) -> tuple[str, Capacity] | None:
    """Where a type's figure comes from; among several candidates, the least per vCPU (the cautious one)."""
    same_arch = [c for c in caps if c.machine.arch == it.arch]  # a type named wrongly never crosses architectures
    for basis, match in (
        ("measured", lambda c: c.machine.instance_type == it.name),
        ("scaled", lambda c: c.machine.instance_type.split(".")[0] == it.family),
        ("extrapolated", lambda c: True),
    ):
        found = [c for c in same_arch if match(c)]
        if found:
            return basis, min(found, key=lambda c: c.per_vcpu)
    return None


def _types(table: pricing.PriceTable, machines: list[MachineResults], sizes: set[str] | None) -> list[str]:
    wanted = sizes or set(table.study_sizes)
    names = {n for n, it in table.types.items() if it.size in wanted}
    names |= {mr.machine.instance_type for mr in machines if mr.machine.instance_type in table.types}
    return sorted(names, key=lambda n: (table.types[n].family, table.types[n].vcpus))


def plan(
    machines: list[MachineResults],
    target_units_per_s: float,
    p99_ms: float,
    *,
    workloads: list[str] | None = None,
    reference: str = "m7i",
    sizes: set[str] | None = None,
    table: pricing.PriceTable | None = None,
) -> Fleet:
    table = table or pricing.load()
    notes: list[str] = []
    rows: list[Row] = []
    unpriced: dict[str, list[str]] = {}  # arch -> workloads whose types of that arch were left out
    for m in machines:
        stated = table.types.get(m.machine.instance_type)
        if stated is not None and stated.arch != m.machine.arch:
            notes.append(
                f"{m.machine.describe()} says it is {stated.name}, an {stated.arch} type: its figures price"
                f" {m.machine.arch} types only (check --instance-type on that machine)"
            )
        if m.machine.instance_type not in table.types:
            notes.append(
                f"{m.machine.describe()} is not in the price table ({table.path.name}): its figures price other"
                " types only (run the bench with --instance-type to price it too)"
            )
    unknown = sorted({wl for mr in machines for wl in mr.runs} - set(WORKLOADS))
    if unknown:
        notes.append(f"workloads this version does not know, left out: {', '.join(unknown)}")
    for wl in workloads or sizable(machines):
        unit = WORKLOADS[wl].unit
        caps = [c for mr in machines if (c := best_capacity(mr, wl, p99_ms)) is not None]
        if not caps:
            notes.append(f"{wl}: no measured level meets p99 <= {p99_ms:g} ms with < 1% errors on any machine")
            continue
        left_out: set[str] = set()
        wl_rows: list[Row] = []
        for name in _types(table, machines, sizes):
            it = table.types[name]
            picked = _pick(it, caps)
            if picked is None:
                left_out.add(it.arch)
                continue
            basis, cap = picked
            per_instance, bound = ceiling(cap, it.vcpus)
            wl_rows.append(
                Row(
                    workload=wl,
                    unit=unit,
                    instance_type=name,
                    arch=it.arch,
                    vcpus=it.vcpus,
                    hourly_usd=it.hourly_usd,
                    price_basis=it.basis,
                    basis=basis,
                    measured_on=cap.describe(),
                    source=cap.source,
                    units_per_s_per_vcpu=round(cap.per_vcpu, 4),
                    bound=bound,
                    units_per_s_per_instance=round(per_instance, 3),
                    instances=math.ceil(target_units_per_s / per_instance),
                    fleet_hourly_usd=round(math.ceil(target_units_per_s / per_instance) * it.hourly_usd, 4),
                    usd_per_1k_units=round(it.hourly_usd * 1e3 / (3600 * per_instance), 6),
                    usd_per_1m_units=round(it.hourly_usd * 1e6 / (3600 * per_instance), 4),
                    vs_reference=None,
                )
            )
        for arch in left_out:
            unpriced.setdefault(arch, []).append(wl)
        rows += _compare(wl_rows, reference, notes, wl)
    for arch, wls in sorted(unpriced.items()):
        notes.append(f"{arch} types left out ({', '.join(wls)}): no {arch} machine measured")
    return Fleet(target_units_per_s, p99_ms, reference, rows, notes)


def ceiling(cap: Capacity, vcpus: int) -> tuple[float, str]:
    """Units/s one node of ``vcpus`` carries: per-vCPU scaling, capped by what its front processes carry."""
    from sandboxd.config import VCPUS_PER_FRONT

    scaled = cap.per_vcpu * vcpus
    if cap.front_ms_per_unit is None:
        return scaled, "front unmeasured"
    fronts = max(1, -(-vcpus // VCPUS_PER_FRONT))
    per_front = 1000.0 / cap.front_ms_per_unit
    if fronts * per_front < scaled:
        return fronts * per_front, f"fronts {fronts} x {per_front:.0f}/s"
    return scaled, "vcpus"


def _compare(rows: list[Row], reference: str, notes: list[str], wl: str) -> list[Row]:
    """Each row's $/unit against the reference type's (same size when the reference names a family)."""
    by_name = {r.instance_type: r for r in rows}
    out = []
    for r in rows:
        size = r.instance_type.split(".")[1]
        ref = by_name.get(reference) or by_name.get(f"{reference}.{size}")
        if ref is None:
            ref = next((x for x in rows if x.instance_type.split(".")[0] == reference), None)
        vs = round(r.usd_per_1m_units / ref.usd_per_1m_units - 1, 4) if ref is not None else None
        out.append(Row(**{**asdict(r), "vs_reference": vs}))
    if rows and not any(r.vs_reference is not None for r in out):
        notes.append(f"{wl}: reference {reference} not priced (not in the table, or its architecture not measured)")
    return out


def print_table(fleet: Fleet) -> None:
    print(
        f"fleet for {fleet.target_units_per_s:g} units/s at p99 <= {fleet.p99_ms:g} ms;"
        f" cost against {fleet.reference} (measured = that type; scaled = same family, other size;"
        " extrapolated = same architecture, other family: per-vCPU scaling)"
    )
    current = None
    for r in fleet.rows:
        if r.workload != current:
            current = r.workload
            print(
                f"\n{r.workload} {WORKLOADS[r.workload].title} ({r.unit}s)\n"
                f"  {'type':<14}{'vCPU':>5}{'$/h':>9}  {'basis':<13}{'bound':<22}{'units/s each':>13}{'instances':>10}"
                f"{'fleet $/h':>11}{'$/1k units':>12}{'$/1M units':>12}{'vs ' + fleet.reference:>9}  measured on"
            )
        price = f"{r.hourly_usd:.4f}" + ("e" if r.price_basis == "estimate" else " ")
        vs = f"{r.vs_reference:+.0%}" if r.vs_reference is not None else "-"
        print(
            f"  {r.instance_type:<14}{r.vcpus:>5}{price:>9}  {r.basis:<13}{r.bound:<22}"
            f"{r.units_per_s_per_instance:>13.2f}"
            f"{r.instances:>10}{r.fleet_hourly_usd:>11.2f}{r.usd_per_1k_units:>12.5f}{r.usd_per_1m_units:>12.2f}"
            f"{vs:>9}  {r.measured_on}"
        )
    if any(r.price_basis == "estimate" for r in fleet.rows):
        print("\ne: estimated price (see the price table's source for how)")
    for n in fleet.notes:
        print(f"note: {n}")


def dumps(fleet: Fleet) -> str:
    return json.dumps(fleet.to_json(), indent=2)
