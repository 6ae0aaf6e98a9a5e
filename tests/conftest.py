"""Shared fixtures: a real sandboxd node on a free loopback port, one per module.

The test-only ``fake`` runner kind is registered the way a third party would
register one: a distribution's ``entry_points.txt`` in the ``sandboxd.runners``
group, found on ``PYTHONPATH`` (set here for this process and every node it
starts). Production, without that path, has no ``fake`` kind.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandboxd.config import settings_model
from sandboxd.localnode import LocalRedis, free_port, local_node
from sandboxd.registry import ENTRY_POINT_GROUP, kinds
from sandboxd.runners.cgroups import CgroupGroup, _delegate_controllers, _move_into_leaf, _own_path, detect_version

REPO = Path(__file__).resolve().parent.parent
FAKE_KIND = "tests.fake_runner:KIND"


def register_test_kinds(where: Path) -> None:
    """Install the fake kind's entry point (metadata only) under ``where`` and put it on the path."""
    dist = where / "sandboxd_test_kinds-0.1.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sandboxd-test-kinds\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nfake = {FAKE_KIND}\n")
    paths = [str(where), str(REPO)]
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])
    for p in reversed(paths):
        if p not in sys.path:
            sys.path.insert(0, p)
    kinds.cache_clear()
    settings_model.cache_clear()


@pytest.fixture(scope="session", autouse=True)
def _test_kinds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    saved = os.environ.get("PYTHONPATH")
    register_test_kinds(tmp_path_factory.mktemp("kinds"))
    yield
    if saved is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SANDBOXD_"):
            monkeypatch.delenv(key)


def own_cgroup(controller: str) -> Path:
    """This process's own group of a v1 ``controller``: where a test makes a pod, a neighbour or a leftover."""
    return Path("/sys/fs/cgroup") / controller / _own_path(controller).lstrip("/")


_V2_PARENT: list[Path] = []


def _v2_parent() -> Path:
    """cgroup v2: where a test makes its groups. The tests' own group holds processes (pytest), and v2 hands
    controllers only to the children of a group that holds none: so, once, pytest's processes move into a leaf
    and the group delegates, as the node does in its pod (``CgroupRoot``)."""
    if not _V2_PARENT:
        own = Path("/sys/fs/cgroup") / _own_path(None).lstrip("/")
        if not _delegate_controllers(own):
            _move_into_leaf(own)
            _delegate_controllers(own)
        _V2_PARENT.append(own)
    return _V2_PARENT[0]


@contextlib.contextmanager
def scratch_group(name: str, controllers: tuple[str, ...] = ("memory", "pids")) -> Iterator[CgroupGroup]:
    """A group beside the tests (a pod a node runs in, a neighbour), on either cgroup version; removed after,
    with whatever still runs in it."""
    if detect_version() == 1:
        group = CgroupGroup({c: own_cgroup(c) / name for c in controllers}, 1)
    else:
        group = CgroupGroup({"unified": _v2_parent() / name}, 2)
    for d in dict.fromkeys(group.dirs.values()):
        d.mkdir(exist_ok=True)
    try:
        yield group
    finally:
        group.remove()


def set_group_limits(group: CgroupGroup, memory: int | None = None, pids: int | None = None) -> None:
    """A test group's limits; a negative one is none."""
    v1 = group.version == 1
    if memory is not None:
        path = group.dirs["memory"] / "memory.limit_in_bytes" if v1 else group.dirs["unified"] / "memory.max"
        path.write_text(str(memory) if memory >= 0 or v1 else "max")
    if pids is not None:
        (group.dirs["pids" if v1 else "unified"] / "pids.max").write_text("max" if pids < 0 else str(pids))


def group_usage(group: CgroupGroup) -> tuple[int, int]:
    """Bytes and pids a test group holds now."""
    v1 = group.version == 1
    mem = group.dirs["memory"] / "memory.usage_in_bytes" if v1 else group.dirs["unified"] / "memory.current"
    pids = group.dirs["pids" if v1 else "unified"] / "pids.current"
    return int(mem.read_text()), int(pids.read_text())


# An emulated guest (scripts/vm/guest.sh) runs a step several times slower than this host, so its test nodes
# take longer limits (worker and jail starts, compiles, browser actions): SANDBOXD_TEST_NODE_SETTINGS, space-
# separated SANDBOXD_X=value pairs every test node gets unless its test sets them, and SANDBOXD_TEST_NODE_START_S,
# how long a test waits for a node to be ready. Read at import: every test's own environment is cleaned.
SLOW_NODE_SETTINGS = dict(
    pair.split("=", 1) for pair in os.environ.get("SANDBOXD_TEST_NODE_SETTINGS", "").split() if "=" in pair
)
NODE_START_S = float(os.environ.get("SANDBOXD_TEST_NODE_START_S", "120"))


def running_node(**settings: object) -> contextlib.AbstractContextManager[str]:
    """A real node as a subprocess; keyword arguments become SANDBOXD_* settings."""
    return running_node_in((), **settings)


def running_node_in(cgroup: tuple[str, ...], **settings: object) -> contextlib.AbstractContextManager[str]:
    """``running_node`` inside a cgroup: ``cgroup`` names the ``cgroup.procs`` files it joins (a pod's limits).

    Test nodes start their templates lazily (``python.warm_templates`` false) unless a test asks for the
    default: warming every slot's template costs ~1.3 s of CPU each at every node start, minutes over the
    suite; verdicts are the same cold or warm (tests/test_verdicts.py), and tests/test_python_envs.py checks
    that a default node is warm when it says it is ready."""
    settings.setdefault("python__warm_templates", False)
    env = {
        f"SANDBOXD_{key.upper()}": value
        if isinstance(value, str)
        else str(value).lower()
        if isinstance(value, bool)
        else str(value)
        for key, value in settings.items()
    }
    env = {**SLOW_NODE_SETTINGS, **env}
    if not cgroup and detect_version() == 2:
        return _node_in_own_group(env)
    return local_node(env, timeout_s=NODE_START_S, cgroup=cgroup)


def running_container_node(images_dir: Path, **settings: object) -> contextlib.AbstractContextManager[str]:
    """``running_node`` of the container kind over a test image store: one worker, one warm slot and no burst,
    small sandboxes (256 MiB, a 128 MiB writable layer); ``settings`` add to or replace these."""
    base: dict[str, object] = {
        "runners": '["container"]',
        "workers": 1,
        "images_dir": str(images_dir),
        "container__slots_per_worker": 1,
        "container__burst_slots_per_worker": 0,
        "container__memory_mb": 256,
        "container__tmpfs_mb": 128,
    }
    return running_node(**{**base, **settings})


_NODE_GROUPS = itertools.count()


@contextlib.contextmanager
def _node_in_own_group(env: dict[str, str]) -> Iterator[str]:
    """cgroup v2: a test node in a group of its own, as a node runs in its pod or unit. Started in the tests'
    group, each node would move every process there (pytest too) one leaf deeper (``_move_into_leaf``), a
    level per node started: ``<unit>/node/node/...``."""
    with scratch_group(f"node-{os.getpid()}-{next(_NODE_GROUPS)}") as group:
        procs = tuple(str(d / "cgroup.procs") for d in dict.fromkeys(group.dirs.values()))
        with local_node(env, timeout_s=NODE_START_S, cgroup=procs) as base:
            yield base


def node_tree(node: str) -> set[int]:
    """The pids of a node's processes (its own and every descendant: fronts, workers, jails, engines, browsers):
    what a test that looks at processes looks at, never another test's node (the suite runs in parallel)."""
    import httpx

    root = int(httpx.get(f"{node}/readyz", timeout=30).json()["pid"])
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(entry.name))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo += parents.get(pid, [])
    return tree


def point_e2b_at(node: str, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The E2B SDKs' environment, as a user sets it, pointing at the node with the key."""
    monkeypatch.setenv("E2B_API_URL", node)
    monkeypatch.setenv("E2B_SANDBOX_URL", node)
    monkeypatch.setenv("E2B_API_KEY", key)


async def step_ok(
    http: httpx.AsyncClient, runner: str, action: dict[str, Any], session_id: str | None = None, **fields: object
) -> dict[str, Any]:
    """POST one step that must be answered 200 (the program may still fail); its result."""
    body: dict[str, Any] = {"runner": runner, "action": action, **fields}
    if session_id:
        body["session_id"] = session_id
    r = await http.post("/rollout/step", json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


@pytest.fixture
async def http(node: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=node, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real S3-compatible server (moto's server mode) on a loopback port, one per module.

    Credentials go through the standard AWS chain (the environment) and the
    host's own ~/.aws files are kept out, so a test never reaches real AWS.
    """
    from moto.server import ThreadedMotoServer

    aws = tmp_path_factory.mktemp("aws")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    with pytest.MonkeyPatch.context() as mp:
        for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            mp.delenv(key, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_CONFIG_FILE", str(aws / "config"))
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(aws / "credentials"))
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.stop()


def make_bucket(endpoint: str, name: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedis]:
    server = LocalRedis(str(tmp_path_factory.mktemp("redis")))
    server.start()
    try:
        yield server
    finally:
        server.kill()


# A test that cannot fail proves nothing: on the machines CI runs on (scripts/test.sh sets
# SANDBOXD_TEST_FORBID_SKIPS=1) a skipped test fails the run, so a skip that no longer matches the machine
# (a binary that moved, a package setup stopped installing) is seen instead of hiding for months. Where a
# skip is the machine's truth (cgroup v2, a kernel before 6.12, arm64 without helm), set it to 0.
_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped and os.environ.get("SANDBOXD_TEST_FORBID_SKIPS") == "1":
        print(f"\n{len(_skipped)} test(s) skipped where this machine should run them (SANDBOXD_TEST_FORBID_SKIPS=1):")
        for line in _skipped:
            print(f"  {line}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
