"""What mixing costs: B9's sub-operations against the same workloads run alone, in one run.

Two figures, both from results of the same ``sandboxd bench`` run (same node,
same machine, minutes apart):

- **p99 inflation** per sub-operation kind: its p99 inside B9 over its p99
  standalone at the level whose host CPU load is closest to the B9 level's
  (a B1 execution on an idle machine is not the right yardstick for one on a
  busy machine; the suite asks for "the same host CPU load").
- **throughput against prediction**: each kind's server CPU per unit (host
  cores busy minus the load generator's own, x duration / units) at its
  highest-throughput standalone level, weighted by the mix B9 actually ran,
  predicts how many sub-operations the cores B9 used should have served, and
  how many the machine can serve at all (the most cores any standalone level
  kept busy). Mixing should cost <= 10% of throughput and <= 1.5x p99.
"""

from __future__ import annotations

from typing import Any

STANDALONE = ("B1", "B3", "B4", "B5", "B7")  # B9's sub-operation kinds
P99_LIMIT = 1.5
THROUGHPUT_LOSS_LIMIT = 0.10


def _server_cores(run: dict[str, Any]) -> float | None:
    res = run.get("resource") or {}
    util, ncpu = res.get("cpu_util_avg"), int(res.get("host_ncpu") or run["instance"]["vcpus"])
    if util is None:
        return None
    return max(float(util) / 100 * ncpu - float(res.get("client_cpu_cores") or 0.0), 0.0)


def _ops_per_s(run: dict[str, Any]) -> float:
    """Requests of the workload's own unit per second (B7's op is a batch of episodes)."""
    extra = run.get("extra") or {}
    if "ops_per_sec" in extra:
        return float(extra["ops_per_sec"])
    tput = run["throughput"]
    return float(tput.get("requests_per_sec", next(iter(tput.values()))))


def _cpu_per_op(runs: list[dict[str, Any]]) -> tuple[float, dict[str, Any]] | None:
    """Server CPU-seconds per op at the highest-throughput level, and that level."""
    ok = [r for r in runs if _ops_per_s(r) > 0 and _server_cores(r) is not None]
    if not ok:
        return None
    best = max(ok, key=_ops_per_s)
    return (_server_cores(best) or 0.0) / _ops_per_s(best), best


def _closest_load(runs: list[dict[str, Any]], util: float) -> dict[str, Any] | None:
    ok = [r for r in runs if (r.get("resource") or {}).get("cpu_util_avg") is not None]
    if not ok:
        return None
    return min(ok, key=lambda r: (abs(r["resource"]["cpu_util_avg"] - util), -r["concurrency"]))


def _ratio(a: float | None, b: float | None, nd: int = 3) -> float | None:
    return round(a / b, nd) if a is not None and b else None


def analyse(benchmarks: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The interference section of summary.json, or None when the run had no B9."""
    b9_runs = benchmarks.get("B9") or []
    if not b9_runs:
        return None
    costs = {t: c for t in STANDALONE if (c := _cpu_per_op(benchmarks.get(t) or []))}
    capacity = max(  # the most server cores any standalone level kept busy: what this machine gives
        (cores for t in STANDALONE for r in benchmarks.get(t) or [] if (cores := _server_cores(r)) is not None),
        default=0.0,
    )
    levels = []
    for r9 in b9_runs:
        util9 = (r9.get("resource") or {}).get("cpu_util_avg")
        per_task = r9["latency_ms"].get("per_task") or {}
        tasks: dict[str, Any] = {}
        weighted_cost, counted = 0.0, 0
        for task, st in per_task.items():
            ops = int(st.get("ops") or 0)
            alone = _closest_load(benchmarks.get(task) or [], util9) if util9 is not None else None
            entry: dict[str, Any] = {"ops_in_b9": ops, "p99_in_b9_ms": st.get("p99")}
            if alone is not None:
                entry |= {
                    "standalone_concurrency": alone["concurrency"],
                    "standalone_cpu_util": alone["resource"]["cpu_util_avg"],
                    "standalone_p99_ms": alone["latency_ms"].get("p99"),
                    "p99_ratio": _ratio(st.get("p99"), alone["latency_ms"].get("p99")),
                }
            if task in costs:
                entry["cpu_s_per_op_standalone"] = round(costs[task][0], 5)
                weighted_cost += ops * costs[task][0]
                counted += ops
            tasks[task] = entry
        total_ops = sum(t["ops_in_b9"] for t in tasks.values())
        level: dict[str, Any] = {
            "concurrency": r9["concurrency"],
            "cpu_util": util9,
            "server_cores": _round(_server_cores(r9)),
            "rollouts_per_sec": r9["throughput"].get("rollouts_per_sec"),
            "sub_ops_per_sec": r9["throughput"].get("steps_per_sec"),
            "tasks": tasks,
        }
        if counted and counted == total_ops and weighted_cost > 0:
            cost = weighted_cost / counted  # CPU-seconds per sub-operation of this mix
            steps = (r9.get("extra") or {}).get("avg_steps_per_rollout") or 0
            at_b9_cpu = (_server_cores(r9) or 0.0) / cost
            at_capacity = capacity / cost
            actual = float(r9["throughput"].get("steps_per_sec") or 0.0)
            level |= {
                "cpu_s_per_sub_op_predicted": round(cost, 5),
                "cpu_s_per_sub_op_in_b9": _round((_server_cores(r9) or 0.0) / actual, 5) if actual else None,
                "predicted_sub_ops_per_sec_at_b9_cpu": round(at_b9_cpu, 2),
                "predicted_sub_ops_per_sec_at_capacity": round(at_capacity, 2),
                "predicted_rollouts_per_sec_at_capacity": round(at_capacity / steps, 3) if steps else None,
                "throughput_vs_prediction_at_b9_cpu": _ratio(actual, at_b9_cpu),
                "throughput_vs_prediction_at_capacity": _ratio(actual, at_capacity),
            }
        else:
            level["missing"] = sorted(t for t in tasks if t not in costs)
        levels.append(level)
    return {"capacity_server_cores": round(capacity, 3), "levels": levels, "verdict": _verdict(levels)}


def _round(v: float | None, nd: int = 3) -> float | None:
    return round(v, nd) if v is not None else None


def _verdict(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """Judged at the B9 level that served the most rollouts (saturation), the suite's limits."""
    rated = [lv for lv in levels if lv.get("throughput_vs_prediction_at_capacity") is not None]
    if not rated:
        return {"judged": False, "why": "standalone results missing for some sub-operation kinds"}
    top = max(rated, key=lambda lv: lv["rollouts_per_sec"] or 0)
    worst = max(
        ((t, e["p99_ratio"]) for t, e in top["tasks"].items() if e.get("p99_ratio") is not None),
        key=lambda te: te[1],
        default=(None, None),
    )
    loss = round(1 - top["throughput_vs_prediction_at_capacity"], 3)
    return {
        "judged": True,
        "at_concurrency": top["concurrency"],
        "throughput_loss": loss,
        "throughput_ok": loss <= THROUGHPUT_LOSS_LIMIT,
        "worst_p99_task": worst[0],
        "worst_p99_ratio": worst[1],
        "p99_ok": None if worst[1] is None else worst[1] <= P99_LIMIT,
    }


def lines(doc: dict[str, Any]) -> list[str]:
    """The figures as console lines (what the bench prints at the end)."""
    out = []
    for lv in doc["levels"]:
        head = f"B9 c={lv['concurrency']}: {lv['rollouts_per_sec']} rollouts/s, {lv['sub_ops_per_sec']} sub-ops/s"
        if "throughput_vs_prediction_at_capacity" in lv:
            head += (
                f"; predicted {lv['predicted_sub_ops_per_sec_at_capacity']} sub-ops/s at capacity"
                f" (x{lv['throughput_vs_prediction_at_capacity']}),"
                f" {lv['predicted_sub_ops_per_sec_at_b9_cpu']} at the CPU B9 used"
                f" (x{lv['throughput_vs_prediction_at_b9_cpu']})"
            )
        out.append(head)
        for task, e in lv["tasks"].items():
            if e.get("p99_ratio") is not None:
                out.append(
                    f"  {task}: p99 {e['p99_in_b9_ms']} ms in B9 vs {e['standalone_p99_ms']} ms alone"
                    f" (c={e['standalone_concurrency']}, cpu {e['standalone_cpu_util']}%): x{e['p99_ratio']}"
                )
    v = doc["verdict"]
    if v.get("judged"):
        p99_word = "not judged" if v["p99_ok"] is None else "within" if v["p99_ok"] else "over"
        out.append(
            f"mixing at c={v['at_concurrency']}: throughput loss {v['throughput_loss']:.1%}"
            f" ({'within' if v['throughput_ok'] else 'over'} the 10% limit), worst p99 x{v['worst_p99_ratio']}"
            f" ({v['worst_p99_task']}; {p99_word} the 1.5x limit)"
        )
    return out
