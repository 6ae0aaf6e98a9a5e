"""Per-execution seccomp filter, installed by the child just before user code runs.

Why a second filter on top of the jail's: the jail's own policy must still allow
what the fork-server needs to build each child's namespaces (``unshare``,
``mount``); once a child is set up, user code needs none of that, so this filter
takes it away. Stdlib only: this module is imported inside the jail, where
nothing but the standard library is mounted.

The filter is a deny-list returning EPERM (programs get a clean ``OSError``, not
a mysterious kill), with two special cases: ``clone`` is refused only when it asks
for new namespaces (plain ``fork``/threads keep working), and ``clone3`` answers
ENOSYS so that libc falls back to ``clone``, whose flags a filter can inspect.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2

_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

_OFF_NR = 0
_OFF_ARCH = 4
_OFF_ARG0_LO = 16  # little-endian low word of args[0]

# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
CLONE_NAMESPACE_FLAGS = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080
)

# AF_VSOCK (40) talks to the hypervisor and other VMs whatever the network namespace;
# AF_KEY (15) and AF_ALG (38) are kernel attack surface no program of ours needs.
DENIED_FAMILIES = (40, 15, 38)

DENIED = [
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "open_by_handle_at",
    "name_to_handle_at",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "adjtimex",
    "syslog",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "personality",
    "vhangup",
    "lookup_dcookie",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # A sandbox's CPUs are the node's to place: pinned to fewer CPUs than its quota, a program's threads wait
    # behind each other while its group is under its quota, and those waits would read as a neighbour's
    # starvation (starvation.py); getting the affinity stays allowed.
    "sched_setaffinity",
    # Kernel objects counted per user and charged up the user namespaces to the one that made the jails (the
    # host's root): one sandbox holding its 128 inotify instances or its message-queue bytes left none for the
    # node's other sandboxes, nor for root on the host (a red team's). No program here needs them.
    "inotify_init",
    "inotify_init1",
    "mq_open",
]

# (audit arch, syscall table); numbers from the kernel's uapi headers, checked against libseccomp's resolver for
# both architectures (tests/test_units.py). Every number a filter or a raw syscall() here uses is in these.
_X86_64 = (
    0xC000003E,
    {
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "chroot": 161,
        "unshare": 272,
        "setns": 308,
        "ptrace": 101,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "bpf": 321,
        "perf_event_open": 298,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "userfaultfd": 323,
        "swapon": 167,
        "swapoff": 168,
        "reboot": 169,
        "acct": 163,
        "quotactl": 179,
        "open_by_handle_at": 304,
        "name_to_handle_at": 303,
        "iopl": 172,
        "ioperm": 173,
        "settimeofday": 164,
        "clock_settime": 227,
        "adjtimex": 159,
        "syslog": 103,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "personality": 135,
        "vhangup": 153,
        "lookup_dcookie": 212,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "inotify_init": 253,
        "inotify_init1": 294,
        "mq_open": 240,
        "sched_setaffinity": 203,
        "clone": 56,
        "clone3": 435,
        "socket": 41,
        "socketpair": 53,
        # the members' filter (build_member_filter), and capset (drop_capabilities)
        "shmget": 29,
        "shmat": 30,
        "shmctl": 31,
        "semget": 64,
        "semop": 65,
        "semctl": 66,
        "msgget": 68,
        "msgsnd": 69,
        "msgrcv": 70,
        "msgctl": 71,
        "semtimedop": 220,
        "prlimit64": 302,
        "getpriority": 140,
        "setpriority": 141,
        "sched_getaffinity": 204,
        "sched_setparam": 142,
        "sched_getparam": 143,
        "sched_setscheduler": 144,
        "sched_getscheduler": 145,
        "sched_rr_get_interval": 148,
        "sched_setattr": 314,
        "sched_getattr": 315,
        "ioprio_set": 251,
        "ioprio_get": 252,
        "migrate_pages": 256,
        "move_pages": 279,
        "kcmp": 312,
        "pidfd_getfd": 438,
        "process_madvise": 440,
        "capset": 126,
        "getpid": 39,
    },
)
_AARCH64 = (
    0xC00000B7,
    {
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "chroot": 51,
        "unshare": 97,
        "setns": 268,
        "ptrace": 117,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "bpf": 280,
        "perf_event_open": 241,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "userfaultfd": 282,
        "swapon": 224,
        "swapoff": 225,
        "reboot": 142,
        "acct": 89,
        "quotactl": 60,
        "open_by_handle_at": 265,
        "name_to_handle_at": 264,
        "settimeofday": 170,
        "clock_settime": 112,
        "adjtimex": 171,
        "syslog": 116,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "mount_setattr": 442,
        "personality": 92,
        "vhangup": 58,
        "lookup_dcookie": 18,
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "inotify_init1": 26,
        "mq_open": 180,
        "sched_setaffinity": 122,
        "clone": 220,
        "clone3": 435,
        "socket": 198,
        "socketpair": 199,
        "shmget": 194,
        "shmat": 196,
        "shmctl": 195,
        "semget": 190,
        "semop": 193,
        "semctl": 191,
        "msgget": 186,
        "msgsnd": 189,
        "msgrcv": 188,
        "msgctl": 187,
        "semtimedop": 192,
        "prlimit64": 261,
        "getpriority": 141,
        "setpriority": 140,
        "sched_getaffinity": 123,
        "sched_setparam": 118,
        "sched_getparam": 121,
        "sched_setscheduler": 119,
        "sched_getscheduler": 120,
        "sched_rr_get_interval": 127,
        "sched_setattr": 274,
        "sched_getattr": 275,
        "ioprio_set": 30,
        "ioprio_get": 31,
        "migrate_pages": 238,
        "move_pages": 239,
        "kcmp": 272,
        "pidfd_getfd": 438,
        "process_madvise": 440,
        "capset": 91,
        "getpid": 172,
    },
)
_TABLES = {"x86_64": _X86_64, "amd64": _X86_64, "aarch64": _AARCH64, "arm64": _AARCH64}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(machine: str | None = None) -> bytes:
    """Return the BPF program (raw ``sock_filter`` array) for this machine's arch."""
    arch, table = _TABLES[(machine or platform.machine()).lower()]
    eperm = _RET_ERRNO | errno.EPERM
    prog = [
        _insn(_LD_W_ABS, 0, 0, _OFF_ARCH),
        _insn(_JEQ_K, 1, 0, arch),
        _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if arch == _X86_64[0]:
        # x32 ABI numbers alias the same calls with bit 30 set: refuse them all.
        prog += [_insn(_JGE_K, 0, 1, 0x40000000), _insn(_RET_K, 0, 0, eperm)]
    for name in DENIED:
        nr = table.get(name)
        if nr is not None:
            prog += [_insn(_JEQ_K, 0, 1, nr), _insn(_RET_K, 0, 0, eperm)]
    prog += [_insn(_JEQ_K, 0, 1, table["clone3"]), _insn(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS)]
    # socket/socketpair: refuse address families that reach past the jail's network namespace.
    for call in ("socket", "socketpair"):
        prog += [_insn(_JEQ_K, 0, 2 * len(DENIED_FAMILIES) + 2, table[call]), _insn(_LD_W_ABS, 0, 0, _OFF_ARG0_LO)]
        for family in DENIED_FAMILIES:
            prog += [_insn(_JEQ_K, 0, 1, family), _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EAFNOSUPPORT)]
        prog += [_insn(_RET_K, 0, 0, _RET_ALLOW)]
    # clone: load flags (args[0]), refuse namespace flags, allow the rest.
    prog += [
        _insn(_JEQ_K, 0, 4, table["clone"]),
        _insn(_LD_W_ABS, 0, 0, _OFF_ARG0_LO),
        _insn(_JSET_K, 0, 1, CLONE_NAMESPACE_FLAGS),
        _insn(_RET_K, 0, 0, eperm),
        _insn(_RET_K, 0, 0, _RET_ALLOW),
        _insn(_RET_K, 0, 0, _RET_ALLOW),
    ]
    return b"".join(prog)


# A forked session's members share their namespaces (docs/isolation.md, "Forked python sessions"); Landlock
# scopes their files, signals, abstract sockets and TCP. What it leaves open between them is closed here:
# inet sockets (UDP between members), SysV IPC (one IPC namespace), and calls that act on another process
# by pid, or on every process of the user or group (priority, affinity, scheduling, rlimits, I/O priority).
MEMBER_FAMILIES = (2, 10, 17)  # AF_INET, AF_INET6, AF_PACKET
NETLINK, NETLINK_ROUTE = 16, 0
_MEMBER_IPC = (
    "shmget",
    "shmat",
    "shmctl",
    "semget",
    "semop",
    "semctl",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "semtimedop",
)
# call -> the (argument, value) pairs it must have: only this process, never another pid, group or user.
_MEMBER_SELF_ONLY = {
    "prlimit64": ((0, 0),),  # prlimit64(pid)
    "getpriority": ((0, 0), (1, 0)),  # getpriority(PRIO_PROCESS, 0)
    "setpriority": ((0, 0), (1, 0)),
    "sched_setaffinity": ((0, 0),),
    "sched_getaffinity": ((0, 0),),
    "sched_setparam": ((0, 0),),
    "sched_getparam": ((0, 0),),
    "sched_setscheduler": ((0, 0),),
    "sched_getscheduler": ((0, 0),),
    "sched_rr_get_interval": ((0, 0),),
    "sched_setattr": ((0, 0),),
    "sched_getattr": ((0, 0),),
    "ioprio_set": ((0, 1), (1, 0)),  # ioprio_set(IOPRIO_WHO_PROCESS, 0)
    "ioprio_get": ((0, 1), (1, 0)),
    "migrate_pages": ((0, 0),),
    "move_pages": ((0, 0),),
    "kcmp": ((0, 0),),  # never across processes
    "pidfd_getfd": ((0, -1),),  # never
    "process_madvise": ((0, -1),),  # never
}


def build_member_filter(machine: str | None = None) -> bytes:
    """The filter a forked session's member adds to its source's: see ``_MEMBER_SELF_ONLY``."""
    arch, table = _TABLES[(machine or platform.machine()).lower()]
    eperm = _RET_ERRNO | errno.EPERM
    prog = [
        _insn(_LD_W_ABS, 0, 0, _OFF_ARCH),
        _insn(_JEQ_K, 1, 0, arch),
        _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    for call in _MEMBER_IPC:
        prog += [_insn(_JEQ_K, 0, 1, table[call]), _insn(_RET_K, 0, 0, eperm)]
    # socket(): refuse MEMBER_FAMILIES; netlink only for NETLINK_ROUTE (the others let user processes
    # message each other by port id, or list the namespace's sockets).
    prog += [
        _insn(_JEQ_K, 0, 2 * len(MEMBER_FAMILIES) + 6, table["socket"]),
        _insn(_LD_W_ABS, 0, 0, _OFF_ARG0_LO),
    ]
    for family in MEMBER_FAMILIES:
        prog += [_insn(_JEQ_K, 0, 1, family), _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EACCES)]
    prog += [
        _insn(_JEQ_K, 0, 3, NETLINK),
        _insn(_LD_W_ABS, 0, 0, _OFF_ARG0_LO + 16),  # protocol
        _insn(_JEQ_K, 1, 0, NETLINK_ROUTE),
        _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EACCES),
        _insn(_RET_K, 0, 0, _RET_ALLOW),
    ]
    for call, conds in _MEMBER_SELF_ONLY.items():
        body: list[bytes] = []
        for i, (arg, value) in enumerate(conds):
            left = len(conds) - i - 1  # conditions after this one, two instructions each
            body += [
                _insn(_LD_W_ABS, 0, 0, _OFF_ARG0_LO + 8 * arg),
                _insn(_JEQ_K, 0, 2 * left + 1, value & 0xFFFFFFFF),
            ]
        body += [_insn(_RET_K, 0, 0, _RET_ALLOW), _insn(_RET_K, 0, 0, eperm)]
        prog += [_insn(_JEQ_K, 0, len(body), table[call]), *body]
    prog += [_insn(_RET_K, 0, 0, _RET_ALLOW)]
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_libc = ctypes.CDLL(None, use_errno=True)
_CapHeader = ctypes.c_uint32 * 2
_CapData = ctypes.c_uint32 * 6
_CAPSET = _TABLES[platform.machine().lower()][1]["capset"]
_PR_GET_NO_NEW_PRIVS = 39
# Programs installed before (``prepare``): their buffers, built in the zygote, shared by every executor it
# forks. An executor that builds them itself writes fresh objects into pages copied for it, and its first
# call of each ctypes function (made here in the zygote by ``prepare``) costs it ~70 page faults: ~5 us each
# on a VM that hands freed memory back to its host, where a program's executor is ~500 faults in all.
_PREPARED: dict[bytes, tuple[ctypes.Array[ctypes.c_char], _SockFprog]] = {}


def syscall_number(name: str, machine: str | None = None) -> int:
    """A system call's number on this machine (for a raw ``syscall()``), from the checked tables."""
    return _TABLES[(machine or platform.machine()).lower()][1][name]


def prepare(program: bytes) -> None:
    """In the zygote, before any executor exists: ``program``'s buffers built once, and the calls ``install``
    and ``drop_capabilities`` make looked up and made once (harmless reads), so executors inherit them warm."""
    if program not in _PREPARED:
        buf = ctypes.create_string_buffer(program, len(program))
        _PREPARED[program] = (buf, _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p)))
    _libc.prctl(_PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
    _libc.syscall(_TABLES[platform.machine().lower()][1]["getpid"])
    _CapHeader(0, 0)
    _CapData(0, 0, 0, 0, 0, 0)


def install(program: bytes) -> None:
    """Install ``program`` for this process and its descendants (irreversible)."""
    prepared = _PREPARED.get(program)
    if prepared is None:
        buf = ctypes.create_string_buffer(program, len(program))
        prepared = (buf, _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p)))
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prepared[1]), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def drop_capabilities(keep: int = 0) -> None:
    """Clear every capability set but the ``keep`` mask's bits in effective and permitted (a container's
    root keeps a few, ``rootfs.ROOT_CAPS``): the jail's user namespace gave this process all of them."""
    header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    low, high = keep & 0xFFFFFFFF, keep >> 32
    data = _CapData(low, low, 0, high, high, 0)  # effective, permitted, inheritable; twice
    if _libc.syscall(_CAPSET, header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")
