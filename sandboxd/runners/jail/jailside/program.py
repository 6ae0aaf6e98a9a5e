"""A step's python program, run as ``python -c`` or ``python main.py`` would run it (stdlib only; runs in the
executor, in the interpreter the program shares with the harness): its ``__main__``, import path and stdio,
its own modules winning over the harness's, its uncaught exception and exit status as CPython reports them,
and the end of the interpreter (threads joined, exit handlers run, output flushed)."""

from __future__ import annotations

import builtins
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # inside the jail these are plain modules beside the zygote (no sandboxd package there)
    from sandboxd.runners.jail.jailside import bound
else:
    import bound

__builtins__ = bound.BUILTINS  # type: ignore[assignment]  # before any def (bound.py says why)
_sys, _ModuleType, _dirname = bound._sys, bound._ModuleType, bound._dirname
_threading, _threading_shutdown, _atexit_run = bound._threading, bound._threading_shutdown, bound._atexit_run
_print_exception, _linecache, _sys_excepthook = bound._print_exception, bound._linecache, bound._sys_excepthook

# The program's import path: the interpreter's own, without the harness's directory (``import wire`` is
# the program's business), headed by its script's directory or, as under ``python -c``, the working one.
PROGRAM_PATH = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]
# The environments this jail serves, by index: (site directory, modules its template preloads). From argv.
ENVS: list[tuple[str, list[str]]] = []
# The modules plain ``python main.py`` of this interpreter holds when ``main.py`` starts (from argv: the
# worker asked the interpreter once). A step's own module named like one of these loses to it there, and
# here; named like anything else this harness (or a template) imported, it wins there, and must here.
STARTUP: set[str] = set()
_MODULE_SUFFIXES = (".py", ".pyc", ".pyw", ".so")  # and the ``.cpython-...so`` kind, which ends in ``.so``
_streams: list[Any] = []  # the stdio objects the harness made for the program: flushed whatever it rebinds


def env_site(req: dict[str, Any]) -> str | None:
    env = req.get("env")
    return ENVS[env][0] if type(env) is int and 0 <= env < len(ENVS) else None


def tops_of(req: dict[str, Any]) -> set[str]:
    """The top-level module names the step's files could be imported as (a name too many only costs a purge)."""
    out = set()
    for given, *_ in req.get("files", []):
        rel = os.path.normpath(str(given))  # as staged: "./calendar.py" is calendar.py
        first = rel.split("/", 1)[0]
        if "/" in rel:
            out.add(first)
        elif first.endswith(_MODULE_SUFFIXES):
            out.add(first.split(".", 1)[0])
    script = req.get("script")
    if script:
        out.add(str(script).split(".", 1)[0])
    return out


_ORIGINALS: dict[str, Any] = {}  # the modules the harness imported, as it imported them (``shadow``)
# In a template and its executors: its preloads (numpy, ...) cannot be imported twice in one process, so a
# step whose files are named like a module it imported is never sent here (the worker runs it lean).
_IN_TEMPLATE = False


def enter_template() -> None:
    """This process is a template (and what it forks, its executors): ``shadow`` leaves its modules be."""
    global _IN_TEMPLATE
    _IN_TEMPLATE = True


def shadow(tops: set[str]) -> None:
    """Make the step's own modules win as they would under ``python main.py`` in its directory: when one is
    named like a module this interpreter imported and plain python would not have at start, every such
    module still as the harness imported it leaves ``sys.modules``, and the program imports afresh (its
    own files first on the path) whatever it imports. The harness keeps its own references."""
    if not tops or _IN_TEMPLATE:  # most steps have no files: nothing to look at
        return
    if not _ORIGINALS:
        _ORIGINALS.update(sys.modules)
    startup_tops = {name.split(".", 1)[0] for name in STARTUP}
    present = {
        top
        for name, mod in sys.modules.items()
        if _ORIGINALS.get(name) is mod and (top := name.split(".", 1)[0]) not in bound.HARNESS_MODULES
    }
    if not (tops & present) - startup_tops:
        return
    for name, mod in list(sys.modules.items()):
        if name not in STARTUP and _ORIGINALS.get(name) is mod:
            del sys.modules[name]


def fresh_main(script: str | None = None, site: str | None = None) -> dict[str, Any]:
    """``__main__`` as CPython makes it for ``python -c`` (no script) or ``python <script>``; the step's
    environment, if any, last on the path, where site-packages would be."""
    for name in [m for m in sys.modules if m in bound.HARNESS_MODULES or m == "__mp_main__"]:
        del sys.modules[name]
    main = _ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins  # the real module: the program's own, to change as it likes
    sys.modules["__main__"] = main
    tail = [site] if site else []
    # A program's own ``python3 -c ...`` (a reward's test harness, ``subprocess.run``, ``!pip list``) is this
    # interpreter (first on PATH) with the same environment, as a venv's would be, not the system's bare one.
    if site:
        os.environ["PYTHONPATH"] = site
    else:
        os.environ.pop("PYTHONPATH", None)
    if script:
        main.__dict__.update(__file__=script, __cached__=None)
        sys.argv = [script]
        sys.path[:] = [_dirname(script), *PROGRAM_PATH, *tail]
    else:
        sys.argv = ["-c"]
        sys.path[:] = ["", *PROGRAM_PATH, *tail]
    return main.__dict__


def stdio() -> None:
    sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
    _streams[:] = [sys.stdout, sys.stderr]


def flush() -> None:
    """What the program wrote reaches its pipes, whatever it rebound: CPython flushes ``sys.stdout`` and
    ``sys.stderr`` at exit, and the objects it made them (still referenced) when they are finalized."""
    for stream in (getattr(_sys, "stdout", None), getattr(_sys, "stderr", None), *_streams):
        try:
            stream.flush()
        except BaseException:
            pass


def _exit_status(exc: SystemExit) -> int:
    """``sys.exit(x)`` as CPython ends with it: None is 0, an int its low byte, anything else printed, 1."""
    try:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        stream = getattr(_sys, "stderr", None)
        print(code, file=stream if stream is not None else _streams[1])
    except BaseException:
        pass
    return 1


def _report(exc: BaseException) -> None:
    """An uncaught exception as CPython reports it (through ``sys.excepthook``), starting at the program's
    own frame; a hook the program broke or removed falls back to the standard report."""
    try:
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        hook = getattr(_sys, "excepthook", None)
        if hook is not None and hook is not _sys_excepthook:
            try:
                hook(type(exc), exc, tb)
                return
            except BaseException:
                pass
        stream = getattr(_sys, "stderr", None)
        _print_exception(type(exc), exc, tb, file=stream if stream is not None else _streams[1])
    except BaseException:
        pass


def exec_code(code: bytes, namespace: dict[str, Any], filename: str = "<program>") -> int:
    """Run ``code`` like ``python -c`` would; return its exit code."""
    text = code.decode("utf-8", errors="replace")
    _linecache[filename] = (len(text), None, text.splitlines(True), filename)
    try:
        exec(compile(text, filename, "exec"), namespace)
        return 0
    except SystemExit as exc:
        return _exit_status(exc)
    except BaseException as exc:
        _report(exc)
        return 1


def _end_program(rc: int) -> int:
    """The end of ``python -c``: wait for non-daemon threads, run exit handlers, flush; the status stays
    ``rc`` unless a handler ends the process itself (``os._exit`` in an atexit function is the program's)."""
    try:
        _threading_shutdown()
    except BaseException:
        pass
    current = _sys.modules.get("threading")
    if current is not None and current is not _threading:  # imported afresh (``shadow``): its threads too
        try:
            current._shutdown()
        except BaseException:
            pass
    try:
        _atexit_run()
    except BaseException:
        pass
    flush()
    return rc


def run_oneshot(code: bytes, script: str | None, site: str | None, tops: set[str]) -> int:
    shadow(tops)
    namespace = fresh_main(script, site)
    stdio()
    return _end_program(exec_code(code, namespace, script or "<program>"))
