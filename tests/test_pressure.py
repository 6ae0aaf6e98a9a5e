"""Neighbour pressure is never blamed on the victim: a node inside a pod's memory and pids limits (a cgroup
this module makes), tenant A pressing on them, tenant B's program inside its own limits.

The kernel counts a kill or a refused fork in the victim's own cgroup whichever ancestor's limit was
reached; before the runner checked which limit it was, B's 300 MB program (own cap 512 MB) came back
``program_killed`` "killed at its memory limit" and B's four threads ``program_exit`` with
``limits_hit: ['pids']``. Now: the program's own result, or ``node_pressure`` (infra, retryable).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from sandboxd.runners.cgroups import CgroupGroup
from tests.conftest import group_usage, running_node_in, scratch_group, set_group_limits

pytestmark = [pytest.mark.node, pytest.mark.vm, pytest.mark.alone]

KEY_A, KEY_B = "pressure-tenant-a", "pressure-tenant-b"
MIB = 1 << 20


def make_pod(name: str) -> contextlib.AbstractContextManager[CgroupGroup]:
    """A pod-like group (either cgroup version): memory and pids limits set by each test, a node inside it."""
    return scratch_group(f"{name}-{os.getpid()}")


@pytest.fixture(scope="module")
def pod() -> Iterator[CgroupGroup]:
    with make_pod("pod") as group:
        yield group


@pytest.fixture(scope="module")
def node(pod: CgroupGroup) -> Iterator[str]:
    procs = tuple(str(d / "cgroup.procs") for d in dict.fromkeys(pod.dirs.values()))
    with running_node_in(
        procs,
        runners='["python"]',
        workers=1,
        api_keys=json.dumps([KEY_A, KEY_B]),
        python__slots_per_worker=2,
        python__session_jails_per_worker=1,
    ) as base:
        yield base


@contextlib.asynccontextmanager
async def tenant(node: str, key: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=node, timeout=60, headers={"authorization": f"Bearer {key}"}) as c:
        yield c


async def step(c: httpx.AsyncClient, code: str, session_id: str | None = None, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"runner": "python", "action": {"code": code}, **fields}
    if session_id:
        body["session_id"] = session_id
    r = await c.post("/rollout/step", json=body)
    data: dict[str, Any] = r.json()
    data["http_status"] = r.status_code
    return data


def blame(result: dict[str, Any]) -> str | None:
    err = result.get("error") or {}
    return err.get("blame")


def set_pod(pod: CgroupGroup, memory: int | None = None, pids: int | None = None) -> None:
    set_group_limits(pod, memory, pids)


def pod_usage(pod: CgroupGroup) -> tuple[int, int]:
    return group_usage(pod)


async def open_sessions(a: httpx.AsyncClient, n: int) -> list[str]:
    out = []
    for _ in range(n):
        r = await a.post("/sessions", json={"runner": "python"})
        assert r.status_code == 201, r.text
        out.append(r.json()["session_id"])
    return out


async def close_sessions(a: httpx.AsyncClient, ids: list[str]) -> None:
    for sid in ids:
        await a.delete(f"/sessions/{sid}")


async def test_a_neighbours_memory_never_gets_the_victim_blamed(node: str, pod: CgroupGroup) -> None:
    async with tenant(node, KEY_A) as a, tenant(node, KEY_B) as b:
        assert (await step(b, "print(1)"))["ok"]
        base, _ = pod_usage(pod)
        set_pod(pod, memory=base + 600 * MIB)
        held = await open_sessions(a, 3)
        try:
            for sid in held:  # A: 3 x 150 MB, inside its own 512 MB each
                r = await step(a, "x = bytearray(150 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1", sid)
                assert r["ok"], r
            blames = []
            for _ in range(3):  # B: 300 MB, inside its own 512 MB: the pod cannot hold it beside A's
                r = await step(b, "x = bytearray(300 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\nprint('ok')")
                blames.append((r["http_status"], blame(r), (r.get("error") or {}).get("code")))
                assert blame(r) != "program", r
                if not r["ok"]:
                    assert r["http_status"] == 503 and r["error"]["code"] == "node_pressure", r
            for sid in held:  # A's sessions: alive, or lost to the pressure (infra), never A's fault
                r = await step(a, "print(len(x))", sid)
                assert blame(r) != "program", r
                if r["http_status"] == 410:  # killed between its steps: said as the node's memory, by name
                    assert "ran out of memory" in r["error"]["message"], r
        finally:
            set_pod(pod, memory=-1)
            await close_sessions(a, held)
        # B's own limit is still B's: the same rule, the other way.
        r = await step(b, "x = bytearray(600 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1")
        assert r["ok"] is False and blame(r) == "program", r
        assert r["error"]["code"] == "program_killed" and "memory" in r["observation"]["limits_hit"], r


async def test_a_neighbours_processes_never_get_the_victim_blamed(node: str, pod: CgroupGroup) -> None:
    threads = (
        "import threading, time\n"
        "ts = [threading.Thread(target=time.sleep, args=(0.3,)) for _ in range(4)]\n"
        "for t in ts: t.start()\n"
        "for t in ts: t.join()\n"
        "print('four threads')"
    )
    async with tenant(node, KEY_A) as a, tenant(node, KEY_B) as b:
        assert (await step(b, threads))["ok"]
        _, base = pod_usage(pod)
        held = await open_sessions(a, 2)
        try:
            set_pod(pod, pids=base + 2 + 40)  # the two sessions' executors, and 40 threads more
            for sid in held:  # A: sleeping threads until the pod is full
                r = await step(a, "import threading, time\nfor _ in range(30):\n"
                                  "    try: threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
                                  "    except RuntimeError: break", sid)  # fmt: skip
                assert r["http_status"] == 200, r
            _, now = pod_usage(pod)
            assert now >= base + 40, (base, now)
            r = await step(b, threads)  # 5 of its own 64 pids
            assert blame(r) != "program", r
            assert r["ok"] or r["error"]["code"] == "node_pressure", r
        finally:
            set_pod(pod, pids=-1)
            await close_sessions(a, held)
        r = await step(b, "import os\nwhile True: os.fork()", timeout_s=2)  # its own limit: its own failure
        assert blame(r) == "program" and "pids" in r["observation"]["limits_hit"], r


async def test_a_neighbours_cpu_storm_is_not_the_victims_timeout(node: str, pod: CgroupGroup) -> None:
    """B's session step needs ~0.6 s of CPU within a 2 s limit; A's spinning sessions (its siblings under the
    CPU scheduler) leave it a fraction of a core. Time B waited on the run queue is given back (up to its
    limit again): its result, or node_pressure when even that was not enough; never program_timeout."""
    spin = "import threading\ndef spin():\n    while True: pass\nthreading.Thread(target=spin, daemon=True).start()"
    work = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\nprint('done')"
    async with tenant(node, KEY_A) as a, tenant(node, KEY_B) as b:
        held = await open_sessions(a, 10)
        mine = (await open_sessions(b, 1))[0]
        try:
            for sid in held:
                assert (await step(a, spin, sid))["ok"]
            t0 = time.monotonic()
            r = await step(b, work, mine, timeout_s=2)
            took = time.monotonic() - t0
            assert blame(r) != "program", (r, took)
            assert r["ok"] or r["error"]["code"] == "node_pressure", r
        finally:
            await asyncio.gather(*(a.delete(f"/sessions/{sid}") for sid in held))
        # Its own time is still its own: a program that spins past its limit alone is timed out.
        r = await step(b, "while True: pass", mine, timeout_s=0.5)
        assert r["error"]["code"] == "program_timeout" and blame(r) == "program", r
        await b.delete(f"/sessions/{mine}")


async def test_a_neighbours_sleeping_programs_do_not_lock_the_kind_away(node: str) -> None:
    """A holds both python slots with sleeping programs and queues two more; B's one-shot does not wait
    behind them (it took 8 s, or 504 at the queue's deadline, when the queue was one line): B is below its
    share, so it takes one of the burst slots at once."""
    async with tenant(node, KEY_A) as a, tenant(node, KEY_B) as b:
        sleepers = [asyncio.ensure_future(step(a, "import time; time.sleep(4)", timeout_s=10)) for _ in range(4)]
        await asyncio.sleep(0.5)  # two running, two queued
        t0 = time.monotonic()
        r = await step(b, "print('served')")
        took = time.monotonic() - t0
        assert r["ok"] and r["observation"]["stdout"] == "served\n", r
        assert took < 3.0, f"B waited {took:.1f}s behind A's sleepers"
        done = await asyncio.gather(*sleepers)
        assert all(x["ok"] for x in done), done  # A loses nothing: its steps ran in turn


def test_the_node_budget_refuses_sessions_before_the_pod_kills_anyone() -> None:
    """A node whose memory budget (x overcommit 1) holds its pools and four 256 MB sessions, in a pod that
    could not hold ten sessions of 200 MB beside another tenant's 200 MB program: A's fifth session is a
    429 naming the budget, and B's program runs (before: A got its ten, and the pod's OOM killed B's
    program, or one of A's)."""
    with make_pod("budget") as pod:
        procs = tuple(str(d / "cgroup.procs") for d in dict.fromkeys(pod.dirs.values()))
        settings = {
            "runners": '["python"]',
            "workers": 1,
            "api_keys": json.dumps([KEY_A, KEY_B]),
            "python__slots_per_worker": 2,
            "python__burst_slots_per_worker": 0,
            "python__memory_mb": 256,
            # 1900 MiB as before templates, plus each slot's templates group (192 MiB, counted at its cap;
            # no step here imports a preload, so none holds anything)
            "memory_budget_mb": 1900 + 2 * 192,
            "overcommit": 1.0,
        }
        with running_node_in(procs, **settings) as base:
            used, _ = pod_usage(pod)
            set_pod(pod, memory=used + 1700 * MIB)

            async def scenario() -> None:
                async with tenant(base, KEY_A) as a, tenant(base, KEY_B) as b:
                    fill = "x = bytearray(200 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1"
                    held, refusal = [], None
                    for _ in range(10):
                        r = await a.post("/sessions", json={"runner": "python"})
                        if r.status_code != 201:
                            refusal = r
                            break
                        held.append(r.json()["session_id"])
                        assert (await step(a, fill, held[-1]))["ok"]
                    assert refusal is not None and refusal.status_code == 429, (len(held), refusal)
                    assert "budget" in refusal.text and len(held) == 4, refusal.text
                    ran = await step(b, fill + "\nprint('B ran')")
                    assert ran["ok"] and ran["observation"]["stdout"] == "B ran\n", ran
                    for sid in held:
                        assert (await step(a, "print(len(x) >> 20)", sid))["observation"]["stdout"] == "200\n"

            asyncio.run(scenario())


def test_a_tenant_holding_every_session_gives_way_to_one_below_its_share() -> None:
    """Sessions cannot be taken back: A alone takes all four of the kind's; B is refused (429, capacity).
    The session A frees next is B's: A, at or above its share while B waits below its own, is refused it."""
    settings = {
        "runners": '["python"]',
        "workers": 1,
        "api_keys": json.dumps([KEY_A, KEY_B]),
        "python__slots_per_worker": 1,
        "python__burst_slots_per_worker": 0,
        "python__max_sessions_per_worker": 4,
    }
    with running_node_in((), **settings) as base:

        async def scenario() -> None:
            async with tenant(base, KEY_A) as a, tenant(base, KEY_B) as b:
                held = await open_sessions(a, 4)  # alone: the whole kind
                r = await b.post("/sessions", json={"runner": "python"})
                assert r.status_code == 429 and r.json()["error"]["blame"] == "infra", r.text
                await a.delete(f"/sessions/{held.pop()}")
                r = await a.post("/sessions", json={"runner": "python"})
                assert r.status_code == 429 and "share" in r.text, r.text  # B waits below its share: B's turn
                r = await b.post("/sessions", json={"runner": "python"})
                assert r.status_code == 201, r.text
                mine = r.json()["session_id"]
                assert (await step(b, "print('B in')", mine))["observation"]["stdout"] == "B in\n"
                await close_sessions(a, held)
                await b.delete(f"/sessions/{mine}")
                again = await open_sessions(a, 4)  # B no longer waits: A alone again takes everything
                await close_sessions(a, again)

        asyncio.run(scenario())


STARVES_ITSELF = """
import os, sys, time, threading
def _starve(*_):
    try: os.sched_setaffinity(0, {0})  # refused in a sandbox since: its threads may not queue on one CPU
    except OSError: pass
    if os.fork() == 0:
        while True:
            if os.fork(): os._exit(0)
            s = time.process_time()
            while time.process_time() - s < 1.5:
                t = time.perf_counter()
                while time.perf_counter() - t < 0.006: pass
                time.sleep(0.004)
    os.nice(19)
    for _ in range(8):
        threading.Thread(target=lambda: [time.sleep(0.0005) for _ in iter(int, 1)], daemon=True).start()
    while True:
        time.sleep(0.01)
        try: os.waitpid(-1, os.WNOHANG)
        except ChildProcessError: pass
sys.excepthook = _starve
def solution(x): return x + 2
assert solution(1) == 2
"""


async def test_a_program_that_starves_itself_is_timed_out_as_its_own(node: str) -> None:
    """Found by the red team: pinned to one CPU behind its own busy child, with threads queueing there, a
    failing program's waits were given back and then reported as node_pressure (infra: masked, a wrong
    answer never scored). Waits count only when the machine was busy and the sandbox did not get its CPU."""
    async with tenant(node, KEY_B) as b:
        for _ in range(2):
            r = await step(b, STARVES_ITSELF, timeout_s=2)
            assert r["http_status"] == 200 and blame(r) == "program", r
            assert r["error"]["code"] == "program_timeout", r


async def test_a_fork_bomb_does_not_leave_its_slot_blaming_the_next_program(node: str, pod: CgroupGroup) -> None:
    """Found by the red team: on cgroup v1 a slot's pids.peak never falls, so after one fork bomb in a slot
    a later refusal by the pod's limit looked like the slot's own, and an honest program that could not
    start its threads while another tenant held the pod's pids came back program_exit ['pids']."""
    bomb = "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"
    honest = (
        "import threading, time, sys\ntime.sleep(0.4)\n"
        "ts = [threading.Thread(target=time.sleep, args=(0.1,)) for _ in range(4)]\n"
        "for t in ts: t.start()\nfor t in ts: t.join()\nprint('ok')"
    )
    pulse = (
        "import os, time\nfor _ in range(60):\n    try: pid = os.fork()\n    except OSError: break\n"
        "    if pid == 0:\n        time.sleep(1.0); os._exit(0)\ntime.sleep(1.2)"
    )
    async with tenant(node, KEY_A) as a, tenant(node, KEY_B) as b:
        for _ in range(8):  # every slot (two, and two burst) has run a fork bomb
            r = await step(a, bomb, timeout_s=1)
            # Its own failure; it meets its pids limit within the second here, not always in an emulated guest.
            assert blame(r) == "program" and {"pids", "time"} & set(r["observation"]["limits_hit"]), r
        sid = (await open_sessions(a, 1))[0]
        _, base = pod_usage(pod)
        try:
            set_pod(pod, pids=base + 50)
            for _ in range(3):
                _, r = await asyncio.gather(step(a, pulse, sid, timeout_s=5), step(b, honest, timeout_s=5))
                assert blame(r) != "program", r
                assert r["ok"] or r["error"]["code"] == "node_pressure", r
        finally:
            set_pod(pod, pids=-1)
            await close_sessions(a, [sid])


async def test_a_neighbours_cpu_bound_programs_leave_the_victim_near_its_unloaded_latency(node: str) -> None:
    """A saturates the kind with CPU-bound one-shots (every slot, and more queued); B's short one-shots do
    not queue behind them (below its share: a burst slot at once) and get the CPU when they wake (the
    scheduler favours a task that slept): B's worst latency stays far below A's 3 s programs."""
    spin = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 3: pass"
    async with tenant(node, KEY_A) as a, tenant(node, KEY_B) as b:
        unloaded = []
        for _ in range(5):
            t0 = time.monotonic()
            assert (await step(b, "print(1)"))["ok"]
            unloaded.append(time.monotonic() - t0)
        hogs = [asyncio.ensure_future(step(a, spin, timeout_s=10)) for _ in range(6)]
        await asyncio.sleep(0.5)
        loaded = []
        for _ in range(10):
            t0 = time.monotonic()
            r = await step(b, "print(1)")
            loaded.append(time.monotonic() - t0)
            assert r["ok"], r
        await asyncio.gather(*hogs)
        assert max(loaded) < 1.0, (sorted(loaded), sorted(unloaded))
