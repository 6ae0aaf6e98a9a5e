"""``sandboxd doctor``: say plainly what a node is missing on this host.

A check tool, not a server: it needs none of ``serve``'s settings (a pod's keys file, a public host), reads
the rest as the node would, and names each missing privilege with what to grant (a crash-looping or unready
pod is where an operator runs it: ``kubectl exec <pod> -- sandboxd doctor``).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from sandboxd.config import load_settings
from sandboxd.runners.python.config import PythonRunnerConfig

# Capabilities the node's jails need (CapEff bits): nsjail builds namespaces and mounts, cgroups are written.
NEEDED_CAPS = {21: "CAP_SYS_ADMIN", 6: "CAP_SETGID", 7: "CAP_SETUID", 1: "CAP_DAC_OVERRIDE", 23: "CAP_SYS_RESOURCE"}


def run_doctor() -> bool:
    ok = True

    def report(good: bool, what: str) -> None:
        nonlocal ok
        ok = ok and good
        print(f"[{'ok' if good else 'FAIL'}] {what}")

    try:
        # allow_insecure: ``serve``'s rule (no keys off loopback) is about serving; checking needs no key.
        settings = load_settings(allow_insecure=True)
    except ValidationError as exc:
        report(False, f"settings (SANDBOXD_*): {exc}")
        return False
    cfg = settings.runner_config("python")
    assert isinstance(cfg, PythonRunnerConfig)
    capabilities(report)
    cgroups_writable(report, Path(cfg.cgroup_mount))

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


def capabilities(report: Callable[[bool, str], None]) -> None:
    """The capabilities the process has (a container's runtime grants them: ``--privileged``, or the chart's
    list), each one the jails need named when missing."""
    eff = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            eff = int(line.split()[1], 16)
    missing = [name for bit, name in NEEDED_CAPS.items() if not eff >> bit & 1]
    report(not missing, f"capabilities: {'missing ' + ', '.join(missing) if missing else 'the jails need are held'}")


def cgroups_writable(report: Callable[[bool, str], None], mount: Path) -> None:
    """A group can be made (and removed) below the node's own in each controller a sandbox's limits use: an
    unprivileged container's cgroup tree is mounted read-only."""
    from sandboxd.runners.cgroups import V1_CONTROLLERS, _own_path, detect_version

    try:
        version = detect_version(mount)
    except Exception as exc:
        report(False, f"cgroups: {exc}")
        return
    dirs = (
        [mount / c / _own_path(c).lstrip("/") for c in V1_CONTROLLERS]
        if version == 1
        else [mount / _own_path(None).lstrip("/")]
    )
    for parent in dirs:
        probe = parent / f"sandboxd-doctor-{uuid.uuid4().hex[:8]}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            report(
                False,
                f"cgroup {parent} is not writable ({exc.strerror}): run the node with writable cgroups "
                "(a privileged container, or cgroupns=private with a writable /sys/fs/cgroup)",
            )
        else:
            report(True, f"cgroup {parent} writable")
