"""The ``code`` runner kind: C, C++, Java, Go, Rust, JavaScript, bash and pytest programs, compiled once
(with a compile cache) and run once or per test case, in the python kind's nsjail jails."""

from __future__ import annotations

from typing import Any

from sandboxd.errors import BadRequest, PayloadTooLarge
from sandboxd.runners.base import Capabilities, RunnerKind, StepLimits
from sandboxd.runners.code.config import CodeRunnerConfig
from sandboxd.runners.code.models import CodeAction, CodeObservation
from sandboxd.runners.jail.admit import check_limits, check_payload


def admit(action: CodeAction, limits: StepLimits, cfg: CodeRunnerConfig) -> None:
    """The language and flags this node takes, payload caps, limits within the node's maxima."""
    from sandboxd.runners.code.languages import check_flags
    from sandboxd.runners.code.runner import node_toolchains

    chains = node_toolchains(cfg)
    chain = chains.get(action.language)
    if chain is None:
        names = sorted({c.language.name for c in chains.values()})
        raise BadRequest(f"language {action.language!r} is not available on this node (available: {', '.join(names)})")
    if action.flags is not None:
        if not chain.language.compile:
            raise BadRequest(f"action.flags: {chain.language.name} is not compiled")
        why = check_flags(chain.language, action.flags)
        if why:
            raise BadRequest(f"action.flags: {why}")
    check_payload(action, action.code, action.stdin, cfg)
    cases = action.cases or []
    if len(cases) > cfg.max_cases:
        raise BadRequest(f"action.cases: {len(cases)} cases; this node takes at most {cfg.max_cases} per step")
    stdin = sum(len(c.stdin.encode()) for c in cases)
    if stdin > cfg.max_stdin_bytes:
        raise PayloadTooLarge(
            f"action.cases hold {stdin} bytes of stdin; this node takes at most {cfg.max_stdin_bytes}"
        )
    step_memory = limits.memory_mb or cfg.memory_mb
    for i, case in enumerate(cases):
        if case.memory_mb is not None and case.memory_mb > step_memory:
            raise BadRequest(
                f"action.cases[{i}].memory_mb: {case.memory_mb} exceeds the step's memory ({step_memory} MB)"
            )
        if case.timeout_s is not None and case.timeout_s > limits.timeout_s:
            raise BadRequest(
                f"action.cases[{i}].timeout_s: {case.timeout_s} exceeds the step's timeout_s {limits.timeout_s}"
            )
    runs_s = sum(case.timeout_s or limits.timeout_s for case in cases) if cases else limits.timeout_s
    if runs_s > limits.budget_s:
        raise BadRequest(
            f"action.cases: {len(cases)} cases could run for {runs_s:g} s in all; this node runs one step for at "
            f"most {limits.budget_s:g} s (max_timeout_s): fewer cases, shorter case timeouts, or several steps"
        )
    check_limits(limits, cfg)


def describe(cfg: CodeRunnerConfig) -> dict[str, Any]:
    """The languages this node runs, with their toolchains and commands."""
    from sandboxd.runners.code.runner import node_toolchains

    out: dict[str, Any] = {}
    for name, chain in sorted(node_toolchains(cfg).items()):
        lang = chain.language
        if name != lang.name:
            continue
        out[name] = {
            "aliases": list(lang.aliases),
            "toolchain": chain.version,
            "source": lang.source,
            "compile": list(lang.compile) or None,
            "default_flags": list(lang.default_flags),
            "allowed_flags": lang.allowed_flags.pattern if lang.allowed_flags else None,
            "run": list(lang.run),
        }
    return {"languages": out}


def _admit(action: Any, limits: StepLimits, cfg: Any) -> None:
    admit(action, limits, cfg)


KIND = RunnerKind(
    name="code",
    title="Compiled and interpreted languages in nsjail sandboxes: compile once, run per test case",
    config=CodeRunnerConfig,
    action=CodeAction,
    observation=CodeObservation,
    runner="sandboxd.runners.code.runner:CodeRunner",
    capabilities=Capabilities(burst=True, borrows_slots=True),
    admit=_admit,
    describe=describe,
    no_fork="code steps are one-shots: the code runner has no sessions to fork",
    no_sessions="it runs one-shot steps (compile once, run once or per case); python sessions hold state",
)
