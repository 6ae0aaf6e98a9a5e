"""Programs whose verdicts are known, for the verdict oracle (tests/test_verdicts.py).

A trainer turns a verdict into a reward: ``program_*`` is scored, infra is masked. Each case says what its
program deserves whatever the node is doing: a loop is the program's timeout on a full node as on an idle
one, an honest program is never the program's failure because its neighbours took the CPU, a step's own
``random.py`` is imported as under ``python main.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Case:
    name: str
    code: str
    verdict: str  # "ok", or the error code a program failure carries (program_exit, program_timeout, ...)
    files: dict[str, str] = field(default_factory=dict)
    stdout: str | None = None  # what an "ok" must print, when it must print something
    memory_mb: int | None = None  # the step's own memory cap (limits.memory_mb), where the case needs one

    def action(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code}
        if self.files:
            out["files"] = self.files
        return out


DEEP = "import os\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\nprint('deep')"
MANY = "import os\nos.mkdir('m')\nfor i in range(3000):\n    open(f'm/{i}', 'w').close()\nprint(len(os.listdir('m')))"
HONEST = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\nprint('done')"
TAMPER = (
    "import builtins, os, sys, threading\nos._exit = None\nbuiltins.exec = None\nthreading._shutdown = None\n"
    "print('before')\nsys.stdout.flush()\nsys.stdout = None\nraise SystemExit(3)"
)

CORPUS = [
    Case("right", "print(sum(range(10)))", "ok", stdout="45\n"),
    Case("wrong_answer", "def add(a, b):\n    return a - b\nassert add(2, 2) == 4", "program_exit"),
    Case("loop", "while True:\n    pass", "program_timeout"),
    Case("sleep_forever", "import time\ntime.sleep(3600)", "program_timeout"),
    Case("crash", "import os\nos.abort()", "program_exit"),
    # Its cap is an eighth of the node's: the kill must come at the memory limit however slowly the machine
    # hands out fresh pages. On the CI VM, filling 544 MiB took 0.25-0.35 s of CPU quiet and up to 2 s beside
    # the suite's other work (perf: 67% of the bomb's samples in clear_page_erms), a timeout at 2 s; at 128 MiB a
    # container's bomb (the image's own python, its page cache reclaimed under the cap) still timed out beside
    # every other kind's cases at once.
    Case("memory_bomb", "data = b'x' * (1 << 30)\nprint(len(data))", "program_killed", memory_mb=64),
    Case(
        "fork_bomb",
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "program_timeout",
    ),
    Case("huge_output", "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", "program_killed"),
    Case("deep_tree", DEEP, "ok", stdout="deep\n"),
    Case("many_files", MANY, "ok", stdout="3000\n"),
    Case(
        "stdlib_named_helpers",
        "import random, string, calendar\nassert random.pick() == 7 and string.X == 1 and calendar.Y == 2\nprint('mine')",
        "ok",
        files={"random.py": "def pick():\n    return 7\n", "string.py": "X = 1\n", "calendar.py": "Y = 2\n"},
        stdout="mine\n",
    ),
    Case(
        "stdlib_named_helper_beside_numpy",
        "import numpy\nimport calendar\nassert calendar.Y == 2\nprint(int(numpy.arange(4).sum()))",
        "ok",
        files={"calendar.py": "Y = 2\n"},
        stdout="6\n",
    ),
    Case(
        "helper_named_by_a_dotted_path",  # "./calendar.py" is staged as calendar.py: it must win warm too
        "import numpy\nimport calendar, json\nassert calendar.Y == 2 and json.Z == 3\nprint('mine')",
        "ok",
        files={"./calendar.py": "Y = 2\n", ".//json.py": "Z = 3\n"},
        stdout="mine\n",
    ),
    Case("interpreter_tampering", TAMPER, "program_exit"),
    Case("honest_cpu", HONEST, "ok", stdout="done\n"),
]


def verdict_of(result: dict[str, Any]) -> str:
    """A step result's verdict class: "ok", or its error's code (a program's or the node's)."""
    if result.get("ok"):
        return "ok"
    error = result.get("error") or {}
    return str(error.get("code"))
