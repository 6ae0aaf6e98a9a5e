"""The README and docs/ never name what does not exist: every repository path, ``SANDBOXD_*`` setting, ``sandboxd``
command and ``python -m`` module they name in code spans is there (a setting in the generated table or read by
the code, a command in the CLI's own parser)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from sandboxd.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SPAN = re.compile(r"`([^`\n]+)`")
TOP = ("sandboxd/", "tests/", "scripts/", "docs/", "helm/", "deploy/", ".ci/")
FILES = (
    "Dockerfile",
    "pyproject.toml",
    "constraints.txt",
    "constraints-e2b-latest.txt",
    "constraints-e2b-1x.txt",
    "README.md",
)
SETTING = re.compile(r"\bSANDBOXD_[A-Z0-9_]*[A-Z0-9]\b")
MODULE = re.compile(r"python3? -m (sandboxd[\w.]*)")
COMMAND = re.compile(r"(?:^|\s|/)sandboxd ([a-z][a-z-]+)(?: ([a-z][a-z-]+))?")


def spans() -> list[tuple[str, str]]:
    """(document, text) of every code span and fenced line of the docs."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        out += [(doc.name, m.group(1)) for m in SPAN.finditer(text)]
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            out += [(doc.name, line) for line in block.splitlines()]
    return out


def _placeholder(token: str) -> bool:
    return any(c in token for c in "<>*{}$…") or "..." in token or "'s " in token


def test_every_path_the_docs_name_exists() -> None:
    missing = []
    for doc, span in spans():
        for token in span.split():
            token = token.strip("`'\",;:()[]").removesuffix(".")
            token = re.sub(r":\d+$", "", token)  # path:line
            if _placeholder(token) or "://" in token:
                continue
            if (token.startswith(TOP) or token in FILES) and not (ROOT / token.split("#")[0]).exists():
                missing.append((doc, token))
    assert not missing, missing


def _known_settings() -> set[str]:
    table = (ROOT / "docs" / "configuration.md").read_text()
    known = set(SETTING.findall(table))
    for path in [*(ROOT / "sandboxd").rglob("*.py"), *(ROOT / "scripts").rglob("*"), ROOT / "Dockerfile"]:
        if path.is_file() and path.suffix in ("", ".py", ".sh"):
            known |= set(SETTING.findall(path.read_text(errors="replace")))
    known |= {s for p in (ROOT / "tests").glob("*.py") for s in SETTING.findall(p.read_text())}
    known |= {s for p in (ROOT / "helm").rglob("*.yaml") for s in SETTING.findall(p.read_text())}
    return known


def test_every_setting_the_docs_name_is_read_somewhere() -> None:
    known = _known_settings()
    named = {(doc, s) for doc, span in spans() for s in SETTING.findall(span)}
    # A runner's nested setting (SANDBOXD_PYTHON__MEMORY_MB) is in the generated table by that name.
    missing = sorted((doc, s) for doc, s in named if s not in known)
    assert not missing, missing


def _commands() -> dict[str, set[str]]:
    """``sandboxd``'s commands, and each one's own subcommands (``image import``, ``env build``)."""
    parser = build_parser()
    out: dict[str, set[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[name] = set()
                for inner in sub._actions:
                    if isinstance(inner, argparse._SubParsersAction):
                        out[name] |= set(inner.choices)
    return out


def test_every_command_and_module_the_docs_name_exists() -> None:
    commands = _commands()
    missing = []
    for doc, span in spans():
        for m in COMMAND.finditer(span):
            name, sub = m.group(1), m.group(2)
            if name not in commands:
                missing.append((doc, f"sandboxd {name}"))
            elif (
                sub
                and commands[name]
                and sub not in commands[name]
                and not span.strip().startswith("sandboxd " + name + " --")
            ):
                missing.append((doc, f"sandboxd {name} {sub}"))
        for module in MODULE.findall(span):
            rel = Path(*module.split("."))
            if not ((ROOT / rel).with_suffix(".py").exists() or (ROOT / rel / "__main__.py").exists()):
                missing.append((doc, f"python -m {module}"))
    assert not missing, missing


@pytest.mark.parametrize("command", ["bench"])
def test_the_help_lists_what_the_command_takes(command: str) -> None:
    """``sandboxd --help``'s one line per command says what it takes (the bench's workloads are its registry's)."""
    from sandboxd.bench.workloads import listed

    text = build_parser().format_help()
    line = next(line for line in text.splitlines() if line.strip().startswith(command))
    assert all(w in line for w in listed()), line
