"""E2B's 1.x SDK line against a node, as the programs written for it use it: reached by ``E2B_DOMAIN`` alone
(1.x knows no other way), sandboxes made by the constructor with ``secure`` left to its default (``false``:
1.x's ``run_code`` never sends a token), and rllm's E2B tool (tests/peers/rllm_tools), verbatim.

Run by tests/test_e2b_versions.py in its own venv (constraints-e2b-1x.txt) against a node that serves sandboxes
reached by their id (``SANDBOXD_E2B_INSECURE_SANDBOXES``); only E2B's environment variables point at it. Nothing
of sandboxd's is imported: this is a user's program.
"""

from __future__ import annotations

import os
from importlib.metadata import version

import pytest
from e2b import SandboxException
from e2b_code_interpreter import Sandbox
from rllm.tools.code_tools.e2b_tool import E2BPythonInterpreter

pytestmark = pytest.mark.timeout(120)


def gone(sandbox_id: str) -> None:
    """A killed sandbox is E2B's 404 (1.x raises it as a plain ``SandboxException`` naming the status)."""
    with pytest.raises(SandboxException, match="404"):
        Sandbox.connect(sandbox_id)


def test_the_release_asked_for() -> None:
    assert f"{version('e2b')}/{version('e2b-code-interpreter')}" == os.environ["E2B_EXPECT_VERSION"]


def test_a_sandbox_reached_by_its_id() -> None:
    """``secure`` left as 1.x leaves it: no token is issued, and code, files and commands reach the sandbox by
    its host name alone."""
    sbx = Sandbox(metadata={"flow": "1.x"}, timeout=120)
    try:
        assert sbx._envd_access_token is None  # as E2B answers a sandbox made with secure: false
        assert sbx.run_code("x = 41").error is None
        assert sbx.run_code("x + 1").text == "42"  # state across cells
        sbx.files.write("/home/user/in.txt", "6 7\n")
        ran = sbx.commands.run("python3 -c \"print(eval(open('in.txt').read().replace(' ', '*')))\"")
        assert (ran.exit_code, ran.stdout) == (0, "42\n")
        assert sbx.files.read("/home/user/in.txt") == "6 7\n"
        ctx = sbx.create_code_context()
        assert sbx.run_code("y = 1; y", context=ctx).text == "1"
        assert sbx.run_code("'y' in globals()").text == "False"  # the default context did not see it
        assert Sandbox.connect(sbx.sandbox_id).run_code("x").text == "41"
    finally:
        sbx.kill()
    gone(sbx.sandbox_id)


def test_a_secure_sandbox_needs_its_token() -> None:
    """``secure=True``: envd's calls carry the token and work; 1.x's ``run_code`` carries none and is refused,
    saying why (never run as if it were open)."""
    sbx = Sandbox(secure=True, timeout=120)
    try:
        assert sbx._envd_access_token
        assert sbx.commands.run("echo ok").stdout == "ok\n"
        with pytest.raises(SandboxException) as refused:
            sbx.run_code("1")
        assert "secure: false" in str(refused.value), refused.value
    finally:
        sbx.kill()


def test_rllms_e2b_tool() -> None:
    """rllm's tool as its agents call it: two sandboxes round robin, a program's output, its error's traceback,
    and the sandboxes killed at the end."""
    tool = E2BPythonInterpreter(n_sandboxes=2)
    try:
        out = tool.forward("print(sum(range(10)))")
        assert (out.stdout, out.stderr, out.error) == ("45\n", None, None), out
        out = tool.forward("import math\nprint(math.factorial(5))\nmath.sqrt(16)")
        assert (out.stdout, out.output, out.to_string()) == ("120\n", "4.0", "4.0"), out
        out = tool.forward("print('before')\n1 / 0")
        assert out.stdout == "before\n" and "ZeroDivisionError" in (out.stderr or ""), out
        assert [s.is_running() for s in tool.sandboxes] == [True, True]
    finally:
        sandboxes = list(tool.sandboxes)
        tool._kill_sandbox()
    for sbx in sandboxes:
        gone(sbx.sandbox_id)
