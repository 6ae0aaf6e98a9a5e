"""Which template a python one-shot can be forked from: the modules its code imports, and the names its files
could be imported as (a step's own ``numpy.py`` must not meet a template's numpy)."""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterable

from sandboxd.runners.python.environments import Environment


def import_pattern(modules: list[str]) -> re.Pattern[str] | None:
    """Lines that import one of ``modules`` (top-level packages) as Python source writes them. A miss only
    costs the program the import; a false hit costs a fork from the larger template."""
    roots = sorted({m.split(".")[0] for m in modules if m})
    if not roots:
        return None
    names = "|".join(re.escape(r) for r in roots)
    return re.compile(rf"(?m)^[ \t]*(?:import|from)[ \t][^\n#]*?\b(?:{names})\b")


MODULE_SUFFIXES = (".py", ".pyc", ".pyw", ".so")  # jailside/program.py's: ``.cpython-312-...so`` ends in ``.so``


def module_tops(paths: Iterable[str]) -> set[str]:
    """The top-level module names files at ``paths`` (relative to the working directory) could be imported
    as; a name too many only costs a step its template (jailside/program.py's ``tops_of`` is the same rule)."""
    out = set()
    for given in paths:
        path = posixpath.normpath(given)  # "./calendar.py" and "x/../calendar.py" are staged as calendar.py
        first = path.split("/", 1)[0]
        if "/" in path:
            out.add(first)
        elif first.endswith(MODULE_SUFFIXES):
            out.add(first.split(".", 1)[0])
    return out


def site_tops(env: Environment) -> set[str]:
    """The top-level names importable from an environment's site directory."""
    try:
        names = os.listdir(env.site)
    except OSError:
        return set()
    return {n.split(".", 1)[0] for n in names if not n.endswith((".dist-info", ".libs", ".pth")) and n[:1].isalpha()}
