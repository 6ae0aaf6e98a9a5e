"""One execution in a jail's executor, and what it says: the jail core's rule for limits, kills and blame.

Every jailed kind runs its programs through here (one-shots, a session's cells, a compilation, a test
case), so one rule decides for all of them which limit stopped a program: its own (a verdict to score) or one
above it (the node's or its pod's memory or processes, CPU kept from it by other sandboxes: ``NodePressure``,
never the program's). The counters are its cgroup's, read before and after the execution
(``runners/cgroups.py``); the CPU it was kept from is ``runners/starvation.py``'s.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from sandboxd.errors import BadRequest, NodePressure, SandboxSetupError, SessionLost
from sandboxd.runners.base import ProgramFailure, StepLimits, StepOutcome
from sandboxd.runners.cgroups import CgroupGroup, Counters, memory_kill
from sandboxd.runners.jail.config import JailConfig
from sandboxd.runners.jail.exchange import Executor, Output, StepRequest, run_step
from sandboxd.runners.jail.jail import Jail
from sandboxd.runners.jail.jailside import wire
from sandboxd.runners.jail.models import ExecutionObservation
from sandboxd.runners.starvation import Density, Starvation, starved_error, usable_cores, wall_cap_s

log = logging.getLogger(__name__)


def verdict(obs: ExecutionObservation) -> ProgramFailure | None:
    """The program's own failure, decided from what was measured outside the sandbox."""
    if obs.timed_out:
        return ProgramFailure("program_timeout", "the program ran past its time limit")
    if obs.killed_by == "protocol":
        return ProgramFailure("program_killed", "the program wrote to its session's control channel; session ended")
    if obs.killed_by:
        return ProgramFailure("program_killed", f"the program was killed at its {obs.killed_by} limit")
    if obs.exit_code != 0:
        what = f"status {obs.exit_code}" if obs.exit_code is not None else f"signal {obs.signal}"
        return ProgramFailure("program_exit", f"the program exited with {what}")
    return None


def fetched_files(
    paths: list[str], fetched: tuple[dict[str, Any], bytes] | None, killed_by: str | None
) -> tuple[dict[str, str], dict[str, str]]:
    """``fetch_files`` as the observation gives them: base64 by path, and the paths not returned with why."""
    if fetched is None:
        why = "the sandbox ended before its files could be read"
        if killed_by:
            why = f"the sandbox ended at its {killed_by} limit before its files could be read"
        return {}, dict.fromkeys(paths, why)
    head, body = fetched
    sizes = head.get("sizes") or []
    reasons = head.get("missing") or {}
    files: dict[str, str] = {}
    missing: dict[str, str] = {}
    pos = 0
    for i, path in enumerate(paths):
        size = sizes[i] if i < len(sizes) and isinstance(sizes[i], int) else -1
        if size < 0:
            missing[path] = str(reasons.get(str(i), "not returned"))
            continue
        files[path] = base64.b64encode(body[pos : pos + size]).decode()
        pos += size
    return files, missing


def _at_node_pids_limit() -> NodePressure:
    return NodePressure(
        "the program could not start a process or thread under its own pids limit: the node (or its pod) is at "
        "its process limit"
    )


class LiveSession(Protocol):
    """What a kind's session is to ``Executions.session_step``: its executor, its group, and the group's counters
    after its last step (``seen``, renewed by each step)."""

    session_id: str
    executor: Executor
    cgroup: CgroupGroup
    seen: Counters


class Executions:
    """A kind's executions: their request headers, their exchange, their observations and verdicts, and the
    counters every jailed kind reports (``stats``). One per runner instance; its slots (``pool.py``) and
    sessions run through it, and count in the worker's density (every kind's) while they run."""

    def __init__(
        self,
        kind: str,
        cfg: JailConfig,
        observation: type[ExecutionObservation] = ExecutionObservation,
        density: Density | None = None,
    ) -> None:
        self.kind = kind
        self.cfg = cfg
        self.observation = observation  # the kind's own model of an execution's observation
        self.stats: dict[str, int] = {
            "sandbox_starts": 0,
            "jail_starts": 0,
            "kills_time": 0,
            "kills_memory": 0,
            "kills_output": 0,
            "limit_pids": 0,
            "node_pressure": 0,  # steps stopped by a limit above the sandbox's own, or starved
            "warm_imports": 0,  # one-shots forked from an environment's template, its preloads imported
        }
        self._cores = usable_cores(cfg.cpu_cores)
        # The worker's density (``RunnerContext.density``), shared with its other kinds; the runner gives its own.
        self.density = density if density is not None else Density()
        self._restart_locks: dict[str, asyncio.Lock] = {}
        self._leftover_cgroups: list[CgroupGroup] = []

    def header(self, limits: StepLimits, files: list[tuple[str, bytes]], stdin: bytes) -> dict[str, Any]:
        """An execution's request header: its limits, and how its body splits into files and stdin."""
        return {
            "op": "run",
            "timeout_s": limits.timeout_s,
            "cpu_s": max(1, int(limits.timeout_s + 0.999)),
            "max_output_bytes": limits.max_output_bytes or self.cfg.max_output_bytes,
            "output_kill_bytes": self.cfg.output_kill_bytes,
            "fsize_bytes": self.cfg.fsize_mb << 20,
            "nofile": self.cfg.nofile,
            "interrupt_grace_s": self.cfg.interrupt_grace_s,
            "files": [[path, len(data)] for path, data in files],
            "stdin_len": len(stdin),
        }

    async def feed(
        self,
        executor: Executor,
        cg: CgroupGroup,
        header: dict[str, Any],
        body: bytes,
        limits: StepLimits,
        session: bool,
    ) -> tuple[dict[str, Any], Output]:
        """The exchange: the request written, the output read with its caps, the deadline kept (with the CPU
        other sandboxes kept from it given back, ``Starvation``), the harness's report read."""
        grace = self.cfg.interrupt_grace_s if session else 0.0
        cap, kill_at = header["max_output_bytes"], self.cfg.output_kill_bytes
        timeout_s = limits.timeout_s

        patience = float("inf")  # wall seconds from the step's start until its caller stops listening
        density = self.density

        def cap_now() -> float:
            if self.cfg.wall_factor:  # the operator's own factor for this kind
                return min(timeout_s * self.cfg.wall_factor, patience)
            return wall_cap_s(timeout_s, density.cores_at_once(), patience)

        # The executor runs the program in a child (executor.run_and_fetch) for an exec and for fetched files.
        in_child = not session and (isinstance(header.get("exec"), dict) or bool(header.get("fetch")))

        def account() -> Starvation:
            nonlocal patience
            if limits.answer_by is not None:  # never past the caller's own patience: the node's failure before it
                patience = limits.answer_by - time.monotonic()
            return Starvation(executor.host_pid, timeout_s, cg.cpu_usage_s, self._cores, cap_now(), cap_now, in_child)

        with density.step(self.cfg.cpu_cores):
            request = StepRequest(header, body, timeout_s, cap, kill_at, session, grace, account)
            return await run_step(executor, request)

    async def run_in(
        self, jail: Jail, cg: CgroupGroup, executor: Executor, header: dict[str, Any], body: bytes, limits: StepLimits
    ) -> StepOutcome:
        """One one-shot execution in ``executor``, attributing limit hits through ``cg``'s counters."""
        before = cg.counters(start=True)
        try:
            result, out = await self.feed(executor, cg, header, body, limits, session=False)
        except (wire.WireError, OSError) as exc:
            await jail.stop()  # a warm slot's next take restarts it
            raise SandboxSetupError(f"sandbox {jail.name} stopped answering: {exc!r}") from exc
        finally:
            executor.close()
        after = cg.counters()
        if result.get("lost"):
            if memory_kill(before, after) == "own":
                # Its own memory took the jail down: at its slot's limit the OOM killer chose the zygote (a
                # program can lower its own oom_score_adj, and unmapped memfds count in nobody's RSS). The
                # jail restarts on the next take; the verdict is the program's, as for any kill at its limit.
                await jail.stop()
                result.update(exit_code=None, signal=9, killed_by="memory", lost=False)
            else:
                raise SandboxSetupError(f"sandbox {jail.name}: its jail ended mid-step")
        outcome = self.observe(result, out, before, after, cg)
        if after.pids_max_hits > before.pids_max_hits and cg.pids_peak_reached():
            # A fork bomb left the slot's peak at its limit for good (v1; v2 without pids.events.local): later
            # refusals by a parent's limit would be blamed on the program that meets them. The slot's pids group
            # starts afresh.
            await asyncio.to_thread(cg.renew_pids)
        return outcome

    def observe(
        self,
        r: dict[str, Any],
        out: Output,
        before: Counters,
        after: Counters,
        cg: CgroupGroup,
        session: bool = False,
    ) -> StepOutcome:
        """The execution's observation and verdict; ``NodePressure`` when what stopped it was above its own
        limits."""
        if "stage_error" in r:  # the program never ran: what the client sent could not be written
            raise BadRequest(f"the step's files could not be written in the sandbox: {r['stage_error']}")
        if "enter_error" in r:  # a container's root could not be entered: the image's fault, or the node's
            if r.get("enter_node"):
                raise SandboxSetupError(f"the sandbox's root could not be made: {r['enter_error']}")
            raise BadRequest(f"the image cannot run this step: {r['enter_error']}")
        killed_by = r.get("killed_by")
        limits_hit: list[str] = []
        if r.get("starved"):
            self.stats["node_pressure"] += 1
            raise starved_error("the program", r["kept_s"], r["wall_s"])
        kill = memory_kill(before, after)
        if kill == "own":
            limits_hit.append("memory")
            if killed_by is None and r.get("signal") == 9:
                killed_by = "memory"
        elif kill == "node" and killed_by is None and r.get("signal") == 9:
            self.stats["node_pressure"] += 1
            raise NodePressure(
                "the program was killed for memory under its own limit: the node (or its pod) ran out of "
                "memory for all its sandboxes"
            )
        if after.pids_max_hits > before.pids_max_hits:
            if cg.pids_refused_here():
                limits_hit.append("pids")
                self.stats["limit_pids"] += 1
            elif r.get("exit_code") != 0:
                self.stats["node_pressure"] += 1
                raise _at_node_pids_limit()
        elif after.pids_refused_above > before.pids_refused_above and r.get("exit_code") != 0 and not killed_by:
            # cgroup v2 from 6.12 counts a refused fork where the limit is: the pod's or the node's group, not
            # this sandbox's. The program failed while forks were refused above it (the guest: an honest
            # program that could not start its threads was blamed, program_exit).
            self.stats["node_pressure"] += 1
            raise _at_node_pids_limit()
        if killed_by is None and r.get("signal") == 9 and not limits_hit and not session:
            # Neither its limits nor the worker killed it: something outside the sandbox did (said in the log,
            # since the verdict below is the program's exit by that signal).
            log.warning(
                "%s: a one-shot ended by SIGKILL that none of its limits sent (cpu %.3f s)",
                self.kind,
                r.get("cpu_s", 0),
            )
        if killed_by == "time":
            limits_hit.append("time")
        if killed_by == "output":
            limits_hit.append("output")
        if killed_by is not None:
            self.stats[f"kills_{killed_by}"] = self.stats.get(f"kills_{killed_by}", 0) + 1
        alive = bool(r.get("alive", True)) if session else None
        obs = self.observation(
            exit_code=r.get("exit_code"),
            stdout=out.out.decode("utf-8", errors="replace"),
            stderr=out.err.decode("utf-8", errors="replace"),
            timed_out=bool(r.get("timed_out")),
            killed_by=killed_by,
            limits_hit=limits_hit,
            signal=r.get("signal"),
            stdout_truncated=out.out_total > len(out.out),
            stderr_truncated=out.err_total > len(out.err),
            cpu_ms=round(float(r.get("cpu_s", 0.0)) * 1000, 3) if "cpu_s" in r else None,
            max_rss_kb=r.get("max_rss_kb"),
            session_alive=alive,
        )
        if "fetched" in r:
            obs.files, obs.files_missing = fetched_files(r["fetch_paths"], r["fetched"], killed_by)
        return StepOutcome(
            observation=obs,
            failure=verdict(obs),
            session_alive=alive is not False,
            killed_by=killed_by,
            limits_hit=tuple(limits_hit),
        )

    async def session_step(
        self,
        sess: LiveSession,
        header: dict[str, Any],
        body: bytes,
        limits: StepLimits,
        drop: Callable[[], Awaitable[None]],
    ) -> StepOutcome:
        """One step in a live session whose lock the caller holds: the exchange, the verdict, and the session
        dropped (``drop``) when its sandbox ended, the step's own error then saying why (its memory limit's
        kill, or the node's, between steps too, as the group's counters tell)."""
        if limits.memory_mb:
            sess.cgroup.set_limits(limits.memory_mb << 20, self.cfg.pids_max)
        before = sess.cgroup.counters(start=True)
        try:
            result, out = await self.feed(sess.executor, sess.cgroup, header, body, limits, session=True)
        except (wire.WireError, OSError) as exc:
            why = self.killed_why(sess) or f"its sandbox stopped answering ({exc!r})"
            await drop()
            raise SessionLost(f"session {sess.session_id}: {why}") from exc
        if result.get("lost"):
            why = self.killed_why(sess) or "its jail ended mid-step"
            await drop()
            raise SessionLost(f"session {sess.session_id}: {why}")
        after = sess.seen = sess.cgroup.counters()
        try:
            outcome = self.observe(result, out, before, after, sess.cgroup, session=True)
        except NodePressure as exc:
            if result.get("alive") is False:
                await drop()
                raise SessionLost(f"session {sess.session_id}: {exc}") from None
            raise
        if not outcome.session_alive:
            await drop()
        return outcome

    @staticmethod
    def killed_why(sess: LiveSession) -> str | None:
        """Why a session's sandbox vanished, when its cgroup says the kernel's OOM killer took it (between steps
        too, which no step's counters saw): its own limit, or the node's (pod's) memory; None otherwise."""
        kill = memory_kill(sess.seen, sess.cgroup.counters())
        if kill is None:
            return None
        if kill == "own":
            return "its program reached the session's memory limit and the kernel killed its sandbox"
        return (
            "the node (or its pod) ran out of memory and the kernel killed its sandbox under its own limit "
            "(node_pressure, not the program's doing)"
        )

    async def ensure_jail(self, jail: Jail) -> None:
        """Restart a dead jail once, however many requests find it dead at the same time."""
        async with self._restart_locks.setdefault(jail.name, asyncio.Lock()):
            if not jail.alive:
                await jail.stop()
                await jail.start()
                self.stats["jail_starts"] += 1

    async def remove_cgroup(self, cg: CgroupGroup) -> None:
        """Remove a sandbox's group (what runs in it is killed); one still busy is tried again by ``retry``."""
        try:
            gone = await asyncio.to_thread(cg.remove)
        except Exception:
            log.exception("%s: removing a sandbox's cgroup", self.kind)
            gone = False
        if not gone:
            self._leftover_cgroups.append(cg)

    @property
    def leftovers(self) -> bool:
        return bool(self._leftover_cgroups)

    async def retry(self) -> None:
        """The groups not removed before (still busy then): once more."""
        pending, self._leftover_cgroups = self._leftover_cgroups, []
        for cg in pending:
            await self.remove_cgroup(cg)
