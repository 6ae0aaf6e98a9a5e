"""Forking python sessions against a real node (nsjail, Landlock, cgroups): state, isolation, lifetimes.

Each copy must pass what any session passes between sessions, here between members of one fork that
share their namespaces: a sibling's files, signals, sockets, /proc, IPC, and limits that kill only the
member that passed them. The source goes on in its continuation; closing it leaves the copies running;
the last member out ends the namespaces' holder.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandboxd.runners.jail.jailside import landlock
from sandboxd.runners.jail.nsjail import FORK_ROOT
from sandboxd.runners.python import fork
from tests.conftest import running_node

pytestmark = [
    pytest.mark.node,
    pytest.mark.vm,
    pytest.mark.skipif(landlock.abi() < landlock.MIN_ABI, reason="python fork needs Landlock ABI 6 (Linux 6.12)"),
]


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    with running_node(runners='["python"]', workers=1, python__slots_per_worker=2, fork_max_copies=16) as base:
        yield base


@pytest.fixture
async def http(node: str) -> Any:
    async with httpx.AsyncClient(base_url=node, timeout=60) as c:
        yield c


async def cell(http: httpx.AsyncClient, sid: str, code: str, **fields: object) -> dict[str, Any]:
    r = await http.post(
        "/rollout/step", json={"runner": "python", "session_id": sid, "action": {"code": code}, **fields}
    )
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def out(http: httpx.AsyncClient, sid: str, code: str) -> str:
    r = await cell(http, sid, code)
    assert r["observation"]["exit_code"] == 0, r
    text: str = r["observation"]["stdout"]
    return text


async def forked(http: httpx.AsyncClient, setup: str, n: int) -> tuple[str, list[str], dict[str, Any]]:
    src = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    await out(http, src, setup)
    r = await http.post(f"/sessions/{src}/fork", json={"n": n})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return src, [s["session_id"] for s in body["sessions"]], body


async def close(http: httpx.AsyncClient, *ids: str) -> None:
    for sid in ids:
        await http.delete(f"/sessions/{sid}")


def holders() -> list[int]:
    """Host processes running a fork's holder."""
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if b"holder.py" in (p / "cmdline").read_bytes():
                    found.append(int(p.name))
            except OSError:
                pass
    return found


SETUP = (
    "import random, os\n"
    "data = {i: str(i) * 3 for i in range(100_000)}\n"
    "open('notes.txt', 'w').write('prepared')\n"
    "os.makedirs('sub/deeper', exist_ok=True)\n"
    "open('sub/deeper/x.bin', 'wb').write(bytes(range(256)) * 64)\n"
    "log = open('log.txt', 'a')\n"
    "log.write('before;')\n"
    "log.flush()\n"
    "rng_state = random.getstate()\n"
)


async def test_copies_start_from_the_state_and_go_apart(http: httpx.AsyncClient) -> None:
    before = len(holders())
    src, copies, body = await forked(http, SETUP, 3)
    assert len(copies) == 3 and src not in copies
    assert any("Landlock" in n for n in body["notes"]) and any("cannot be forked again" in n for n in body["notes"])
    seen = {}
    for sid in [src, *copies]:
        seen[sid] = json.loads(
            await out(
                http,
                sid,
                "import json, hashlib\n"
                "print(json.dumps([len(data), data[99_999], open('notes.txt').read(), os.getcwd(),"
                " hashlib.sha256(open('sub/deeper/x.bin', 'rb').read()).hexdigest()[:12],"
                " random.getstate() == rng_state, os.environ['TMPDIR']]))",
            )
        )
    digest = seen[src][4]
    for sid, (size, last, notes, cwd, sha, same_rng, tmpdir) in seen.items():
        assert (size, last, notes, sha) == (100_000, "99999" * 1 * 3, "prepared", digest), sid
        if sid == src:  # the source goes on where it was, its generators untouched
            assert cwd == "/tmp" and same_rng
        else:  # a copy: its own directory, TMPDIR there, generators reseeded
            assert cwd.startswith(FORK_ROOT + "/") and tmpdir == cwd and not same_rng, (cwd, tmpdir)
    assert len({v[3] for v in seen.values()}) == 4
    # Writes stay where they were made: globals, files, and the file each had open before the fork.
    for i, sid in enumerate([src, *copies]):
        await out(
            http, sid, f"data[0] = 'member {i}'\nopen('notes.txt', 'w').write('{i}')\nlog.write('{i};')\nlog.flush()"
        )
    for i, sid in enumerate([src, *copies]):
        got = await out(http, sid, "print(data[0], open('notes.txt').read(), open('log.txt').read())")
        assert got == f"member {i} {i} before;{i};\n", (i, got)
    # Closing the source leaves the copies running; the last one out ends the holder.
    await close(http, src)
    assert await out(http, copies[0], "print(data[0])") == "member 1\n"
    assert len(holders()) == before + 1
    await close(http, *copies)
    for _ in range(50):
        if len(holders()) == before:
            break
        await asyncio.sleep(0.1)
    assert len(holders()) == before


ISOLATION = r"""
import os, socket, signal, ctypes, resource
res = {}
def attempt(name, f):
    try:
        f()
        res[name] = 'ALLOWED'
    except OSError as e:
        res[name] = e.errno
sib_pid, sib_dir = SIB_PID, SIB_DIR
attempt('read sibling file', lambda: open(sib_dir + '/notes.txt').read())
attempt('write sibling dir', lambda: open(sib_dir + '/planted', 'w'))
attempt('list copies', lambda: os.listdir('/forks'))
attempt('read source tmp', lambda: open('/tmp/notes.txt').read())
attempt('read source home', lambda: open('/home/user/notes.txt').read())
attempt('sibling cwd link', lambda: os.listdir(f'/proc/{sib_pid}/cwd'))
attempt('sibling environ', lambda: open(f'/proc/{sib_pid}/environ').read())
attempt('sibling mem maps', lambda: open(f'/proc/{sib_pid}/maps').read())
attempt('signal sibling', lambda: os.kill(sib_pid, 0))
attempt('signal holder', lambda: os.kill(1, signal.SIGKILL))
attempt('pidfd signal', lambda: signal.pidfd_send_signal(os.pidfd_open(sib_pid), signal.SIGKILL))
attempt('prlimit sibling', lambda: resource.prlimit(sib_pid, resource.RLIMIT_NOFILE, (1, 1)))
attempt('priority of the user', lambda: os.setpriority(os.PRIO_USER, 0, 19))
attempt('tcp', lambda: socket.create_connection(('127.0.0.1', 1), timeout=1))
attempt('udp', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
attempt('udp6', lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
def abstract():
    s = socket.socket(socket.AF_UNIX)
    s.connect(b'\0fork-test-' + str(sib_pid).encode())
attempt('sibling abstract socket', abstract)
def named():
    s = socket.socket(socket.AF_UNIX)
    s.bind('mine.sock')
attempt('named socket', named)
libc = ctypes.CDLL(None, use_errno=True)
def shm():
    if libc.shmget(0, 4096, 0o1600) < 0:
        raise OSError(ctypes.get_errno(), 'shmget')
attempt('sysv shm', shm)
attempt('dev shm', lambda: open('/dev/shm/x', 'w'))
attempt('own files', lambda: open('mine.txt', 'w').write('ok'))
attempt('kill -1', lambda: os.kill(-1, signal.SIGKILL))
print(res)
"""


async def test_each_copy_is_confined_from_its_siblings_and_the_source(http: httpx.AsyncClient) -> None:
    src, copies, _ = await forked(http, "import os\nopen('notes.txt', 'w').write('x')", 2)
    a, b = copies
    # b listens on an abstract socket; a tries to reach it, b's files, b itself, and the source.
    b_pid, b_dir = json.loads(
        await out(
            http,
            b,
            "import socket, json\n"
            "srv = socket.socket(socket.AF_UNIX)\n"
            "srv.bind(b'\\0fork-test-' + str(os.getpid()).encode())\n"
            "srv.listen()\n"
            "print(json.dumps([os.getpid(), os.getcwd()]))",
        )
    )
    r = await cell(http, a, ISOLATION.replace("SIB_PID", str(b_pid)).replace("SIB_DIR", repr(b_dir)))
    res = eval(r["observation"]["stdout"])  # a dict of names to "ALLOWED" or an errno
    assert res.pop("own files") == "ALLOWED" and res.pop("kill -1") == "ALLOWED", res  # its own, nobody else's
    assert all(v != "ALLOWED" for v in res.values()), res
    # b and the source are untouched: alive, their files and listener there.
    assert await out(http, b, "print(srv.fileno() > 0, sorted(os.listdir('.')))") == "True ['notes.txt']\n"
    assert await out(http, src, "print(sorted(os.listdir('.')))") == "['notes.txt']\n"
    # The source is confined the same way after its fork: no copy's files, no copy's signals.
    r = await cell(http, src, ISOLATION.replace("SIB_PID", str(b_pid)).replace("SIB_DIR", repr(b_dir)))
    res = eval(r["observation"]["stdout"])
    res.pop("own files"), res.pop("kill -1"), res.pop("read source tmp"), res.pop("read source home")
    assert all(v != "ALLOWED" for v in res.values()), res
    assert await out(http, b, "print('alive')") == "alive\n"
    await close(http, src, *copies)


async def test_a_copy_past_its_limits_ends_alone(http: httpx.AsyncClient) -> None:
    src, copies, _ = await forked(http, "kept = 'yes'", 3)
    hog, bomb, calm = copies
    r = await cell(http, hog, "b = []\nwhile True:\n    b.append(bytearray(32 << 20))", limits={"memory_mb": 64})
    assert r["observation"]["killed_by"] == "memory" and r["observation"]["session_alive"] is False, r
    assert r["error"]["blame"] == "program", r
    r = await cell(http, bomb, "import os\nwhile True:\n    os.fork()", timeout_s=3)
    assert r["error"] is None or r["error"]["blame"] == "program", r
    r = await cell(http, calm, "import time\nwhile True:\n    time.sleep(0.01)", timeout_s=1)
    assert r["observation"]["timed_out"] and r["observation"]["session_alive"] is True, r  # interrupted, kept
    r = await cell(http, calm, "import os\nos._exit(3)")
    assert r["observation"]["exit_code"] == 3 and r["observation"]["session_alive"] is False, r  # the holder's word
    assert await out(http, src, "print(kept)") == "yes\n"
    for sid in (hog, calm):
        assert (
            await http.post("/rollout/step", json={"runner": "python", "session_id": sid, "action": {"code": "1"}})
        ).status_code == 404
    await close(http, src, *copies)


async def test_grading_a_copy_reads_its_own_files(http: httpx.AsyncClient) -> None:
    src, copies, _ = await forked(http, "open('answer.txt', 'w').write('41')", 2)
    await out(http, copies[0], "open('answer.txt', 'w').write('42')")
    r = await http.post(
        "/rollout/step",
        json={
            "runner": "python",
            "session_id": copies[0],
            "action": {"code": "print(open('answer.txt').read())", "grade": True},
        },
    )
    assert r.status_code == 200 and r.json()["observation"]["stdout"] == "42\n", r.text
    await close(http, src, *copies)


async def test_what_cannot_be_forked_says_why(http: httpx.AsyncClient) -> None:
    src, copies, _ = await forked(http, "x = 1", 1)
    for sid in (src, copies[0]):
        r = await http.post(f"/sessions/{sid}/fork", json={"n": 1})
        assert r.status_code == 422 and "forks once" in r.json()["error"]["message"], r.text
    await close(http, src, *copies)
    threaded = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    await out(
        http,
        threaded,
        "import threading, time\nt = threading.Thread(target=time.sleep, args=(30,), daemon=True)\nt.start()",
    )
    r = await http.post(f"/sessions/{threaded}/fork", json={"n": 2})
    assert r.status_code == 422 and "threads" in r.json()["error"]["message"], r.text
    assert await out(http, threaded, "print(t.is_alive())") == "True\n"  # refused: the session is as it was
    keeper = (await http.post("/sessions", json={"runner": "python", "options": {"keep_processes": True}})).json()[
        "session_id"
    ]
    r = await http.post(f"/sessions/{keeper}/fork", json={"n": 1})
    assert r.status_code == 422 and "keep_processes" in r.json()["error"]["message"], r.text
    await close(http, threaded, keeper)


def test_an_old_kernel_is_refused_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(landlock, "abi", lambda: 5)
    why = fork.host_refusal()
    assert why is not None and "Landlock ABI is 5" in why and "6.12" in why


async def test_a_grpo_group_from_the_client(node: str) -> None:
    from sandboxd.client import SandboxClient

    before = len(holders())
    async with SandboxClient(node, timeout_s=60) as c:
        setup = [{"code": "import random\nprompt = 'two plus two'\nseen = []"}]
        async with await c.group("python", 4, setup=setup) as g:
            results = await g.step([{"code": f"seen.append({i})\nprint(prompt, seen)"} for i in range(4)])
            assert [r["observation"]["stdout"] for r in results] == [f"two plus two [{i}]\n" for i in range(4)]
    for _ in range(50):
        if len(holders()) == before:
            break
        await asyncio.sleep(0.1)
    assert len(holders()) == before  # the prepared session closed after the fork, the copies with the group


async def fork_status(http: httpx.AsyncClient, sid: str, n: int = 2) -> httpx.Response:
    return await http.post(f"/sessions/{sid}/fork", json={"n": n})


async def test_what_the_red_team_shared_between_copies_is_not_shared(http: httpx.AsyncClient) -> None:
    """Found by the red team: a shared mapping made before the fork was one memory for every member; the
    source kept a /dev/shm file (readable by copies) and a /forks directory (listing the copies) open;
    netlink user sockets reached a sibling by pid; a copy's files outlived it, charged to nobody."""
    setup = (
        "import mmap, os, socket\n"
        "shared = mmap.mmap(-1, 4096)\n"
        "shared[:5] = b'start'\n"
        "shm = open('/dev/shm/chan', 'w+')\n"
        "forks = os.open('/forks', os.O_RDONLY)\n"
    )
    src, (a, b), _ = await forked(http, setup, 2)
    await out(http, src, "shm.write('from the source'); shm.flush(); shared[:5] = b'SRC!!'")
    await out(http, a, "shared[:5] = b'AAAAA'")
    got = [await out(http, sid, "print(bytes(shared[:5]))") for sid in (src, a, b)]
    assert got == ["b'SRC!!'\n", "b'AAAAA'\n", "b'start'\n"], got
    probe = (
        "def attempt(f):\n"
        "    try:\n"
        "        return repr(f())\n"
        "    except OSError as e:\n"
        "        return e.errno\n"
        "print(attempt(lambda: open('/dev/shm/chan').read()), attempt(lambda: os.listdir(forks)),"
        " attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2)))"
    )
    for sid in (src, a):
        fields = (await out(http, sid, probe)).split()
        assert fields[0] != "'from the source'" and not fields[1].startswith("["), (sid, fields)
    assert (await out(http, a, probe)).split()[2] == "13"  # NETLINK_USERSOCK: refused in copies
    # A closed copy's files go with it.
    await out(http, b, "open('big', 'wb').write(b'x' * (32 << 20))")
    holder = max(holders())
    assert len(os.listdir(f"/proc/{holder}/root/forks")) == 2
    await close(http, b)
    assert len(os.listdir(f"/proc/{holder}/root/forks")) == 1
    await close(http, src, a)


async def test_a_fork_the_sessions_own_code_subverts_is_refused_and_blamed_on_it(http: httpx.AsyncClient) -> None:
    """Found by the red team: a thread started by an at-fork hook kept every right (Landlock confines the
    calling thread); a harness patched through gc confined nothing; a bound unix socket stayed reachable by
    its path. Each is refused and blamed on the client; a hook that holds the fork closes the session."""
    hooked = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    await out(
        http,
        hooked,
        "import os, threading, time\n"
        "os.register_at_fork(after_in_child=lambda: threading.Thread(target=time.sleep, args=(60,)).start())",
    )
    r = await fork_status(http, hooked)
    assert r.status_code == 422 and "threads" in r.json()["error"]["message"], r.text
    patched = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    await out(
        http,
        patched,
        "import gc, types\n"
        "gc.unfreeze()\n"  # the zygote froze what it shares (gc.freeze): back in the collector's sight
        "for m in gc.get_objects():\n"
        "    if isinstance(m, types.ModuleType) and m.__name__ == 'seccomp':\n"
        "        m.install = lambda *a, **k: None",
    )
    r = await fork_status(http, patched)
    assert r.status_code == 422 and "did not confine itself" in r.json()["error"]["message"], r.text
    assert r.json()["error"]["blame"] == "client"
    # Its own continuation did not confine itself either: the session ended with it, said on its next step.
    r = await http.post("/rollout/step", json={"runner": "python", "session_id": patched, "action": {"code": "1"}})
    assert r.status_code == 404 and "ended by its fork" in r.json()["error"]["message"], r.text
    bound = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    await out(http, bound, "import socket\nsrv = socket.socket(socket.AF_UNIX)\nsrv.bind('/tmp/s.sock')\nsrv.listen()")
    r = await fork_status(http, bound)
    assert r.status_code == 422 and "/tmp/s.sock" in r.json()["error"]["message"], r.text
    held = (await http.post("/sessions", json={"runner": "python"})).json()["session_id"]
    await out(http, held, "import os, time\nos.register_at_fork(before=lambda: time.sleep(30))")
    r = await fork_status(http, held)
    assert r.status_code == 422 and "did not answer its fork" in r.json()["error"]["message"], r.text
    assert (await http.get(f"/sessions/{held}")).status_code in (404, 410)
    await close(http, hooked, patched, bound, held)
