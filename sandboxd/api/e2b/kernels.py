"""Code contexts in other languages, run inside an E2B sandbox: a JavaScript or bash process per language,
kept by the sandbox's python interpreter (the code interpreter's driver) across cells, as a notebook's
kernel keeps its state.

This file's source is part of the in-sandbox driver (``cells.py`` appends it, with ``kernel.js`` as
``_JS_KERNEL``), so it imports only the standard library. A cell is sent to its kernel; what it prints is
read from the kernel's stdout and stderr up to the cell's marker and written to the cell's own, so the
session step carries it as any python cell's output; the cell's answer (a value's text, or an error) comes
back on a pipe of its own. A kernel that dies, or a cell interrupted (the client left, the step's limit), ends
that kernel: the next cell starts a fresh one, as a kernel restart would.
"""

import base64 as _kbase64
import contextlib as _kcontextlib
import json as _kjson
import os as _kos
import secrets as _ksecrets
import selectors as _kselectors
import shlex as _kshlex
import signal as _ksignal
import subprocess as _ksp
import sys as _ksys
from typing import Any

_JS_KERNEL = ""  # kernel.js's source, set when the driver is built
_JAVA_KERNEL = ""  # Kernel.java's source, likewise
_STATE = "/tmp/.sandboxd-e2b"  # the facade's own files in the sandbox (hidden from its listings)
_LANGUAGES = {
    "js": "javascript",
    "javascript": "javascript",
    "ts": "typescript",
    "typescript": "typescript",
    "bash": "bash",
    "sh": "bash",
    "java": "java",
}
_STALE_MAX = 10_000  # lines on the answer pipe that are not this cell's answer, before the kernel is ended
_NODE_PATH = "/usr/local/lib/node_modules"  # the node's packages (read-only): typescript, lodash, ...
_kernels: dict[str, Any] = {}


class _Kernel:
    def __init__(self, language: str) -> None:
        self.language = language
        read_answer, write_answer = _kos.pipe()
        self.answer_fd = write_answer  # its number in the kernel
        if language in ("javascript", "typescript"):
            argv = ["node", "-e", _JS_KERNEL, str(write_answer), "ts" if language == "typescript" else "js"]
        elif language == "java":  # JShell in one small JVM (its snippets run in it: no second JVM)
            _kos.makedirs(_STATE, exist_ok=True)
            source = _STATE + "/Kernel.java"
            with open(source, "w") as f:
                f.write(_JAVA_KERNEL)
            jvm = ["-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss1m", "-XX:MaxRAMPercentage=40"]
            argv = ["java", *jvm, source, str(write_answer)]
        else:
            argv = ["bash", "--noprofile", "--norc", "-s"]
        self.proc = _ksp.Popen(
            argv,
            stdin=_ksp.PIPE,
            stdout=_ksp.PIPE,
            stderr=_ksp.PIPE,
            pass_fds=(write_answer,),
            env={"NODE_PATH": _NODE_PATH, **_kos.environ},
            start_new_session=True,
        )
        _kos.close(write_answer)
        self.answers = _kos.fdopen(read_answer, "rb")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        with _kcontextlib.suppress(OSError):
            _kos.killpg(self.proc.pid, _ksignal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr, self.answers):
            if stream is not None:
                with _kcontextlib.suppress(OSError):
                    stream.close()

    def request(self, code: str, envs: dict[str, str], marker: str) -> bytes:
        if self.language == "java":
            pairs = "\n".join(f"{k}={v}" for k, v in envs.items())
            return f"{marker} {_kb64(code)} {_kb64(pairs)}\n".encode()
        if self.language != "bash":
            return (_kjson.dumps({"code": code, "envs": envs, "marker": marker}) + "\n").encode()
        # bash: the cell through eval of a here-document (an unbalanced quote is its own syntax error, never a
        # read of what follows), its stdin /dev/null (a `read` or `cat` does not eat the protocol), in this shell
        saved = " ".join(f"__sbx_{i}=${{{k}-__sbx_unset}};" for i, k in enumerate(envs))
        put = " ".join(f"export {k}={_kshlex.quote(v)};" for k, v in envs.items())
        back = " ".join(
            f'if [ "$__sbx_{i}" = __sbx_unset ]; then unset {k}; else export {k}="$__sbx_{i}"; fi;'
            for i, k in enumerate(envs)
        )
        cell = f"eval \"$(cat <<'__sbx_{marker}'\n{code}\n__sbx_{marker}\n)\" </dev/null"
        end = (
            f"__sbx_rc=$?; {back} printf '\\036%s\\n' {marker} >&2; printf '\\036%s\\n' {marker}; "
            f'printf \'{{"exit": %d, "marker": "%s"}}\\n\' "$__sbx_rc" {marker} >&{self.answer_fd}'
        )
        return f"{saved} {put}\n{cell}\n{end}\n".encode()

    def run(self, code: str, envs: dict[str, str]) -> dict[str, Any]:
        """Send one cell; copy its output to ours as it comes; its answer."""
        marker = "sbx-" + _ksecrets.token_hex(12)
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdin.write(self.request(code, envs, marker))
        self.proc.stdin.flush()
        end = ("\x1e" + marker + "\n").encode()
        pending = {self.proc.stdout.fileno(): (b"", 1), self.proc.stderr.fileno(): (b"", 2)}
        selector = _kselectors.DefaultSelector()
        for fd in pending:
            selector.register(fd, _kselectors.EVENT_READ)
        try:
            while pending:
                for key, _ in selector.select():
                    fd = key.fd
                    chunk = _kos.read(fd, 65536)
                    seen, out = pending[fd]
                    seen += chunk
                    if not chunk:  # the kernel ended mid-cell
                        _write(out, seen)
                        raise EOFError
                    at = seen.find(end)
                    if at >= 0:
                        _write(out, seen[:at])
                        selector.unregister(fd)
                        del pending[fd]
                    else:
                        keep = len(end) - 1  # a marker split across two reads
                        _write(out, seen[:-keep] if len(seen) > keep else b"")
                        pending[fd] = (seen[-keep:] if len(seen) > keep else seen, out)
        finally:
            selector.close()
        for _ in range(_STALE_MAX):  # the answer tagged with this cell's marker; others (forged, stale) skipped
            line = self.answers.readline()
            if not line:
                raise EOFError
            try:
                answer = _kjson.loads(line)
            except ValueError:
                continue
            if isinstance(answer, dict) and answer.get("marker") == marker:
                return answer
        raise EOFError


def _kb64(text: str) -> str:
    return _kbase64.b64encode(text.encode()).decode()


def _write(fd: int, data: bytes) -> None:
    _ksys.stdout.flush() if fd == 1 else _ksys.stderr.flush()
    while data:
        data = data[_kos.write(fd, data) :]


def language_of(language: str | None) -> str | None:
    """The kernel a cell's language names; None for python (the driver's own interpreter)."""
    if language in (None, "", "python", "python3"):
        return None
    return _LANGUAGES[str(language).lower()]


def run_in_kernel(language: str, code: str, envs: dict[str, str]) -> dict[str, Any]:
    """One cell in the language's kernel (started on first use): ``{"text": ...}`` or ``{"error": {...}}``."""
    kernel = _kernels.get(language)
    if kernel is None or not kernel.alive():
        kernel = _kernels[language] = _Kernel(language)
    try:
        answer = kernel.run(code, envs)
    except EOFError:
        _kernels.pop(language, None)
        kernel.kill()
        why = f"the {language} kernel ended (exit status {kernel.proc.returncode}); the next cell starts a new one"
        return {"error": {"name": "KernelDied", "value": why, "traceback": ""}}
    except BaseException:  # interrupted (the client left, the step's limit): the kernel's state is gone
        _kernels.pop(language, None)
        kernel.kill()
        raise
    if "exit" in answer:  # bash: a failing last command is the cell's error, as bash_kernel reports it
        rc = answer["exit"]
        return {"text": None} if rc == 0 else {"error": {"name": "ExitCode", "value": str(rc), "traceback": ""}}
    error = answer.get("error")
    if isinstance(error, dict):
        return {"error": {k: str(error.get(k, "")) for k in ("name", "value", "traceback")}}
    text = answer.get("text")
    return {"text": None if text is None else str(text)}


def end_kernels(language: str | None = None) -> None:
    """A context's restart: its kernel (``language``), or every kernel, goes with its state."""
    for name in [language] if language else list(_kernels):
        kernel = _kernels.pop(name, None)
        if kernel is not None:
            kernel.kill()
