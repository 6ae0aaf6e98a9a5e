"""Start a sandboxd node (or the redis-server nodes share) as a subprocess on a free loopback port (demo, bench,
tests)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator


class NodeDidNotStart(RuntimeError):
    pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def wait_ready(base_url: str, timeout_s: float = 120.0, proc: subprocess.Popen[bytes] | None = None) -> bool:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base_url}/readyz", timeout=2).status_code == 200:
                return True
        time.sleep(0.2)
    return False


_PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: no dlopen between fork and exec
PR_SET_PDEATHSIG = 1


def _die_with(parent: int, join: tuple[str, ...] = ()) -> Callable[[], None]:
    def before_exec() -> None:
        """In the child: SIGTERM it when its parent dies, even by SIGKILL.

        A bench or test killed mid-run must not leave a node (and its jails and
        Chromium) running with nobody to stop it; a parent gone before this ran
        is caught by comparing the parent pid.
        """
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)
        for procs in join:  # a cgroup to run in (a test's "pod"): everything the node starts is below it
            with open(procs, "w") as f:
                f.write("0")

    return before_exec


class NodeProcess:
    """A node started as a subprocess; ``stop`` (SIGTERM, then SIGKILL after 30 s) is idempotent."""

    def __init__(
        self,
        settings: dict[str, str] | None = None,
        inherit: bool = False,
        port: int = 0,
        cgroup: tuple[str, ...] = (),
        cwd: str | None = None,
    ) -> None:
        """``cwd``: a source tree whose code the node runs: it starts there (``python -m`` puts the working
        directory first on the path, ahead of ``PYTHONPATH``: from this repository's root, any node ran it) with
        the tree first on ``PYTHONPATH`` too, for every process it starts."""
        self.port = port or free_port()
        env = {k: v for k, v in os.environ.items() if inherit or not k.startswith("SANDBOXD_")}
        env.update({"SANDBOXD_HOST": "127.0.0.1", "SANDBOXD_PORT": str(self.port)})
        env.setdefault("SANDBOXD_LOG_LEVEL", "warning")
        env.update(settings or {})
        if cwd:
            env["PYTHONPATH"] = os.pathsep.join([cwd, *filter(None, [env.get("PYTHONPATH")])])
        self.settings = dict(settings or {})
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandboxd", "serve"], env=env, cwd=cwd, preexec_fn=_die_with(os.getpid(), cgroup)
        )

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        if not wait_ready(self.url, timeout_s=timeout_s, proc=self.proc):
            self.stop()
            raise NodeDidNotStart(
                f"sandboxd did not become ready at {self.url} (exit {self.proc.poll()}); see its log above"
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()


@contextlib.contextmanager
def local_node(
    settings: dict[str, str] | None = None,
    inherit: bool = False,
    timeout_s: float = 180.0,
    cgroup: tuple[str, ...] = (),
) -> Iterator[str]:
    """Yield the base URL of a fresh node; stop it (and all it started) on exit.

    ``settings`` are SANDBOXD_* variables for it; with ``inherit`` false, the
    caller's own SANDBOXD_* variables are not passed on (bench and tests want a
    node of known configuration), with it true they are (``sandboxd demo``).
    ``cgroup``: ``cgroup.procs`` files the node joins before it starts (a test's pod).
    """
    node = NodeProcess(settings, inherit, cgroup=cgroup)
    try:
        node.wait_ready(timeout_s)
        yield node.url
    finally:
        node.stop()


class LocalRedis:
    """A real ``redis-server`` on a free loopback port, no persistence; ``kill`` and ``start`` again on the
    same port (what a Redis restart without persistence looks like to the nodes: an empty store)."""

    def __init__(self, workdir: str) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 20.0) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise NodeDidNotStart("redis-server is not installed (scripts/setup.sh installs it)")
        args = ["--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"]
        args += ["--dir", self.workdir, "--protected-mode", "yes", "--loglevel", "warning"]
        self.proc = subprocess.Popen([exe, *args], stdout=subprocess.DEVNULL, preexec_fn=_die_with(os.getpid()))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        self.kill()
        raise NodeDidNotStart(f"redis-server did not answer on port {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @classmethod
    @contextlib.contextmanager
    def running(cls) -> Iterator[LocalRedis]:
        with tempfile.TemporaryDirectory() as workdir:
            server = cls(workdir)
            server.start()
            try:
                yield server
            finally:
                server.kill()
