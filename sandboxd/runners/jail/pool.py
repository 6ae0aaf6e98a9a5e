"""A kind's one-shot slots: warm jails, each running one execution at a time.

``slots_per_worker`` jails (and ``burst_slots_per_worker`` more, for tenants below their fair share), each in
a cgroup of its own, each with an executor forked and set up before the request comes (the next one is
prepared while the current one runs). An executor may be forked from a template, a second zygote that has
imported an environment's heavy modules (its flavor: the environment's number), when the step asked for one.
Without a warm pool (``warm_pool`` false) every execution pays for its own jail, cgroup and executor: what the
pool takes off the request path, on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandboxd.errors import SandboxSetupError
from sandboxd.runners.base import StepLimits, StepOutcome
from sandboxd.runners.cgroups import CgroupGroup, CgroupRoot
from sandboxd.runners.jail.config import SLOT_HEADROOM_BYTES, SLOT_OVERHEAD_PIDS, JailConfig
from sandboxd.runners.jail.exchange import Executor
from sandboxd.runners.jail.executions import Executions
from sandboxd.runners.jail.jail import Jail, Shape
from sandboxd.runners.jail.jailside import wire

log = logging.getLogger(__name__)

SPAWN_RETRY_DELAYS_S = (0.02, 0.1, 0.3)  # a jail that could not fork is retried this often before a restart
TEMPLATE_WARM_TIMEOUT_S = 120.0  # a template still importing after this at start: the worker starts without it


@dataclass
class Slot:
    jail: Jail
    cgroup: CgroupGroup
    next_executor: asyncio.Task[Executor] | None = None
    next_flavor: int | None = None  # what the prepared executor was asked as: the last step's flavor
    memory_bytes: int = 0
    templates: CgroupGroup | None = None  # the group its environments' templates are born in


def _close_executor(task: asyncio.Task[Executor]) -> None:
    """A prepared executor nobody will use (its flavor was not the step's)."""
    if not task.cancelled() and task.exception() is None:
        task.result().close()


class SlotPool:
    """The one-shot slots of one runner instance; its executions run through ``execs``."""

    def __init__(
        self, cfg: JailConfig, runtime_dir: Path, execs: Executions, mode: str = "oneshot", shape: Shape | None = None
    ) -> None:
        self.cfg = cfg
        self.mode, self.shape = mode, shape  # what its jails are (``Jail``)
        self.runtime_dir = runtime_dir
        self.execs = execs
        self.slots: list[Slot] = []
        self.free: asyncio.Queue[Slot] = asyncio.Queue()
        self.root: CgroupRoot | None = None
        self._cold = asyncio.Semaphore(cfg.slots_per_worker + cfg.burst_slots_per_worker)  # warm_pool=False
        self._cold_seq = 0
        self._healer: asyncio.Task[None] | None = None

    def capacity(self) -> int:
        return self.cfg.slots_per_worker

    def health(
        self, alive: int, total: int, heal: Callable[[], Coroutine[Any, Any, None]], **extra: Any
    ) -> dict[str, Any]:
        """A jailed kind's health: its jails (``alive`` of ``total``, the pool's and its own; while one is dead,
        ``heal`` runs, one at a time, before a step lands there), its slots, ``extra`` and its counters."""
        if alive < total and (self._healer is None or self._healer.done()):
            self._healer = asyncio.create_task(heal())
        return {
            "capacity": self.capacity(),
            "free_slots": self.free_slots(),
            "burst_slots": self.burst_capacity(),
            **extra,
            "jails_alive": alive,
            "jails_total": total,
            "ready": alive == total,
            **self.execs.stats,
        }

    def burst_capacity(self) -> int:
        """Slots for tenants below their fair share only (the worker's admission decides who takes them)."""
        return self.cfg.burst_slots_per_worker

    # ------------------------------------------------------------------ lifecycle

    async def start(self, root: CgroupRoot, warm_flavor: int | None = None) -> None:
        """Every slot's jail started, its first executor prepared and, for ``warm_flavor``, its template
        imported before the worker says it is ready: a node that has just joined serves its first numpy steps
        as fast as its hundredth (lazily, each slot's first such steps imported for themselves: 0.4-0.9 s
        each, 60x a warm one)."""
        self.root = root
        mem = self.cfg.memory_mb << 20
        slots = self.cfg.slots_per_worker + self.cfg.burst_slots_per_worker
        for i in range(slots if self.cfg.warm_pool else 0):
            cg = root.slot(f"slot{i}")
            cg.set_limits(mem + SLOT_HEADROOM_BYTES, self.cfg.pids_max + SLOT_OVERHEAD_PIDS)
            cg.set_cpu(self.cfg.cpu_cores)
            jail = Jail(f"slot{i}", self.mode, self.cfg, cg, self.runtime_dir, self.shape)
            slot = Slot(jail, cg, memory_bytes=mem + SLOT_HEADROOM_BYTES)
            if self.cfg.templates():
                slot.templates = root.slot(f"slot{i}-templates")
                room = self.cfg.templates_reservation()
                slot.templates.set_limits(room.memory_bytes, room.pids)
                slot.templates.set_cpu(self.cfg.cpu_cores)
            self.slots.append(slot)
        await asyncio.gather(*(self._start_slot(slot, warm_flavor) for slot in self.slots))
        for slot in self.slots:
            self.free.put_nowait(slot)

    async def _start_slot(self, slot: Slot, warm_flavor: int | None) -> None:
        await slot.jail.start()
        self.execs.stats["jail_starts"] += 1
        slot.next_executor = asyncio.create_task(self.spawn(slot.jail, slot.next_flavor))
        await asyncio.wait([slot.next_executor])
        if warm_flavor is None or slot.templates is None:
            return
        try:
            await slot.jail.ensure_template(warm_flavor, slot.templates)
        except (SandboxSetupError, OSError, TimeoutError, wire.WireError) as exc:
            log.warning("slot %s: its template did not start: %r", slot.jail.name, exc)
            return
        if not await slot.jail.template_warm(warm_flavor, TEMPLATE_WARM_TIMEOUT_S):
            log.warning("slot %s: its template was not ready within %g s", slot.jail.name, TEMPLATE_WARM_TIMEOUT_S)

    async def close(self) -> None:
        for slot in self.slots:
            if slot.next_executor is not None:
                slot.next_executor.cancel()
                with contextlib.suppress(BaseException):
                    (await slot.next_executor).close()
            await slot.jail.stop()

    def alive(self) -> tuple[int, int]:
        """Jails alive, jails in all."""
        return sum(s.jail.alive for s in self.slots), len(self.slots)

    def free_slots(self) -> int:
        """Slots free now, less the burst ones (free or not: which jail a burst step took is not tracked)."""
        free = self.free.qsize() if self.cfg.warm_pool else self._cold._value
        return max(0, free - self.burst_capacity())

    async def heal(self) -> None:
        """Restart dead jails before a step lands on them (idle slots are taken out of the free queue while
        their jail restarts; busy ones are left to ``take_executor``)."""
        for _ in range(self.free.qsize()):
            slot = self.free.get_nowait()
            try:
                if not slot.jail.alive:
                    if slot.next_executor is not None:
                        slot.next_executor.cancel()
                        slot.next_executor = None
                    with contextlib.suppress(SandboxSetupError, OSError, wire.WireError):
                        await self.execs.ensure_jail(slot.jail)  # it stops what is left of the dead jail first
                        slot.next_executor = asyncio.create_task(self.spawn(slot.jail, slot.next_flavor))
            finally:
                self.free.put_nowait(slot)

    def template_modules(self, flavor: int) -> frozenset[str] | None:
        """The modules a template of ``flavor`` imported, as the first slot whose template said so."""
        for slot in self.slots:
            modules = slot.jail.template_modules.get(flavor)
            if modules is not None:
                return frozenset(modules)
        return None

    # ------------------------------------------------------------------ executions

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Slot | None]:
        """A slot for one step, given back after it (None without a warm pool: a cold jail, within the cap)."""
        if not self.cfg.warm_pool:
            async with self._cold:
                yield None
            return
        slot = await self.free.get()
        try:
            yield slot
        finally:
            self.free.put_nowait(slot)

    def borrow(self) -> Slot | None:
        """A free slot now, for work a step spreads (its lender said it may), or None."""
        try:
            return self.free.get_nowait()
        except asyncio.QueueEmpty:
            return None

    def give_back(self, slot: Slot) -> None:
        self.free.put_nowait(slot)

    async def run(
        self, slot: Slot | None, header: dict[str, Any], body: bytes, limits: StepLimits, flavor: int | None = None
    ) -> StepOutcome:
        """One execution in ``slot`` (from ``acquire``), or in a cold jail of its own when it is None."""
        if slot is None:
            return await self._cold_oneshot(header, body, limits)
        executor = await self.take_executor(slot, flavor)
        if executor.flavor is not None:
            self.execs.stats["warm_imports"] += 1
        want_mem = self.slot_memory(limits)
        if want_mem != slot.memory_bytes:
            slot.cgroup.set_limits(want_mem, self.cfg.pids_max + SLOT_OVERHEAD_PIDS)
            slot.memory_bytes = want_mem
        slot.next_executor = asyncio.create_task(self.spawn(slot.jail, slot.next_flavor))
        return await self.execs.run_in(slot.jail, slot.cgroup, executor, header, body, limits)

    async def _cold_oneshot(self, header: dict[str, Any], body: bytes, limits: StepLimits) -> StepOutcome:
        """Everything a warm pool takes off the request path, on it: jail, cgroup, executor."""
        assert self.root is not None
        self._cold_seq += 1
        name = f"cold{self._cold_seq}"
        cg = self.root.slot(name)
        jail = Jail(name, self.mode, self.cfg, cg, self.runtime_dir, self.shape)
        try:
            cg.set_limits(self.slot_memory(limits), self.cfg.pids_max + SLOT_OVERHEAD_PIDS)
            cg.set_cpu(self.cfg.cpu_cores)
            await jail.start()
            self.execs.stats["jail_starts"] += 1
            # No template: it would start after the jail's one step, which imports for itself.
            return await self.execs.run_in(jail, cg, await self.spawn(jail), header, body, limits)
        finally:
            await jail.stop()
            await self.execs.remove_cgroup(cg)

    async def spawn(self, jail: Jail, flavor: int | None = None) -> Executor:
        executor = await jail.spawn(flavor=flavor)
        self.execs.stats["sandbox_starts"] += 1
        return executor

    def slot_memory(self, limits: StepLimits) -> int:
        """The slot's cgroup cap: the step's memory plus room for the zygote and the next executor."""
        return ((limits.memory_mb or self.cfg.memory_mb) << 20) + SLOT_HEADROOM_BYTES

    async def take_executor(self, slot: Slot, flavor: int | None) -> Executor:
        if flavor is not None and slot.templates is not None:
            try:
                await slot.jail.ensure_template(flavor, slot.templates)
            except (SandboxSetupError, OSError, TimeoutError, wire.WireError) as exc:
                log.warning("slot %s: its template for environment %d did not start: %r", slot.jail.name, flavor, exc)
        if slot.next_flavor != flavor:
            # The prepared one is of the other flavor: this step gets its own, and the slot prepares this
            # flavor from now on (a slot's steps tend to be alike: a trainer's task set, one kind of program).
            stale, slot.next_executor = slot.next_executor, asyncio.create_task(self.spawn(slot.jail, flavor))
            slot.next_flavor = flavor
            if stale is not None:
                stale.add_done_callback(_close_executor)
        task = slot.next_executor
        slot.next_executor = None
        try:
            if task is None:
                raise SandboxSetupError("no executor was being prepared")
            executor = await task
            if executor.alive() and slot.jail.alive:
                if flavor is not None and executor.flavor is None and slot.jail.warm_ready(flavor):
                    # Asked while its template was still importing: the template is ready now.
                    executor.close()
                    executor = await self.spawn(slot.jail, flavor)
                return executor
            executor.close()
            log.warning("slot %s: its prepared executor died; restarting the jail", slot.jail.name)
        except (SandboxSetupError, OSError, wire.WireError) as exc:
            # A live jail that could not fork (EAGAIN: the last program's processes are still being torn
            # down at the pids limit) is fine a moment later; a broken one (zygote killed, cgroup gone) is
            # replaced once.
            if slot.jail.alive:
                for delay in SPAWN_RETRY_DELAYS_S:
                    await asyncio.sleep(delay)
                    with contextlib.suppress(SandboxSetupError, OSError, wire.WireError):
                        return await self.spawn(slot.jail, flavor)
            log.warning("slot %s: %s; restarting its jail", slot.jail.name, exc)
        await slot.jail.stop()
        await self.execs.ensure_jail(slot.jail)
        return await self.spawn(slot.jail, flavor)
