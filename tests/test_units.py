"""Unit tests of the pure parts: seccomp program, cgroup files, errors, settings, cache."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
from pydantic import ValidationError

from runners.python.cgroups import CgroupGroup
from runners.python.jail import build_config, kafel_policy
from runners.python.jailside import seccomp, wire
from runners.python.models import PythonAction
from sandboxd import errors
from sandboxd.config import PythonRunnerConfig, Settings
from sandboxd.idempotency import IdempotencyCache


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_seccomp_program_shape(machine: str) -> None:
    prog = seccomp.build_filter(machine)
    assert len(prog) % 8 == 0 and len(prog) // 8 < 255
    insns = [struct.unpack("=HBBI", prog[i : i + 8]) for i in range(0, len(prog), 8)]
    # first: load arch, compare, kill on mismatch
    assert insns[0] == (0x20, 0, 0, 4)
    assert insns[2][3] == 0x80000000
    # every jump stays inside the program
    for i, (code, jt, jf, _) in enumerate(insns):
        if code & 0x07 == 0x05:
            assert i + 1 + max(jt, jf) < len(insns)
    assert insns[-1][3] == 0x7FFF0000  # default allow


def test_wire_round_trip() -> None:
    frame = wire.encode({"a": 1}, b"body")
    head_len, body_len = wire.decode_prefix(frame[:8])
    assert frame[8 : 8 + head_len] == b'{"a":1}' and frame[8 + head_len :] == b"body" and body_len == 4
    with pytest.raises(wire.WireError):
        wire.decode_prefix(wire.PREFIX.pack(wire.MAX_HEADER_BYTES + 1, 0))


def test_cgroup_v2_files(tmp_path: Path) -> None:
    g = CgroupGroup({"unified": tmp_path}, 2)
    g.set_limits(64 << 20, 32)
    assert (tmp_path / "memory.max").read_text() == str(64 << 20)
    assert (tmp_path / "pids.max").read_text() == "32"
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (tmp_path / "pids.events").write_text("max 7\n")
    c = g.counters()
    assert (c.oom_kills, c.pids_max_hits) == (1, 7)


def test_cgroup_v1_counters(tmp_path: Path) -> None:
    mem, pids = tmp_path / "memory", tmp_path / "pids"
    mem.mkdir()
    pids.mkdir()
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (pids / "pids.events").write_text("max 5\n")
    g = CgroupGroup({"memory": mem, "pids": pids}, 1)
    assert g.counters().oom_kills == 2 and g.counters().pids_max_hits == 5


def test_jail_config_hides_host_paths() -> None:
    cfg = build_config(PythonRunnerConfig())
    dsts = {m.dst for m in cfg.mount}
    assert {"/usr", "/tmp", "/proc", "/dev/null"} <= dsts
    assert not dsts & {"/run", "/var", "/root", "/home", "/sys"}
    assert cfg.clone_newnet and cfg.clone_newuser and cfg.clone_newpid and cfg.clone_newipc
    assert cfg.time_limit == 0 and cfg.nice_level == 0
    assert "ptrace" in kafel_policy() and "DEFAULT ALLOW" in kafel_policy()


def test_error_tree_statuses_and_blame() -> None:
    assert errors.Saturated("x", 1.0).status == 429
    assert errors.DeadlineExceeded("x").status == 504 and errors.DeadlineExceeded.blame == "infra"
    assert errors.UnknownSession("x").status == 404 and errors.UnknownSession.blame == "client"
    assert isinstance(errors.from_dict(errors.WorkerDied("gone").to_dict()), errors.WorkerDied)


def test_settings_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOXD_PYTHON__SLOTS_PER_WORKER", "7")
    assert Settings().python.slots_per_worker == 7
    with pytest.raises(ValidationError):
        Settings(runners=["nope"])
    with pytest.raises(ValidationError):
        Settings(default_timeout_s=500, max_timeout_s=10)


def test_python_action_paths() -> None:
    PythonAction(code="1", files={"a/b.txt": "x"})
    for bad in ("/etc/x", "../x", "a/../../x", ""):
        with pytest.raises(ValidationError):
            PythonAction(code="1", files={bad: "x"})


async def test_idempotency_cache_runs_once() -> None:
    cache = IdempotencyCache(ttl_s=60, max_entries=10)
    calls = 0

    async def work() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return 42

    results = await asyncio.gather(*(cache.run("k", "fp", work, keep=lambda _: True) for _ in range(5)))
    assert results == [42] * 5 and calls == 1
    with pytest.raises(errors.BadRequest):
        await cache.run("k", "other", work, keep=lambda _: True)
