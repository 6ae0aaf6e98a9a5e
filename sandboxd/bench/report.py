"""Self-contained HTML report: one table row per (workload, level), SVG plots of
throughput and p99 against concurrency. No scripts, no network: it opens from a
file on an air-gapped laptop the same as anywhere.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from sandboxd.bench.workloads import WORKLOADS

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: right; font-size: 13px; }
th { background: #f3f3f3; } td:first-child, td:last-child { text-align: left; }
.plots { display: flex; flex-wrap: wrap; gap: 1em; }
.meta { color: #555; font-size: 13px; }
"""
TITLES = {k: w.title for k, w in WORKLOADS.items()}
UNITS = {k: w.rate_unit for k, w in WORKLOADS.items()}


def _primary(run: dict[str, Any]) -> tuple[float, float | None]:
    tput = next(iter(run["throughput"].values()))
    return float(tput), run["latency_ms"].get("p99")


def fmt(v: Any, nd: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return html.escape(str(v))


def plot(title: str, series: Mapping[str, Sequence[tuple[int, float | None]]], y_label: str) -> str:
    """A log-x line plot as inline SVG; points without a value (a level that failed) are skipped."""
    w, h, left, right, top, bottom = 460, 270, 60, 20, 46, 40
    pts = [(x, y) for s in series.values() for x, y in s if y is not None]
    if not pts:
        return f"<p>{html.escape(title)}: no data</p>"
    xs = sorted({p[0] for p in pts})
    xmin, xmax = math.log2(max(xs[0], 1)), math.log2(max(xs[-1], 1))
    ymax = max(p[1] for p in pts) * 1.1 or 1.0

    def sx(x: int) -> float:
        span = (xmax - xmin) or 1.0
        return left + (math.log2(max(x, 1)) - xmin) / span * (w - left - right)

    def sy(y: float) -> float:
        return top + (1 - y / ymax) * (h - top - bottom)

    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" role="img" aria-label="{html.escape(title)}">',
        f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="14" font-weight="bold">{html.escape(title)}</text>',
        f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="#333"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="#333"/>',
        f'<text x="{w / 2}" y="{h - 6}" text-anchor="middle" font-size="12">concurrency</text>',
        f'<text x="14" y="{h / 2}" text-anchor="middle" font-size="12" transform="rotate(-90 14 {h / 2})">{html.escape(y_label)}</text>',
    ]
    for x in xs:
        parts.append(f'<text x="{sx(x):.1f}" y="{h - bottom + 16}" text-anchor="middle" font-size="11">{x}</text>')
    for i in range(5):
        y = ymax * i / 4
        parts.append(
            f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end" font-size="11">{y:,.{0 if ymax >= 10 else 2}f}</text>'
        )
        parts.append(f'<line x1="{left}" y1="{sy(y):.1f}" x2="{w - right}" y2="{sy(y):.1f}" stroke="#ddd"/>')
    for k, (name, s) in enumerate(series.items()):
        color = colors[k % len(colors)]
        good = [(x, y) for x, y in s if y is not None]
        path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(y):.1f}" for i, (x, y) in enumerate(good))
        parts.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in good:
            parts.append(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3.5" fill="{color}"><title>c={x}: {y:,.1f}</title></circle>'
            )
        lx = left + 10 + min(130, (w - left - right) // max(len(series), 1)) * k  # a row above the plot area
        parts.append(f'<rect x="{lx}" y="{top - 16}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{lx + 14}" y="{top - 7}" font-size="12" fill="{color}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _per_task(runs: list[dict[str, Any]]) -> str:
    """B9: each sub-operation kind inside the mix, per level (the suite's per-task table), and its p99."""
    rows: list[str] = []
    series: dict[str, list[tuple[int, float]]] = {}
    for r in runs:
        extra = r.get("extra") or {}
        mix = extra.get("task_mix") or {}
        for task, st in (r["latency_ms"].get("per_task") or {}).items():
            rows.append(
                f"<tr><td>{task}</td><td>{r['concurrency']}</td><td>{fmt(mix.get(task), 2)}</td>"
                f"<td>{fmt(st.get('ops'), 0)}</td><td>{fmt(st.get('p50'))}</td><td>{fmt(st.get('p95'))}</td>"
                f"<td>{fmt(st.get('p99'))}</td><td>{fmt(st.get('mean'))}</td><td>{fmt(st.get('max'))}</td></tr>"
            )
            if st.get("p99") is not None:
                series.setdefault(task, []).append((r["concurrency"], float(st["p99"])))
    avg = ", ".join(
        f"c={r['concurrency']}: {fmt((r.get('extra') or {}).get('avg_steps_per_rollout'), 2)}" for r in runs
    )
    return (
        f"<h3>B9 per task (avg steps/rollout {html.escape(avg)})</h3>"
        "<table><thead><tr><th>Task</th><th>Concurrency</th><th>Weight</th><th>Ops</th><th>p50 ms</th>"
        "<th>p95 ms</th><th>p99 ms</th><th>Mean ms</th><th>Max ms</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
        f"<div class='plots'>{plot('B9 p99 per task', series, 'ms')}</div>"
    )


def _interference(doc: dict[str, Any] | None) -> str:
    """What mixing cost in this run (``interference.py``): p99 in B9 vs alone, throughput vs prediction."""
    if not doc:
        return ""
    rows = []
    for lv in doc["levels"]:
        for task, e in lv["tasks"].items():
            rows.append(
                f"<tr><td>{task}</td><td>{lv['concurrency']}</td><td>{fmt(lv.get('cpu_util'))}</td><td>{fmt(e.get('p99_in_b9_ms'))}</td>"
                f"<td>{fmt(e.get('standalone_p99_ms'))}</td><td>{fmt(e.get('standalone_concurrency'))}</td>"
                f"<td>{fmt(e.get('standalone_cpu_util'))}</td><td>{fmt(e.get('p99_ratio'), 2)}</td></tr>"
            )
    levels = "".join(
        f"<tr><td>B9</td><td>{lv['concurrency']}</td><td>{fmt(lv.get('sub_ops_per_sec'), 2)}</td>"
        f"<td>{fmt(lv.get('predicted_sub_ops_per_sec_at_b9_cpu'), 2)}</td><td>{fmt(lv.get('throughput_vs_prediction_at_b9_cpu'), 3)}</td>"
        f"<td>{fmt(lv.get('predicted_sub_ops_per_sec_at_capacity'), 2)}</td><td>{fmt(lv.get('throughput_vs_prediction_at_capacity'), 3)}</td></tr>"
        for lv in doc["levels"]
    )
    v = doc.get("verdict") or {}
    verdict = (
        f"<p>At c={v['at_concurrency']}: throughput loss {v['throughput_loss']:.1%} (limit 10%), worst p99 ratio "
        f"{fmt(v['worst_p99_ratio'], 2)} ({html.escape(str(v['worst_p99_task']))}; limit 1.5).</p>"
        if v.get("judged")
        else f"<p>Not judged: {html.escape(str(v.get('why', '')))}</p>"
    )
    return (
        "<h2>Interference: B9 against its sub-operations alone</h2>"
        "<p class='meta'>Standalone p99 at the level whose host CPU load is closest to the B9 level's; prediction from "
        "each kind's server CPU per unit at its best standalone level, weighted by the mix B9 ran.</p>"
        "<table><thead><tr><th>Task</th><th>B9 concurrency</th><th>B9 CPU %</th><th>p99 in B9 ms</th><th>p99 alone ms</th>"
        "<th>Alone at c</th><th>Alone CPU %</th><th>Ratio</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
        "<table><thead><tr><th>Workload</th><th>Concurrency</th><th>Sub-ops/s</th><th>Predicted at B9's CPU</th><th>Ratio</th>"
        "<th>Predicted at capacity</th><th>Ratio</th></tr></thead>"
        f"<tbody>{levels}</tbody></table>{verdict}"
    )


def render(doc: dict[str, Any]) -> str:
    inst = doc["instance"]
    cfg = doc["config"]
    rows = []
    plots = []
    for bench, runs in doc["benchmarks"].items():
        for r in runs:
            tput = _primary(r)[0]
            extra = r.get("extra") or {}
            note = ""
            if bench == "B1":
                note = f"pass rate {fmt(extra.get('pass_rate'), 4)}, client {fmt(r['resource'].get('client_cpu_cores'), 2)} cores"
            if bench == "B8" and extra.get("warm_pool_disabled"):
                cold = extra["warm_pool_disabled"]["latency_ms"]
                note = f"warm pool off: p50 {fmt(cold.get('p50'))} / p99 {fmt(cold.get('p99'))} ms"
            if extra.get("per_target"):
                note += "; " + ", ".join(
                    f"{url}: {fmt(t['ops_per_sec'])} ops/s, p99 {fmt(t['latency_ms'].get('p99'))} ms"
                    for url, t in extra["per_target"].items()
                )
            if r.get("failed"):
                note = f"FAILED: {r['failed']}" + (f"; {note}" if note else "")
            lat = r["latency_ms"]
            rows.append(
                "<tr>"
                f"<td>{bench} {TITLES.get(bench, '')}</td><td>{r['concurrency']}</td>"
                f"<td>{fmt(tput)} {UNITS.get(bench, '')}</td><td>{fmt(lat.get('p50'))}</td><td>{fmt(lat.get('p95'))}</td>"
                f"<td>{fmt(lat.get('p99'))}</td><td>{fmt(lat.get('errors'), 0)}</td>"
                f"<td>{fmt(r['resource'].get('cpu_util_avg'))}</td><td>{fmt(r['resource'].get('mem_peak_gb'), 2)}</td>"
                f"<td>{fmt((r.get('cost') or {}).get('cost_per_1k_units_usd'), 5)}</td><td>{html.escape(note)}</td></tr>"
            )
        pts_t = [(r["concurrency"], _primary(r)[0]) for r in runs]
        pts_p = [(r["concurrency"], _primary(r)[1]) for r in runs]
        series_p = {"p99": pts_p, "p50": [(r["concurrency"], r["latency_ms"].get("p50")) for r in runs]}
        if bench == "B8":
            series_p["p99, warm pool off"] = [
                (r["concurrency"], ((r["extra"].get("warm_pool_disabled") or {}).get("latency_ms") or {}).get("p99"))
                for r in runs
            ]
        per_task = _per_task(runs) if bench == "B9" else ""
        plots.append(
            f"<h2>{bench} {TITLES.get(bench, '')}</h2><div class='plots'>"
            + plot(f"{bench} throughput", {UNITS.get(bench, "ops/s"): pts_t}, UNITS.get(bench, "ops/s"))
            + plot(f"{bench} latency", series_p, "ms")
            + "</div>"
            + per_task
        )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sandboxd bench — {html.escape(inst["instance_type"])}</title>
<style>{STYLE}</style></head><body>
<h1>sandboxd bench</h1>
<p class="meta">Generated {html.escape(doc["generated_at"])} on {html.escape(inst["instance_type"])}
({html.escape(inst["arch"])}, {inst["vcpus"]} vCPU, {html.escape(inst["cpu_model"])}, {inst.get("mem_gb")} GiB).
Preset {html.escape(str(cfg["preset"]))}: warm-up {cfg["warmup_sec"]} s, measured {cfg["duration_sec"]} s per level,
target {html.escape(str(cfg["target"]))}. Latencies are client-side, from raw samples.</p>
<table><thead><tr><th>Benchmark</th><th>Concurrency</th><th>Throughput</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th>
<th>Errors</th><th>CPU avg %</th><th>Mem peak GB</th><th>$/1k units<br><small>(needs --instance-type)</small></th><th>Notes</th></tr></thead>
<tbody>{"".join(rows)}</tbody></table>
{"".join(plots)}
{_interference(doc.get("interference"))}
</body></html>
"""
