"""The ``code`` runner: compile once, run once or per case, in the jail core's warm one-shot slots.

It composes the jail core (``runners/jail/``: a zygote per jail, one executor per execution, its cgroup,
seccomp, namespaces, the blame rule) and drives it with another program: each execution's executor stages the
files, takes its limits and then runs the language's command in a child it waits for (``jailside/executor.py``,
``exec_program``), reporting its status and the files asked for. A step holds one slot (what admission gave
it) for its compilation and its runs, one after the other: compilation with its own time and memory limits,
its artifact fetched back to the worker (and into the compile cache), then staged, executable, for every run.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import posixpath
from pathlib import Path
from typing import Any

from sandboxd.errors import BadRequest
from sandboxd.runners.base import ProgramFailure, RunnerContext, StepLimits, StepOutcome
from sandboxd.runners.cgroups import CgroupRoot
from sandboxd.runners.code.cache import CompileCache, cache_key
from sandboxd.runners.code.config import CodeRunnerConfig
from sandboxd.runners.code.languages import Toolchain, installed
from sandboxd.runners.code.models import CaseResult, CodeAction, CodeObservation, CompileObservation, TestCase
from sandboxd.runners.jail.executions import Executions
from sandboxd.runners.jail.models import ExecutionObservation
from sandboxd.runners.jail.nsjail import python_executable
from sandboxd.runners.jail.pool import Slot, SlotPool
from sandboxd.runners.python.environments import served


@functools.cache
def toolchains(prefix: str, enabled: tuple[str, ...], environments_dir: str) -> dict[str, Toolchain]:
    """What this host can compile and run (probed once per process)."""
    return installed(python_executable(prefix), list(enabled), served(environments_dir).get("default"))


def node_toolchains(cfg: CodeRunnerConfig) -> dict[str, Toolchain]:
    return toolchains(cfg.resolved_prefix(), tuple(cfg.languages), cfg.environments_dir)


# What a case's result and a compilation's keep of their execution's observation (the fields they share).
RUN_FIELDS = set(CaseResult.model_fields) - {"verdict"}
COMPILE_FIELDS = set(CompileObservation.model_fields) - {"wall_ms", "cached"}


def judge(compare: str, expected: str, got: str) -> bool:
    if compare == "exact":
        return got == expected
    if compare == "tokens":
        return got.split() == expected.split()
    lines = [line.rstrip() for line in got.rstrip().split("\n")]
    want = [line.rstrip() for line in expected.rstrip().split("\n")]
    return lines == want


def case_verdict(obs: ExecutionObservation, case: TestCase, compare: str) -> CaseResult:
    if obs.timed_out:
        verdict = "time_limit"
    elif obs.killed_by in ("memory", "output"):
        verdict = f"{obs.killed_by}_limit"
    elif obs.stdout_truncated and case.expected_stdout is not None:
        verdict = "output_limit"  # what was kept cannot be judged: the rest could be anything
    elif obs.exit_code != 0:
        verdict = "runtime_error"
    elif case.expected_stdout is None:
        verdict = "finished"
    else:
        verdict = "accepted" if judge(compare, case.expected_stdout, obs.stdout) else "wrong_answer"
    return CaseResult(verdict=verdict, **obs.model_dump(include=RUN_FIELDS))  # type: ignore[arg-type]


class CodeRunner:
    def __init__(self, cfg: CodeRunnerConfig, ctx: RunnerContext) -> None:
        self.cfg = cfg
        self.name = ctx.name
        self.execs = Executions("code", cfg, density=ctx.density)
        self.stats = self.execs.stats
        self.stats.update(compiles=0, compile_cache_hits=0, compile_errors=0, cases_run=0, cases_parallel_lanes=0)
        self.pool = SlotPool(cfg, ctx.runtime_dir / ctx.name, self.execs)
        self.cache = CompileCache(cfg.compile_cache_dir, cfg.compile_cache_mb << 20)
        self.root: CgroupRoot | None = None

    def capacity(self) -> int:
        return self.pool.capacity()

    def burst_capacity(self) -> int:
        return self.pool.burst_capacity()

    async def start(self) -> None:
        await asyncio.to_thread(node_toolchains, self.cfg)
        self.root = CgroupRoot(self.name, Path(self.cfg.cgroup_mount), self.cfg.cgroup_version or None)
        await self.pool.start(self.root)

    async def close(self) -> None:
        await self.pool.close()
        if self.root is not None:
            await asyncio.to_thread(self.root.group.remove)

    async def health(self) -> dict[str, Any]:
        if self.execs.leftovers:
            await self.execs.retry()
        return self.pool.health(*self.pool.alive(), self.pool.heal)

    async def open_session(self, session_id: str, options: dict[str, Any]) -> None:
        raise BadRequest("the code runner runs one-shot steps (compile and run); sessions are the python kind's")

    async def close_session(self, session_id: str) -> None:
        """No sessions here: nothing to close."""

    async def step(self, action: Any, session_id: str | None, limits: StepLimits) -> StepOutcome:
        assert isinstance(action, CodeAction)
        if session_id is not None:
            raise BadRequest("the code runner runs one-shot steps; it has no sessions")
        chain = node_toolchains(self.cfg).get(action.language)
        if chain is None:
            raise BadRequest(f"language {action.language!r} is not available on this node")
        async with self.pool.acquire() as slot:
            return await self._program(slot, chain, action, limits)

    async def _program(
        self, slot: Slot | None, chain: Toolchain, action: CodeAction, limits: StepLimits
    ) -> StepOutcome:
        lang = chain.language
        source = action.code.encode()
        files = [(posixpath.normpath(path), data) for path, data in action.file_bytes()]  # as staged, and keyed
        if lang.compile:
            flags = tuple(action.flags) if action.flags is not None else lang.default_flags
            # The whole command, not only the flags: a change of the table's command is a new entry.
            # Per tenant: a hit is faster (and says ``cached``), so a shared entry would tell one tenant that
            # another compiled exactly this source.
            key = cache_key(lang.name, chain.version, lang.compile_argv(flags), source, files, limits.tenant)
            artifact = await asyncio.to_thread(self.cache.get, key)
            if artifact is not None:
                self.stats["compile_cache_hits"] += 1
                compiled = CompileObservation(exit_code=0, cached=True)
            else:
                compiled, artifact, failed = await self._compile(
                    slot, chain, action, flags, [*files, (lang.source, source)]
                )
                if failed is not None:
                    obs = CodeObservation(language=lang.name, compile=compiled)
                    return StepOutcome(observation=obs, failure=failed, killed_by=compiled.killed_by)
                assert artifact is not None
                await asyncio.to_thread(self.cache.put, key, artifact)
            run_files, executable = [*files, (lang.artifact, artifact)], [lang.artifact]
        else:
            compiled, run_files, executable = None, [*files, (lang.source, source)], []
        if action.cases is None:
            outcome = await self._run(slot, chain, run_files, executable, action.stdin.encode(), limits)
            assert isinstance(outcome.observation, ExecutionObservation)
            obs = CodeObservation(**outcome.observation.model_dump(), language=lang.name, compile=compiled)
            return StepOutcome(
                observation=obs, failure=outcome.failure, killed_by=outcome.killed_by, limits_hit=outcome.limits_hit
            )
        return await self._cases(slot, chain, action, compiled, run_files, executable, limits)

    async def _compile(
        self,
        slot: Slot | None,
        chain: Toolchain,
        action: CodeAction,
        flags: tuple[str, ...],
        files: list[tuple[str, bytes]],
    ) -> tuple[CompileObservation, bytes | None, ProgramFailure | None]:
        lang, cfg = chain.language, self.cfg
        timeout = min(action.compile_timeout_s or cfg.compile_timeout_s, cfg.compile_timeout_s)
        limits = StepLimits(timeout_s=timeout, memory_mb=cfg.compile_memory_mb, max_output_bytes=None)
        header, body = self._exec_request(lang.compile_argv(flags), lang.environ, files, b"", limits, [lang.artifact])
        self.stats["compiles"] += 1
        started = asyncio.get_running_loop().time()
        outcome = await self._execute(slot, header, body, limits)
        wall_ms = round((asyncio.get_running_loop().time() - started) * 1000, 3)
        obs = outcome.observation
        assert isinstance(obs, ExecutionObservation)
        compiled = CompileObservation(**obs.model_dump(include=COMPILE_FIELDS), wall_ms=wall_ms)
        artifact = (obs.files or {}).get(lang.artifact)
        if outcome.failure is None and artifact is not None:
            return compiled, base64.b64decode(artifact), None
        self.stats["compile_errors"] += 1
        if outcome.failure is None:  # it said it succeeded and left nothing we can take
            why = (obs.files_missing or {}).get(lang.artifact, "absent")
            return compiled, None, ProgramFailure("compile_error", f"the compiler left no {lang.artifact}: {why}")
        if obs.timed_out:
            return compiled, None, ProgramFailure("compile_error", f"compilation ran past its time limit ({timeout} s)")
        if obs.killed_by:
            return (
                compiled,
                None,
                ProgramFailure("compile_error", f"compilation was killed at its {obs.killed_by} limit"),
            )
        return compiled, None, ProgramFailure("compile_error", f"compilation failed (status {obs.exit_code})")

    async def _run(
        self,
        slot: Slot | None,
        chain: Toolchain,
        files: list[tuple[str, bytes]],
        executable: list[str],
        stdin: bytes,
        limits: StepLimits,
    ) -> StepOutcome:
        lang = chain.language
        argv = lang.run_argv(limits.memory_mb or self.cfg.memory_mb)
        header, body = self._exec_request(argv, lang.environ, files, stdin, limits, None, executable)
        return await self._execute(slot, header, body, limits)

    async def _cases(
        self,
        slot: Slot | None,
        chain: Toolchain,
        action: CodeAction,
        compiled: CompileObservation | None,
        files: list[tuple[str, bytes]],
        executable: list[str],
        limits: StepLimits,
    ) -> StepOutcome:
        """The cases, each in a fresh execution with its own limits within the step's: in turn in the step's
        slot with ``stop_on_failure``; otherwise also in slots borrowed while they are free, nobody waits and
        the tenant is below its fair share (``SlotLender``), given back as soon as the cases are done."""
        cases = action.cases or []
        results: list[CaseResult | None] = [None] * len(cases)
        lanes: list[Slot | None] = [slot]
        lender = limits.lender
        if slot is not None and lender is not None and not action.stop_on_failure:
            while len(lanes) < len(cases) and lender.borrow():
                borrowed = self.pool.borrow()
                if borrowed is None:
                    lender.give_back()
                    break
                lanes.append(borrowed)
        self.stats["cases_parallel_lanes"] += len(lanes) - 1
        pending = iter(range(len(cases)))
        last: list[StepOutcome] = []
        stop = False

        async def lane(where: Slot | None, borrowed: bool) -> None:
            nonlocal stop
            try:
                for i in pending:
                    if stop:
                        results[i] = CaseResult(verdict="skipped")
                        continue
                    case = cases[i]
                    case_limits = StepLimits(
                        timeout_s=case.timeout_s or limits.timeout_s,
                        memory_mb=case.memory_mb or limits.memory_mb,
                        max_output_bytes=limits.max_output_bytes,
                        answer_by=limits.answer_by,
                    )
                    outcome = await self._run(where, chain, files, executable, case.stdin.encode(), case_limits)
                    self.stats["cases_run"] += 1
                    assert isinstance(outcome.observation, ExecutionObservation)
                    result = results[i] = case_verdict(outcome.observation, case, action.compare)
                    last[:] = [outcome]
                    stop = action.stop_on_failure and result.verdict not in ("accepted", "finished")
            finally:
                if borrowed:  # no case left for it: the slot goes back now, not when the step's last case ends
                    assert where is not None and lender is not None
                    self.pool.give_back(where)
                    lender.give_back()

        done = await asyncio.gather(*(lane(where, i > 0) for i, where in enumerate(lanes)), return_exceptions=True)
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome  # an infrastructure failure of one case is the step's
        final = [r if r is not None else CaseResult(verdict="skipped") for r in results]
        passed = sum(r.verdict in ("accepted", "finished") for r in final)
        base = last[0].observation.model_dump() if last else {}
        obs = CodeObservation(**base, language=chain.language.name, compile=compiled, cases=final, cases_passed=passed)
        failure = None
        if passed < len(final):
            first = next(i for i, r in enumerate(final) if r.verdict not in ("accepted", "finished"))
            failure = ProgramFailure(
                "cases_failed",
                f"{len(final) - passed} of {len(final)} cases failed (first: case {first}, {final[first].verdict})",
            )
        hit = tuple(sorted({r.killed_by for r in final if r.killed_by}))
        return StepOutcome(observation=obs, failure=failure, limits_hit=hit)

    def _exec_request(
        self,
        argv: list[str],
        environ: dict[str, str],
        files: list[tuple[str, bytes]],
        stdin: bytes,
        limits: StepLimits,
        fetch: list[str] | None,
        executable: tuple[str, ...] | list[str] = (),
    ) -> tuple[dict[str, Any], bytes]:
        header = self.execs.header(limits, files, stdin)
        header["exec"] = {"argv": argv, "environ": environ, "x": list(executable)}
        header["fetch"] = fetch or []  # the harness reports the program's status (and these files) after it ends
        header["fetch_max_bytes"] = self.cfg.max_fetch_bytes
        return header, b"".join(data for _, data in files) + stdin

    async def _execute(self, slot: Slot | None, header: dict[str, Any], body: bytes, limits: StepLimits) -> StepOutcome:
        return await self.pool.run(slot, header, body, limits)
