"""The code runner over HTTP, real nsjail and real toolchains: every language's hello, stdin, failures and
limits; hostile programs and compiler tricks; the compile cache; many cases in one call; /run_code."""

from __future__ import annotations

import asyncio
import itertools
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import running_node

pytestmark = pytest.mark.node

CACHE = tempfile.mkdtemp(prefix="sandboxd-ccache-")

# A program per language: print its stdin's integer doubled.
DOUBLE = {
    "c": '#include <stdio.h>\nint main(void){long x; scanf("%ld",&x); printf("%ld\\n", 2*x); return 0;}',
    "cpp": "#include <bits/stdc++.h>\nint main(){long x; std::cin>>x; std::cout<<2*x<<std::endl;}",
    "java": "import java.util.*;\npublic class Main { public static void main(String[] a) {\n"
    "  long x = new Scanner(System.in).nextLong(); System.out.println(2*x); } }",
    "go": 'package main\nimport "fmt"\nfunc main(){ var x int64; fmt.Scan(&x); fmt.Println(2*x) }',
    "rust": "use std::io::Read;\nfn main(){ let mut s=String::new(); std::io::stdin().read_to_string(&mut s)"
    '.unwrap(); let x: i64 = s.trim().parse().unwrap(); println!("{}", 2*x); }',
    "javascript": "const x = parseInt(require('fs').readFileSync(0, 'utf8')); console.log(2*x);",
    "bash": "read x; echo $((2*x))",
}
# Exits with status 3 after writing to stderr.
FAILS = {
    "c": '#include <stdio.h>\nint main(void){fprintf(stderr,"bad\\n"); return 3;}',
    "cpp": '#include <iostream>\nint main(){std::cerr<<"bad"<<std::endl; return 3;}',
    "java": 'public class Main { public static void main(String[] a) { System.err.println("bad"); System.exit(3); } }',
    "go": 'package main\nimport ("fmt"; "os")\nfunc main(){ fmt.Fprintln(os.Stderr, "bad"); os.Exit(3) }',
    "rust": 'fn main(){ eprintln!("bad"); std::process::exit(3); }',
    "javascript": "console.error('bad'); process.exit(3);",
    "bash": "echo bad >&2; exit 3",
}
SPINS = {
    "c": "int main(void){volatile unsigned long i=0; for(;;) i++;}",
    "cpp": "int main(){volatile unsigned long i=0; for(;;) i++;}",
    "java": "public class Main { public static void main(String[] a) { long i=0; while (true) { i++; } } }",
    "go": "package main\nfunc main(){ i := 0; for { i++ } }",
    "rust": 'fn main(){ let mut i: u64 = 0; loop { i = i.wrapping_add(1); if i == u64::MAX { println!("{}", i); } } }',
    "javascript": "let i = 0; for (;;) { i++; }",
    "bash": "while true; do :; done",
}
SYNTAX_ERRORS = {
    "c": "int main(void){ return 0 }",
    "cpp": "int main(){ return 0 }",
    "java": "public class Main { public static void main(String[] a) { int x = } }",
    "go": "package main\nfunc main(){ x := }",
    "rust": 'fn main(){ let x: i32 = "s"; }',
}
COMPILED = sorted(SYNTAX_ERRORS)
# Touches 400 MB (run with a 128 MB limit): killed at the memory limit, or the runtime's own out-of-memory.
HOGS = {
    "c": "#include <stdlib.h>\nint main(){volatile char*p=malloc(400<<20); for(long i=0;i<(400<<20);i+=4096) p[i]=1;}",
    "cpp": '#include <vector>\n#include <cstdio>\nint main(){std::vector<char> v(400<<20, 1); std::printf("%d", v[9]);}',
    "java": "public class Main { public static void main(String[] a) { byte[][] k = new byte[400][];\n"
    "  for (int i = 0; i < 400; i++) { k[i] = new byte[1 << 20]; k[i][7] = 1; } System.out.println(k.length); } }",
    "go": 'package main\nimport "fmt"\nfunc main(){ b := make([]byte, 400<<20); for i := 0; i < len(b); i += 4096'
    " { b[i] = 1 }; fmt.Println(len(b)) }",
    "rust": "fn main(){ let mut v = vec![0u8; 400<<20]; let mut i = 0; while i < v.len() { v[i] = 1; i += 4096; }"
    ' println!("{}", v[4096]); }',
    "javascript": "const b = Buffer.alloc(400 << 20, 1); console.log(b[7]);",
    "bash": "x=$(head -c 400000000 /dev/zero | tr '\\0' a); echo ${#x}",
}
FLOODS = {
    "c": '#include <stdio.h>\nint main(){for(;;) puts("yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy");}',
    "cpp": '#include <cstdio>\nint main(){for(;;) std::puts("yyyyyyyyyyyyyyyyyyyyyyyyyyyyy");}',
    "java": 'public class Main { public static void main(String[] a) { while (true) System.out.println("yyyyyyyyyyyyy"); } }',
    "go": 'package main\nimport ("bufio"; "os")\nfunc main(){ w := bufio.NewWriter(os.Stdout); for { w.WriteString("yyyyyyyy\\n") } }',
    "rust": 'use std::io::Write;\nfn main(){ let o = std::io::stdout(); let mut l = o.lock(); loop { let _ = l.write_all(b"yyyyyyyy\\n"); } }',
    "javascript": "const s = 'y'.repeat(65536); function w() { process.stdout.write(s, w); } w();",
    "bash": "yes",
}
# Reads a host secret and writes outside its working directory: both must fail; it says what happened.
ESCAPES = {
    "c": '#include <stdio.h>\nint main(){puts(fopen("/etc/shadow","r")?"read":"no-read"); '
    'puts(fopen("/etc/pwned","w")?"wrote":"no-write");}',
    "cpp": '#include <fstream>\n#include <iostream>\nint main(){std::ifstream r("/etc/shadow"); std::ofstream w("/usr/pwned");'
    ' std::cout<<(r.good()?"read":"no-read")<<"\\n"<<(w.good()?"wrote":"no-write")<<"\\n";}',
    "java": "import java.nio.file.*;\npublic class Main { public static void main(String[] a) {\n"
    '  try { Files.readString(Path.of("/etc/shadow")); System.out.println("read"); } catch (Exception e) { System.out.println("no-read"); }\n'
    '  try { Files.writeString(Path.of("/etc/pwned"), "x"); System.out.println("wrote"); } catch (Exception e) { System.out.println("no-write"); } } }',
    "go": 'package main\nimport ("fmt"; "os")\nfunc main(){ if _, e := os.ReadFile("/etc/shadow"); e != nil { fmt.Println("no-read") } else { fmt.Println("read") }\n'
    ' if e := os.WriteFile("/etc/pwned", []byte("x"), 0644); e != nil { fmt.Println("no-write") } else { fmt.Println("wrote") } }',
    "rust": 'fn main(){ println!("{}", if std::fs::read("/etc/shadow").is_ok() {"read"} else {"no-read"});'
    ' println!("{}", if std::fs::write("/etc/pwned", "x").is_ok() {"wrote"} else {"no-write"}); }',
    "javascript": "const fs = require('fs'); for (const [f, ok, no] of [[() => fs.readFileSync('/etc/shadow'), 'read', 'no-read'],"
    " [() => fs.writeFileSync('/etc/pwned', 'x'), 'wrote', 'no-write']]) { try { f(); console.log(ok); } catch (e) { console.log(no); } }",
    "bash": "cat /etc/shadow >/dev/null 2>&1 && echo read || echo no-read; echo x 2>/dev/null >/etc/pwned && echo wrote || echo no-write",
}


KEY, OTHER = "code-tenant-a-0123456789", "code-tenant-b-0123456789"


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    """The node's URL with tenant A's key in it (Basic auth, as clients that take only a URL send it)."""
    with running_node(
        runners='["code", "python"]',
        workers=1,
        api_keys=f'["{KEY}", "{OTHER}"]',
        code__slots_per_worker=2,
        code__burst_slots_per_worker=0,
        code__compile_cache_dir=CACHE,
        python__slots_per_worker=1,
        python__burst_slots_per_worker=0,
    ) as base:
        yield base.replace("http://", f"http://key:{KEY}@")


@pytest.fixture(scope="module")
def languages(node: str) -> dict[str, Any]:
    described: dict[str, Any] = httpx.get(f"{node}/runners/code", timeout=30).json()["languages"]
    return described


async def run(http: httpx.AsyncClient, language: str, code: str, **fields: Any) -> dict[str, Any]:
    timeout = fields.pop("timeout_s", 10)
    limits = fields.pop("limits", None)
    body: dict[str, Any] = {"runner": "code", "action": {"language": language, "code": code, **fields}}
    body["timeout_s"] = timeout
    if limits:
        body["limits"] = limits
    r = await http.post("/rollout/step", json=body)
    return {"http": r.status_code, **r.json()}


def test_setup_installed_every_language(languages: dict[str, Any]) -> None:
    assert sorted(languages) == ["bash", "c", "cpp", "go", "java", "javascript", "pytest", "rust"]
    assert languages["cpp"]["default_flags"] == ["-O2", "-std=c++17"]


def in_vm(programs: dict[str, str]) -> list[Any]:
    """The languages, C++ marked for the cgroup v2 guest's subset (scripts/vm-test.sh: one compiled language)."""
    return [pytest.param(x, marks=pytest.mark.vm) if x == "cpp" else x for x in sorted(programs)]


@pytest.mark.parametrize("language", in_vm(DOUBLE))
async def test_hello_stdin_and_failures(http: httpx.AsyncClient, language: str) -> None:
    r = await run(http, language, DOUBLE[language], stdin="21\n")
    assert r["ok"], r
    assert r["observation"]["stdout"] == "42\n" and r["observation"]["exit_code"] == 0
    r = await run(http, language, FAILS[language])
    assert r["ok"] is False and r["error"]["blame"] == "program" and r["error"]["code"] == "program_exit", r
    assert r["observation"]["exit_code"] == 3 and "bad" in r["observation"]["stderr"]


@pytest.mark.parametrize("language", in_vm(SPINS))
async def test_time_limit(http: httpx.AsyncClient, language: str) -> None:
    r = await run(http, language, SPINS[language], timeout_s=1)
    assert r["ok"] is False and r["error"]["code"] == "program_timeout", r
    assert r["observation"]["timed_out"] and r["observation"]["killed_by"] == "time"


@pytest.mark.parametrize("language", COMPILED)
async def test_compile_error_is_the_programs_with_its_output(http: httpx.AsyncClient, language: str) -> None:
    r = await run(http, language, SYNTAX_ERRORS[language])
    assert r["http"] == 200 and r["ok"] is False, r
    assert r["error"]["blame"] == "program" and r["error"]["code"] == "compile_error", r
    compiled = r["observation"]["compile"]
    assert compiled["exit_code"] not in (0, None) and (compiled["stderr"] or compiled["stdout"]), compiled
    assert r["observation"]["exit_code"] is None and r["observation"]["stdout"] == ""


@pytest.mark.parametrize("language", in_vm(HOGS))
async def test_memory_limit(http: httpx.AsyncClient, language: str) -> None:
    r = await run(http, language, HOGS[language], limits={"memory_mb": 128}, timeout_s=10)
    assert r["ok"] is False and r["error"]["blame"] == "program", r
    assert r["error"]["code"] in ("program_killed", "program_exit"), r  # the JVM throws OutOfMemoryError itself
    if r["error"]["code"] == "program_killed":
        assert r["observation"]["killed_by"] == "memory" and "memory" in r["observation"]["limits_hit"], r


@pytest.mark.parametrize("language", sorted(FLOODS))
async def test_output_cap(http: httpx.AsyncClient, language: str) -> None:
    r = await run(http, language, FLOODS[language], timeout_s=10)
    assert r["ok"] is False and r["observation"]["killed_by"] == "output", r
    assert r["observation"]["stdout_truncated"] and r["error"]["blame"] == "program", r


@pytest.mark.parametrize("language", sorted(ESCAPES))
async def test_programs_read_no_host_secret_and_write_nothing_outside(http: httpx.AsyncClient, language: str) -> None:
    r = await run(http, language, ESCAPES[language])
    assert r["observation"]["stdout"].split() == ["no-read", "no-write"], r


async def test_memory_and_output_limits_and_fork_bombs(http: httpx.AsyncClient) -> None:
    hog = "#include <stdlib.h>\nint main(){volatile char*p=malloc(400<<20); for(long i=0;i<(400<<20);i+=4096) p[i]=1;}"
    r = await run(http, "c", hog, limits={"memory_mb": 128})
    assert r["ok"] is False and r["error"]["code"] == "program_killed", r
    assert r["observation"]["killed_by"] == "memory" and "memory" in r["observation"]["limits_hit"]
    r = await run(http, "cpp", '#include <cstdio>\nint main(){for(;;) std::puts("yyyyyyyyyyyyyyyy");}')
    assert r["observation"]["killed_by"] == "output" and r["observation"]["stdout_truncated"], r
    bomb = "#include <unistd.h>\nint main(){for(;;) fork();}"
    r = await run(http, "c", bomb, timeout_s=2)
    assert r["ok"] is False and r["error"]["blame"] == "program", r
    assert "pids" in r["observation"]["limits_hit"], r
    # The script itself ends at once (status 0); what it left behind dies with its sandbox, at the pids cap.
    r = await run(http, "bash", ":(){ :|:& };:", timeout_s=2)
    assert r["http"] == 200 and (r["error"] is None or r["error"]["blame"] == "program"), r
    r = await run(http, "c", DOUBLE["c"], stdin="1")  # the slot is whole again
    assert r["ok"] and r["observation"]["stdout"] == "2\n", r


async def test_the_compiler_cannot_read_the_host_or_write_outside(http: httpx.AsyncClient) -> None:
    r = await run(http, "cpp", '#include "/etc/shadow"\nint main(){}')
    assert r["error"]["code"] == "compile_error" and "Permission denied" in r["observation"]["compile"]["stderr"], r
    r = await run(http, "c", '#include "/proc/1/environ"\nint main(){}')
    assert r["error"]["code"] == "compile_error", r
    r = await run(http, "rust", 'const S: &str = include_str!("/etc/shadow");\nfn main(){ println!("{}", S); }')
    assert r["error"]["code"] == "compile_error" and "ermission denied" in r["observation"]["compile"]["stderr"], r
    for flags in (["-o", "/tmp/elsewhere"], ["-B/tmp"], ["@/etc/passwd"], ["-fplugin=/tmp/x.so"], ["-include/etc/x"]):
        r = await run(http, "cpp", DOUBLE["cpp"], flags=flags)
        assert r["http"] == 422 and "not allowed" in r["error"]["message"], (flags, r)
    r = await run(http, "cpp", DOUBLE["cpp"], flags=["-O0", "-std=c++20", "-DONLINE_JUDGE", "-Wall"], stdin="5")
    assert r["ok"] and r["observation"]["stdout"] == "10\n", r
    r = await run(http, "bash", "echo x", flags=["-O2"])
    assert r["http"] == 422, r


async def test_the_compile_cache_serves_the_second_request_and_refuses_a_poisoned_entry(
    http: httpx.AsyncClient,
) -> None:
    code = DOUBLE["cpp"] + "\n// cache test\n"
    first = await run(http, "cpp", code, stdin="4")
    assert first["ok"] and first["observation"]["compile"]["cached"] is False, first
    second = await run(http, "cpp", code, stdin="5")
    assert second["observation"]["compile"]["cached"] is True and second["observation"]["stdout"] == "10\n"
    entries = sorted(Path(CACHE).glob("*.bin"), key=lambda p: p.stat().st_mtime)
    poisoned = entries[-1]
    blob = bytearray(poisoned.read_bytes())
    blob[-100] ^= 0xFF  # one byte of the artifact: the digest no longer matches
    poisoned.write_bytes(bytes(blob))
    third = await run(http, "cpp", code, stdin="6")
    assert third["observation"]["compile"]["cached"] is False and third["observation"]["stdout"] == "12\n", third
    assert (await run(http, "cpp", code, stdin="7"))["observation"]["compile"]["cached"] is True


async def test_the_compile_cache_is_each_tenants_own(node: str, http: httpx.AsyncClient) -> None:
    """A hit is ~100 ms faster and says ``cached``: shared between tenants, it told B that A had compiled exactly
    this source (found by a red team). Each tenant's compilations serve that tenant only."""
    code = DOUBLE["c"] + "\n// tenant cache test\n"
    assert (await run(http, "c", code, stdin="1"))["observation"]["compile"]["cached"] is False
    assert (await run(http, "c", code, stdin="2"))["observation"]["compile"]["cached"] is True
    async with httpx.AsyncClient(base_url=node.replace(KEY, OTHER), timeout=120) as other:
        first = await run(other, "c", code, stdin="3")
        assert first["ok"] and first["observation"]["compile"]["cached"] is False, first
        assert (await run(other, "c", code, stdin="4"))["observation"]["compile"]["cached"] is True


async def test_many_cases_compile_once(http: httpx.AsyncClient) -> None:
    cases = [
        {"stdin": "1", "expected_stdout": "2"},
        {"stdin": "2", "expected_stdout": "4\n\n"},
        {"stdin": "3", "expected_stdout": "7"},
        {"stdin": "x", "expected_stdout": "0"},
        {"stdin": "5", "expected_stdout": "10", "timeout_s": 2},
    ]
    r = await run(http, "go", DOUBLE["go"] + "\n// cases\n", cases=cases)
    assert r["ok"] is False and r["error"]["code"] == "cases_failed", r
    verdicts = [c["verdict"] for c in r["observation"]["cases"]]
    assert verdicts == ["accepted", "accepted", "wrong_answer", "accepted", "accepted"], r["observation"]["cases"]
    assert r["observation"]["cases_passed"] == 4 and r["observation"]["compile"]["cached"] is False
    r = await run(http, "go", DOUBLE["go"] + "\n// cases\n", cases=cases, stop_on_failure=True)
    verdicts = [c["verdict"] for c in r["observation"]["cases"]]
    assert verdicts == ["accepted", "accepted", "wrong_answer", "skipped", "skipped"]
    assert r["observation"]["compile"]["cached"] is True
    # Each case runs in a fresh sandbox (the first one's file is not there for the next), with its own limits.
    script = 'read x; [ -f /tmp/mark ] && echo seen; touch /tmp/mark; [ "$x" = slow ] && sleep 5; echo $x'
    cases = [{"stdin": "a\n"}, {"stdin": "b\n", "expected_stdout": "b"}, {"stdin": "slow\n", "timeout_s": 0.5}]
    r = await run(http, "bash", script, cases=cases)
    assert [c["verdict"] for c in r["observation"]["cases"]] == ["finished", "accepted", "time_limit"], r


async def test_pytest_runs_a_test_file_with_the_default_environment(http: httpx.AsyncClient) -> None:
    ok = "import numpy\n\ndef test_sum():\n    assert numpy.arange(4).sum() == 6\n"
    r = await run(http, "pytest", ok)
    assert r["ok"] and "1 passed" in r["observation"]["stdout"], r
    r = await run(http, "pytest", "def test_bad():\n    assert 1 == 2\n")
    assert r["ok"] is False and r["observation"]["exit_code"] == 1 and "1 failed" in r["observation"]["stdout"]


async def test_javascript_has_its_packages(http: httpx.AsyncClient) -> None:
    code = "const _ = require('lodash'); const md5 = require('js-md5'); console.log(_.sum([1, 2, 3]), md5('a'));"
    r = await run(http, "javascript", code)
    assert r["ok"] and r["observation"]["stdout"] == "6 0cc175b9c0f1b6a831c399e269772661\n", r


async def test_bad_requests_are_named(http: httpx.AsyncClient) -> None:
    r = await run(http, "cobol", "x")
    assert r["http"] == 422 and "available" in r["error"]["message"] and "cpp" in r["error"]["message"], r
    created = await http.post("/sessions", json={"runner": "code"})
    assert created.status_code == 422, created.text
    r = await run(http, "cpp", DOUBLE["cpp"], cases=[{"stdin": "1", "timeout_s": 50}], timeout_s=5)
    assert r["http"] == 422 and "timeout_s" in r["error"]["message"], r


def test_run_code_speaks_sandboxfusion_for_compiled_languages(node: str) -> None:
    """verl maps a compile error to -4 from SandboxFusion's shape: status Failed, compile_result Finished
    with a non-zero return code, no run_result; the official client parses every answer."""
    from sandbox_fusion import CommandRunStatus, RunCodeRequest, RunStatus, run_code

    ok = run_code(RunCodeRequest(code=DOUBLE["cpp"], language="cpp", stdin="8"), endpoint=node, max_attempts=1)
    assert ok.status == RunStatus.Success and ok.run_result is not None and ok.run_result.stdout == "16\n"
    assert ok.compile_result is not None and ok.compile_result.status == CommandRunStatus.Finished
    bad = httpx.post(f"{node}/run_code", json={"code": "int main(){", "language": "cpp"}, timeout=60).json()
    assert bad["status"] == "Failed" and bad["run_result"] is None, bad
    assert bad["compile_result"]["status"] == "Finished" and bad["compile_result"]["return_code"] != 0
    spin = run_code(RunCodeRequest(code=SPINS["rust"], language="rust", run_timeout=0.5), endpoint=node, max_attempts=1)
    assert spin.status == RunStatus.Failed and spin.run_result.status == CommandRunStatus.TimeLimitExceeded
    js = run_code(RunCodeRequest(code="console.log(1+1)", language="nodejs"), endpoint=node, max_attempts=1)
    assert js.status == RunStatus.Success and js.compile_result is None and js.run_result.stdout == "2\n"
    r = httpx.post(f"{node}/run_code", json={"code": "x", "language": "cobol"}, timeout=30)
    assert r.status_code == 422 and "cpp" in r.json()["detail"]


async def test_cases_spread_over_free_slots_within_the_tenants_share(http: httpx.AsyncClient) -> None:
    """Two slots, one tenant: the step borrows the free one, and cases overlap in time; with stop_on_failure
    they run in turn (each case prints when it started and ended, from the machine's monotonic clock)."""
    script = "cat /proc/uptime | cut -d' ' -f1; sleep 0.6; cat /proc/uptime | cut -d' ' -f1"
    spans = []
    for stop in (False, True):
        r = await run(http, "bash", script, cases=[{"stdin": str(i)} for i in range(4)], stop_on_failure=stop)
        assert r["ok"] and [c["verdict"] for c in r["observation"]["cases"]] == ["finished"] * 4, r
        spans.append(sorted(tuple(map(float, c["stdout"].split())) for c in r["observation"]["cases"]))
    parallel, sequential = spans
    assert any(b[0] < a[1] for a, b in itertools.pairwise(parallel)), parallel
    assert all(b[0] >= a[1] for a, b in itertools.pairwise(sequential)), sequential


async def test_a_borrowed_slot_goes_back_when_no_case_is_left_for_it(http: httpx.AsyncClient) -> None:
    """Two slots: a step's long case runs in its own slot, its short one in the borrowed slot; another step
    sent meanwhile gets the borrowed slot as soon as the short case is done, and ends first (921c1ca: it
    waited for the long case, the borrowed slot held until the step's last case ended)."""
    script = "read n; sleep $n; echo done"
    first = asyncio.ensure_future(run(http, "bash", script, cases=[{"stdin": "3"}, {"stdin": "0"}]))
    await asyncio.sleep(0.8)
    second = asyncio.ensure_future(run(http, "bash", "echo second"))
    done, _ = await asyncio.wait({first, second}, return_when=asyncio.FIRST_COMPLETED)
    assert second in done, "the other step waited for the first step's last case"
    assert second.result()["observation"]["stdout"] == "second\n"
    assert (await first)["ok"]


async def test_judging_and_case_limits_cannot_be_gamed(http: httpx.AsyncClient) -> None:
    """Found by a red team: truncated output was judged as if whole (the right answer, then anything past
    the cap, was accepted); a case could ask for more memory than its step; duplicate paths made the compile
    cache serve an artifact built from other files; cases could run far past the node's longest step."""
    pad = '#include <cstdio>\nint main(){std::printf("42\\n"); for(int i=0;i<1021;i++) std::putchar(10);'
    liar = pad + ' std::printf("WRONG ANSWER 99999\\n");}'
    r = await run(http, "cpp", liar, cases=[{"expected_stdout": "42\n"}], limits={"max_output_bytes": 1024})
    assert r["observation"]["cases"][0]["verdict"] == "output_limit" and r["ok"] is False, r
    r = await run(http, "c", DOUBLE["c"], cases=[{"stdin": "1", "memory_mb": 500}], limits={"memory_mb": 64})
    assert r["http"] == 422 and "memory" in r["error"]["message"], r
    r = await run(http, "c", '#include "x.h"\nint main(){}', files={"x.h": "", "./x.h": ""})
    assert r["http"] == 422 and "same file" in r["error"]["message"], r
    r = await run(http, "bash", "sleep 1", cases=[{"stdin": ""}] * 40, timeout_s=10)
    assert r["http"] == 422 and "max_timeout_s" in r["error"]["message"], r
    r = await run(http, "bash", "true", cases=[])
    assert r["http"] == 422, r
