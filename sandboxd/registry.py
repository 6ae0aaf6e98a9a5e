"""The registry of runner kinds: built-in ones by import string, third-party ones by entry point.

A kind is registered in one line here (built-in) or, without editing sandboxd,
in the ``sandboxd.runners`` entry-point group of any installed distribution::

    [project.entry-points."sandboxd.runners"]
    terminal = "mypkg.terminal:KIND"

Everything else derives from it: the settings model (one nested section per
kind), validation of ``runners=[...]``, the action and observation schemas of
the OpenAPI document, and which workers build which runners.
"""

from __future__ import annotations

import functools
import re
from importlib.metadata import entry_points

from sandboxd.runners.base import RunnerKind, import_string

BUILTIN: dict[str, str] = {
    "python": "sandboxd.runners.python:KIND",
    "code": "sandboxd.runners.code:KIND",
    "tools": "sandboxd.runners.tools:KIND",
    "sql": "sandboxd.runners.sql:KIND",
    "textgame": "sandboxd.runners.textgame:KIND",
    "browser": "sandboxd.runners.browser:KIND",
    "container": "sandboxd.runners.container:KIND",
}
ENTRY_POINT_GROUP = "sandboxd.runners"
KIND_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class RegistryError(RuntimeError):
    """A kind that cannot be loaded or that clashes with another: a start-up failure, never a request's."""


def _load(name: str, spec: str) -> RunnerKind:
    try:
        kind = import_string(spec)
    except (ImportError, AttributeError) as exc:
        raise RegistryError(f"runner kind {name!r}: cannot import {spec!r}: {exc}") from exc
    if not isinstance(kind, RunnerKind):
        raise RegistryError(f"runner kind {name!r}: {spec!r} is a {type(kind).__name__}, not a RunnerKind")
    if kind.name != name:
        raise RegistryError(f"runner kind registered as {name!r} calls itself {kind.name!r}")
    return kind


@functools.cache
def kinds() -> dict[str, RunnerKind]:
    """Every registered kind by name (imported once per process; light modules only)."""
    specs = dict(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in specs and specs[ep.name] != ep.value:
            raise RegistryError(f"runner kind {ep.name!r} is registered twice: {specs[ep.name]!r} and {ep.value!r}")
        specs[ep.name] = ep.value
    out: dict[str, RunnerKind] = {}
    for name, spec in sorted(specs.items()):
        if not KIND_NAME.match(name):
            raise RegistryError(f"runner kind name {name!r} must match {KIND_NAME.pattern}")
        out[name] = _load(name, spec)
    return out
