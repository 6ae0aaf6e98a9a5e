"""Edge models of the ``code`` runner: a program in a language, its compilation, its runs."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sandboxd.runners.jail.models import ExecutionObservation, StepFiles

Verdict = Literal[
    "accepted", "wrong_answer", "runtime_error", "time_limit", "memory_limit", "output_limit", "finished", "skipped"
]


class TestCase(BaseModel):
    """One input of the program, and what it must print."""

    __test__ = False  # not a pytest class
    model_config = ConfigDict(extra="forbid")

    stdin: str = Field("", description="The case's standard input.")
    expected_stdout: str | None = Field(
        None, description="What the program must print (compared as `compare` says); omitted: not judged."
    )
    timeout_s: float | None = Field(None, gt=0, le=300, description="This case's time limit (default: the step's).")
    memory_mb: int | None = Field(None, ge=16, description="This case's memory cap (default: the step's).")


class CodeAction(StepFiles):
    """Compile (if the language is compiled) and run ``code``; once, or on each of ``cases``. ``files`` are
    written into the working directory of the compilation and of every run (headers such as testlib.h, data)."""

    model_config = ConfigDict(extra="forbid")

    language: str = Field(
        ...,
        pattern=r"^[a-z+]{1,16}$",
        description="c, cpp, java, go, rust, javascript (nodejs), bash or pytest: GET /runners/code lists what "
        "this node has.",
    )
    code: str = Field(..., description="The source: written to the language's file (main.cpp, Main.java, ...).")
    stdin: str = Field("", description="Standard input of the run (without `cases`).")
    flags: list[str] | None = Field(
        None,
        max_length=32,
        description="Compile flags instead of the language's defaults (cpp: -O2 -std=c++17), each within the "
        "language's allow-list (standards, optimisation, -D macros, warnings, -lm/-lpthread/-lcrypto/-lssl).",
    )
    compile_timeout_s: float | None = Field(
        None, gt=0, le=300, description="The compilation's time limit; at most (and by default) the node's."
    )
    cases: list[TestCase] | None = Field(
        None,
        min_length=1,
        description="Run the program once per case (compiled once), each with its stdin and limits; the "
        "observation has a verdict per case.",
    )
    compare: Literal["exact", "lines", "tokens"] = Field(
        "lines",
        description="How a case's stdout is judged: exact bytes; lines (trailing spaces and trailing blank lines "
        "ignored); tokens (whitespace-separated words).",
    )
    stop_on_failure: bool = Field(
        False, description="Cases: stop at the first one that does not pass (the rest are `skipped`)."
    )


class CompileObservation(BaseModel):
    """The compilation, as measured outside its sandbox; ``cached``: none ran, the artifact was in the cache."""

    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    killed_by: str | None = None
    cpu_ms: float | None = None
    wall_ms: float | None = Field(None, description="The compilation's wall-clock time, as the worker saw it.")
    cached: bool = False


class CaseResult(BaseModel):
    """One case's run and its verdict."""

    verdict: Verdict = Field(
        ...,
        description="accepted | wrong_answer (judged and different) | runtime_error | time_limit | memory_limit | "
        "output_limit | finished (ran, nothing to judge) | skipped (after a failure, with stop_on_failure)",
    )
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    timed_out: bool = False
    killed_by: str | None = None
    cpu_ms: float | None = None
    max_rss_kb: int | None = None


class CodeObservation(ExecutionObservation):
    """The run's fields (as a python one-shot's), or those of the last case run; the compilation; the cases."""

    language: str = ""
    compile: CompileObservation | None = Field(None, description="Compiled languages: what compiling did.")
    cases: list[CaseResult] | None = None
    cases_passed: int | None = Field(None, description="With `cases`: how many were accepted (or finished).")
