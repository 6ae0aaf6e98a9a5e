"""Fleet sizing across machines, the comparison report in real Chromium, results through a real S3 server.

The result sets are fixtures shaped exactly as ``sandboxd bench`` writes them
(the slow smoke test in test_bench.py checks that shape on a real run), for
two machines of different architectures; the S3 server is moto's server mode
on a loopback port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandboxd.bench import fleet_report, interference, pricing, report, results, s3, size
from sandboxd.localnode import free_port
from tests.conftest import make_bucket

TABLE = pricing.load()
WORKLOAD_KEYS = {"B1": "executions_per_sec", "B9": "rollouts_per_sec"}


def _run(wl: str, inst: dict[str, Any], c: int, tput: float, p99: float, errors: int = 0) -> dict[str, Any]:
    count = int(tput * 20)
    return {
        "benchmark": wl,
        "instance": inst,
        "concurrency": c,
        "duration_sec": 20.0,
        "throughput": {WORKLOAD_KEYS[wl]: tput, "total_ops": count},
        "latency_ms": {"count": count, "errors": errors, "p50": p99 / 3, "p95": p99 / 1.5, "p99": p99},
        "resource": {"cpu_util_avg": 90.0, "client_cpu_cores": 0.5, "host_ncpu": inst["vcpus"]},
        "extra": {},
    }


def _machine(root: Path, itype: str, arch: str, b1: list[tuple[int, float, float]], b9: list[tuple[int, float, float]],
             generated_at: str = "2026-12-01T10:00:00+0000") -> Path:  # fmt: skip
    inst = {"instance_type": itype, "arch": arch, "vcpus": 16, "cpu_model": f"cpu of {itype}"}
    doc = {
        "generated_at": generated_at,
        "instance": inst,
        "config": {"preset": "quick"},
        "benchmarks": {
            "B1": [_run("B1", inst, c, t, p) for c, t, p in b1],
            "B9": [_run("B9", inst, c, t, p) for c, t, p in b9],
        },
    }
    run_dir = root / arch / f"{itype}_{generated_at[:10]}"
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps(doc))
    (run_dir / "report.html").write_text("<html>per-run report</html>")
    return run_dir


@pytest.fixture
def two_machines(tmp_path: Path) -> tuple[Path, Path]:
    intel = _machine(tmp_path / "intel", "m7i.4xlarge", "x86_64", [(8, 300.0, 90.0), (32, 400.0, 400.0)],
                     [(64, 2.0, 40_000.0), (256, 3.0, 90_000.0)])  # fmt: skip
    graviton = _machine(tmp_path / "graviton", "m8g.4xlarge", "aarch64", [(8, 330.0, 80.0), (32, 480.0, 350.0)],
                        [(64, 2.6, 35_000.0), (256, 3.6, 80_000.0)])  # fmt: skip
    return intel.parent.parent, graviton.parent.parent


def test_size_prices_each_type_from_the_right_machine(two_machines: tuple[Path, Path]) -> None:
    machines = results.load([str(d) for d in two_machines])
    assert {m.machine.instance_type for m in machines} == {"m7i.4xlarge", "m8g.4xlarge"}
    fleet = size.plan(machines, 50.0, 60_000.0, reference="m7i")
    rows = {(r.workload, r.instance_type): r for r in fleet.rows}

    # B9 at p99 <= 60 s: c=64 on both (c=256 is over the limit).
    m7i, m8g = rows["B9", "m7i.4xlarge"], rows["B9", "m8g.4xlarge"]
    assert (m7i.basis, m8g.basis) == ("measured", "measured")
    assert m7i.units_per_s_per_instance == 2.0 and "c=64" in m7i.measured_on and "m7i.4xlarge" in m7i.measured_on
    assert m7i.usd_per_1m_units == pytest.approx(0.8064 * 1e6 / (3600 * 2.0), rel=1e-4)
    assert m7i.instances == 25 and m7i.vs_reference == 0.0
    assert m8g.usd_per_1m_units == pytest.approx(0.71808 * 1e6 / (3600 * 2.6), rel=1e-4)
    assert m8g.vs_reference == pytest.approx((0.71808 / 2.6) / (0.8064 / 2.0) - 1, abs=1e-3)  # about -32%
    assert m8g.vs_reference is not None and m8g.vs_reference < -0.3

    # Same family, other size: scaled per vCPU. Other family, same arch: extrapolated from that arch only.
    big = rows["B9", "m7i.16xlarge"]
    assert big.basis == "scaled" and big.units_per_s_per_instance == pytest.approx(8.0)
    assert big.vs_reference == 0.0  # compared with m7i of its own size
    m9g, m8i = rows["B9", "m9g.4xlarge"], rows["B9", "m8i.4xlarge"]
    assert m9g.basis == "extrapolated" and "m8g.4xlarge" in m9g.measured_on and m9g.arch == "aarch64"
    assert m8i.basis == "extrapolated" and "m7i.4xlarge" in m8i.measured_on and m8i.price_basis == "estimate"
    assert rows["B1", "c8g.4xlarge"].units_per_s_per_instance == 480.0  # m8g's best B1 level, per vCPU x 16
    assert size.best_capacity(machines[1], "B1", 100.0).concurrency == 8  # type: ignore[union-attr]
    assert not fleet.notes


def test_size_never_prices_an_unmeasured_architecture(two_machines: tuple[Path, Path]) -> None:
    fleet = size.plan(results.load([str(two_machines[0])]), 10.0, 60_000.0, workloads=["B9"])
    assert fleet.rows and all(r.arch == "x86_64" for r in fleet.rows)
    assert "aarch64 types left out (B9): no aarch64 machine measured" in fleet.notes


def test_size_honours_the_p99_target_and_the_error_share(tmp_path: Path) -> None:
    inst = "c7i.4xlarge"
    run_dir = _machine(tmp_path, inst, "x86_64", [(8, 100.0, 50.0), (32, 200.0, 80.0)], [(64, 1.0, 1000.0)])
    machines = results.load([str(tmp_path)])
    assert size.best_capacity(machines[0], "B1", 100.0).throughput == 200.0  # type: ignore[union-attr]
    assert size.best_capacity(machines[0], "B1", 60.0).throughput == 100.0  # type: ignore[union-attr]
    doc = json.loads((run_dir / "summary.json").read_text())
    doc["benchmarks"]["B1"][1]["latency_ms"]["errors"] = 100  # 2.5% of 4000: that level does not count
    doc["benchmarks"]["B9"][0]["throughput"]["rollouts_per_sec"] = float("nan")  # nor does a figure that is none
    (run_dir / "summary.json").write_text(json.dumps(doc))
    machines = results.load([str(tmp_path)])
    assert size.best_capacity(machines[0], "B1", 100.0).throughput == 100.0  # type: ignore[union-attr]
    assert size.best_capacity(machines[0], "B9", 1e9) is None
    assert size.best_capacity(machines[0], "B1", 40.0) is None
    fleet = size.plan(machines, 10.0, 40.0, workloads=["B1"])
    assert not fleet.rows and "B1: no measured level meets p99 <= 40 ms" in fleet.notes[0]


def test_the_newest_run_of_a_machine_counts(tmp_path: Path) -> None:
    """Newest by the instant, not the text: 10:30+0200 is before 09:00+0000."""
    _machine(
        tmp_path / "a", "m7i.4xlarge", "x86_64", [(8, 100.0, 50.0)], [(64, 1.0, 1000.0)], "2026-12-01T09:00:00+0000"
    )
    _machine(
        tmp_path / "b", "m7i.4xlarge", "x86_64", [(8, 150.0, 50.0)], [(64, 1.5, 1000.0)], "2026-12-01T10:30:00+0200"
    )
    (machine,) = results.load([str(tmp_path / "a"), str(tmp_path / "b")])
    assert machine.runs["B1"][0]["throughput"]["executions_per_sec"] == 100.0


def test_a_machine_that_names_a_type_of_another_architecture_prices_only_its_own(tmp_path: Path) -> None:
    _machine(tmp_path, "m8g.4xlarge", "x86_64", [(8, 100.0, 50.0)], [(64, 1.0, 1000.0)])  # --instance-type typo
    fleet = size.plan(results.load([str(tmp_path)]), 10.0, 60_000.0, workloads=["B9"])
    assert fleet.rows and {r.arch for r in fleet.rows} == {"x86_64"}
    assert not any(r.basis == "measured" for r in fleet.rows)
    assert any("says it is m8g.4xlarge, an aarch64 type" in n for n in fleet.notes)


def test_the_load_window_opens_when_every_process_is_steady() -> None:
    import math
    import multiprocessing as mp
    import time

    from sandboxd.bench.loadgen import Level, Window
    from sandboxd.bench.target import Target

    ctx = mp.get_context("spawn")
    t0 = time.monotonic()
    level = Level("B1", Target.of("http://127.0.0.1:9"), 4, 0.5, 2.0, 1, {}, t0, 2)
    ready, opens = ctx.Value("i", 0), ctx.Value("d", math.inf)
    a, b = Window(ready, opens, level), Window(ready, opens, level)
    a.process_ready(t0 + 0.1)
    assert a.start == math.inf and b.stop == math.inf  # one process steady is not the level steady
    b.process_ready(t0 + 0.2)
    assert a.start == b.start == t0 + 0.5 and b.stop == t0 + 2.5  # never before the asked warm-up
    ready2, opens2 = ctx.Value("i", 0), ctx.Value("d", math.inf)
    late = Window(ready2, opens2, level)
    late.process_ready(t0 + 0.1)
    late.process_ready(t0 + 7.0)
    assert late.start == t0 + 7.0
    capped = Window(ctx.Value("i", 0), ctx.Value("d", math.inf), level)
    capped.cap()
    assert capped.start >= t0 + 0.5 and capped.start != math.inf


def test_results_errors_name_the_location(tmp_path: Path) -> None:
    with pytest.raises(results.ResultsError, match=r"no summary\.json under"):
        results.load([str(tmp_path)])
    with pytest.raises(results.ResultsError, match="no such directory"):
        results.load([str(tmp_path / "nope")])
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "summary.json").write_text('{"benchmarks": {}}')
    with pytest.raises(results.ResultsError, match="not a sandboxd bench summary"):
        results.load([str(tmp_path / "x")])


def test_price_table_says_where_each_price_comes_from() -> None:
    fams = TABLE.families()
    assert {"m7i", "m8i", "m8g", "m9g", "c7i", "c8g"} <= set(fams)
    for it in fams.values():
        assert it.date[:4].isdigit() and it.source and it.basis in ("list", "estimate")
    assert fams["c7i"].hourly_usd == 0.714 and fams["c8g"].hourly_usd == 0.6381  # the public suite's own
    assert {"4xlarge", "16xlarge", "24xlarge"} == set(TABLE.study_sizes)


def test_size_cli_prints_json_and_explains_bad_input(two_machines: tuple[Path, Path], tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "sandboxd", "size", "--results", *map(str, two_machines)]
    out = subprocess.run([*cmd, "--json", "--workload", "B9"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["reference"] == "m7i" and {r["workload"] for r in doc["rows"]} == {"B9"}
    text = subprocess.run([*cmd, "--p99-ms", "60000"], capture_output=True, text=True, timeout=60)
    assert "B9 Concurrent-Rollout" in text.stdout and "extrapolated" in text.stdout and "vs m7i" in text.stdout
    bad = subprocess.run([*cmd, "--workload", "B42"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown workloads ['B42']" in bad.stderr
    missing = subprocess.run([*cmd[:-2], str(tmp_path / "none")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no such directory" in missing.stderr


def test_interference_compares_b9_with_the_workloads_alone() -> None:
    inst = {"instance_type": "m7i.large", "arch": "x86_64", "vcpus": 2}

    def alone(wl: str, c: int, ops: float, util: float, p99: float) -> dict[str, Any]:
        return {
            "benchmark": wl,
            "instance": inst,
            "concurrency": c,
            "throughput": {"x": ops},
            "latency_ms": {"p99": p99},
            "resource": {"cpu_util_avg": util, "client_cpu_cores": 0.0, "host_ncpu": 2},
            "extra": {"ops_per_sec": ops},
        }

    # B1: 1 CPU-s per 100 ops at its best level (2 cores busy, 200 ops/s); B3: 2 cores at 400 ops/s.
    bench = {
        "B1": [alone("B1", 1, 50.0, 50.0, 10.0), alone("B1", 8, 200.0, 100.0, 40.0)],
        "B3": [alone("B3", 1, 100.0, 50.0, 20.0), alone("B3", 8, 400.0, 100.0, 60.0)],
        "B9": [
            {
                "benchmark": "B9",
                "instance": inst,
                "concurrency": 8,
                "throughput": {"rollouts_per_sec": 10.0, "steps_per_sec": 200.0},
                "latency_ms": {
                    "per_task": {"B1": {"ops": 500, "p99": 80.0}, "B3": {"ops": 500, "p99": 66.0}},
                },
                "resource": {"cpu_util_avg": 95.0, "client_cpu_cores": 0.0, "host_ncpu": 2},
                "extra": {"avg_steps_per_rollout": 20.0},
            }
        ],
    }
    doc = interference.analyse(bench)
    assert doc is not None
    (lv,) = doc["levels"]
    assert lv["tasks"]["B1"]["standalone_concurrency"] == 8 and lv["tasks"]["B1"]["p99_ratio"] == 2.0
    assert lv["tasks"]["B3"]["p99_ratio"] == 1.1
    # Mix cost: (0.01 + 0.005) / 2 = 0.0075 CPU-s per sub-op; 2 cores -> 266.67 sub-ops/s predicted.
    assert lv["cpu_s_per_sub_op_predicted"] == 0.0075
    assert lv["predicted_sub_ops_per_sec_at_capacity"] == pytest.approx(266.67, abs=0.01)
    assert lv["throughput_vs_prediction_at_capacity"] == pytest.approx(0.75, abs=1e-3)
    v = doc["verdict"]
    assert v["throughput_loss"] == 0.25 and not v["throughput_ok"]
    assert v["worst_p99_task"] == "B1" and not v["p99_ok"]
    assert any("x2.0" in line for line in interference.lines(doc))
    assert interference.analyse({"B1": bench["B1"]}) is None
    missing = interference.analyse({"B1": bench["B1"], "B9": bench["B9"]})
    assert missing is not None and missing["levels"][0]["missing"] == ["B3"] and not missing["verdict"]["judged"]


# ---- the HTML reports, rendered by real Chromium --------------------------------------------------------------


def _chromium() -> str:
    """The Chromium the browser runner drives (Debian's headless shell, which scripts/setup.sh installs)."""
    from sandboxd.runners.browser.config import BrowserRunnerConfig

    path = BrowserRunnerConfig().chromium_path
    if not os.path.exists(path):
        pytest.fail(f"{path} is not installed (scripts/setup.sh installs it): the reports cannot be rendered")
    return path


async def _render(html_text: str, tmp_path: Path) -> Any:
    """Open the page from a file in headless Chromium; return (page facts, every request it made)."""
    from playwright.async_api import async_playwright

    page_file = tmp_path / "page.html"
    page_file.write_text(html_text)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=_chromium(), args=["--disable-gpu"])
        try:
            page = await browser.new_page()
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            await page.goto(page_file.as_uri())
            facts = await page.evaluate(
                """() => ({
                    title: document.title,
                    tables: [...document.querySelectorAll('table')].map(t => ({
                        id: t.id, cls: t.className, rows: t.tBodies[0] ? t.tBodies[0].rows.length : 0,
                        text: t.innerText})),
                    svgs: [...document.querySelectorAll('svg')].map(s => ({
                        label: s.getAttribute('aria-label'), paths: s.querySelectorAll('path').length,
                        circles: s.querySelectorAll('circle').length, bars: s.querySelectorAll('rect.bar').length,
                        width: s.getBoundingClientRect().width})),
                    text: document.body.innerText,
                })"""
            )
            shot = await page.screenshot(full_page=True)
        finally:
            await browser.close()
    return facts, requests, shot


@pytest.mark.browser
async def test_fleet_report_renders_in_chromium(two_machines: tuple[Path, Path], tmp_path: Path) -> None:
    locations = [str(d) for d in two_machines]
    machines = results.load(locations)
    fleet = size.plan(machines, 50.0, 60_000.0)
    facts, requests, shot = await _render(fleet_report.render(machines, fleet, TABLE, locations), tmp_path)
    assert requests == [(tmp_path / "page.html").as_uri()]  # self-contained: nothing fetched
    assert len(shot) > 10_000
    tables = {t["id"] or t["cls"]: t for t in facts["tables"]}
    assert tables["machines"]["rows"] == 2 and "m8g.4xlarge" in tables["machines"]["text"]
    assert tables["prices"]["rows"] == len(TABLE.families())
    assert "2025-06-01" in tables["prices"]["text"] and "estimate" in tables["prices"]["text"]
    sizing = [t for t in facts["tables"] if t["cls"] == "sizing"]
    assert len(sizing) == 2  # B9 and B1
    svgs = {s["label"]: s for s in facts["svgs"]}
    b9_rows = [r for r in fleet.rows if r.workload == "B9"]
    assert svgs["B9: $ per 1M rollouts by instance type"]["bars"] == len(b9_rows) > 6
    for label in ("B9 throughput per machine", "B9 p99 per machine", "B1 throughput per machine"):
        assert svgs[label]["paths"] == 2 and svgs[label]["circles"] == 4 and svgs[label]["width"] > 300, label
    assert facts["text"].index("B9 Concurrent-Rollout") < facts["text"].index("B1 CodeExec")  # the headline first
    assert "-32%" in facts["text"] or "-32.0%" in facts["text"]  # m8g against m7i on B9


@pytest.mark.browser
async def test_run_report_shows_interference_in_chromium(tmp_path: Path) -> None:
    inst = {"instance_type": "m7i.large", "arch": "x86_64", "vcpus": 2, "cpu_model": "x", "mem_gb": 8}
    b9 = _run("B9", inst, 8, 1.5, 20_000.0)
    b9["latency_ms"]["per_task"] = {"B1": {"ops": 10, "p50": 5.0, "p95": 9.0, "p99": 12.0, "mean": 6.0, "max": 13.0}}
    b9["extra"] = {"task_mix": {"B1": 0.2}, "avg_steps_per_rollout": 20.0}
    b9["cost"] = {}
    b1 = _run("B1", inst, 8, 100.0, 10.0)
    b1["cost"] = {}
    benchmarks = {"B1": [b1], "B9": [b9]}
    doc = {
        "generated_at": "2026-12-03T00:00:00",
        "instance": inst,
        "config": {"preset": "quick", "warmup_sec": 1, "duration_sec": 2, "target": "embedded"},
        "benchmarks": benchmarks,
        "interference": interference.analyse(benchmarks),
    }
    facts, requests, _ = await _render(report.render(doc), tmp_path)
    assert len(requests) == 1
    assert "Interference: B9 against its sub-operations alone" in facts["text"]
    ratios = [t for t in facts["tables"] if "p99 in B9" in t["text"]]
    assert ratios and ratios[0]["rows"] == 1 and "1.20" in ratios[0]["text"]


# ---- S3: a real S3-compatible server (moto's server mode) on loopback ------------------------------------------


def test_upload_and_read_back_through_s3(two_machines: tuple[Path, Path], s3_endpoint: str, tmp_path: Path) -> None:
    page = tmp_path / "fleet.html"
    make_bucket(s3_endpoint, "fleet")
    for root in two_machines:
        (run_dir,) = [p.parent for p in root.rglob("summary.json")]
        urls = s3.upload_run(run_dir, root, "s3://fleet/cmp/2026-12/", s3_endpoint)
        assert sorted(u.rsplit("/", 1)[-1] for u in urls) == ["report.html", "summary.json"]
        assert all(u.startswith("s3://fleet/cmp/2026-12/") for u in urls)
    machines = results.load(["s3://fleet/cmp/2026-12"], s3_endpoint)
    assert {m.machine.instance_type for m in machines} == {"m7i.4xlarge", "m8g.4xlarge"}
    assert all(src.startswith("s3://fleet/cmp/2026-12/") for m in machines for src in m.sources.values())
    local = size.plan(results.load([str(d) for d in two_machines]), 50.0, 60_000.0)
    remote = size.plan(machines, 50.0, 60_000.0)
    assert [(r.instance_type, r.usd_per_1m_units) for r in remote.rows] == [
        (r.instance_type, r.usd_per_1m_units) for r in local.rows
    ]
    # One prefix read by the CLI, with the endpoint from AWS_ENDPOINT_URL as botocore reads it.
    env = {**os.environ, "AWS_ENDPOINT_URL": s3_endpoint}
    out = subprocess.run(
        [sys.executable, "-m", "sandboxd", "report", "--results", "s3://fleet/cmp", "--out", str(page)],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert page.read_text().count("<svg") >= 6 and "s3://fleet/cmp" in page.read_text()


def test_s3_failures_are_clear_and_quick(two_machines: tuple[Path, Path], s3_endpoint: str) -> None:
    (run_dir,) = [p.parent for p in two_machines[0].rglob("summary.json")]
    with pytest.raises(s3.S3Error, match=r"upload to s3://no-such-bucket/x/ failed after 0 of 2 files: NoSuchBucket"):
        s3.upload_run(run_dir, two_machines[0], "s3://no-such-bucket/x", s3_endpoint)
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(s3.S3Error, match=r"EndpointConnectionError|Could not connect"):
        s3.upload_run(run_dir, two_machines[0], "s3://fleet/x", dead)
    assert (run_dir / "summary.json").exists()  # nothing local is touched
    make_bucket(s3_endpoint, "empty")
    with pytest.raises(results.ResultsError, match=r"no summary.json under s3://empty/nothing/"):
        results.load(["s3://empty/nothing"], s3_endpoint)
    with pytest.raises(s3.S3Error, match=r"s3://no-such-bucket is not usable: (404|NoSuchBucket)"):
        s3.check("s3://no-such-bucket/x", s3_endpoint)
    with pytest.raises(s3.S3Error, match="s3://checked is not reachable: ValueError"):
        s3.check("s3://checked/x", "localhost:9000")  # no scheme
    make_bucket(s3_endpoint, "checked")
    assert s3.check("s3://checked/x", s3_endpoint) is None
    for bad in ("s3://", "http://x/y", "s3:///key"):
        with pytest.raises(s3.S3Error, match="expected s3://bucket/prefix"):
            s3.Location.parse(bad)
    bench = subprocess.run(
        [sys.executable, "-m", "sandboxd", "bench", "B1", "--upload", "s3:/typo"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bench.returncode == 2 and "--upload" in bench.stderr and "not an s3:// URL" in bench.stderr
    bench = subprocess.run(
        [sys.executable, "-m", "sandboxd", "bench", "B1", "--upload", "s3://nope/x", "--s3-endpoint-url", s3_endpoint],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bench.returncode == 2 and "s3://nope is not usable" in bench.stderr  # before any benchmarking


def test_sizing_never_extrapolates_a_node_past_what_its_front_processes_carry() -> None:
    """A 2-vCPU node carried 2,000 light steps/s (1,000 per vCPU) with 0.1 ms of front CPU each: per-vCPU
    scaling would give a 64-vCPU node 64,000/s, but its default front processes carry 80,000/s only if
    there are 8 of them; with fewer, they are the bound, and the row says so."""
    from sandboxd.bench.results import Machine
    from sandboxd.bench.size import Capacity, ceiling
    from sandboxd.config import VCPUS_PER_FRONT

    m = Machine("m7i.large", "x86_64", 2, "test")
    light = Capacity(m, "B3", 32, 2000.0, 50.0, "here", front_ms_per_unit=0.1)
    fronts = -(-64 // VCPUS_PER_FRONT)
    units, bound = ceiling(light, 64)
    assert units == min(64_000.0, fronts * 10_000.0)
    assert bound == ("vcpus" if fronts * 10_000 >= 64_000 else f"fronts {fronts} x 10000/s")
    heavy_front = Capacity(m, "B3", 32, 2000.0, 50.0, "here", front_ms_per_unit=2.0)  # 500/s per front
    units, bound = ceiling(heavy_front, 64)
    assert units == fronts * 500.0 and bound == f"fronts {fronts} x 500/s"
    assert ceiling(Capacity(m, "B3", 32, 2000.0, 50.0, "here"), 64) == (64_000.0, "front unmeasured")
