"""The ``container`` runner: sandboxes whose root is an image of the node's store, on the jail core.

One-shots run in the core's warm slots (``SlotPool``), sessions in a session jail, each in a cgroup of its
own, as the python kind's: the same executors, limits, blame rule and fair share. What differs is the jail
(``shape``: its user namespace maps the image's ids 0..65535 onto the store's host range, and the store's
layers are bound read-only into it) and what an executor does once its request names the image
(``jailside/container.py``, ``jailside/rootfs.py``): it stacks the image's layers under a writable layer of its
own, pivots into them, and runs the command as the image's user, the one-shot's program in a child it
reports on, a session's commands in the image's shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsjail.config import IdMap, MountPt, NsJailConfig

from sandboxd.errors import (
    BadRequest,
    NotFound,
    SandboxSetupError,
    UnknownSession,
)
from sandboxd.images.store import Image, ImageStore
from sandboxd.images.unpack import ID_COUNT, IdRange, Limits
from sandboxd.runners.base import RunnerContext, StepLimits, StepOutcome, refuse_at_session_cap
from sandboxd.runners.cgroups import CgroupGroup, CgroupRoot, Counters
from sandboxd.runners.container.config import SESSION_ZYGOTE_BYTES, ContainerRunnerConfig
from sandboxd.runners.container.models import ContainerAction, ContainerObservation, ContainerSessionOptions
from sandboxd.runners.jail.config import SLOT_OVERHEAD_PIDS
from sandboxd.runners.jail.exchange import Executor, recv_frame, request_frame
from sandboxd.runners.jail.executions import Executions
from sandboxd.runners.jail.jail import Jail
from sandboxd.runners.jail.jailside import wire
from sandboxd.runners.jail.pool import SlotPool

log = logging.getLogger(__name__)

# The overlay's options must fit a page: each layer is "<64 hex>/fs:" (68 bytes) beside the upper and work dirs.
MAX_LAYERS = 56
LAYERS = "/opt/sandboxd/layers"  # jailside/rootfs.py's LAYERS: where the jail sees the store's layers/
ENTER_TIMEOUT_S = 30.0  # a session's root made and entered (a mount and a pivot: milliseconds on a quiet node)


@dataclass
class Session:
    session_id: str
    executor: Executor
    cgroup: CgroupGroup
    image: Image
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    seen: Counters = field(default_factory=lambda: Counters(0, 0))


class ContainerRunner:
    def __init__(self, cfg: ContainerRunnerConfig, ctx: RunnerContext) -> None:
        self.cfg = cfg
        self.name = ctx.name
        if ctx.images_dir is None or not ctx.image_uid_base:
            raise SandboxSetupError("the container runner needs the node's image store (SANDBOXD_IMAGES_DIR)")
        self.ids = IdRange(ctx.image_uid_base)
        self.store = ImageStore(ctx.images_dir, Limits(1, 1), self.ids)  # read only here: no limits apply
        self.execs = Executions("container", cfg, ContainerObservation, ctx.density)
        self.stats = self.execs.stats
        runtime = ctx.runtime_dir / ctx.name
        self.pool = SlotPool(cfg, runtime, self.execs, mode="container", shape=self.shape)
        self.runtime_dir = runtime
        self.root: CgroupRoot | None = None
        self.session_jail: Jail | None = None
        self.session_host: CgroupGroup | None = None
        self.sessions: dict[str, Session] = {}
        self._images: dict[str, tuple[tuple[int, int], Image]] = {}
        self._seq = 0

    def shape(self, config: NsJailConfig) -> None:
        """The jail of a container: root inside is the store's base uid outside, and ids 0..65535 map onto the
        range the store's owners are shifted to; the store's layers read-only where the executor stacks them."""
        ids = [IdMap(inside_id="0", outside_id=str(self.ids.base), count=ID_COUNT)]
        config.uidmap, config.gidmap = ids, list(ids)
        layers = self.store.root / "layers"
        config.mount.append(MountPt(src=str(layers), dst=LAYERS, is_bind=True, nosuid=True, nodev=True))

    def capacity(self) -> int:
        return self.pool.capacity()

    def burst_capacity(self) -> int:
        return self.pool.burst_capacity()

    async def start(self) -> None:
        await asyncio.to_thread(self._prepare_store)
        self.root = CgroupRoot(self.name, Path(self.cfg.cgroup_mount), self.cfg.cgroup_version or None)
        host = self.session_host = self.root.slot("sessions")
        zygote = host.child("zygote")
        zygote.set_limits(SESSION_ZYGOTE_BYTES, SLOT_OVERHEAD_PIDS + 4)
        self.session_jail = Jail("sessions", "container_session", self.cfg, zygote, self.runtime_dir, self.shape)
        await asyncio.gather(self.pool.start(self.root), self.session_jail.start())
        self.stats["jail_starts"] += 1

    def _prepare_store(self) -> None:
        """The store checked against this node's uid base, and its layers/ there for the jails to bind (an
        empty store on a new node too: images imported later are served without a restart). nsjail binds it
        from inside the jail's user namespace: every directory above the store must let others pass."""
        self.store.prepare()
        for parent in self.store.root.resolve().parents:
            if not os.stat(parent).st_mode & 0o001:
                raise SandboxSetupError(
                    f"the image store {self.store.root} is under {parent}, which the containers' jails cannot pass "
                    "(no o+x): give the directory o+x, or set SANDBOXD_IMAGES_DIR elsewhere"
                )

    async def close(self) -> None:
        for sess in list(self.sessions.values()):
            await self._drop_session(sess)
        await self.pool.close()
        if self.session_jail is not None:
            await self.session_jail.stop()
        if self.root is not None:
            await asyncio.to_thread(self.root.group.remove)

    async def health(self) -> dict[str, Any]:
        alive, total = self.pool.alive()
        if self.session_jail is not None:
            alive, total = alive + self.session_jail.alive, total + 1
        if self.execs.leftovers:
            await self.execs.retry()
        return self.pool.health(alive, total, self._heal, sessions=len(self.sessions))

    async def _heal(self) -> None:
        await self.pool.heal()
        if self.session_jail is not None and not self.session_jail.alive:
            with contextlib.suppress(SandboxSetupError, OSError, wire.WireError):
                await self.execs.ensure_jail(self.session_jail)

    # ------------------------------------------------------------------ images

    def image(self, name: str) -> Image:
        """The image's record, read again only when its file changed (one ``stat`` per step)."""
        path = self.store.record_path(name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._images.pop(name, None)
            raise NotFound(f"no image {name!r} on this node (sandboxd image list)") from None
        key = (st.st_ino, st.st_mtime_ns)
        cached = self._images.get(name)
        if cached is not None and cached[0] == key:
            return cached[1]
        image = self.store.get(name)
        if len(image.layers) > MAX_LAYERS:
            raise BadRequest(f"image {name!r} has {len(image.layers)} layers; a sandbox stacks at most {MAX_LAYERS}")
        self._images[name] = (key, image)
        return image

    @staticmethod
    def root_spec(image: Image, env: dict[str, str], user: str | None, workdir: str | None) -> dict[str, Any]:
        merged = dict(item.partition("=")[::2] for item in image.run.env)
        merged.update(env)
        return {
            "layers": [d.removeprefix("sha256:") for d in image.layers],
            "user": image.run.user if user is None else user,
            "workdir": workdir or image.run.working_dir or "/",
            "env": [f"{k}={v}" for k, v in merged.items()],
        }

    @staticmethod
    def argv(image: Image, cmd: str | list[str] | None) -> list[str]:
        """Docker's rule: a string is a shell command; a list follows the Entrypoint, replacing the Cmd."""
        if isinstance(cmd, str):
            return ["/bin/sh", "-c", cmd]
        argv = [*image.run.entrypoint, *(image.run.cmd if cmd is None else cmd)]
        if not argv:
            raise BadRequest(f"image {image.name!r} has no Entrypoint or Cmd: the step must give cmd")
        return argv

    # ------------------------------------------------------------------ steps

    async def step(self, action: ContainerAction, session_id: str | None, limits: StepLimits) -> StepOutcome:
        if session_id is not None:
            return await self._session_step(session_id, action, limits)
        if action.image is None:
            raise BadRequest("action.image: a one-shot names its image (sandboxd image list)")
        if action.code is not None:
            raise BadRequest("action.code: python cells run in sessions; a one-shot runs python3 -c as its cmd")
        image = self.image(action.image)
        files = action.file_bytes()
        stdin = action.stdin.encode()
        header = self.execs.header(limits, files, stdin)
        header["root"] = self.root_spec(image, action.env, action.user, action.workdir)
        header["exec"] = {"argv": self.argv(image, action.cmd)}
        header["fetch"] = list(action.fetch_files)
        header["fetch_max_bytes"] = self.cfg.max_fetch_bytes
        body = b"".join(data for _, data in files) + stdin
        async with self.pool.acquire() as slot:
            outcome = await self.pool.run(slot, header, body, limits)
        assert isinstance(outcome.observation, ContainerObservation)
        outcome.observation.image_id = image.id
        return outcome

    # ------------------------------------------------------------------ sessions

    async def open_session(self, session_id: str, options: dict[str, Any]) -> None:
        if session_id in self.sessions:
            return
        refuse_at_session_cap("container", len(self.sessions), self.cfg.max_sessions_per_worker, session_id)
        opts = ContainerSessionOptions.model_validate(options)  # checked at the node already
        image = self.image(opts.image)
        # Refused before anything is made for it (a sandbox and its group made first leaked here).
        enter = request_frame({"op": "enter", "root": self.root_spec(image, opts.env, opts.user, opts.workdir)})
        jail, host = self.session_jail, self.session_host
        assert jail is not None and host is not None
        await self.execs.ensure_jail(jail)
        self._seq += 1
        cg = host.child(f"x{self._seq}")
        try:
            cg.set_limits(self.cfg.memory_mb << 20, self.cfg.pids_max)
            cg.set_cpu(self.cfg.cpu_cores)
            executor = await jail.spawn(into=cg)
        except BaseException:
            await self.execs.remove_cgroup(cg)
            raise
        self.stats["sandbox_starts"] += 1
        try:
            await self._enter(executor, enter)
        except BaseException:
            executor.close()
            await self.execs.remove_cgroup(cg)
            raise
        self.sessions[session_id] = Session(session_id, executor, cg, image)

    async def _enter(self, executor: Executor, request: bytes) -> None:
        """The session's root made and entered: ``entered``, or why not, and whose fault that was."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(ENTER_TIMEOUT_S):
                await loop.sock_sendall(executor.sock, request)
                reply, _ = await recv_frame(executor.sock, 8192, 0)
        except (TimeoutError, wire.WireError, OSError) as exc:
            raise SandboxSetupError(f"a container session's sandbox did not start: {exc!r}") from exc
        if reply.get("op") == "entered":
            return
        why = str(reply.get("error"))
        if reply.get("node") is True:
            raise SandboxSetupError(f"the session's root could not be made: {why}")
        raise BadRequest(f"the image cannot run this session: {why}")

    async def _session_step(self, session_id: str, action: ContainerAction, limits: StepLimits) -> StepOutcome:
        sess = self.sessions.get(session_id)
        if sess is None:
            raise UnknownSession(f"no container session {session_id} on worker {self.name}")
        if action.image is not None and action.image != sess.image.name:
            raise BadRequest(f"action.image: session {session_id} runs image {sess.image.name!r}, not {action.image!r}")
        for name in ("env", "user", "workdir", "fetch_files"):
            if getattr(action, name):
                raise BadRequest(
                    f"action.{name} is for one-shots: a session's commands export, cd and read files themselves"
                )
        files = action.file_bytes()
        stdin = action.stdin.encode()
        header = self.execs.header(limits, files, stdin)
        body = b"".join(data for _, data in files) + stdin
        if action.code is not None:
            cell = action.code.encode("utf-8", "surrogatepass")
            header["python_len"] = len(cell)
            body += cell
        else:
            header["command"] = action.command()
        async with sess.lock:
            header["tag"] = secrets.randbits(62)
            outcome = await self.execs.session_step(sess, header, body, limits, lambda: self._drop_session(sess))
        assert isinstance(outcome.observation, ContainerObservation)
        outcome.observation.image_id = sess.image.id
        return outcome

    async def interrupt_session(self, session_id: str) -> bool:
        """The running command and what it started are killed; the shell's state stays (the next command
        starts where the last one that finished left it)."""
        sess = self.sessions.get(session_id)
        if sess is None or not sess.lock.locked():
            return False
        sess.executor.kill(signal.SIGINT)
        return True

    async def close_session(self, session_id: str) -> None:
        sess = self.sessions.get(session_id)
        if sess is not None:
            await self._drop_session(sess)

    async def _drop_session(self, sess: Session) -> None:
        self.sessions.pop(sess.session_id, None)
        sess.executor.close()
        await self.execs.remove_cgroup(sess.cgroup)
