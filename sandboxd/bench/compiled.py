"""C++ in the code runner against ``g++ -O2`` and the binary run outside any sandbox, side by side.

    .venv/bin/python -m sandboxd.bench.compiled [--rounds 10] [--cases 20] [--repeats 30] [--target URL]

Each round, alternating which goes first, with a source never seen before (a comment with a fresh
nonce, so neither side's caches help):
  first    one request that compiles and runs it  vs  g++ -O2 -std=c++17 then the binary, here
  cases    one request with N cases (compiled once)  vs  g++ then the binary N times
and, after the rounds, ``--repeats`` requests of one program already compiled (the compile cache)
vs running its binary directly. Printed: medians and the ratio sandboxd/outside (lower is better).
Without --target a node is started on a free loopback port (code runner, one worker) and stopped after.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from sandboxd.localnode import local_node

PROGRAM = """#include <bits/stdc++.h>
using namespace std;
int main() {
    long n; cin >> n;
    vector<long> v(n);
    for (long i = 0; i < n; i++) v[i] = (i * 2654435761L) % 1000003;
    sort(v.begin(), v.end());
    long s = 0;
    for (long i = 0; i < n; i += 7) s += v[i];
    cout << s << endl;
}
"""


def _source() -> str:
    return PROGRAM + f"// {secrets.token_hex(8)}\n"


def _outside(source: str, stdins: list[str], work: Path) -> float:
    """Compile and run outside any sandbox: the wall ms of g++ and of every run."""
    src = work / "main.cpp"
    src.write_text(source)
    t0 = time.perf_counter()
    subprocess.run(["g++", "-O2", "-std=c++17", "-o", str(work / "main"), str(src)], check=True)
    for stdin in stdins:
        subprocess.run([str(work / "main")], input=stdin.encode(), check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1000


def _request(client: httpx.Client, source: str, stdins: list[str]) -> float:
    action: dict[str, object] = {"language": "cpp", "code": source}
    if len(stdins) == 1:
        action["stdin"] = stdins[0]
    else:
        action["cases"] = [{"stdin": s} for s in stdins]
    t0 = time.perf_counter()
    r = client.post("/rollout/step", json={"runner": "code", "action": action, "timeout_s": 10})
    wall = (time.perf_counter() - t0) * 1000
    body = r.json()
    if not body.get("ok"):
        raise SystemExit(f"the step failed: {str(body)[:400]}")
    return wall


def _line(name: str, ours: list[float], theirs: list[float]) -> None:
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"{name:<34} sandboxd {a:8.1f} ms   outside {b:8.1f} ms   ratio {a / b:5.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="a running sandboxd; default: start one on loopback")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--n", type=int, default=200_000, help="the program's input: elements it sorts")
    args = ap.parse_args(argv)
    stdin = f"{args.n}\n"
    node = (
        contextlib.nullcontext(args.target)
        if args.target
        else local_node(
            {
                "SANDBOXD_RUNNERS": '["code"]',
                "SANDBOXD_WORKERS": "1",
                "SANDBOXD_CODE__COMPILE_CACHE_DIR": tempfile.mkdtemp(prefix="sandboxd-bench-ccache-"),
            }
        )
    )
    first: tuple[list[float], list[float]] = ([], [])
    cases: tuple[list[float], list[float]] = ([], [])
    cached: tuple[list[float], list[float]] = ([], [])
    with node as base, httpx.Client(base_url=base, timeout=120) as client, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        _request(client, _source(), [stdin])  # the slot's first compile warms the page cache for both
        _outside(_source(), [stdin], work)
        for i in range(args.rounds):
            for which in ("ours", "outside") if i % 2 == 0 else ("outside", "ours"):
                for into, stdins in ((first, [stdin]), (cases, [stdin] * args.cases)):
                    if which == "ours":
                        into[0].append(_request(client, _source(), stdins))
                    else:
                        into[1].append(_outside(_source(), stdins, work))
        repeat = _source()
        _request(client, repeat, [stdin])
        binary = work / "main"
        _outside(repeat, [stdin], work)
        for _ in range(args.repeats):
            cached[0].append(_request(client, repeat, [stdin]))
            t0 = time.perf_counter()
            subprocess.run([str(binary)], input=stdin.encode(), check=True, stdout=subprocess.DEVNULL)
            cached[1].append((time.perf_counter() - t0) * 1000)
    print(f"C++ (g++ -O2 -std=c++17, sorts {args.n} longs), concurrency 1, {args.rounds} rounds alternating")
    _line("first request (compile + run)", *first)
    _line(f"{args.cases} cases in one request", *cases)
    _line("cached repeat (run only)", *cached)
    print(f"outside: g++ and the binary run directly on this host ({os.uname().machine}), no sandbox, no HTTP")
    return 0


if __name__ == "__main__":
    sys.exit(main())
