"""The languages of the ``code`` kind, as one declarative table.

A language is a source file name, an optional compile command that leaves one artifact, and a run
command; every command runs in its own one-shot execution of the same jail the python kind uses
(its own limits; the compile's artifact comes back to the worker, then is staged for the run).
Toolchains come from Debian packages (scripts/setup.sh, the Dockerfile), read-only under the jail's
``/usr``. Adding a language is a row here; its toolchain's version is part of the compile cache key.

In commands, ``{flags}`` expands to the step's compile flags (or the language's defaults) and
``{heap_mb}`` to three quarters of the step's memory (a JVM's heap, which it cannot learn from a
cgroup it does not see).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sandboxd.runners.jail.nsjail import env_path
from sandboxd.runners.python.environments import Environment

# Flags a C or C++ compile may be given: language standard, optimisation, macros, warnings, the
# libraries SandboxFusion links. Nothing that names a file or a program (-o, -B, -wrapper, @file,
# -fplugin, -specs, -include, -I with a path) passes.
C_FAMILY_FLAGS = re.compile(
    r"-std=(c|gnu)(89|90|99|11|17|18|2x|23)"
    r"|-std=(c|gnu)\+\+(98|03|0x|11|14|1y|17|1z|20|2a|23|2b)"
    r"|-O[0-3sgz]?|-Ofast"
    r"|-D[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_.+-]*)?|-U[A-Za-z_][A-Za-z0-9_]*"
    r"|-w|-W[a-z][a-z0-9=+-]*|-pedantic|-g[0-3]?|-pthread|-static|-fno-[a-z][a-z0-9-]*|-fwrapv"
    r"|-l(m|pthread|crypto|ssl|gmp)"
)
RUST_FLAGS = re.compile(r"-O|-C(opt-level=[0-3sz]|debug-assertions=(on|off|yes|no)|overflow-checks=(on|off|yes|no))"
                        r"|--edition=20(15|18|21)|-g")  # fmt: skip
JAVA_FLAGS = re.compile(r"-source=[0-9]{1,2}|--release=[0-9]{1,2}|-g|-nowarn|-Xlint(:[a-z,-]+)?")


@dataclass(frozen=True)
class Language:
    name: str
    source: str  # the file the code is written to, in the working directory
    run: tuple[str, ...]
    version: tuple[str, ...]  # prints the toolchain's version (run on the host once; the jail sees the same /usr)
    compile: tuple[str, ...] = ()  # empty: interpreted
    artifact: str = ""  # the compile's one output, staged for the run (made executable)
    default_flags: tuple[str, ...] = ()
    allowed_flags: re.Pattern[str] | None = None  # None: no flags accepted
    environ: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    # The host path whose presence says the toolchain is installed (the first word of ``version``).
    needs: str = ""

    def compile_argv(self, flags: tuple[str, ...]) -> list[str]:
        return _expand(self.compile, flags, 0)

    def run_argv(self, memory_mb: int) -> list[str]:
        return _expand(self.run, (), memory_mb)


def _expand(argv: tuple[str, ...], flags: tuple[str, ...], memory_mb: int) -> list[str]:
    out: list[str] = []
    for arg in argv:
        if arg == "{flags}":
            out.extend(flags)
        else:
            out.append(arg.replace("{heap_mb}", str(max(16, memory_mb * 3 // 4))))
    return out


JAIL_PATH = "/usr/local/bin:/usr/bin:/bin"  # the jail's PATH (jail.py): what its programs find
JVM = ("-XX:+UseSerialGC", "-XX:ActiveProcessorCount=1", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData", "-Xshare:auto")
GO_ENV = {"GOCACHE": "/tmp/.cache/go", "GOPATH": "/tmp/go", "GO111MODULE": "off", "CGO_ENABLED": "0", "HOME": "/tmp"}


def _table(python: str, pytest_env: Environment | None) -> list[Language]:
    return [
        Language(
            "c",
            "main.c",
            compile=("gcc", "{flags}", "-o", "main", "main.c", "-lm"),
            artifact="main",
            run=("./main",),
            default_flags=("-O2", "-std=gnu11"),
            allowed_flags=C_FAMILY_FLAGS,
            version=("gcc", "--version"),
        ),
        Language(
            "cpp",
            "main.cpp",
            compile=("g++", "{flags}", "-o", "main", "main.cpp"),
            artifact="main",
            run=("./main",),
            default_flags=("-O2", "-std=c++17"),
            allowed_flags=C_FAMILY_FLAGS,
            version=("g++", "--version"),
            aliases=("c++",),
        ),
        Language(
            "java",
            "Main.java",
            # The classes (a program may declare several) travel as one tar, unpacked beside the run.
            compile=(
                "/bin/sh",
                "-c",
                "javac -J-XX:+UseSerialGC -J-XX:TieredStopAtLevel=1 -J-XX:-UsePerfData -encoding UTF-8 -d classes "
                '"$@" Main.java && tar -cf main.tar -C classes .',
                "javac",
                "{flags}",
            ),
            artifact="main.tar",
            run=(
                "/bin/sh",
                "-c",
                'mkdir -p classes && tar -xf main.tar -C classes && exec java "$@" -ea -cp classes:. Main',
                "java",
                *JVM,
                "-Xmx{heap_mb}m",
            ),
            allowed_flags=JAVA_FLAGS,
            version=("javac", "-version"),
        ),
        Language(
            "go",
            "main.go",
            compile=("go", "build", "-ldflags=-s -w", "-o", "main", "main.go"),
            artifact="main",
            run=("./main",),
            environ=GO_ENV,
            version=("go", "version"),
            aliases=("golang",),
        ),
        Language(
            "rust",
            "main.rs",
            # Without the standard library's debug information: 11 MB less to carry per run, same panics.
            compile=("rustc", "{flags}", "-C", "strip=debuginfo", "-o", "main", "main.rs"),
            artifact="main",
            run=("./main",),
            default_flags=("-O", "--edition=2021"),
            allowed_flags=RUST_FLAGS,
            version=("rustc", "--version"),
        ),
        Language(
            "javascript",
            "main.js",
            run=("node", "main.js"),
            # lodash, js-md5, seedrandom, random-seed, commander: installed there by scripts/setup.sh.
            environ={"NODE_PATH": "/usr/local/lib/node_modules"},
            version=("node", "--version"),
            aliases=("nodejs", "js", "node"),
        ),
        Language("bash", "main.sh", run=("bash", "main.sh"), version=("bash", "--version"), aliases=("sh",)),
        Language(
            "pytest",
            "test_main.py",
            run=(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_main.py"),
            environ={"PYTHONPATH": env_path(pytest_env) if pytest_env else "", "PYTHONDONTWRITEBYTECODE": "1"},
            version=(python, "-c", "import sys; print(sys.version.split()[0])"),
            needs=python,
        ),
    ]


@dataclass(frozen=True)
class Toolchain:
    language: Language
    version: str  # what its version command printed: part of every compile cache key


def installed(python: str, enabled: list[str], pytest_env: Environment | None) -> dict[str, Toolchain]:
    """The languages of the table whose toolchain this host has (those named in ``enabled``, or all), by
    name and by alias. pytest needs a Python environment that has it (the node's default one)."""
    found: dict[str, Toolchain] = {}
    for lang in _table(python, pytest_env):
        if enabled and lang.name not in enabled:
            continue
        exe = lang.needs or shutil.which(lang.version[0], path=JAIL_PATH)
        if not exe or not Path(exe).exists():
            continue
        if lang.name == "pytest" and not (pytest_env and (Path(pytest_env.site) / "pytest").is_dir()):
            continue
        try:
            proc = subprocess.run(
                [exe, *lang.version[1:]], capture_output=True, text=True, timeout=30, env={"PATH": JAIL_PATH}
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        text = (proc.stdout or proc.stderr).strip().splitlines()
        if proc.returncode != 0 or not text:
            continue
        chain = Toolchain(lang, text[0])
        for name in (lang.name, *lang.aliases):
            found[name] = chain
    return found


def check_flags(lang: Language, flags: list[str]) -> str | None:
    """Why ``flags`` are refused for ``lang``, or None."""
    if lang.allowed_flags is None:
        return f"{lang.name} takes no compile flags"
    bad = [f for f in flags if not lang.allowed_flags.fullmatch(f)]
    if bad:
        return f"compile flags not allowed for {lang.name}: {bad[:5]} (allowed: {lang.allowed_flags.pattern})"
    return None
