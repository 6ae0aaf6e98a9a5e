"""Python environments of the jail: named package trees, built once, mounted read-only into every jail.

An environment is ``<environments_dir>/<name>/site`` (``pip install --target``, for the jail's own
interpreter version) plus ``env.json`` saying what it was built from. Programs choose one per step
(``action.env``; the node's ``default_environment`` otherwise); its ``site`` is the last entry of their
``sys.path``, after the standard library, as site-packages is under any interpreter. Requirement lists
shipped here (``default.txt``) are what ``scripts/setup.sh`` builds; an operator builds others with
``sandboxd env build NAME --requirements FILE``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sandboxd.runners.jail.jailside.wire import MAX_ENVS

log = logging.getLogger(__name__)

SPECS_DIR = Path(__file__).parent
STAMP = "env.json"
NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"


@dataclass(frozen=True)
class Environment:
    name: str
    site: str  # the package tree on the host (every jail has it at ``jail.env_mount(name)``)
    python: str  # X.Y it was built for
    packages: tuple[str, ...]  # name==version of what is installed


def shipped(name: str) -> Path:
    """The requirements file this package ships for ``name`` (``default``)."""
    return SPECS_DIR / f"{name}.txt"


def _fingerprint(requirements: str) -> str:
    return hashlib.sha256(f"{sys.version_info.major}.{sys.version_info.minor}\n{requirements}".encode()).hexdigest()


def _installed(site: Path) -> tuple[str, ...]:
    out = []
    for info in sorted(site.glob("*.dist-info")):
        stem = info.name.removesuffix(".dist-info")
        name, _, version = stem.partition("-")
        out.append(f"{name}=={version}")
    return tuple(out)


def build(name: str, requirements_file: Path, root: Path, log: bool = True) -> Environment:
    """Install ``requirements_file`` into ``root/name/site`` for this interpreter; a no-op when the same list
    was built already. Built beside and renamed into place, so a jail never sees a half-built tree, and made
    world-readable (the jail runs as uid nobody)."""
    requirements = requirements_file.read_text()
    fingerprint = _fingerprint(requirements)
    env_dir = root / name
    stamp = env_dir / STAMP
    if stamp.exists() and json.loads(stamp.read_text()).get("fingerprint") == fingerprint:
        return load(root, name)
    tmp = root / f".{name}.building"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "site").mkdir(parents=True)
    if log:
        print(f"[env] building python environment {name!r} from {requirements_file} into {env_dir}", flush=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-warn-conflicts",
            "--no-compile",  # byte-compiled below, in one pass, so the jail never writes .pyc files
            "--target",
            str(tmp / "site"),
            "-r",
            str(requirements_file),
        ],
        check=True,
    )
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j", "0", str(tmp / "site")], check=False, capture_output=True
    )
    info = {
        "name": name,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "fingerprint": fingerprint,
        "requirements": requirements,
        "packages": list(_installed(tmp / "site")),
    }
    (tmp / STAMP).write_text(json.dumps(info, indent=1))
    subprocess.run(["chmod", "-R", "o+rX,go-w", str(tmp)], check=True)
    old = root / f".{name}.old"
    shutil.rmtree(old, ignore_errors=True)
    if env_dir.exists():
        os.rename(env_dir, old)
    os.rename(tmp, env_dir)
    shutil.rmtree(old, ignore_errors=True)
    for p in [root, *root.parents]:
        if p == Path("/"):
            break
        p.chmod(p.stat().st_mode | 0o005)
    return load(root, name)


def load(root: Path, name: str) -> Environment:
    env_dir = root / name
    info = json.loads((env_dir / STAMP).read_text())
    return Environment(name, str(env_dir / "site"), str(info.get("python", "")), tuple(info.get("packages", ())))


@functools.cache
def served(root: str) -> dict[str, Environment]:
    """The environments a node serves: every one built for this interpreter, the first ``MAX_ENVS`` by name
    (what a jail's zygote can number). What admission accepts, jails mount and ``GET /runners/python`` lists."""
    built = available(root)
    names = sorted(built)[:MAX_ENVS]
    if len(built) > MAX_ENVS:
        log.warning(
            "python: %d environments under %s; a node serves %d (the first by name), not %s",
            len(built),
            root,
            MAX_ENVS,
            ", ".join(sorted(built)[MAX_ENVS:]),
        )
    return {name: built[name] for name in names}


@functools.cache
def available(root: str) -> dict[str, Environment]:
    """Every environment built under ``root`` for this interpreter's version (read once per process)."""
    want = f"{sys.version_info.major}.{sys.version_info.minor}"
    out: dict[str, Environment] = {}
    base = Path(root)
    if not base.is_dir():
        return out
    for entry in sorted(base.iterdir()):
        if entry.name.startswith(".") or not (entry / STAMP).is_file():
            continue
        try:
            env = load(base, entry.name)
        except (OSError, ValueError):
            continue
        if env.python == want:
            out[env.name] = env
    return out
