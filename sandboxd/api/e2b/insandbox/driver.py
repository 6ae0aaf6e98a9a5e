"""The code interpreter's driver inside an E2B sandbox: one cell of the session's interpreter per ``/execute``.

``cells.py`` builds it there as a module of its own, from the chart extraction (``charts.py``), the other
languages' kernels (``kernels.py``, with ``kernel.js`` and ``Kernel.java`` as text) and this file, in that
order: the names it takes from them are imported here only for the type checker. A cell runs the code in the
session's globals the way a Jupyter kernel would, then writes what the kernel would have displayed to the
cell's stdout after a marker the request chose at random. It runs inside the tenant's own interpreter, so the
program can read or rebind it: it can only forge its own sandbox's results (as in a Jupyter kernel), never
another's.
"""

import ast as _ast
import base64 as _b64
import io as _io
import json as _json
import linecache as _lc
import os as _os
import sys as _sys
import textwrap as _tw
import traceback as _tb
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # in the sandbox these come first in the driver's own text (cells.py builds it)
    from sandboxd.api.e2b.charts import chart_of, record_boxplots
    from sandboxd.api.e2b.kernels import end_kernels, language_of, run_in_kernel

# The running cell's results: where display() puts what it shows (None between cells).
_shown: list[dict[str, Any]] | None = None
executions = 0  # the current context's count of cells (E2B's execution_count)
_MIME: dict[str, str] = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


def _from_mime(bundle: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for mime, value in bundle.items():
        key = _MIME.get(mime)
        if key is None:
            continue
        if isinstance(value, bytes):
            value = _b64.b64encode(value).decode()
        data[key] = value
    return data


def _drawn(fig: Any) -> dict[str, Any]:
    # A figure as E2B's kernel shows it: its PNG, and the chart it draws (read once drawn) where one is found.
    buf = _io.BytesIO()
    fig.savefig(buf, format="png")
    shown: dict[str, Any] = {"text": repr(fig), "png": _b64.b64encode(buf.getvalue()).decode()}
    try:
        chart = chart_of(fig)
    except Exception:  # a chart is extra: the figure is shown whatever this finds
        chart = None
    if chart is not None:
        shown["chart"] = chart
    return shown


def _figure(value: Any) -> dict[str, Any] | None:
    figure = _sys.modules.get("matplotlib.figure")
    return _drawn(value) if figure is not None and isinstance(value, figure.Figure) else None


def display(
    *objs: Any,
    raw: bool = False,
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
    **kwargs: Any,
) -> None:
    # IPython's display(), as a kernel's: each object's richest representations become a result of the cell
    # (not its main one); outside a cell, its text is printed, as IPython does without a kernel.
    for obj in objs:
        data = _from_mime(obj) if raw and isinstance(obj, dict) else _repr_bundle(obj)
        if include is not None:
            wanted = set(include)
            data = {k: v for k, v in data.items() if k in wanted or k == "text"}
        if exclude is not None:
            unwanted = set(exclude)
            data = {k: v for k, v in data.items() if k not in unwanted}
        if _shown is None:
            print(data.get("text", ""))
        else:
            _shown.append({**data, "is_main_result": False})


def _patch_ipython(module: Any) -> None:
    module.display = display


def _patch_pil(module: Any) -> None:
    # E2B's kernel shows a PIL image on show() and on save(); a save made by matplotlib is not the program's.
    cls = module.Image
    if getattr(cls, "_sandboxd_shown", False):
        return
    save = cls.save

    def shown_save(self: Any, fp: Any, format: str | None = None, **params: Any) -> None:
        save(self, fp, format, **params)
        if not _sys._getframe(1).f_globals.get("__name__", "").startswith(("matplotlib", "PIL")):
            display(self)

    def shown_show(self: Any, title: str | None = None, **options: Any) -> None:
        display(self)

    cls.show = shown_show
    cls.save = shown_save
    cls._sandboxd_shown = True


_PATCHES: dict[str, Callable[[Any], None]] = {
    "IPython.core.display_functions": _patch_ipython,
    "PIL.Image": _patch_pil,
    "matplotlib.axes": record_boxplots,
}


class _Patcher:
    # Patches a module of _PATCHES right after it is first imported (the program imports it in a cell).
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in _sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                run = spec.loader.exec_module

                def exec_module(module: Any, run: Any = run, patch: Callable[[Any], None] = patch) -> None:
                    run(module)
                    patch(module)

                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


for _name, _patch in _PATCHES.items():
    if _name in _sys.modules:
        _patch(_sys.modules[_name])
_sys.meta_path.insert(0, _Patcher())


def _repr_bundle(value: Any) -> dict[str, Any]:
    text = repr(value)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]  # as E2B's server gives a string: without its quotes
    data: dict[str, Any] = {"text": text}
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
    for attr, key in (
        ("_repr_html_", "html"),
        ("_repr_markdown_", "markdown"),
        ("_repr_svg_", "svg"),
        ("_repr_latex_", "latex"),
        ("_repr_json_", "json"),
        ("_repr_javascript_", "javascript"),
        ("_repr_png_", "png"),
        ("_repr_jpeg_", "jpeg"),
    ):
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


def _shell_lines(code: str) -> str:
    lines = code.splitlines(True)
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if stripped.startswith("!") and not stripped.startswith("!="):
            indent = line[: len(line) - len(stripped)]
            command = stripped[1:].rstrip("\n")
            lines[i] = indent + f"__import__('subprocess').run({command!r}, shell=True)\n"
    return "".join(lines)


def _figures() -> list[dict[str, Any]]:
    plt = _sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return []
    shown: list[dict[str, Any]] = []
    try:
        for num in plt.get_fignums():
            shown.append({**_drawn(plt.figure(num)), "is_main_result": False})
    finally:  # a figure that cannot be drawn is this cell's error once, never every later cell's
        plt.close("all")
    return shown


def restart(user: dict[str, Any], home: str, marker: str, language: str | None = None) -> None:
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


def _answer(marker: str, events: dict[str, Any]) -> None:
    # NaN and infinities as null (E2B's JSON has no NaN); what JSON cannot hold (a set a repr returned) as text
    def clean(value: Any) -> Any:
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            return None
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    out = ("\n" + marker + _json.dumps(clean(events), default=repr, allow_nan=False) + "\n").encode()
    while out:
        out = out[_os.write(1, out) :]


def run(code: str, envs: dict[str, str], marker: str, user: dict[str, Any], language: str | None = None) -> None:
    global executions, _shown
    kernel = language_of(language)
    counts = globals().setdefault("_counts", {})  # per language, as E2B counts each context's cells
    counts[kernel] = counts.get(kernel, 0) + 1
    executions = counts[kernel]
    events: dict[str, Any] = {"results": [], "error": None, "execution_count": executions}
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
    name = f"<cell {executions}>"  # kept in linecache: tracebacks show the source, later ones too
    code = _shell_lines(_tw.dedent(code))  # as IPython: indented cells run, "!cmd" lines are shell commands
    _lc.cache[name] = (len(code), None, code.splitlines(True), name)
    try:
        _os.environ.update(envs)  # inside: a name the OS refuses is this execution's error, and rolled back
        tree = _ast.parse(code, name, "exec")
        last = None
        if tree.body and isinstance(tail := tree.body[-1], _ast.Expr):
            tree.body.pop()
            last = _ast.Expression(tail.value)
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
        events["error"] = {
            "name": type(exc).__name__,
            "value": str(exc),
            "traceback": "".join(_tb.format_exception(type(exc), exc, tb)),
        }
    finally:
        _shown = None
        for k, v in saved.items():
            if v is None:
                _os.environ.pop(k, None)
            else:
                _os.environ[k] = v
        for stream in (_sys.stdout, _sys.stderr, _sys.__stdout__, _sys.__stderr__):
            try:
                stream.flush()  # type: ignore[union-attr]  # a stream the program set to None: nothing to flush
            except Exception:
                pass
    _answer(marker, events)
