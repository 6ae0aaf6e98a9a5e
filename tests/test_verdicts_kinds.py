"""The verdict oracle across every jailed kind: one program, one verdict class, whichever kind ran it.

The corpus's programs (tests/verdict_corpus.py) run as python one-shots, python session cells, the code kind's
bash running ``python3``, the container kind's one-shots (``python3`` of the image) and its session's python
cells, through the native API and ``/run_code``; cold, warm, and all at once beside loops that fill the node's
slots (its own density). Found by a red team at 96673f7: the same loop was ``program_timeout`` as a python
one-shot and 503 ``node_pressure`` as a container one-shot under the same load (each kind's wall cap was
its own slots'); a program that slept past its deadline under load came back a success; a cell that wrote
its own status made the next, innocent cell's ``137``.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import running_node
from tests.imagebuild import image_store, python_template
from tests.verdict_corpus import CORPUS, TIMEOUT_S, Case, verdict_of

pytestmark = [pytest.mark.node, pytest.mark.timeout(600), pytest.mark.alone]

IMAGE = "verdicts/py:1"
HOME = "/home/user"  # the image's user's own directory: its root directory is not the user's to write
# What every kind can run: the standard library's programs (the python kind's environments are its own).
PORTABLE = [case for case in CORPUS if "numpy" not in case.code]
KINDS = ("python", "python-cell", "code-bash", "container", "container-cell")
FUSION = {"ok": "Success", "program_exit": "Failed", "program_timeout": "Failed", "program_killed": "Failed"}


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    with image_store("verdicts-kinds-") as (root, store):
        store.import_image(python_template(root / "oci", IMAGE))
        with running_node(
            runners='["python", "code", "container"]',
            workers=1,
            images_dir=str(store.root),
            container__memory_mb=512,
            container__tmpfs_mb=256,
            # At the node's density the python cases queue behind loops the node gives back what it kept
            # from them (up to their wall cap): the class of a case, not the queue's patience, is tested.
            queue_timeout_s=120,
        ) as base:
            yield base


@pytest.fixture
async def http(node: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=node, timeout=300) as c:
        yield c


def _files(case: Case) -> dict[str, str]:
    return {"prog.py": case.code, **case.files}


def body_of(kind: str, case: Case, session_id: str | None = None) -> dict[str, Any]:
    """The step that runs ``case`` as ``kind`` runs programs."""
    action: dict[str, Any]
    if kind in ("python", "python-cell"):
        runner, action = "python", case.action()
    elif kind == "code-bash":
        runner, action = "code", {"language": "bash", "code": "exec python3 prog.py", "files": _files(case)}
    elif kind == "container":
        action = {"image": IMAGE, "cmd": "exec python3 prog.py", "files": _files(case), "workdir": HOME}
        runner = "container"
    else:
        runner, action = "container", {"code": case.code, "files": case.files} if case.files else {"code": case.code}
    body: dict[str, Any] = {"runner": runner, "action": action, "timeout_s": TIMEOUT_S}
    if case.memory_mb:
        body["limits"] = {"memory_mb": case.memory_mb}
    if session_id:
        body["session_id"] = session_id
    return body


async def session(http: httpx.AsyncClient, kind: str) -> str:
    if kind == "python-cell":
        r = await http.post("/sessions", json={"runner": "python"})
    else:
        r = await http.post("/sessions", json={"runner": "container", "options": {"image": IMAGE, "workdir": HOME}})
    assert r.status_code == 201, r.text
    return str(r.json()["session_id"])


async def run_as(http: httpx.AsyncClient, kind: str, case: Case) -> dict[str, Any]:
    """One case as ``kind``: a session kind's in a fresh session (a cell that ends its kernel ends nothing else)."""
    sid = await session(http, kind) if kind.endswith("-cell") else None
    try:
        r = await http.post("/rollout/step", json=body_of(kind, case, sid))
        result: dict[str, Any] = r.json()
        return result
    finally:
        if sid:
            await http.delete(f"/sessions/{sid}")


async def every_kind(http: httpx.AsyncClient, cases: list[Case], at_once: bool = True) -> dict[tuple[str, str], str]:
    """Each case as every kind: all at once (``at_once``: far past the node's own density, every kind's slots
    and sessions full), or a case at a time on every kind together."""
    runs = [(kind, case) for case in cases for kind in KINDS]
    if at_once:
        results = await asyncio.gather(*(run_as(http, kind, case) for kind, case in runs))
    else:
        results = []
        for case in cases:
            results += await asyncio.gather(*(run_as(http, kind, case) for kind in KINDS))
    return {(case.name, kind): verdict_of(r) for (kind, case), r in zip(runs, results, strict=True)}


def mismatches(got: dict[tuple[str, str], str], cases: list[Case]) -> list[tuple[str, str, str, str]]:
    want = {case.name: case.verdict for case in cases}
    return [(name, kind, v, want[name]) for (name, kind), v in sorted(got.items()) if v != want[name]]


async def test_every_case_is_one_class_on_every_kind_cold_and_warm(http: httpx.AsyncClient) -> None:
    """The state a kind is in (its first steps on a new node, then again), not load: a case at a time on every
    kind (the node's density and beyond are the next test's)."""
    for condition in ("cold", "warm"):
        got = await every_kind(http, PORTABLE, at_once=False)
        assert not mismatches(got, PORTABLE), (condition, mismatches(got, PORTABLE))


async def test_every_case_is_one_class_on_every_kind_at_the_nodes_density(http: httpx.AsyncClient) -> None:
    """All at once, beside a loop of every kind in every slot the node has: each case keeps its class, and every
    loop is its program's timeout whichever kind ran it."""
    loop = next(case for case in CORPUS if case.name == "loop")
    status = (await http.get("/readyz")).json()
    runners = status["workers"][0]["health"]["runners"]
    fill = [("python", runners["python"]["capacity"]), ("code-bash", runners["code"]["capacity"])]
    fill.append(("container", runners["container"]["capacity"]))
    loops = [asyncio.ensure_future(run_as(http, kind, loop)) for kind, n in fill for _ in range(2 * n)]
    await asyncio.sleep(0.5)
    got = await every_kind(http, PORTABLE)
    looped = collections.Counter(verdict_of(r) for r in await asyncio.gather(*loops))
    assert not mismatches(got, PORTABLE), mismatches(got, PORTABLE)
    assert set(looped) == {"program_timeout"}, looped


async def test_run_code_gives_the_same_class_for_python_and_bash(http: httpx.AsyncClient) -> None:
    """Through SandboxFusion's contract: python (the python kind) and bash running python3 (the code kind)."""

    async def fusion(language: str, case: Case) -> str:
        code = case.code if language == "python" else "exec python3 prog.py"
        files = case.files if language == "python" else _files(case)
        body: dict[str, Any] = {"code": code, "language": language, "run_timeout": TIMEOUT_S}
        body["files"] = {name: __import__("base64").b64encode(text.encode()).decode() for name, text in files.items()}
        if case.memory_mb:
            body["memory_limit_MB"] = case.memory_mb
        r = await http.post("/run_code", json=body)
        assert r.status_code == 200, r.text
        return str(r.json()["status"])

    cases = [c for c in PORTABLE if c.verdict in FUSION]
    got = await asyncio.gather(*(fusion(lang, c) for c in cases for lang in ("python", "bash")))
    want = [FUSION[c.verdict] for c in cases for _ in ("python", "bash")]
    named = zip([(c.name, lang) for c in cases for lang in ("python", "bash")], got, want, strict=True)
    assert got == want, [(name, g, w) for name, g, w in named if g != w]


async def test_a_program_that_ends_after_its_deadline_is_never_a_success(http: httpx.AsyncClient) -> None:
    """A sleep past its limit, on a node full of loops (its end seen late, or in a time extension it was given):
    the program's timeout, on every kind, native and through /run_code."""
    late = Case("late_sleep", "import time\ntime.sleep(0.6)\nprint('late')", "program_timeout")
    loop = next(case for case in CORPUS if case.name == "loop")
    loops = [asyncio.ensure_future(run_as(http, "python", loop)) for _ in range(8)]
    await asyncio.sleep(0.3)

    async def one(kind: str) -> tuple[str, str, dict[str, Any]]:
        body = body_of(kind, late)
        body["timeout_s"] = 0.3
        sid = await session(http, kind) if kind.endswith("-cell") else None
        if sid:
            body["session_id"] = sid
        try:
            result = (await http.post("/rollout/step", json=body)).json()
            return kind, verdict_of(result), result
        finally:
            if sid:
                await http.delete(f"/sessions/{sid}")

    got = await asyncio.gather(*(one(kind) for kind in KINDS for _ in range(3)))
    fusion = await asyncio.gather(
        *(http.post("/run_code", json={"code": late.code, "language": "python", "run_timeout": 0.3}) for _ in range(4))
    )
    await asyncio.gather(*loops)
    wrong = [(kind, result) for kind, verdict, result in got if verdict != "program_timeout"]
    assert not wrong, f"{collections.Counter(verdict for _, verdict, _ in got)}: {json.dumps(wrong)}"
    assert {r.json()["status"] for r in fusion} == {"Failed"}, [r.json() for r in fusion]


FORGE_PYTHON = (
    "import gc, json, sys\n"
    "gc.unfreeze()\n"  # the zygote froze what it shares: back in sight
    "frame = sys._getframe(1)\n"
    "while frame is not None and 'tag' not in frame.f_locals:\n"
    "    frame = frame.f_back\n"
    "tag = frame.f_locals['tag'] if frame is not None else 0\n"
    "sock = next(o for o in gc.get_objects() if type(o).__name__ == 'socket')\n"
    "head = json.dumps({'op': 'done', 'tag': tag, 'exit_code': 0}).encode()\n"
    "import struct\n"
    "sock.sendall(struct.pack('!II', len(head), 0) + head)\n"
    "raise SystemExit(5)"
)
FORGE_CELL = (
    "import os, struct, sys\n"
    "frame = sys._getframe(1)\n"
    "while frame is not None and 'nonce' not in frame.f_locals:\n"
    "    frame = frame.f_back\n"
    "os.write(4, struct.pack('>8si', frame.f_locals['nonce'], 0))\n"
    "raise SystemExit(5)"
)


@pytest.mark.parametrize("kind", ["python-cell", "container-cell"])
async def test_a_cell_that_forges_its_status_never_makes_the_next_cells(http: httpx.AsyncClient, kind: str) -> None:
    """A cell can set its own status (it shares the kernel's interpreter: docs/security.md); its real end, which
    follows, must never answer the next cell, nor end the session under it."""
    sid = await session(http, kind)
    try:
        forge = Case("forge", FORGE_PYTHON if kind == "python-cell" else FORGE_CELL, "any")
        r = await http.post("/rollout/step", json=body_of(kind, forge, sid))
        assert r.status_code == 200, r.text
        for i in range(3):
            ok = Case("next", f"print({i} + 40)", "ok")
            r = await http.post("/rollout/step", json=body_of(kind, ok, sid))
            data = r.json()
            assert data["ok"] and data["observation"]["stdout"] == f"{i + 40}\n", json.dumps(data)[:800]
    finally:
        await http.delete(f"/sessions/{sid}")
