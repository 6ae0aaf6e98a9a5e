"""A jail's nsjail configuration: what it mounts (an empty root, the system and interpreter read-only, the
built environments, the jail's own side), its environment, rlimits, namespaces and seccomp filter, and the
interpreter its zygote runs on."""

from __future__ import annotations

import ast
import functools
import json
import logging
import subprocess
from pathlib import Path

from nsjail.config import Exe, IdMap, MountPt, NsJailConfig
from nsjail.enums import LogLevel, Mode, RLimitType

from sandboxd.constants import SESSION_HOME
from sandboxd.errors import SandboxSetupError
from sandboxd.runners import jailconf
from sandboxd.runners.jail.config import JailConfig
from sandboxd.runners.python import environments
from sandboxd.runners.python.environments import Environment

log = logging.getLogger(__name__)

JAILSIDE_DIR = Path(__file__).parent / "jailside"
JAILSIDE_MOUNT = "/opt/sandboxd/jailside"
ENVS_MOUNT = "/opt/sandboxd/envs"
FORK_ROOT = "/forks"  # jailside/forking.py: where a forked session's copies keep their files
THREAD_POOL_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def kafel_policy() -> str:
    """The jail's own filter; the per-execution one (jailside/seccomp.py) adds mount, unshare and
    namespace flags on clone on top."""
    return jailconf.kafel_policy("sandboxd_jail")


def nsjail_binary(cfg: JailConfig) -> str:
    return jailconf.nsjail_binary(cfg.nsjail_path)


def python_executable(prefix: str) -> str:
    import sys

    name = f"python{sys.version_info.major}.{sys.version_info.minor}"
    exe = Path(prefix) / "bin" / name
    if not exe.exists():
        raise SandboxSetupError(f"no {name} under python prefix {prefix}")
    return str(exe)


def env_path(env: Environment) -> str:
    """Where ``env``'s package tree is in every jail. Under ``/usr`` (the default directory) it is there
    already, read-only, at its own path: no mount of its own, which every execution's mount namespace
    would copy (one bind mount more cost B1 ~1.5% of its one-shots/s, measured side by side). Elsewhere
    it is bound at a fixed path (never under /tmp, which each execution gets afresh)."""
    if env.site.startswith("/usr/"):
        return env.site
    return f"{ENVS_MOUNT}/{env.name}/site"


def jail_environments(cfg: JailConfig) -> list[tuple[str, Environment]]:
    """The environments a jail serves, in the order the zygote numbers them (``action.env`` -> index)."""
    root = cfg.environments_root()
    return list(environments.served(root).items()) if root else []  # by name, as ``served`` keeps them


JAIL_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}


@functools.cache
def startup_modules(prefix: str) -> tuple[str, ...]:
    """The modules ``python main.py`` of the jail's interpreter holds when ``main.py`` starts (asked once per
    process): the zygote has them too, and a step's own file named like one loses, as there."""
    exe = python_executable(prefix)
    probe = "import sys; print(repr(sorted(sys.modules)))"  # importing json here would count json, re, ..."
    env = {**JAIL_ENV, "LD_LIBRARY_PATH": f"{prefix}/lib"}
    try:
        out = subprocess.run([exe, "-s", "-c", probe], env=env, cwd="/", capture_output=True, timeout=30, check=True)
        names = ast.literal_eval(out.stdout.decode())
    except (OSError, subprocess.SubprocessError, ValueError, SyntaxError) as exc:
        raise SandboxSetupError(f"cannot ask {exe} which modules it starts with: {exc!r}") from exc
    return tuple(str(n) for n in names if n != "__main__")


def build_config(cfg: JailConfig, mode: str = "oneshot", hostname: str = "sandbox") -> NsJailConfig:
    """The jail: empty tmpfs root, read-only system and interpreter, nothing of /run, /var, /home (sessions:
    only ``SESSION_HOME``, their own /tmp bound again); the built environments read-only at their own path."""
    prefix = cfg.resolved_prefix()
    mounts = [
        *jailconf.base_mounts("size=1m", "size=1m"),
        MountPt(src=prefix, dst=prefix, is_bind=True),
        MountPt(src=str(JAILSIDE_DIR), dst=JAILSIDE_MOUNT, is_bind=True),
    ]
    if mode == "session":  # where each session sees its /tmp again (the executor binds it): E2B's home
        mounts.append(MountPt(dst=SESSION_HOME, fstype="tmpfs", rw=False, is_dir=True, options="size=4k,mode=0755"))
        # ... and where each session mounts a tmpfs for the copies a fork makes of it
        mounts.append(MountPt(dst=FORK_ROOT, fstype="tmpfs", rw=False, is_dir=True, options="size=4k,mode=0755"))
    envs = jail_environments(cfg)
    mounts += [MountPt(src=env.site, dst=env_path(env), is_bind=True) for _, env in envs if env_path(env) != env.site]
    served = [[env_path(env), cfg.preloads(name)] for name, env in envs]
    mounts += [MountPt(src=path, dst=path, is_bind=True) for path in cfg.ro_mounts]
    return NsJailConfig(
        name="sandboxd",
        mode=Mode.ONCE,
        hostname=hostname,
        cwd="/tmp",
        time_limit=0,
        nice_level=0,
        log_level=LogLevel.WARNING,
        # LD_LIBRARY_PATH: a copied pyenv build still has its RPATH pointing at the original tree.
        envar=[
            *(f"{k}={v}" for k, v in JAIL_ENV.items() if k != "PATH"),
            f"PATH={prefix}/bin:{JAIL_ENV['PATH']}",  # python and python3 are the jail's interpreter
            f"LD_LIBRARY_PATH={prefix}/lib",
            # Native libraries' thread pools: one thread each, so a template forks safely (a fork copies
            # one thread; a pool's others would be gone in every child) and a step uses its one core.
            *(f"{var}=1" for var in THREAD_POOL_VARS),
            "MPLBACKEND=Agg",
            "MPLCONFIGDIR=/tmp/.matplotlib",
        ],
        uidmap=[IdMap(inside_id=str(jailconf.JAIL_UID), outside_id=str(jailconf.JAIL_UID))],
        gidmap=[IdMap(inside_id=str(jailconf.JAIL_UID), outside_id=str(jailconf.JAIL_UID))],
        rlimit_as_type=RLimitType.INF,
        rlimit_cpu_type=RLimitType.INF,
        rlimit_fsize=cfg.fsize_mb,
        rlimit_nofile=max(cfg.nofile, 64),
        rlimit_nproc_type=RLimitType.SOFT,  # raising it is refused in the user namespace; cgroup pids caps it
        rlimit_core=0,
        # The zygote keeps the jail's capabilities (inside the jail's user
        # namespace only) to build each executor's mount/pid namespaces; every
        # executor drops them all before it reads its request.
        keep_caps=True,
        clone_newnet=True,
        clone_newcgroup=True,
        mount=mounts,
        seccomp_string=[kafel_policy()],
        exec_bin=Exe(
            path=python_executable(prefix),
            arg=[
                *("-I", "-S", "-B", f"{JAILSIDE_MOUNT}/zygote.py", mode, str(cfg.tmpfs_mb << 20)),
                *(json.dumps(served), json.dumps(startup_modules(prefix))),
            ],
        ),
    )
