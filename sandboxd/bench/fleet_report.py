"""``sandboxd report``: one self-contained HTML page comparing measured machines.

Per workload (B9 first, the headline): throughput and p99 against concurrency
with one line per machine, $/1M units per instance type as bars (measured,
scaled and extrapolated figures told apart by colour and label, each naming
the machine it came from), the sizing table, and the price table with each
price's date and source. No scripts and no network, like the per-run report.
"""

from __future__ import annotations

import html
import time

from sandboxd.bench import pricing
from sandboxd.bench.report import STYLE, fmt, plot
from sandboxd.bench.results import MachineResults
from sandboxd.bench.size import Fleet, Row
from sandboxd.bench.workloads import WORKLOADS

BASIS_COLOURS = {"measured": "#1f77b4", "scaled": "#7fb3dc", "extrapolated": "#c7c7c7"}


def bars(title: str, rows: list[Row]) -> str:
    """Horizontal bars of $/1M units, one per instance type, labelled with the value and its basis."""
    if not rows:
        return f"<p>{html.escape(title)}: nothing priced</p>"
    w, bar_h, gap, left, right, top = 720, 18, 6, 120, 250, 30
    h = top + len(rows) * (bar_h + gap) + 10
    vmax = max(r.usd_per_1m_units for r in rows) or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img" aria-label="{html.escape(title)}">',
        f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="14" font-weight="bold">{html.escape(title)}</text>',
    ]
    for i, r in enumerate(rows):
        y = top + i * (bar_h + gap)
        bw = (w - left - right) * r.usd_per_1m_units / vmax
        vs = f", {r.vs_reference:+.0%}" if r.vs_reference is not None else ""
        label = f"${r.usd_per_1m_units:,.2f}{vs} ({r.basis})"
        parts += [
            f'<text x="{left - 6}" y="{y + 13}" text-anchor="end" font-size="12">{html.escape(r.instance_type)}</text>',
            f'<rect class="bar" x="{left}" y="{y}" width="{bw:.1f}" height="{bar_h}" fill="{BASIS_COLOURS[r.basis]}">'
            f"<title>{html.escape(r.instance_type)}: {html.escape(label)}, measured on {html.escape(r.measured_on)}</title></rect>",
            f'<text x="{left + bw + 6:.1f}" y="{y + 13}" font-size="12">{html.escape(label)}</text>',
        ]
    parts.append("</svg>")
    return "".join(parts)


def _machines(machines: list[MachineResults]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(mr.machine.instance_type)}</td><td>{html.escape(mr.machine.arch)}</td>"
        f"<td>{mr.machine.vcpus}</td><td>{html.escape(mr.machine.cpu_model)}</td>"
        f"<td>{html.escape(' '.join(sorted(mr.runs)))}</td>"
        f"<td>{html.escape(max(mr.generated_at.values(), default=''))}</td>"
        f"<td>{html.escape(' '.join(sorted(set(mr.sources.values()))))}</td></tr>"
        for mr in machines
    )
    return (
        "<table id='machines'><thead><tr><th>Machine</th><th>Arch</th><th>vCPU</th><th>CPU</th><th>Workloads</th>"
        f"<th>Newest run</th><th>Results</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _sizing(rows: list[Row], reference: str) -> str:
    body = "".join(
        f"<tr><td>{html.escape(r.instance_type)}</td><td>{r.vcpus}</td><td>{r.hourly_usd:.4f}"
        f"{' (est.)' if r.price_basis == 'estimate' else ''}</td><td>{r.basis}</td><td>{html.escape(r.bound)}</td>"
        f"<td>{fmt(r.units_per_s_per_vcpu, 3)}</td><td>{fmt(r.units_per_s_per_instance, 2)}</td><td>{r.instances}</td>"
        f"<td>{fmt(r.fleet_hourly_usd, 2)}</td><td>{fmt(r.usd_per_1k_units, 5)}</td><td>{fmt(r.usd_per_1m_units, 2)}</td>"
        f"<td>{f'{r.vs_reference:+.1%}' if r.vs_reference is not None else '-'}</td>"
        f"<td>{html.escape(r.measured_on)}</td></tr>"
        for r in rows
    )
    return (
        "<table class='sizing'><thead><tr><th>Type</th><th>vCPU</th><th>$/h</th><th>Basis</th><th>Bound</th><th>Units/s per vCPU</th>"
        "<th>Units/s each</th><th>Instances</th><th>Fleet $/h</th><th>$/1k units</th><th>$/1M units</th>"
        f"<th>vs {html.escape(reference)}</th><th>Measured on</th></tr></thead><tbody>{body}</tbody></table>"
    )


def _prices(table: pricing.PriceTable) -> str:
    body = "".join(
        f"<tr><td>{html.escape(f)}</td><td>{html.escape(it.arch)}</td><td>{it.hourly_usd:.4f}</td>"
        f"<td>{html.escape(it.basis)}</td><td>{html.escape(it.date)}</td><td>{html.escape(it.source)}</td></tr>"
        for f, it in sorted(table.families().items())
    )
    return (
        f"<h2>Price table</h2><p class='meta'>{html.escape(table.about)} ({html.escape(str(table.path))})</p>"
        "<table id='prices'><thead><tr><th>Family</th><th>Arch</th><th>$/h (4xlarge)</th><th>Basis</th><th>Date</th>"
        f"<th>Source</th></tr></thead><tbody>{body}</tbody></table>"
    )


def render(machines: list[MachineResults], fleet: Fleet, table: pricing.PriceTable, locations: list[str]) -> str:
    workloads = sorted({wl for mr in machines for wl in mr.runs if wl in WORKLOADS}, key=lambda w: (w != "B9", w))
    sections = []
    types = [mr.machine.instance_type for mr in machines]
    label = {  # a line per machine: its type, or all it states when two machines share a type name
        mr.machine: mr.machine.instance_type if types.count(mr.machine.instance_type) == 1 else mr.machine.describe()
        for mr in machines
    }
    for wl in workloads:
        w = WORKLOADS[wl]
        key = w.throughput_key
        measured = [mr for mr in machines if wl in mr.runs]
        tput = {
            label[mr.machine]: [(r["concurrency"], float(r["throughput"][key])) for r in mr.runs[wl]] for mr in measured
        }
        p99 = {
            label[mr.machine]: [(r["concurrency"], r["latency_ms"].get("p99")) for r in mr.runs[wl]] for mr in measured
        }
        rows = [r for r in fleet.rows if r.workload == wl]
        sections.append(
            f"<h2 id='{wl}'>{wl} {html.escape(w.title)}</h2><div class='plots'>"
            + plot(f"{wl} throughput per machine", tput, w.rate_unit)
            + plot(f"{wl} p99 per machine", p99, "ms")
            + "</div>"
            + bars(f"{wl}: $ per 1M {w.unit}s by instance type", rows)
            + (_sizing(rows, fleet.reference) if rows else "")
        )
    legend = " ".join(f"<span style='color:{c}'>&#9632;</span> {html.escape(b)}" for b, c in BASIS_COLOURS.items())
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in fleet.notes)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sandboxd fleet report</title>
<style>{STYLE}</style></head><body>
<h1>sandboxd fleet report</h1>
<p class="meta">Generated {html.escape(time.strftime("%Y-%m-%dT%H:%M:%S%z"))} from {html.escape(", ".join(locations))}.
Sizing for {fleet.target_units_per_s:g} units/s at p99 &le; {fleet.p99_ms:g} ms; cost against {html.escape(fleet.reference)}.
Bars: {legend} (measured = that type; scaled = same family, another size; extrapolated = same architecture,
another family, per-vCPU). Latencies are client-side, from raw samples.</p>
<h2>Machines</h2>{_machines(machines)}
{f"<ul class='notes'>{notes}</ul>" if notes else ""}
{"".join(sections)}
{_prices(table)}
</body></html>
"""
