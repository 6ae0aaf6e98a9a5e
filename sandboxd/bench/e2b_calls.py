"""What the E2B SDK's calls cost through a node's E2B facade, and how fast a dead trainer's sessions go.

    .venv/bin/python -m sandboxd.bench.e2b_calls [--rounds 20] [--orphans 200] [--idle 4]

Needs the official SDKs (``e2b``, ``e2b-code-interpreter``: the dev extra). A node is started on a free
loopback port with one E2B key and stopped after. Printed, as medians (p90) over ``--rounds``:
``Sandbox.create``, ``run_code("1 + 1")``, ``commands.run("true")``, a 10 MiB ``files.write`` and
``files.read``, ``kill``. Then the orphan test: a trainer process opens ``--orphans`` sessions labelled
with its run, renews them with ``keepalive(idle_timeout_s=--idle)``, and is SIGKILLed; printed: seconds
from the kill until ``GET /sessions?label=run_id:...`` is empty (the bound is the idle timeout plus the
reaper's interval).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import httpx

from sandboxd.localnode import local_node

KEY = "e2b_" + "5e" * 20
TRAINER = """
import asyncio, sys
from sandboxd.client import SandboxClient

async def main() -> None:
    async with SandboxClient(sys.argv[1], api_key=sys.argv[2]) as c:
        async with c.keepalive(idle_timeout_s=IDLE, run_id="orphans"):
            await asyncio.gather(*(
                c.create_session("textgame", labels={"run_id": "orphans"}, idle_timeout_s=IDLE) for _ in range(N)
            ))
            print("ready", flush=True)
            await asyncio.sleep(3600)

asyncio.run(main())
"""


def _timed(fn: Callable[[], Any], rounds: int) -> tuple[float, float]:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9) - 1 if len(times) >= 10 else -1]


def calls(base: str, rounds: int) -> None:
    try:
        from e2b import Sandbox as BaseSandbox
        from e2b_code_interpreter import Sandbox
    except ImportError:
        sys.exit("the E2B SDKs are not installed: pip install -e '.[dev]'")
    os.environ.update(E2B_API_URL=base, E2B_SANDBOX_URL=base, E2B_API_KEY=KEY)
    made: list[Any] = []
    rows = [("Sandbox.create", *_timed(lambda: made.append(Sandbox.create()), rounds))]
    sbx = made[0]
    base_sbx = BaseSandbox.connect(sbx.sandbox_id)
    blob = os.urandom(10 << 20)
    rows += [
        ("run_code('1 + 1')", *_timed(lambda: sbx.run_code("1 + 1"), rounds)),
        ("commands.run('true')", *_timed(lambda: base_sbx.commands.run("true"), rounds)),
        ("files.write 10 MiB", *_timed(lambda: base_sbx.files.write("blob.bin", blob), max(3, rounds // 4))),
        ("files.read 10 MiB", *_timed(lambda: base_sbx.files.read("blob.bin", format="bytes"), max(3, rounds // 4))),
        ("kill", *_timed(lambda: made.pop().kill(), rounds)),
    ]
    print(f"{'call':24} {'p50 ms':>9} {'p90 ms':>9}")
    for name, p50, p90 in rows:
        print(f"{name:24} {p50:9.1f} {p90:9.1f}")


def orphans(base: str, n: int, idle_s: float) -> None:
    code = textwrap.dedent(TRAINER).replace("IDLE", str(idle_s)).replace("N)", f"{n})")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root}
    trainer = subprocess.Popen([sys.executable, "-c", code, base, KEY], stdout=subprocess.PIPE, env=env)
    try:
        assert trainer.stdout is not None
        if trainer.stdout.readline().strip() != b"ready":
            sys.exit("the trainer did not open its sessions")
        time.sleep(idle_s * 1.5)
        with httpx.Client(base_url=base, headers={"authorization": f"Bearer {KEY}"}, timeout=30) as c:
            alive = len(c.get("/sessions", params={"label": "run_id:orphans"}).json()["sessions"])
            trainer.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            while c.get("/sessions", params={"label": "run_id:orphans"}).json()["sessions"]:
                time.sleep(0.1)
            gone = time.monotonic() - killed
        print(f"orphans: {alive} sessions alive {idle_s * 1.5:g} s after their idle timeout of {idle_s:g} s (renewed);")
        print(f"         the trainer SIGKILLed, all gone {gone:.2f} s later (bound: idle + reap interval)")
    finally:
        trainer.kill()
        trainer.wait()
        if trainer.stdout is not None:
            trainer.stdout.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--orphans", type=int, default=200)
    ap.add_argument("--idle", type=float, default=4.0)
    args = ap.parse_args()
    settings = {
        "SANDBOXD_RUNNERS": '["python", "textgame"]',
        "SANDBOXD_API_KEYS": f'["{KEY}"]',
        "SANDBOXD_REAP_INTERVAL_S": "0.5",
        "SANDBOXD_TENANT_MAX_SESSIONS": str(max(600, args.orphans + 50)),
    }
    with local_node(settings) as base:
        calls(base, args.rounds)
        orphans(base, args.orphans, args.idle)


if __name__ == "__main__":
    main()
