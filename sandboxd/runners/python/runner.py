"""The Python runner: the jail core's one-shot slots (``runners/jail/``), and session jails for kernels.

One-shot: the slots of ``runners/jail/pool.py``, an executor forked from the step's environment's template
when its code imports a preloaded module. Sessions: a few jails whose zygotes fork one long-lived executor per
session, each born in a cgroup of its own, so one session's memory or fork bomb cannot starve another; a
session can be graded over a copy of its files, interrupted, and forked (``fork.py``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandboxd.errors import BadRequest, SandboxSetupError, SessionLost, UnknownSession
from sandboxd.runners.base import (
    RunnerContext,
    StepLimits,
    StepOutcome,
    refuse_at_session_cap,
    refuse_fork_at_cap,
)
from sandboxd.runners.cgroups import CgroupGroup, CgroupRoot, Counters
from sandboxd.runners.jail.config import SLOT_OVERHEAD_PIDS
from sandboxd.runners.jail.exchange import Executor
from sandboxd.runners.jail.executions import Executions
from sandboxd.runners.jail.jail import Jail
from sandboxd.runners.jail.jailside import wire
from sandboxd.runners.jail.models import MAX_FILES
from sandboxd.runners.jail.nsjail import jail_environments, startup_modules
from sandboxd.runners.jail.pool import SlotPool
from sandboxd.runners.python import fork
from sandboxd.runners.python.config import SESSION_ZYGOTE_BYTES, PythonRunnerConfig
from sandboxd.runners.python.fork import Lineage
from sandboxd.runners.python.imports import import_pattern, module_tops, site_tops
from sandboxd.runners.python.models import PythonAction, PythonObservation, PythonSessionOptions
from sandboxd.runners.python.snapshot import read_workdir

log = logging.getLogger(__name__)


@dataclass
class Placed:
    """A session sandbox made ahead: its executor, born in its own cgroup (``Jail.spawn(into=...)``)."""

    executor: Executor
    cgroup: CgroupGroup

    def close(self) -> None:
        self.executor.close()


@dataclass
class SessionJail:
    """A jail whose zygote forks session sandboxes, and the ones it has ready."""

    jail: Jail
    host: CgroupGroup  # the parent of the zygote's group and of every session's group
    warm: asyncio.Queue[asyncio.Task[Placed]] = field(default_factory=asyncio.Queue)


@dataclass
class Session:
    session_id: str
    executor: Executor
    cgroup: CgroupGroup
    jail: Jail
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    steps: int = 0
    env: str | None = None  # its environment, set by its first step
    keep_processes: bool = False  # what its cells start outlives them (PythonSessionOptions)
    lineage: Lineage | None = None  # a fork's namespaces it lives in (a copy, or a source after its fork)
    workdir: str = "/tmp"  # where its files are: a copy's own directory under fork.FORK_ROOT
    seen: Counters = field(default_factory=lambda: Counters(0, 0))  # its group's counters after its last step


class PythonRunner:
    def __init__(self, cfg: PythonRunnerConfig, ctx: RunnerContext) -> None:
        self.cfg = cfg
        self.runtime_dir = ctx.runtime_dir / ctx.name
        self.name = ctx.name
        self.execs = Executions("python", cfg, PythonObservation, ctx.density)
        self.stats = self.execs.stats
        self.stats["forks"] = 0
        self.pool = SlotPool(cfg, self.runtime_dir, self.execs)
        self.session_jails: list[SessionJail] = []
        self.sessions: dict[str, Session] = {}
        self.root: CgroupRoot | None = None
        self._leftover_dirs: list[tuple[Lineage, str]] = []  # closed copies' files not all deleted yet
        self._sandbox_seq = 0
        # The environments, numbered as the jails' zygotes number them; the default one, if it was built.
        self.envs = {name: i for i, (name, _) in enumerate(jail_environments(cfg))}
        self.default_env = cfg.default_environment if cfg.default_environment in self.envs else None
        self._preloaded = {
            self.envs[n]: import_pattern(m) for n, m in cfg.preload.items() if n in self.envs and cfg.templates() > 0
        }
        # What a step's own files must not be named for its template's imports to be the ones ``python main.py``
        # in its directory would make: a module the template imported that plain python has not at start (a
        # ``calendar.py`` loses to numpy's calendar there, and wins under plain python), or a matplotlibrc
        # (read at import). Until a jail's template has said what it imported: anything it could import.
        startup = {name.split(".", 1)[0] for name in startup_modules(cfg.resolved_prefix())}
        self._startup_tops = frozenset(startup)
        self._template_tops: dict[int, frozenset[str]] = {}
        self._could_shadow = {
            self.envs[n]: frozenset(
                (set(sys.stdlib_module_names) | site_tops(env) | {m.split(".")[0] for m in cfg.preload.get(n, [])})
                - startup
            )
            | {"matplotlibrc"}
            for n, env in jail_environments(cfg)
        }
        if cfg.default_environment and self.default_env is None:
            log.warning(
                "python: default_environment %r is not built under %s (steps get the standard library only); "
                "build it with `sandboxd env build %s`",
                cfg.default_environment,
                cfg.environments_dir,
                cfg.default_environment,
            )
        self._fork_refusal = fork.host_refusal()

    def capacity(self) -> int:
        return self.pool.capacity()

    def burst_capacity(self) -> int:
        return self.pool.burst_capacity()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.root = CgroupRoot(self.name, Path(self.cfg.cgroup_mount), self.cfg.cgroup_version or None)
        jobs = []
        for i in range(self.cfg.session_jails_per_worker):
            host = self.root.slot(f"sessions{i}")
            zyg = host.child("zygote")
            zyg.set_limits(SESSION_ZYGOTE_BYTES, SLOT_OVERHEAD_PIDS + 4 * (self.cfg.warm_sessions_per_jail + 1))
            sj = SessionJail(Jail(f"sessions{i}", "session", self.cfg, zyg, self.runtime_dir), host)
            self.session_jails.append(sj)
            jobs.append(self._start_session_jail(sj))
        await asyncio.gather(self.pool.start(self.root, self._warm_flavor()), *jobs)

    def _warm_flavor(self) -> int | None:
        """The default environment's template, imported at start when it has preloads (``SlotPool.start``)."""
        flavor = self.envs.get(self.default_env) if self.default_env is not None else None
        if not self.cfg.warm_templates or flavor is None or self._preloaded.get(flavor) is None:
            return None
        return flavor

    async def _start_session_jail(self, sj: SessionJail) -> None:
        await sj.jail.start()
        self.stats["jail_starts"] += 1
        self._fill_warm(sj)

    def _fill_warm(self, sj: SessionJail) -> None:
        while sj.warm.qsize() < self.cfg.warm_sessions_per_jail:
            sj.warm.put_nowait(asyncio.create_task(self._session_sandbox(sj)))

    async def _session_sandbox(self, sj: SessionJail) -> Placed:
        """A session's sandbox in a cgroup of its own from birth: nothing it holds is charged to the jail."""
        self._sandbox_seq += 1
        cg = sj.host.child(f"x{self._sandbox_seq}")
        try:
            cg.set_limits(self.cfg.memory_mb << 20, self.cfg.pids_max)
            cg.set_cpu(self.cfg.cpu_cores)
            executor = await sj.jail.spawn(into=cg)
        except BaseException:
            await self.execs.remove_cgroup(cg)
            raise
        self.stats["sandbox_starts"] += 1
        return Placed(executor, cg)

    async def close(self) -> None:
        for sess in list(self.sessions.values()):
            await self._drop_session(sess)
        await self.pool.close()
        for sj in self.session_jails:
            await self._drop_warm(sj)
            await sj.jail.stop()
        if self.root is not None:
            await asyncio.to_thread(self.root.group.remove)

    async def health(self) -> dict[str, Any]:
        alive, total = self.pool.alive()
        alive += sum(sj.jail.alive for sj in self.session_jails)
        total += len(self.session_jails)
        if self.execs.leftovers or self._leftover_dirs:
            await self._retry_leftovers()
        return self.pool.health(alive, total, self._heal, sessions=len(self.sessions))

    async def _heal(self) -> None:
        """Restart dead jails before a step lands on them (health checks call this; /readyz says 503 meanwhile).
        Session jails restart in place (their sessions are already lost)."""
        await self.pool.heal()
        for sj in self.session_jails:
            if not sj.jail.alive:
                with contextlib.suppress(SandboxSetupError, OSError, wire.WireError):
                    await self.execs.ensure_jail(sj.jail)
                    await self._drop_warm(sj)
                    self._fill_warm(sj)

    # ------------------------------------------------------------------ steps

    def _env_of(self, action: PythonAction) -> str | None:
        name = action.env or self.default_env
        if name is not None and name not in self.envs:
            raise BadRequest(f"action.env: no Python environment {name!r} on this node (built: {', '.join(self.envs)})")
        return name

    def _flavor(self, header: dict[str, Any], action: PythonAction) -> int | None:
        """The template to fork this one-shot from: its environment's, when its code imports a preload and
        none of its files is named like a module the template imported (``_shadowed``)."""
        env = header.get("env")
        if not isinstance(env, int):
            return None
        pattern = self._preloaded.get(env)
        if pattern is None:
            return None
        if module_tops((*action.files, action.script or "")) & self._shadowed(env):
            return None  # the step's own module (or rc file) must win, as under a fresh interpreter
        if pattern.search(action.code) or any(
            p.endswith(".py") and pattern.search(c) for p, c in action.files.items() if action.file_encoding == "utf-8"
        ):
            return env
        return None

    def _shadowed(self, env: int) -> frozenset[str]:
        """Top-level names a step's files must not have to be forked from ``env``'s template."""
        known = self._template_tops.get(env)
        if known is None:
            modules = self.pool.template_modules(env)
            if modules is not None:
                known = self._template_tops[env] = (modules - self._startup_tops) | {"matplotlibrc"}
        return known if known is not None else self._could_shadow[env]

    def _request(self, action: PythonAction, limits: StepLimits) -> tuple[dict[str, Any], bytes]:
        files = action.file_bytes()
        stdin = action.stdin.encode()
        code = action.code.encode()
        header = self.execs.header(limits, files, stdin)
        if action.script is not None:
            header["script"] = action.script
        env = self._env_of(action)
        if env is not None:
            header["env"] = self.envs[env]
        if action.fetch_files:
            header["fetch"] = action.fetch_files
            header["fetch_max_bytes"] = self.cfg.max_fetch_bytes
        return header, b"".join(data for _, data in files) + stdin + code

    async def step(self, action: PythonAction, session_id: str | None, limits: StepLimits) -> StepOutcome:
        if action.grade:
            if session_id is None:
                raise BadRequest("grade is for session steps: it grades a session's files in a fresh sandbox")
            return await self._grade(session_id, action, limits)
        header, body = self._request(action, limits)
        if session_id is not None:
            if action.fetch_files:
                raise BadRequest(
                    "fetch_files is for one-shot steps (a session's later cells can read its files themselves)"
                )
            if action.script is not None:
                raise BadRequest("script is for one-shot steps (a session's cells run as a notebook's do)")
            return await self._session_step(session_id, header, body, limits, action.env)
        flavor = self._flavor(header, action)
        async with self.pool.acquire() as slot:
            return await self.pool.run(slot, header, body, limits, flavor)

    # ------------------------------------------------------------------ sessions

    async def open_session(self, session_id: str, options: dict[str, Any]) -> None:
        if session_id in self.sessions:
            return
        refuse_at_session_cap("python", len(self.sessions), self.cfg.max_sessions_per_worker, session_id)
        sj = max(self.session_jails, key=lambda j: j.warm.qsize())
        keep = PythonSessionOptions.model_validate(options).keep_processes  # checked at the node already
        placed = await self._warm_sandbox(sj)
        self.sessions[session_id] = Session(session_id, placed.executor, placed.cgroup, sj.jail, keep_processes=keep)

    async def _warm_sandbox(self, sj: SessionJail) -> Placed:
        """A live pre-forked sandbox of ``sj``; dead ones (their jail died) are dropped, not handed out."""
        while not sj.warm.empty():
            task = sj.warm.get_nowait()
            self._fill_warm(sj)
            try:
                placed = await task
            except (SandboxSetupError, OSError, wire.WireError):
                break
            if placed.executor.alive() and sj.jail.alive:
                return placed
            await self._discard(placed)
            break
        await self.execs.ensure_jail(sj.jail)
        return await self._session_sandbox(sj)

    async def _drop_warm(self, sj: SessionJail) -> None:
        while not sj.warm.empty():
            task = sj.warm.get_nowait()
            task.cancel()
            with contextlib.suppress(BaseException):
                await self._discard(await task)

    async def _discard(self, placed: Placed) -> None:
        placed.close()
        await self.execs.remove_cgroup(placed.cgroup)

    async def _session_step(
        self, session_id: str, header: dict[str, Any], body: bytes, limits: StepLimits, env: str | None
    ) -> StepOutcome:
        sess = self.sessions.get(session_id)
        if sess is None:
            raise UnknownSession(f"no Python session {session_id} on worker {self.name}")
        async with sess.lock:
            if sess.steps == 0:
                sess.env = env or self.default_env
            elif env is not None and env != sess.env:
                raise BadRequest(
                    f"action.env: session {session_id} runs in environment {sess.env!r} (its first step's); "
                    f"a session cannot change it to {env!r}"
                )
            # Unguessable, so a program cannot write the reply to a cell it has not seen yet (it can still read
            # its own cell's tag from the interpreter it shares with the harness: docs/security.md).
            header["tag"] = secrets.randbits(62)
            if sess.keep_processes:
                header["keep"] = True
            try:
                return await self.execs.session_step(sess, header, body, limits, lambda: self._drop_session(sess))
            finally:
                sess.steps += 1

    async def interrupt_session(self, session_id: str) -> bool:
        """SIGINT to the session's interpreter while a cell runs (``KeyboardInterrupt`` in the cell, as a
        notebook's interrupt: its state stays). Between cells the session holds SIGINT and drops it."""
        sess = self.sessions.get(session_id)
        if sess is None or not sess.lock.locked():
            return False
        sess.executor.kill(signal.SIGINT)
        return True

    async def _grade(self, session_id: str, action: PythonAction, limits: StepLimits) -> StepOutcome:
        """A one-shot in a fresh sandbox over a copy of the session's files (``snapshot.py``), taken while no
        cell runs; the grader never shares an interpreter, a process or a namespace with the policy's code."""
        sess = self.sessions.get(session_id)
        if sess is None:
            raise UnknownSession(f"no Python session {session_id} on worker {self.name}")
        if action.env is not None and action.env != sess.env:
            raise BadRequest(
                f"action.env: session {session_id} runs in environment {sess.env!r}; its grader runs there too"
            )
        async with sess.lock:
            if not sess.executor.alive():
                await self._drop_session(sess)
                raise SessionLost(f"session {session_id}: its sandbox is gone")
            snap = await asyncio.to_thread(
                read_workdir, sess.executor.host_pid, MAX_FILES, self.cfg.max_files_bytes, sess.workdir
            )
        given = dict(zip(action.files, (data for _, data in action.file_bytes()), strict=True))
        files = {**snap.files, **given}
        if sum(len(v) for v in files.values()) > self.cfg.max_files_bytes:
            raise BadRequest(f"the session's files and the step's pass max_files_bytes {self.cfg.max_files_bytes}")
        oneshot = action.model_copy(
            update={
                "grade": False,
                "files": {p: base64.b64encode(v).decode() for p, v in files.items()},
                "file_encoding": "base64",
                "env": sess.env,
            }
        )
        outcome = await self.step(oneshot, None, limits)
        if snap.skipped and isinstance(outcome.observation, PythonObservation):
            outcome.observation.session_files_skipped = snap.skipped
        return outcome

    async def fork_session(self, source_id: str, new_ids: list[str]) -> list[str]:
        """Copies of the session's interpreter and files (``fork.py``, ``jailside/forking.py``); all or none."""
        sess = self.sessions.get(source_id)
        if sess is None:
            raise UnknownSession(f"no Python session {source_id} on worker {self.name}")
        if self._fork_refusal:
            raise BadRequest(self._fork_refusal)
        n = len(new_ids)
        if n > fork.COPIES_MAX:
            raise BadRequest(f"n: python sessions fork at most {fork.COPIES_MAX} copies at once")
        refuse_fork_at_cap("python", len(self.sessions), n, self.cfg.max_sessions_per_worker, source_id)
        sj = next(j for j in self.session_jails if j.jail is sess.jail)
        async with sess.lock:
            if not sess.executor.alive():
                await self._drop_session(sess)
                raise SessionLost(f"session {source_id}: its sandbox is gone")
            groups: list[CgroupGroup] = []
            _, limit = sess.cgroup.memory()
            limit = limit or self.cfg.memory_mb << 20
            try:
                # The members are born in the source's group and moved out one by one: room for them there,
                # and for what their birth charges (page tables, kernel stacks) which stays charged there.
                sess.cgroup.set_limits(limit + (n + 1) * fork.BIRTH_BYTES, self.cfg.pids_max + n + 1)
                for _ in range(n + 1):
                    self._sandbox_seq += 1
                    groups.append(sj.host.child(f"x{self._sandbox_seq}"))
                    groups[-1].set_limits(self.cfg.memory_mb << 20, self.cfg.pids_max)
                    groups[-1].set_cpu(self.cfg.cpu_cores)
                # The first move into a cgroup after a quiet spell waits for an RCU grace period (v1: ~10-45 ms
                # here), the next ones do not: pay it now, while the session forks, not when its members arrive.
                warming = asyncio.ensure_future(asyncio.to_thread(sess.cgroup.add, sess.executor.host_pid))
                try:
                    lineage, members = await fork.fork(sess.executor, sess.cgroup, n, groups, sess.keep_processes)
                finally:
                    with contextlib.suppress(SandboxSetupError):
                        await warming
            except BaseException as exc:
                for cg in groups:
                    await self.execs.remove_cgroup(cg)
                if isinstance(exc, fork.Hung):  # its own code held the fork: in no known state, it ends
                    exc.session_ended = True
                    await self._drop_session(sess)
                    raise
                broke = (SandboxSetupError, wire.WireError, OSError, TimeoutError)
                if isinstance(exc, broke) and not isinstance(exc, fork.NotForked):
                    await self._drop_session(sess)
                    raise SessionLost(
                        f"session {source_id}: its fork broke off ({exc!r}); the session is gone"
                    ) from exc
                with contextlib.suppress(SandboxSetupError):  # refused, or nothing made: its limits as they were
                    sess.cgroup.set_limits(limit, self.cfg.pids_max)
                raise
            cont, copies = members[0], [m for m in members[1:] if isinstance(m, fork.Member)]
            if not isinstance(cont, fork.Member) or len(copies) != n:
                failed = next(m for m in members if not isinstance(m, fork.Member))
                for m in copies:
                    m.executor.close()
                for cg in groups[1:]:
                    await self.execs.remove_cgroup(cg)
                for m in copies:
                    await asyncio.to_thread(fork.remove_workdir, lineage.holder.host_pid, m.workdir)
                if not isinstance(cont, fork.Member):  # the source's own continuation did not start: it ends
                    lineage.close()
                    await self.execs.remove_cgroup(groups[0])
                    self.sessions.pop(source_id, None)
                    await self.execs.remove_cgroup(sess.cgroup)
                    if isinstance(failed, BadRequest):
                        failed.message += f"; session {source_id} is closed"
                        failed.session_ended = True
                        raise failed
                    raise SessionLost(f"session {source_id}: its fork broke off ({failed!r}); the session is gone")
                self._rebase(sess, lineage, cont)
                blamed = next((m for m in members if isinstance(m, BadRequest)), None)
                if blamed is not None:
                    raise blamed  # the session's own doing (a thread at fork, a changed harness): no copy is kept
                raise SandboxSetupError(f"python: a copy of session {source_id} did not start: {failed!r}")
            self._rebase(sess, lineage, cont)
            for sid, m in zip(new_ids, copies, strict=True):
                lineage.members.add(sid)
                self.sessions[sid] = Session(
                    sid,
                    m.executor,
                    m.cgroup,
                    sess.jail,
                    steps=sess.steps,
                    env=sess.env,
                    lineage=lineage,
                    workdir=m.workdir,
                )
            self.stats["forks"] += 1
        return fork.notes(copies)

    def _rebase(self, sess: Session, lineage: Lineage, continuation: fork.Member) -> None:
        """The source goes on in its continuation; its old process holds the namespaces."""
        sess.executor, sess.cgroup, sess.lineage = continuation.executor, continuation.cgroup, lineage
        lineage.members.add(sess.session_id)

    async def close_session(self, session_id: str) -> None:
        sess = self.sessions.get(session_id)
        if sess is not None:
            await self._drop_session(sess)

    async def _drop_session(self, sess: Session) -> None:
        """End a session whatever state it is in: its sandbox killed, a copy's files deleted (they live in
        the fork group's shared tmpfs), its cgroup removed, and the group's holder closed with its last
        member. A cleanup that fails is logged and tried again (``health``), never the caller's answer."""
        self.sessions.pop(sess.session_id, None)
        sess.executor.close()
        lineage = sess.lineage
        try:
            if lineage is not None and sess.workdir != "/tmp":
                # Nothing of the copy may write while its files go; they are charged to its group until then.
                await asyncio.to_thread(sess.cgroup.kill_all)
                await self._remove_copy_files(lineage, sess.workdir)
        finally:
            await self.execs.remove_cgroup(sess.cgroup)
            if lineage is not None:
                lineage.members.discard(sess.session_id)
                if not lineage.members:  # the last one out closes the namespaces (and their tmpfs)
                    lineage.close()
                    await self.execs.remove_cgroup(lineage.cgroup)

    async def _remove_copy_files(self, lineage: Lineage, workdir: str) -> None:
        if not lineage.holder.alive():
            return  # the namespaces are gone, and their tmpfs with them
        try:
            gone = await asyncio.to_thread(fork.remove_workdir, lineage.holder.host_pid, workdir)
        except Exception:
            log.exception("python: removing a closed copy's files (%s)", workdir)
            gone = False
        if not gone:
            log.warning("python: a closed copy's files (%s) are not all gone; trying again later", workdir)
            self._leftover_dirs.append((lineage, workdir))

    async def _retry_leftovers(self) -> None:
        dirs, self._leftover_dirs = self._leftover_dirs, []
        for lineage, workdir in dirs:
            await self._remove_copy_files(lineage, workdir)
        await self.execs.retry()
