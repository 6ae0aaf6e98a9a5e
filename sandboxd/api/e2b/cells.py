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

DRIVER_TEXT = r"""
import ast as _ast, base64 as _b64, io as _io, json as _json, linecache as _lc, os as _os, sys as _sys
import textwrap as _tw, traceback as _tb

_shown = None  # the running cell's results: where display() puts what it shows (None between cells)
_MIME = {"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
         "image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
         "application/json": "json", "application/javascript": "javascript"}


def _from_mime(bundle):
    data = {}
    for mime, value in bundle.items():
        key = _MIME.get(mime)
        if key is None:
            continue
        if isinstance(value, bytes):
            value = _b64.b64encode(value).decode()
        data[key] = value
    return data


def _drawn(fig):
    # A figure as E2B's kernel shows it: its PNG, and the chart it draws (read once drawn) where one is found.
    buf = _io.BytesIO()
    fig.savefig(buf, format="png")
    shown = {"text": repr(fig), "png": _b64.b64encode(buf.getvalue()).decode()}
    try:
        chart = chart_of(fig)
    except Exception:  # a chart is extra: the figure is shown whatever this finds
        chart = None
    if chart is not None:
        shown["chart"] = chart
    return shown


def _figure(value):
    figure = _sys.modules.get("matplotlib.figure")
    return _drawn(value) if figure is not None and isinstance(value, figure.Figure) else None


def display(*objs, raw=False, include=None, exclude=None, **kwargs):
    # IPython's display(), as a kernel's: each object's richest representations become a result of the cell
    # (not its main one); outside a cell, its text is printed, as IPython does without a kernel.
    for obj in objs:
        data = _from_mime(obj) if raw and isinstance(obj, dict) else _repr_bundle(obj)
        if include is not None:
            data = {k: v for k, v in data.items() if k in include or k == "text"}
        if exclude is not None:
            data = {k: v for k, v in data.items() if k not in exclude}
        if _shown is None:
            print(data.get("text", ""))
        else:
            _shown.append({**data, "is_main_result": False})


def _patch_ipython(module):
    module.display = display


def _patch_pil(module):
    # E2B's kernel shows a PIL image on show() and on save(); a save made by matplotlib is not the program's.
    cls = module.Image
    if getattr(cls, "_sandboxd_shown", False):
        return
    save = cls.save

    def shown_save(self, fp, format=None, **params):
        save(self, fp, format, **params)
        if not _sys._getframe(1).f_globals.get("__name__", "").startswith(("matplotlib", "PIL")):
            display(self)

    cls.show = lambda self, title=None, **options: display(self)
    cls.save = shown_save
    cls._sandboxd_shown = True


_PATCHES = {
    "IPython.core.display_functions": _patch_ipython,
    "PIL.Image": _patch_pil,
    "matplotlib.axes": record_boxplots,
}


class _Patcher:
    # Patches a module of _PATCHES right after it is first imported (the program imports it in a cell).
    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in _sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_module(module, run=run, patch=patch):
                    run(module)
                    patch(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


for _name, _patch in _PATCHES.items():
    if _name in _sys.modules:
        _patch(_sys.modules[_name])
_sys.meta_path.insert(0, _Patcher())


def _repr_bundle(value):
    text = repr(value)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]  # as E2B's server gives a string: without its quotes
    data = {"text": text}
    if isinstance(value, (list, dict)):
        try:
            data["json"] = _json.loads(_json.dumps(value, default=str))
        except (TypeError, ValueError):
            pass
    pandas = _sys.modules.get("pandas")
    if pandas is not None and isinstance(value, pandas.DataFrame):  # E2B's "e2b/data": columns as lists
        try:
            columns = _json.loads(value.to_json(orient="columns", date_format="iso"))
            data["data"] = {k: list(v.values()) for k, v in columns.items()}
        except (TypeError, ValueError):
            pass
    drawn = _figure(value)
    if drawn is not None:
        data.update(drawn)
    bundle = getattr(value, "_repr_mimebundle_", None)
    if callable(bundle):
        try:
            got = bundle()
            data.update(_from_mime(got[0] if isinstance(got, tuple) else got))
        except Exception:
            pass
    for attr, key in (("_repr_html_", "html"), ("_repr_markdown_", "markdown"), ("_repr_svg_", "svg"),
                      ("_repr_latex_", "latex"), ("_repr_json_", "json"), ("_repr_javascript_", "javascript"),
                      ("_repr_png_", "png"), ("_repr_jpeg_", "jpeg")):
        method = getattr(value, attr, None)
        if not callable(method):
            continue
        try:
            out = method()
        except Exception:
            continue
        if key in ("png", "jpeg"):
            out = _b64.b64encode(out).decode() if isinstance(out, bytes) else None
        if out is not None:
            data[key] = out
    return data


def _shell_lines(code):
    lines = code.splitlines(True)
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if stripped.startswith("!") and not stripped.startswith("!="):
            indent = line[: len(line) - len(stripped)]
            command = stripped[1:].rstrip("\n")
            lines[i] = indent + "__import__('subprocess').run(%r, shell=True)\n" % command
    return "".join(lines)


def _figures():
    plt = _sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    shown = []
    try:
        for num in plt.get_fignums():
            shown.append({**_drawn(plt.figure(num)), "is_main_result": False})
    finally:  # a figure that cannot be drawn is this cell's error once, never every later cell's
        plt.close("all")
    return shown


def restart(user, home, marker, language=None):
    # A kernel's restart as this interpreter can make it: the context's variables gone, the count from 1, its
    # figures closed, back in its home. Modules stay imported (a fresh kernel imports them again, the same).
    globals().setdefault("_counts", {}).pop(language, None)
    if language is not None:  # another language's context: its kernel only
        end_kernels(language)
    else:
        keep = ("__name__", "__doc__", "__builtins__", "__spec__", "__loader__", "__package__")
        kept = {k: user[k] for k in keep if k in user}
        user.clear()
        user.update(kept)
        plt = _sys.modules.get("matplotlib.pyplot")
        if plt is not None:
            plt.close("all")
        _os.chdir(home)
    _answer(marker, {})


def _answer(marker, events):
    # NaN and infinities as null (E2B's JSON has no NaN); what JSON cannot hold (a set a repr returned) as text
    def clean(value):
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            return None
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    out = ("\n" + marker + _json.dumps(clean(events), default=repr, allow_nan=False) + "\n").encode()
    while out:
        out = out[_os.write(1, out):]


def run(code, envs, marker, user, language=None):
    global executions, _shown
    kernel = language_of(language)
    counts = globals().setdefault("_counts", {})  # per language, as E2B counts each context's cells
    counts[kernel] = counts.get(kernel, 0) + 1
    executions = counts[kernel]
    events = {"results": [], "error": None, "execution_count": executions}
    if kernel is not None:  # another language's kernel: its output went to ours as it came
        answer = run_in_kernel(kernel, _tw.dedent(code), envs)
        if answer.get("error"):
            events["error"] = answer["error"]
        elif answer.get("text") is not None:
            events["results"].append({"text": answer["text"], "is_main_result": True})
        _answer(marker, events)
        return
    _shown = events["results"]
    user.setdefault("display", display)  # a kernel's user namespace has it without an import
    saved = {k: _os.environ.get(k) for k in envs}
    name = "<cell %d>" % executions  # kept in linecache: tracebacks show the source, later ones too
    code = _shell_lines(_tw.dedent(code))  # as IPython: indented cells run, "!cmd" lines are shell commands
    _lc.cache[name] = (len(code), None, code.splitlines(True), name)
    try:
        _os.environ.update(envs)  # inside: a name the OS refuses is this execution's error, and rolled back
        tree = _ast.parse(code, name, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], _ast.Expr):
            last = _ast.Expression(tree.body.pop().value)
        exec(compile(tree, name, "exec"), user)
        value = eval(compile(last, name, "eval"), user) if last is not None else None
        events["results"].extend(_figures())
        if value is not None:
            user["_"] = value
            events["results"].append({**_repr_bundle(value), "is_main_result": True})
    except BaseException as exc:  # KeyboardInterrupt (an interrupt) and SystemExit too, as a kernel reports them
        try:
            events["results"].extend(_figures())  # what the cell drew before it failed is shown, as a kernel does
        except Exception:
            pass
        tb = exc.__traceback__
        while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell "):
            tb = tb.tb_next
        events["error"] = {"name": type(exc).__name__, "value": str(exc),
                           "traceback": "".join(_tb.format_exception(type(exc), exc, tb))}
    finally:
        _shown = None
        for k, v in saved.items():
            if v is None:
                _os.environ.pop(k, None)
            else:
                _os.environ[k] = v
        for stream in (_sys.stdout, _sys.stderr, _sys.__stdout__, _sys.__stderr__):
            try:
                stream.flush()
            except Exception:
                pass
    _answer(marker, events)
"""
# The driver as the sandbox builds it: the chart extraction and the other languages' kernels (real modules
# here, linted and typed) first.
HERE = Path(__file__).parent
DRIVER = (
    (HERE / "charts.py").read_text()
    + (HERE / "kernels.py").read_text()
    + f"_JS_KERNEL = {(HERE / 'kernel.js').read_text()!r}\n"
    + f"_JAVA_KERNEL = {(HERE / 'Kernel.java').read_text()!r}\n"
    + DRIVER_TEXT
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
