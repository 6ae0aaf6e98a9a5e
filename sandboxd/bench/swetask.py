"""A SWE-style task as a workload: a session of a repository's image, a patch applied, its tests run, the
reward read from their exit code, the session closed; N tasks at each concurrency.

    SANDBOXD_IMAGES_DIR=... python -m sandboxd.bench.swetask [--tasks 64] [--concurrency 1,8,32] [--target URL]

The image (``bench/swe-calc:1``, built into the store from this host's programs when it is missing, as
``hostimage`` builds one) holds a shell, git, the system's python3 with its standard library, and a small
repository whose test fails until a patch fixes it. Half the tasks send the fix (reward 1), half a wrong patch
(reward 0): a reward that differs is counted as wrong, and a step that is not the program's answer as failed.
Each level prints one JSON line: tasks/s, the whole task's p50/p99 and each phase's p50 (create, grade, close).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import glob
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from sandboxd.bench.hostimage import SHELL_TOOLS, base_entries, import_layers, write_dir_layer, write_layer
from sandboxd.bench.stats import percentile
from sandboxd.localnode import local_node

IMAGE = "bench/swe-calc:1"
PYTHON = os.path.basename(os.path.realpath("/usr/bin/python3"))
AGENT = 1000  # hostimage's PASSWD: the image's user, who owns the repository
REPO = [
    ("dir", "repo", 0o755, AGENT),
    ("file", "repo/calc.py", b"def add(a, b):\n    return a - b\n", 0o644, AGENT),
    (
        "file",
        "repo/test_calc.py",
        b"import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
        b"    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n",
        0o644,
        AGENT,
    ),
    ("sym", "usr/bin/python3", PYTHON),
]
FIX = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n"
WRONG = FIX.replace("a + b", "a * b")
GRADE = "git apply fix.patch && python3 -m unittest -q test_calc 2>&1 | tail -1"


def build(images_dir: str) -> str:
    """The task's image in the store (made once): its summary line."""
    from sandboxd.config import load_settings
    from sandboxd.images.store import ImageStore

    programs: tuple[str, ...] = (*SHELL_TOOLS, "/usr/bin/git", f"/usr/bin/{PYTHON}")
    programs += tuple(glob.glob(f"/usr/lib/{PYTHON}/lib-dynload/_ctypes.*.so"))  # with its libffi
    writers: list[Callable[[Path], None]] = [
        functools.partial(write_layer, entries=base_entries(programs)),
        functools.partial(write_dir_layer, directory=f"/usr/lib/{PYTHON}"),
        functools.partial(write_layer, entries=REPO),
    ]
    config = {"Env": ["PATH=/usr/bin:/bin"], "WorkingDir": "/repo", "User": "agent", "Cmd": ["sh"]}
    image = import_layers(ImageStore.of(load_settings(images_dir=images_dir)), IMAGE, writers, config)
    return f"{image.name}: {len(image.layers)} layers, {image.size} bytes"


async def task(http: httpx.AsyncClient, patch: str) -> tuple[int | None, list[float]]:
    """One task: its reward (None: the node failed it) and its phases' wall times (ms)."""
    t0 = time.perf_counter()
    r = await http.post("/sessions", json={"runner": "container", "options": {"image": IMAGE}})
    if r.status_code != 201:
        return None, []
    sid = r.json()["session_id"]
    t1 = time.perf_counter()
    try:
        body = {"runner": "container", "session_id": sid, "timeout_s": 60,
                "action": {"cmd": GRADE, "files": {"fix.patch": patch}}}  # fmt: skip
        step = (await http.post("/rollout/step", json=body)).json()
        t2 = time.perf_counter()
    finally:
        await http.delete(f"/sessions/{sid}")
    t3 = time.perf_counter()
    obs, err = step.get("observation") or {}, step.get("error") or {}
    if err and err.get("blame") != "program":
        return None, []
    reward = 1 if obs.get("exit_code") == 0 and obs.get("stdout", "").strip() == "OK" else 0
    return reward, [(t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3]


async def level(base: str, tasks: int, concurrency: int) -> dict[str, Any]:
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as http:

        async def one(i: int) -> tuple[int, int | None, list[float]]:
            want = 1 if i % 2 == 0 else 0
            async with gate:
                reward, phases = await task(http, FIX if want else WRONG)
            return want, reward, phases

        t0 = time.perf_counter()
        done = await asyncio.gather(*(one(i) for i in range(tasks)))
        wall = time.perf_counter() - t0
    timed = [phases for _, reward, phases in done if reward is not None]
    cols = [sorted(c) for c in zip(*timed, strict=True)] if timed else [[0.0]] * 4
    return {
        "concurrency": concurrency,
        "tasks": tasks,
        "tasks_per_s": round(len(timed) / wall, 2),
        "failed": sum(reward is None for _, reward, _ in done),
        "wrong_rewards": sum(reward is not None and reward != want for want, reward, _ in done),
        "p50_ms": round(percentile(cols[3], 50), 1),
        "p99_ms": round(percentile(cols[3], 99), 1),
        "create_p50_ms": round(percentile(cols[0], 50), 1),
        "grade_p50_ms": round(percentile(cols[1], 50), 1),
        "close_p50_ms": round(percentile(cols[2], 50), 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=64, help="tasks per level")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--target", help="a running node with the container kind and the image; default: start one")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    images_dir = os.environ.get("SANDBOXD_IMAGES_DIR", "/var/lib/sandboxd/images")
    if args.target is None:
        print(build(images_dir))
    settings = {
        "SANDBOXD_RUNNERS": '["container"]',
        "SANDBOXD_CONTAINER__MAX_SESSIONS_PER_WORKER": str(max(64, max(levels))),
        "SANDBOXD_IMAGES_DIR": images_dir,
    }
    with local_node(settings) if args.target is None else contextlib.nullcontext(args.target) as base:
        for c in levels:
            print(json.dumps(asyncio.run(level(base, args.tasks, c))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
