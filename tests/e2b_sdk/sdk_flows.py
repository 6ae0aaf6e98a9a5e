"""E2B's SDK, whichever release this interpreter has installed, against a node's E2B API: only E2B's own
environment variables point at it (``E2B_API_KEY``, ``E2B_API_URL``, ``E2B_SANDBOX_URL``, set by the caller).

Run by tests/test_e2b_versions.py with each SDK release the node is tested against (the pinned pair in the
project's venv, the newest in a venv of its own), so this module imports nothing of sandboxd's: it is what a
user's program would be. ``E2B_EXPECT_VERSION`` names the release the caller meant to run; the first test
checks it, so a venv that drifted fails instead of testing another release.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from importlib.metadata import version

import e2b
import pytest
from e2b import AuthenticationException, NotFoundException, SandboxException, TimeoutException
from e2b import Sandbox as BaseSandbox
from e2b_code_interpreter import AsyncSandbox, Sandbox

pytestmark = pytest.mark.timeout(120)


def test_the_release_asked_for() -> None:
    assert f"{version('e2b')}/{version('e2b-code-interpreter')}" == os.environ["E2B_EXPECT_VERSION"]


def test_create_connect_list_and_kill() -> None:
    sbx = Sandbox.create(metadata={"flow": "lifecycle"}, envs={"GREETING": "hello"}, timeout=120)
    assert sbx.run_code("x = 41").error is None
    assert sbx.run_code("x + 1").text == "42"
    assert sbx.run_code("import os; os.environ['GREETING'], os.getcwd()").text == "('hello', '/home/user')"
    again = Sandbox.connect(sbx.sandbox_id)  # the same interpreter, through a new client
    assert again.run_code("x").text == "41"
    info = again.get_info()
    assert info.sandbox_id == sbx.sandbox_id and info.metadata == {"flow": "lifecycle"}
    listed = BaseSandbox.list(query=e2b.SandboxQuery(metadata={"flow": "lifecycle"})).next_items()
    assert [s.sandbox_id for s in listed] == [sbx.sandbox_id]
    sbx.set_timeout(60)
    assert sbx.is_running()
    assert sbx.kill() is True
    assert BaseSandbox.kill(sbx.sandbox_id) is False  # gone: E2B's 404, not an error
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id)
    with pytest.raises((TimeoutException, SandboxException)) as gone:  # 2.46 on: SandboxNotRunningException
        sbx.run_code("1")
    assert "not found" in str(gone.value) or "timeout" in str(gone.value).lower()
    assert not sbx.is_running()


def test_commands_files_and_the_sandboxs_python() -> None:
    with Sandbox.create() as sbx:
        sbx.files.write("/home/user/data/input.txt", "3 4\n")
        sbx.files.write("/home/user/solve.py", "a, b = map(int, open('data/input.txt').read().split())\nprint(a * b)")
        ran = sbx.commands.run("python solve.py")
        assert (ran.exit_code, ran.stdout) == (0, "12\n")
        # python3 is the interpreter run_code runs, with its packages (a reward's test harness calls it)
        probe = "python3 -c 'import numpy, sys; print(numpy.arange(3).sum(), sys.version_info[0])'"
        assert sbx.commands.run(probe).stdout == "3 3\n"
        assert sbx.files.read("/home/user/data/input.txt") == "3 4\n"
        assert {e.name for e in sbx.files.list("/home/user")} >= {"data", "solve.py"}


def test_a_custom_template_is_the_images_sandbox() -> None:
    """``template=``: a sandbox of the node's image (``E2B_TEST_TEMPLATE``), its code run by the image's python."""
    with Sandbox.create(template=os.environ["E2B_TEST_TEMPLATE"], envs={"GREETING": "hi"}) as sbx:
        ran = sbx.run_code("import greeter, os\ngreeter.greet(os.environ['GREETING'])")
        assert ran.error is None and ran.text == "hello hi from the image", ran
        sbx.files.write("/home/user/n.txt", "7")
        assert sbx.commands.run("cat n.txt; echo; echo $FROM_PROFILE").stdout == "7\nimage\n"
        assert sbx.get_info().template_id == os.environ["E2B_TEST_TEMPLATE"]


EVALUATION = """
import subprocess
import json

def evaluate_code(code, test_cases):
    passed = 0
    for case in test_cases:
        process = subprocess.run(["python3", "-c", code], input=case["input"], text=True, capture_output=True,
                                 timeout=5)
        if process.returncode != 0:
            continue
        if process.stdout.strip() == case["output"].strip():
            passed += 1
    return passed / len(test_cases)

code_snippet = {code}
test_cases = json.loads({test_cases})

evaluate_code(code_snippet, test_cases)
"""


async def _code_rewards(programs: list[str], cases: list[dict[str, str]]) -> list[float]:
    """ms-swift's ``CodeReward.run_async`` (after open-r1's), as it drives E2B: one sandbox for a batch, every
    script through ``run_code`` at once, the last expression's text as the reward, any exception a 0.0."""
    sbx = await AsyncSandbox.create(timeout=30, request_timeout=3)

    async def run_script(script: str) -> float:
        try:
            execution = await sbx.run_code(script, language="python", timeout=30)
        except Exception:
            return 0.0
        try:
            return float(execution.text or "")
        except (TypeError, ValueError):
            return 0.0

    scripts = [EVALUATION.format(code=json.dumps(p), test_cases=json.dumps(json.dumps(cases))) for p in programs]
    rewards = list(await asyncio.gather(*(run_script(s) for s in scripts)))
    await sbx.kill()
    return rewards


def test_a_code_reward_as_ms_swift_computes_it() -> None:
    cases = [{"input": "2 3\n", "output": "5"}, {"input": "10 -4\n", "output": "6"}]
    programs = [
        "a, b = map(int, input().split())\nprint(a + b)",  # right
        "a, b = map(int, input().split())\nprint(a - b)",  # wrong on both
        "a, b = map(int, input().split())\nprint(5)",  # right on one
        "import numpy as np\nprint(int(np.sum([int(t) for t in input().split()])))",  # right, with numpy
        "while True:\n    pass",  # runs past the case's 5 s: a failed case
    ]
    assert asyncio.run(_code_rewards(programs, cases)) == [1.0, 0.0, 0.5, 1.0, 0.0]


def test_a_cell_the_client_stops_waiting_for_is_interrupted() -> None:
    """E2B's test_interrupt: a cell whose client timed out does not hold the next one behind it."""
    with Sandbox.create() as sbx:
        sbx.run_code("kept = 'state'")
        with pytest.raises(TimeoutException):
            sbx.run_code("import time; time.sleep(300)", timeout=3)
        t0 = time.monotonic()
        assert sbx.run_code("1 + 1", timeout=10).text == "2"
        assert time.monotonic() - t0 < 8
        assert sbx.run_code("kept").text == "state"  # interrupted, not restarted


def test_contexts_and_their_restart() -> None:
    with Sandbox.create() as sbx:
        ctx = sbx.create_code_context()
        assert sbx.run_code("y = 5", context=ctx).error is None
        assert sbx.run_code("y", context=ctx).text == "5"
        assert sbx.run_code("'y' in globals()").text == "False"  # the sandbox's own context is another
        sbx.restart_code_context(ctx)
        assert sbx.run_code("'y' in globals()", context=ctx).text == "False"
        assert sbx.run_code("import os; os.getcwd()", context=ctx).text == "/home/user"
        assert ctx.id in {c.id for c in sbx.list_code_contexts()}
        sbx.remove_code_context(ctx)
        assert ctx.id not in {c.id for c in sbx.list_code_contexts()}


def test_a_wrong_key_is_the_sdks_authentication_error() -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="e2b_" + "0" * 40)


def _refusal(call: object) -> Exception:
    """What the SDK raised: one of its own exceptions with the node's message, never a crash of its client
    (``KeyError: 'code'`` from a body without E2B's shape, a JSON error, or a silent False)."""
    try:
        result = call()  # type: ignore[operator]
    except Exception as exc:
        assert type(exc).__module__.startswith("e2b"), repr(exc)
        return exc
    raise AssertionError(f"not refused: {result!r}")


def test_what_is_not_served_is_an_sdk_exception() -> None:
    with Sandbox.create() as sbx:
        refusals = {
            "pause": _refusal(lambda: sbx.pause()),
            "fork": _refusal(lambda: sbx.fork()),
            "snapshot": _refusal(lambda: sbx.create_snapshot()),
            "network": _refusal(lambda: sbx.update_network({"allow_out": ["10.0.0.1"]})),
            "metrics": _refusal(lambda: sbx.get_metrics()),
            "template": _refusal(lambda: Sandbox.create(template="my-own-image")),
            "mcp": _refusal(lambda: Sandbox.create(mcp={"exa": {"apiKey": "k"}})),
        }
        if hasattr(BaseSandbox, "resume"):  # SDKs before 2.46 resume by this call
            refusals["resume"] = _refusal(lambda: BaseSandbox.resume(sbx.sandbox_id))
        if hasattr(e2b, "Volume"):
            refusals["volume"] = _refusal(lambda: e2b.Volume.create("vol"))
        for what, exc in refusals.items():
            assert "not served" in str(exc), (what, exc)
        assert sbx.run_code("1 + 1").text == "2"  # nothing of that harmed the sandbox
