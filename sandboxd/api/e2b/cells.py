"""The code interpreter's ``/execute`` as a python session cell, and its answer as the SDK's NDJSON lines.

E2B's code interpreter is a Jupyter kernel: the value of a cell's last expression is its main result, open
matplotlib figures are displayed as PNG, an exception is an ``error`` (the execution still answers 200),
and ``execution_count`` counts the cells. Here a sandbox is a python session, so each ``/execute`` sends
one cell that runs the code in the session's globals the way a kernel would, then writes what the kernel
would have displayed to the cell's stdout after a marker the request chose at random. What comes before
the marker is the program's own stdout.

The driver runs inside the tenant's own interpreter, so the program can read or rebind it: it can only
forge its own sandbox's results (as in a Jupyter kernel), never another's.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import orjson

# The driver as the sandbox builds it: the chart extraction and the other languages' kernels first, then the
# driver itself (insandbox/driver.py); all real modules here, linted and typed.
HERE = Path(__file__).parent
DRIVER = (
    (HERE / "charts.py").read_text()
    + (HERE / "kernels.py").read_text()
    + f"_JS_KERNEL = {(HERE / 'kernel.js').read_text()!r}\n"
    + f"_JAVA_KERNEL = {(HERE / 'Kernel.java').read_text()!r}\n"
    + (HERE / "insandbox" / "driver.py").read_text()
)


def module_cell(module: str, source: str, call: str) -> str:
    """A cell that calls ``module.<call>``, building the module from ``source`` first when this interpreter has
    not got it (its first use, or the program dropped it): nothing of a driver's lands in the program's globals."""
    build = (
        f"(lambda m: (__import__('sys').modules.__setitem__({module!r}, m), exec({source!r}, m.__dict__), m)[2])"
        f"(type(__import__('sys'))({module!r}))"
    )
    return f"(__import__('sys').modules.get({module!r}) or {build}).{call}\n"


def new_marker() -> str:
    """What a driver's answer follows on the cell's stdout: random per request, so output cannot be taken for it
    by accident (the program could still forge its own sandbox's answer, as it could its own output)."""
    return f"\x1esandboxd-e2b-{secrets.token_hex(16)}\x1e"


def restart_cell(home: str, language: str | None = None) -> tuple[str, str]:
    """The session cell for a context's restart (``language``: only that kernel's), and its answer's marker."""
    marker = new_marker()
    return module_cell("_sandboxd_e2b", DRIVER, f"restart(globals(), {home!r}, {marker!r}, {language!r})"), marker


def execution_cell(code: str, envs: dict[str, str], language: str | None = None) -> tuple[str, str]:
    """The session cell for one ``/execute`` (``language``: a kernel's, ``KERNEL_LANGUAGES``; None: python),
    and the marker its answer follows."""
    marker = new_marker()
    call = f"run({code!r}, {envs!r}, {marker!r}, globals(), {language!r})"
    return module_cell("_sandboxd_e2b", DRIVER, call), marker


def split_answer(stdout: str, marker: str) -> tuple[str, str | None]:
    """The program's own stdout, and the driver's answer after the marker (None when it never came)."""
    head, found, tail = stdout.rpartition("\n" + marker)
    return (head, tail.strip()) if found else (stdout, None)


def ndjson(result: dict[str, Any], marker: str) -> bytes:
    """The SDK's lines for a session step's result: stdout, stderr, results, error, execution count."""
    obs = result.get("observation") or {}
    stdout, answer = split_answer(str(obs.get("stdout") or ""), marker)
    stderr = str(obs.get("stderr") or "")
    found = answer is not None
    events: dict[str, Any] = {}
    if answer is not None:
        try:
            events = orjson.loads(answer)
        except orjson.JSONDecodeError:
            events = {}
    lines: list[dict[str, Any]] = []
    ts = time.time_ns()
    if stdout:
        lines.append({"type": "stdout", "text": stdout, "timestamp": ts})
    if stderr:
        lines.append({"type": "stderr", "text": stderr, "timestamp": ts})
    results = events.get("results") if isinstance(events, dict) else None
    # What the driver said is only taken in its own shape: a program that changed it hurts only its answers.
    lines.extend({**r, "type": "result"} for r in results or [] if isinstance(r, dict))
    error = events.get("error") if isinstance(events, dict) else None
    if not (isinstance(error, dict) and {"name", "value", "traceback"} <= error.keys()):
        error = _step_error(result, found=bool(found))
    if error:
        lines.append(
            {
                "type": "error",
                "name": str(error["name"]),
                "value": str(error["value"]),
                "traceback": str(error["traceback"]),
            }
        )
    count = events.get("execution_count") if isinstance(events, dict) else None
    if isinstance(count, int):
        lines.append({"type": "number_of_executions", "execution_count": count})
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def _step_error(result: dict[str, Any], found: bool) -> dict[str, str] | None:
    """An execution the driver could not report on: killed at a limit, timed out, its output cut."""
    err = result.get("error")
    if err:
        names = {"program_timeout": "TimeoutError", "program_killed": "MemoryError"}
        name = names.get(str(err.get("code")), "SandboxError")
        if ((result.get("observation") or {}).get("killed_by")) == "output":
            name = "OutputLimitError"
        return {"name": name, "value": str(err.get("message")), "traceback": ""}
    if not found:
        return {
            "name": "OutputLimitError",
            "value": "the execution's output passed the node's max_output_bytes; its results were cut",
            "traceback": "",
        }
    return None
