"""Every jailed kind of a worker owns its jails: its cgroups, its jails' config files and logs.

The kinds of one worker start at once; when python, code and container named their slots ``slot0..N`` under one
cgroup root and runtime directory, two nsjails read one ``slot0.cfg`` (whichever kind wrote it last) and one
memory group held two kinds' zygotes under one kind's limit: a node of python + container failed 8 of 14
starts. A real node of the three kinds, each with its own memory limit, so a group two kinds share shows as a
limit that is not its kind's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandboxd.runners.cgroups import detect_version
from sandboxd.runners.jail.config import SLOT_HEADROOM_BYTES
from tests.conftest import running_node
from tests.imagebuild import image_store

pytestmark = [pytest.mark.node, pytest.mark.vm]

KINDS = {"python": 384, "code": 320, "container": 256}  # each kind's memory_mb: a shared group shows


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    with image_store("jailnames-") as (root, _store):
        settings = {f"{kind}__memory_mb": mb for kind, mb in KINDS.items()}
        with running_node(
            runners='["python", "code", "container"]',
            workers=1,
            images_dir=str(root / "store"),
            container__tmpfs_mb=128,
            python__warm_templates=True,  # the failing start: templates importing while the other kinds start
            **settings,
        ) as base:
            yield base


def _nsjails() -> dict[int, Path]:
    """Every nsjail process on the host and the config file it runs."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"nsjail") and b"--config" in argv:
            out[int(proc.name)] = Path(argv[argv.index(b"--config") + 1].decode())
    return out


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


def _jail_of(pid: int, jails: dict[int, Path]) -> Path | None:
    """The config of the nsjail ``pid`` runs under (itself, or an ancestor)."""
    while pid > 1:
        if pid in jails:
            return jails[pid]
        pid = _parent(pid)
    return None


def _groups(node_id: str, pid: int) -> dict[str, Path]:
    """Worker 0's groups (the memory controller's on v1): by the name's last part, ``...-w0-<kind>``."""
    mount = Path("/sys/fs/cgroup/memory") if detect_version() == 1 else Path("/sys/fs/cgroup")
    found = {}
    for path in mount.glob(f"**/{node_id}-{pid}-w0*"):
        if path.is_dir():
            found[path.name.removeprefix(f"{node_id}-{pid}-w0").lstrip("-")] = path
    return found


def _limit(group: Path) -> int:
    for name in ("memory.limit_in_bytes", "memory.max"):
        if (group / name).exists():
            return int((group / name).read_text())
    raise AssertionError(f"no memory limit in {group}")


def _procs(group: Path) -> set[int]:
    return {int(p) for f in group.rglob("cgroup.procs") for p in f.read_text().split()}


async def test_each_jailed_kind_has_its_own_groups_configs_and_limits(node: str) -> None:
    async with httpx.AsyncClient(base_url=node, timeout=60) as http:
        ready = (await http.get("/readyz")).json()
        for kind in KINDS:  # every kind serves
            action = {"code": "print(1)"} if kind == "python" else {"language": "bash", "code": "echo 1"}
            if kind == "container":
                continue  # an empty store: its jails are up (readyz), it has no image to run
            r = await http.post("/rollout/step", json={"runner": kind, "action": action})
            assert r.status_code == 200 and r.json()["ok"], r.text
    groups = _groups(ready["node_id"], ready["pid"])
    assert set(groups) == set(KINDS), f"worker 0's groups are {sorted(groups)}: one per jailed kind, none shared"
    jails = _nsjails()
    configs = [cfg for cfg in jails.values() if cfg.parent.name.startswith(f"{ready['node_id']}-{ready['pid']}-w0")]
    assert len(configs) == len(set(configs)), "two nsjails run one config file"
    assert {cfg.parent.name.rsplit("-", 1)[1] for cfg in configs} == set(KINDS)
    for kind, group in groups.items():
        slots = sorted(p for p in group.iterdir() if p.is_dir() and p.name.startswith("slot") and "-" not in p.name)
        assert slots, f"{kind} has no one-shot slots"
        for slot in slots:
            assert _limit(slot) == (KINDS[kind] << 20) + SLOT_HEADROOM_BYTES, (kind, slot.name)
        procs = _procs(group)
        assert procs, f"nothing runs in {kind}'s groups"
        for p in procs:
            cfg = _jail_of(p, jails)
            if cfg is None:
                continue  # gone since (an executor that ended), or a kind's own helper outside a jail
            assert cfg.parent.name.endswith(f"-{kind}"), f"pid {p} in {kind}'s group runs under {cfg}"
