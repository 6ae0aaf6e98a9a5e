"""docs/configuration.md, generated from the settings models (``sandboxd config-docs``).

Generated, not written by hand, so the page cannot drift from the code: a test
compares the file with what this renders. Only built-in kinds are listed (a
third-party kind documents its own section).
"""

from __future__ import annotations

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from sandboxd.config import NodeSettings, build_settings_model
from sandboxd.registry import BUILTIN
from sandboxd.runners.base import RunnerKind, import_string

DYNAMIC = {"node_id": "(host name)", "runners": "(every kind on by default)"}
DYNAMIC_KIND = {("browser", "instances_per_node"): "(1 per 2 vCPUs and 4 GiB)"}

HEADER = """# Configuration

Every setting is an environment variable `SANDBOXD_<NAME>`; each runner kind's
settings are a nested section (`SANDBOXD_PYTHON__SLOTS_PER_WORKER=8`). Lists are
JSON (`SANDBOXD_RUNNERS='["python"]'`). `sandboxd serve --host/--port/--workers/--runners`
set the same names. This page is generated from the models (`sandboxd/config.py`
and each kind's `config.py`) by `sandboxd config-docs`; a test keeps it current.
"""


def _default(name: str, info: FieldInfo, kind: str = "") -> str:
    if (kind, name) in DYNAMIC_KIND:
        return DYNAMIC_KIND[(kind, name)]
    if name in DYNAMIC:
        return DYNAMIC[name]
    if info.default is not PydanticUndefined:
        return str(info.default)
    if info.default_factory is not None:
        return str(info.default_factory())  # type: ignore[call-arg]
    return "(required)"


def _rows(prefix: str, model: type[BaseModel], skip: set[str], kind: str = "") -> list[str]:
    rows = []
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        desc = (info.description or "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name.upper()}` | `{_default(name, info, kind)}` | {desc} |")
    return rows


def render() -> str:
    kinds: dict[str, RunnerKind] = {name: import_string(spec) for name, spec in BUILTIN.items()}
    model = build_settings_model(kinds)
    lines = [HEADER, "## Node", "", "| variable | default | meaning |", "|---|---|---|"]
    lines += _rows("SANDBOXD_", model, skip=set(kinds))
    for name, kind in kinds.items():
        lines += ["", f"## `{name}`: {kind.title}", "", "| variable | default | meaning |", "|---|---|---|"]
        lines += _rows(f"SANDBOXD_{name.upper()}__", kind.config, skip=set(), kind=name)
    assert issubclass(model, NodeSettings)
    return "\n".join(lines) + "\n"
