"""``sandboxd doctor``: say plainly what the Python runner is missing on this host."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sandboxd.config import load_settings
from sandboxd.runners.python.config import PythonRunnerConfig


def run_doctor() -> bool:
    cfg = load_settings().runner_config("python")
    assert isinstance(cfg, PythonRunnerConfig)
    ok = True

    def report(good: bool, what: str) -> None:
        nonlocal ok
        ok = ok and good
        print(f"[{'ok' if good else 'FAIL'}] {what}")

    report(os.geteuid() == 0, f"running as root (uid {os.geteuid()}): nsjail needs it to build namespaces and cgroups")
    try:
        from sandboxd.runners.jail.nsjail import nsjail_binary

        nsjail = nsjail_binary(cfg)
        proc = subprocess.run([nsjail, "--help"], capture_output=True, text=True, timeout=10)
        missing = "error while loading shared libraries" in proc.stderr
        report(not missing, f"nsjail at {nsjail} loads (needs Debian's libnl-route-3-200)")
    except Exception as exc:
        report(False, f"nsjail: {exc}")
    try:
        from sandboxd.runners.cgroups import detect_version

        version = detect_version(Path(cfg.cgroup_mount))
        report(True, f"cgroup v{version} with the memory controller under {cfg.cgroup_mount}")
    except Exception as exc:
        report(False, f"cgroups: {exc}")
    try:
        prefix = cfg.resolved_prefix()
        report(True, f"interpreter for the jail: {prefix}")
    except ValueError as exc:
        report(False, str(exc))
    from sandboxd.runners.python.environments import served

    built = served(cfg.environments_dir)
    if cfg.default_environment:
        report(
            cfg.default_environment in built,
            f"python environment {cfg.default_environment!r} built under {cfg.environments_dir} "
            f"(built: {', '.join(built) or 'none'}; `sandboxd env build {cfg.default_environment}`)",
        )
    users = Path("/proc/sys/user/max_user_namespaces")
    if users.exists():
        report(int(users.read_text()) > 0, "user namespaces allowed (user.max_user_namespaces > 0)")
    return ok
