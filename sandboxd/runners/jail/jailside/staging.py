"""What a step brings into its sandbox before its program runs (stdlib only; runs in the executor): its files
in the working directory, its limits, its stdin, and random generators of its own."""

from __future__ import annotations

import os
import resource
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # inside the jail these are plain modules beside the zygote (no sandboxd package there)
    from sandboxd.runners.jail.jailside import bound
else:
    import bound

__builtins__ = bound.BUILTINS  # type: ignore[assignment]  # before any def (bound.py says why)
_os_makedirs, _normpath, _dirname = bound._os_makedirs, bound._normpath, bound._dirname
_setrlimit, _getrusage = bound._setrlimit, bound._getrusage

WORKDIR = "/tmp"  # the executor's own tmpfs (namespaces.py mounts it)


def stage(req: dict[str, Any], body: bytes) -> tuple[bytes, bytes]:
    """Write the request's files into the workdir; return (code, stdin)."""
    view = memoryview(body)
    pos = 0
    for rel, size in req.get("files", []):
        path = _normpath(WORKDIR + "/" + rel)
        if not path.startswith(WORKDIR + "/"):
            raise ValueError(f"file path escapes the workdir: {rel!r}")
        _os_makedirs(_dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(view[pos : pos + size])
        pos += size
    stdin_len = int(req.get("stdin_len", 0))
    stdin = bytes(view[pos : pos + stdin_len])
    code = bytes(view[pos + stdin_len :])
    script = req.get("script")
    if script:
        path = _normpath(WORKDIR + "/" + str(script))
        if _dirname(path) != WORKDIR:
            raise ValueError(f"script is not a file of the workdir: {script!r}")
        with open(path, "wb") as f:
            f.write(code)
    return code, stdin


# Queued signals and message-queue bytes are counted per user and charged up the user namespaces to the host's
# root (seccomp.py): a sandbox keeps few of the first and none of the second.
SIGPENDING_MAX = 64


def set_limits(req: dict[str, Any], session: bool) -> None:
    _setrlimit(resource.RLIMIT_SIGPENDING, (SIGPENDING_MAX, SIGPENDING_MAX))
    _setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    cpu = max(1, int(req["cpu_s"]))
    if session:
        used = _getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime) + cpu + 1
        _setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
        return
    # A backstop only: the worker ends a step at its own time (the wall less what others kept from it), and the
    # kernel's count behind RLIMIT_CPU ran ~1.5x the process's own rusage on a saturated machine (a loop was
    # SIGKILLed at 1.9 s of its 2 s limit, as "exited by signal 9").
    backstop = 2 * cpu + 5
    _setrlimit(resource.RLIMIT_CPU, (backstop, backstop))
    _setrlimit(resource.RLIMIT_FSIZE, (int(req["fsize_bytes"]),) * 2)
    _setrlimit(resource.RLIMIT_NOFILE, (int(req["nofile"]),) * 2)
    _setrlimit(resource.RLIMIT_CORE, (0, 0))


def set_stdin(data: bytes) -> None:
    """fd 0 = a memfd holding the step's stdin (no feeder process, no pipe)."""
    fd = os.memfd_create("stdin", 0)
    if data:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    if fd != 0:  # fd 0 may be free (the zygote's channel was closed): then it is already stdin
        os.dup2(fd, 0)
        os.close(fd)


# Generators a preloaded library seeds from the OS once, at import: in a template that import was shared by
# every executor, so each gets fresh state as a fresh interpreter would (module, attributes).
_LIBRARY_RNGS = (("sympy.core.random", ("rng", "_assumptions_rng")),)


def reseed() -> None:
    import random

    # ``random``'s own generator needs nothing here: the module reseeds it in every child at its fork
    # (``os.register_at_fork``), which the executor's clone runs as ``os.fork`` would.
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # a template's numpy: its global generator was seeded once, for every executor
        numpy.random.seed()
    for module, names in _LIBRARY_RNGS:
        mod = sys.modules.get(module)
        for name in names:
            rng = getattr(mod, name, None)
            if isinstance(rng, random.Random):
                rng.seed()
