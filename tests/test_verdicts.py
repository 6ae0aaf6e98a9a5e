"""The verdict oracle: programs with known verdicts (tests/verdict_corpus.py) run cold, warm, on a node full
of the same tenant's programs and beside a hostile neighbour, through the native API, /run_code, OpenEnv and
the E2B SDK: every verdict class must be the same in every condition.

What it caught on 921c1ca: loops on a full node came back 503 ``node_pressure`` (masked: the policy lost its
penalty), a step's own ``calendar.py`` lost to the template's once the slot was warm (AttributeError where a
cold slot and ``python main.py`` said ok), a deep tree turned the grade step into a 500.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandboxd.runners.jail.jailside import landlock
from tests.conftest import node_tree, running_node, scratch_group
from tests.verdict_corpus import CORPUS, TIMEOUT_S, Case, verdict_of

pytestmark = [pytest.mark.node, pytest.mark.timeout(600), pytest.mark.alone]

KEY_A, KEY_B = "e2b_" + "a7" * 20, "verdicts-tenant-b-0123"
SLOTS = 4  # per worker; two workers
ENVS = Path("/usr/local/lib/sandboxd/envs/default/site")


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    # Templates start with their jail's first numpy step here, so the first steps are cold (lean) slots.
    with running_node(
        runners='["python"]',
        workers=2,
        api_keys=json.dumps([KEY_A, KEY_B]),
        python__slots_per_worker=SLOTS,
        python__warm_templates=False,
        # Up to 4x the slots, steps queue behind loops given back what the node kept from them (up to their
        # wall cap): a class is tested, not the queue's patience (30 s: a loop once came back 504 in CI).
        queue_timeout_s=120,
    ) as base:
        yield base


@contextlib.asynccontextmanager
async def tenant(node: str, key: str = KEY_A) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=node, timeout=300, headers={"authorization": f"Bearer {key}"}) as c:
        yield c


async def run(c: httpx.AsyncClient, case: Case) -> dict[str, Any]:
    body: dict[str, Any] = {"runner": "python", "action": case.action(), "timeout_s": TIMEOUT_S}
    if case.memory_mb:
        body["limits"] = {"memory_mb": case.memory_mb}
    r = await c.post("/rollout/step", json=body)
    data: dict[str, Any] = r.json()
    return data


def check(case: Case, result: dict[str, Any], condition: str) -> None:
    got = verdict_of(result)
    assert got == case.verdict, f"{case.name} ({condition}): {got}, expected {case.verdict}: {str(result)[:600]}"
    if case.stdout is not None:
        assert result["observation"]["stdout"] == case.stdout, (case.name, condition, result["observation"])


async def warm_up(c: httpx.AsyncClient) -> None:
    """Every slot's template started and ready: numpy steps on every slot until the workers report (pinged every
    2 s) that warm executors served every slot more than once."""
    for _ in range(60):
        rs = await asyncio.gather(*(c.post("/rollout/step", json={"runner": "python", "action": {"code": "import numpy"}})
                                    for _ in range(2 * SLOTS)))  # fmt: skip
        assert all(r.json()["ok"] for r in rs)
        status = (await c.get("/readyz")).json()
        warm = sum(w["health"]["runners"]["python"].get("warm_imports", 0) for w in status["workers"])
        if warm >= 4 * SLOTS:
            return
        await asyncio.sleep(0.5)
    raise AssertionError("the templates did not warm up")


async def test_every_case_cold_then_warm(node: str) -> None:
    async with tenant(node) as c:
        for case, result in zip(CORPUS, await asyncio.gather(*(run(c, case) for case in CORPUS)), strict=True):
            check(case, result, "cold")
        await warm_up(c)
        for case, result in zip(CORPUS, await asyncio.gather(*(run(c, case) for case in CORPUS)), strict=True):
            check(case, result, "warm")


async def test_every_case_on_a_node_full_of_the_same_tenants_loops(node: str) -> None:
    """A GRPO batch holds several looping programs: beside twice the node's slots of the same tenant's loops,
    each case (all at once, through the native API and through /run_code as verl sends it) keeps its verdict,
    and every loop is the program's timeout (921c1ca: 8 of 8 loops were node_pressure at 8 concurrent)."""
    async with tenant(node) as c:
        loops = [asyncio.ensure_future(run(c, CORPUS[2])) for _ in range(4 * SLOTS)]
        await asyncio.sleep(0.5)
        native = asyncio.gather(*(run(c, case) for case in CORPUS))
        fusion = asyncio.gather(*(run_code(c, case) for case in CORPUS))
        results, classes = await asyncio.gather(native, fusion)
        looped = [verdict_of(r) for r in await asyncio.gather(*loops)]
    for case, result in zip(CORPUS, results, strict=True):
        check(case, result, "saturated")
    assert set(looped) == {"program_timeout"}, collections.Counter(looped)
    want = [FUSION_OF[case.verdict] for case in CORPUS]
    assert list(classes) == want, list(zip([c.name for c in CORPUS], classes, want, strict=True))


@pytest.mark.parametrize("total", [1, 2 * SLOTS, 8 * SLOTS])
async def test_a_batch_of_loops_and_honest_programs_up_to_four_times_the_slots(node: str, total: int) -> None:
    """N looping and M honest programs at once, N+M from 1 to 4x the node's slots: every loop is the program's
    timeout, every honest program is ok, whatever the node's load."""
    loop, honest = CORPUS[2], CORPUS[-1]
    batch = [loop if i % 2 == 0 else honest for i in range(total)]
    async with tenant(node) as c:
        results = await asyncio.gather(*(run(c, case) for case in batch))
    got = collections.Counter((case.name, verdict_of(r)) for case, r in zip(batch, results, strict=True))
    want = collections.Counter((case.name, case.verdict) for case in batch)
    assert got == want, got


async def test_a_tenants_looping_sessions_beyond_the_slots_are_its_own_timeouts(node: str) -> None:
    """Session cells are not bounded by slots: three times the node's slots of one tenant's sessions looping at
    once are each the program's timeout, never the node's (a red team's 20 and 30 on 2 vCPUs: all node_pressure,
    the wall cap allowed for the slots' density only)."""
    n = 3 * 2 * SLOTS
    async with tenant(node) as c:
        made = await asyncio.gather(*(c.post("/sessions", json={"runner": "python"}) for _ in range(n)))
        ids = [r.json()["session_id"] for r in made]
        try:
            body = {"runner": "python", "action": {"code": "while True:\n    pass"}, "timeout_s": 0.5}
            results = await asyncio.gather(*(c.post("/rollout/step", json={**body, "session_id": sid}) for sid in ids))
        finally:
            await asyncio.gather(*(c.delete(f"/sessions/{sid}") for sid in ids))
    got = collections.Counter(verdict_of(r.json()) for r in results)
    assert got == {"program_timeout": n}, got


@contextlib.contextmanager
def hostile_neighbour() -> Iterator[None]:
    """Another pod on the same host: a group of its own (2 cores of CPU quota, 1 GiB) whose processes burn
    both CPUs and hold memory, started outside the node."""
    with scratch_group(f"neighbour-{os.getpid()}", ("memory", "pids", "cpu")) as group:
        group.set_limits(1 << 30, 64)
        group.set_cpu(2.0)
        burn = "import threading\nb = bytearray(400 << 20)\nwhile True: pass"
        procs = []
        try:
            for _ in range(3):
                procs.append(subprocess.Popen([sys.executable, "-c", burn]))
                group.add(procs[-1].pid)
            time.sleep(0.5)
            yield
        finally:
            for p in procs:
                p.kill()
                p.wait()


async def test_every_case_beside_a_hostile_neighbour(node: str) -> None:
    async with tenant(node, KEY_B) as c:
        with hostile_neighbour():
            results = await asyncio.gather(*(run(c, case) for case in CORPUS))
    for case, result in zip(CORPUS, results, strict=True):
        check(case, result, "hostile neighbour")


# ------------------------------------------------------------------ the same programs through the other surfaces


def fusion_class(answer: dict[str, Any]) -> str:
    """SandboxFusion's answer as a verdict class: what verl's reward reads (status, run_result)."""
    if answer["status"] == "SandboxError":
        return "infra"
    run = answer["run_result"]
    if run["status"] == "TimeLimitExceeded":
        return "program_timeout"
    return "ok" if answer["status"] == "Success" else "program_failed"


FUSION_OF = {"ok": "ok", "program_timeout": "program_timeout", "program_exit": "program_failed",
             "program_killed": "program_failed"}  # fmt: skip


async def run_code(c: httpx.AsyncClient, case: Case) -> str:
    """/run_code as verl sends it (files too); 504 (the node could not take or finish it in time) retried as
    verl retries it; the class verl scores."""
    body: dict[str, Any] = {"code": case.code, "language": "python", "run_timeout": TIMEOUT_S,
                            "compile_timeout": TIMEOUT_S, "memory_limit_MB": case.memory_mb or -1}  # fmt: skip
    if case.files:
        body["files"] = {k: base64.b64encode(v.encode()).decode() for k, v in case.files.items()}
    for _ in range(6):
        r = await c.post("/run_code", json=body)
        if r.status_code != 504:
            break
        await asyncio.sleep(1.0)
    assert r.status_code == 200, r.text
    return fusion_class(r.json())


async def test_every_case_through_run_code(node: str) -> None:
    """/run_code on a quiet node: the class verl scores is the native one's (on a full node: the saturated test)."""
    async with tenant(node) as c:
        got = await asyncio.gather(*(run_code(c, case) for case in CORPUS))
    want = [FUSION_OF[case.verdict] for case in CORPUS]
    assert list(got) == want, list(zip([c.name for c in CORPUS], got, want, strict=True))


SESSION_CASES = [c for c in CORPUS if c.name in ("right", "wrong_answer", "loop", "stdlib_named_helpers", "honest_cpu")]


async def test_session_cells_through_openenv_keep_their_verdicts(node: str) -> None:
    """OpenEnv's python environment (a session per episode): its observation's exit code and blame."""
    from tests.peers.coding_env import CodeAction, CodingEnv

    keyed = node.replace("http://", f"http://key:{KEY_A}@")  # what a client that takes only a URL is given
    with CodingEnv(base_url=f"{keyed}/envs/python").sync() as env:
        env.reset()
        for case in SESSION_CASES:
            if case.files:
                continue  # OpenEnv's coding action carries code only
            got = env.step(CodeAction(code=case.code)).observation
            if case.verdict == "ok":
                assert got.exit_code == 0, (case.name, got)
            else:
                assert got.exit_code != 0, (case.name, got)


async def test_every_case_through_the_e2b_sdk(node: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The E2B SDK as ms-swift's CodeReward drives it: a sandbox per program, ``run_code``, its error read."""
    from e2b_code_interpreter import Sandbox

    monkeypatch.setenv("E2B_API_URL", node)
    monkeypatch.setenv("E2B_SANDBOX_URL", node)
    monkeypatch.setenv("E2B_API_KEY", KEY_A)

    def one(case: Case) -> str:
        sbx = Sandbox.create()
        try:
            execution = sbx.run_code(case.code, timeout=TIMEOUT_S * 10)
            return "ok" if execution.error is None else "program_failed"
        finally:
            sbx.kill()

    cases = [c for c in CORPUS if c.name in ("right", "wrong_answer", "deep_tree", "many_files", "honest_cpu")]
    got = await asyncio.gather(*(asyncio.to_thread(one, case) for case in cases))
    want = ["ok" if c.verdict == "ok" else "program_failed" for c in cases]
    assert list(got) == want, list(zip([c.name for c in cases], got, want, strict=True))


# ------------------------------------------------------------------ the step's own modules win, cold or warm


def plain_python(name: str, with_numpy: bool) -> tuple[int, str]:
    """What ``python main.py`` of the jail's interpreter says, in a directory holding ``<name>.py``."""
    prefix = "/opt/sandboxd/python/3.12" if Path("/opt/sandboxd/python/3.12").is_dir() else sys.base_prefix
    exe = f"{prefix}/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    with tempfile.TemporaryDirectory() as d:
        Path(d, f"{name}.py").write_text("MARK = 'mine'\n")
        Path(d, "main.py").write_text(shadow_program(name, with_numpy))
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONPATH": str(ENVS), "MPLBACKEND": "Agg"}
        r = subprocess.run([exe, "main.py"], cwd=d, capture_output=True, text=True, env=env, timeout=60)
    return r.returncode, r.stdout.strip() or error_class(r.stderr)


def shadow_program(name: str, with_numpy: bool) -> str:
    return ("import numpy\n" if with_numpy else "") + f"import {name}\nprint(getattr({name}, 'MARK', 'std'))\n"


def error_class(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    return lines[-1].split(":", 1)[0] if lines else ""


def shadow_names() -> list[str]:
    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "__future__"}
    names = {n for n in sys.stdlib_module_names if not n.startswith("_") and n not in skip}
    return sorted(names | {"numpy", "pandas", "scipy", "sympy", "networkx", "matplotlib", "cycler", "dateutil"})


@pytest.mark.skipif(not ENVS.is_dir(), reason="the default environment is not built")
async def test_step_files_named_like_any_module_win_or_lose_as_under_plain_python(node: str) -> None:
    """For every standard-library and preload top-level name written as a step's file: its verdict and what
    it printed, on a lean executor and on one forked from the warm template, are what ``python main.py``
    says in a directory holding that file (921c1ca: ``calendar.py`` AttributeError once warm, ``random.py``
    and ``json.py`` lost even on the lean path)."""
    names = shadow_names()
    async with tenant(node) as c:
        await warm_up(c)

        async def ours(name: str, with_numpy: bool) -> tuple[int, str]:
            action = {"code": shadow_program(name, with_numpy), "files": {f"{name}.py": "MARK = 'mine'\n"}}
            r = (await c.post("/rollout/step", json={"runner": "python", "action": action, "timeout_s": 30})).json()
            obs = r["observation"]
            return obs["exit_code"], obs["stdout"].strip() or error_class(obs["stderr"])

        differ = []
        for with_numpy in (False, True):
            got = await asyncio.gather(*(ours(n, with_numpy) for n in names))
            want = await asyncio.gather(*(asyncio.to_thread(plain_python, n, with_numpy) for n in names))
            differ += [(n, with_numpy, g, w) for n, g, w in zip(names, got, want, strict=True) if g != w]
    assert not differ, differ[:20]


# ------------------------------------------------------------------ deep trees: grading, fork copies, cleanup


async def test_a_deep_tree_never_turns_grading_into_infra(node: str) -> None:
    """A session's 1,500-level tree and 30,000 files: the grade step still runs (200, the files that fit, the
    rest named as skipped, bounded), and the worker's answer stays small."""
    async with tenant(node) as c:
        sid = (await c.post("/sessions", json={"runner": "python"})).json()["session_id"]
        try:
            made = await c.post("/rollout/step", json={"runner": "python", "session_id": sid, "timeout_s": 30, "action": {
                "code": DEEP_AND_WIDE}})  # fmt: skip
            assert made.json()["observation"]["stdout"] == "made\n", made.text
            grade = "import os\nprint(open('answer.txt').read())"
            r = await c.post("/rollout/step", json={"runner": "python", "session_id": sid, "timeout_s": 30,
                                                    "action": {"code": grade, "grade": True}})  # fmt: skip
            assert r.status_code == 200, r.text[:500]
            body = r.json()
            assert body["ok"] and body["observation"]["stdout"] == "42\n", body
            skipped = body["observation"]["session_files_skipped"]
            assert len(skipped) <= 101 and any("more" in why for why in skipped.values()), list(skipped.items())[:5]
            assert len(r.content) < 200_000
        finally:
            await c.delete(f"/sessions/{sid}")


async def test_a_name_that_is_not_utf8_is_skipped_by_grading_and_the_session_goes_on(node: str) -> None:
    """A session's file named with bytes that are not UTF-8: the grade step answers 200 and names it as skipped
    (a red team's ``open(b'/tmp/\\xff')``: 500 infra, and the session answered 409 busy until its TTL)."""
    async with tenant(node) as c:
        sid = (await c.post("/sessions", json={"runner": "python"})).json()["session_id"]
        try:
            make = "open(b'/tmp/\\xff', 'w').write('x'); open('answer.txt', 'w').write('42')"
            made = await c.post("/rollout/step", json={"runner": "python", "session_id": sid, "action": {"code": make}})
            assert made.json()["ok"], made.text
            grade = {"code": "print(open('answer.txt').read())", "grade": True}
            r = await c.post("/rollout/step", json={"runner": "python", "session_id": sid, "action": grade})
            assert r.status_code == 200 and r.json()["ok"], r.text[:500]
            assert "not UTF-8" in str(r.json()["observation"]["session_files_skipped"]), r.json()["observation"]
            again = await c.post("/rollout/step", json={"runner": "python", "session_id": sid, "action": {"code": "1"}})
            assert again.status_code == 200 and again.json()["ok"], again.text  # not stuck busy
        finally:
            await c.delete(f"/sessions/{sid}")


DEEP_AND_WIDE = (
    "import os\nopen('answer.txt', 'w').write('42')\nos.mkdir('wide')\nfor i in range(30000):\n"
    "    open(f'wide/{i}', 'w').close()\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\nprint('made')"
)


def holders(node: str) -> list[int]:
    """The node's fork holders (never another test's node: the suite runs in parallel)."""
    out = []
    mine = node_tree(node)
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) in mine:
            with contextlib.suppress(OSError):
                if b"holder.py" in (p / "cmdline").read_bytes():
                    out.append(int(p.name))
    return out


@pytest.mark.skipif(landlock.abi() < landlock.MIN_ABI, reason="python fork needs Landlock ABI 6 (Linux 6.12)")
async def test_a_fork_copys_deep_tree_closes_cleanly_and_the_group_ends_with_its_last_member(node: str) -> None:
    """A copy that made a tree 3,000 levels deep closes with 204, its files go (a second copy of the group sees
    its tmpfs shrink), and the group's holder ends with its last member; a source deeper than a copy may be
    is refused whole with a 422 that names the bound, and stays as it was."""
    async with tenant(node) as c:
        before = len(holders(node))
        sid = (await c.post("/sessions", json={"runner": "python"})).json()["session_id"]
        r = await c.post(f"/sessions/{sid}/fork", json={"n": 2})
        assert r.status_code == 201, r.text
        copies = [s["session_id"] for s in r.json()["sessions"]]
        deep = "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')"
        r = await c.post("/rollout/step", json={"runner": "python", "session_id": copies[0], "timeout_s": 30,
                                                "action": {"code": deep}})  # fmt: skip
        assert r.json()["observation"]["stdout"] == "deep\n", r.text
        assert len(holders(node)) == before + 1
        holder = max(holders(node))
        assert len(os.listdir(f"/proc/{holder}/root/forks")) == 2
        closed = await c.delete(f"/sessions/{copies[0]}")
        assert closed.status_code == 204, closed.text
        assert len(os.listdir(f"/proc/{holder}/root/forks")) == 1  # its files are gone, at any depth
        for s in (sid, copies[1]):
            assert (await c.delete(f"/sessions/{s}")).status_code == 204
        for _ in range(50):
            if len(holders(node)) == before:
                break
            await asyncio.sleep(0.1)
        assert len(holders(node)) == before, "the group's holder outlived its last member"

        src = (await c.post("/sessions", json={"runner": "python"})).json()["session_id"]
        made: list[str] = []
        try:
            # 1,200 levels (2,400 bytes of path) fit: each copy gets the tree whole, to its leaf.
            leaf = "open('leaf', 'w').write('x')"
            await c.post("/rollout/step", json={"runner": "python", "session_id": src, "timeout_s": 30,
                                                "action": {"code": deep.replace("3000", "1200") + "\n" + leaf}})  # fmt: skip
            r = await c.post(f"/sessions/{src}/fork", json={"n": 1})
            assert r.status_code == 201, r.text
            made = [x["session_id"] for x in r.json()["sessions"]]
            walk = "import os\nos.chdir(os.environ['HOME'])\nd = 0\nwhile os.path.isdir('d'):\n    os.chdir('d')\n    d += 1\nprint(d, os.path.exists('leaf'))"
            r = await c.post(
                "/rollout/step", json={"runner": "python", "session_id": made[0], "action": {"code": walk}}
            )
            assert r.json()["observation"]["stdout"] == "1200 True\n", r.text
            # 1,700 levels pass the bound: refused whole, naming it, and the session is as it was.
            src2 = (await c.post("/sessions", json={"runner": "python"})).json()["session_id"]
            made.append(src2)
            await c.post("/rollout/step", json={"runner": "python", "session_id": src2, "timeout_s": 30,
                                                "action": {"code": deep.replace("3000", "1700")}})  # fmt: skip
            r = await c.post(f"/sessions/{src2}/fork", json={"n": 2})
            assert r.status_code == 422 and "longer than" in r.json()["error"]["message"], r.text
            still = await c.post("/rollout/step", json={"runner": "python", "session_id": src2,
                                                        "action": {"code": "import os\nprint(len(os.getcwd()) > 3000)"}})  # fmt: skip
            assert still.json()["observation"]["stdout"] == "True\n", still.text
        finally:
            for s in made:
                await c.delete(f"/sessions/{s}")
            await c.delete(f"/sessions/{src}")
