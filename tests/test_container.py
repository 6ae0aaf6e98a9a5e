"""The ``container`` kind on a real node: sandboxes whose root is an image of the node's store, built here from
this host's own programs (``tests/imagebuild.py``), imported as a user would (``ImageStore``, as ``sandboxd
image import``), driven over HTTP. One-shots and sessions with the image's Env, WorkingDir and User; two
sandboxes of one image that cannot see each other's files, processes or network; the limits and verdicts
of every jailed kind; and what a hostile command tries from inside."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandboxd.images.store import ImageStore
from tests.conftest import running_container_node, step_ok
from tests.imagebuild import base_layer, dir_layer, host_image, image_store
from tests.test_images import IDS, layer

pytestmark = pytest.mark.node

IMAGE = "agent/work:1"
SWE = "swe/calc:1"
ODD = "odd/accounts:1"
PYTHON = os.path.basename(os.path.realpath("/usr/bin/python3"))  # the system's (python3.11 here, 3.13 on trixie)
# A SWE-style task: a repository with a failing test, in an image with its interpreter and git.
REPO = layer(
    ("dir", "repo", 0o755, 1000),
    ("file", "repo/calc.py", b"def add(a, b):\n    return a - b\n", 0o644, 1000),
    (
        "file",
        "repo/test_calc.py",
        b"import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
        b"    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n",
        0o644,
        1000,
    ),
    ("sym", "usr/bin/python3", PYTHON),
)
FIX = """--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
"""
WRONG = FIX.replace("a + b", "a * b")
TOP = layer(
    ("dir", "work", 0o755, 1000),
    ("file", "work/hello.txt", b"hello from the image\n", 0o644, 1000),
    ("file", "etc/motd", b"shared by every sandbox\n"),
)


@pytest.fixture(scope="module")
def store() -> Iterator[ImageStore]:
    with image_store("sandboxd-images-") as (root, store):
        config: dict[str, Any] = {"Env": ["PATH=/usr/bin:/bin", "GREETING=hi"], "WorkingDir": "/work", "User": "agent"}
        store.import_image(host_image(root / "oci", IMAGE, [TOP], Cmd=["id"], **config))
        ctypes_module = glob.glob(f"/usr/lib/{PYTHON}/lib-dynload/_ctypes.*.so")  # for its libffi
        base = base_layer(programs=("sh", "cat", "ls", "tail", f"/usr/bin/{PYTHON}", "/usr/bin/git", *ctypes_module))
        layers = [dir_layer(f"/usr/lib/{PYTHON}"), REPO]
        swe: dict[str, Any] = {"Env": ["PATH=/usr/bin:/bin"], "WorkingDir": "/repo", "User": "agent"}
        store.import_image(host_image(root / "swe", SWE, layers, base=base, **swe))
        odd = layer(("fifo", "etc/passwd"))  # a hostile image: its accounts file would block a reader
        store.import_image(host_image(root / "odd", ODD, [odd], Env=["PATH=/usr/bin:/bin"]))
        yield store


@pytest.fixture(scope="module")
def node(store: ImageStore) -> Iterator[str]:
    with running_container_node(store.root, container__slots_per_worker=2) as base:
        yield base


async def run(http: httpx.AsyncClient, cmd: Any = None, **fields: Any) -> dict[str, Any]:
    action: dict[str, Any] = {"image": IMAGE, **fields.pop("action", {})}
    if cmd is not None:
        action["cmd"] = cmd
    return await step_ok(http, "container", action, **fields)


async def session(http: httpx.AsyncClient, **options: Any) -> str:
    r = await http.post("/sessions", json={"runner": "container", "options": {"image": IMAGE, **options}})
    assert r.status_code == 201, r.text
    sid: str = r.json()["session_id"]
    return sid


async def shell(http: httpx.AsyncClient, sid: str, cmd: str, **fields: Any) -> dict[str, Any]:
    return await step_ok(http, "container", {"cmd": cmd, **fields.pop("action", {})}, session_id=sid, **fields)


# ---------------------------------------------------------------------------------------------- one-shots


@pytest.mark.vm  # overlayfs in a user namespace, the id map, cgroup v2 limits: the guest's too
async def test_a_one_shot_runs_as_the_image_says(http: httpx.AsyncClient, store: ImageStore) -> None:
    image = store.get(IMAGE)
    out = await run(http)  # the image's Cmd, as its User, in its WorkingDir
    assert out["ok"], out
    assert out["observation"]["stdout"] == "uid=1000(agent) gid=1000(agent) groups=1000(agent),10(wheel)\n"
    assert out["observation"]["image_id"] == image.id
    out = await run(http, "echo $GREETING $HOME; pwd; cat hello.txt /etc/motd; cat")
    assert out["observation"]["stdout"] == "hi /home/agent\n/work\nhello from the image\nshared by every sandbox\n"
    out = await run(http, "cat; echo; echo $EXTRA", action={"stdin": "in", "env": {"EXTRA": "x y"}})
    assert out["observation"]["stdout"] == "in\nx y\n"
    out = await run(http, ["-c", "echo $0 $1"], action={"user": "root", "workdir": "/tmp"})  # no Entrypoint
    assert out["observation"]["exit_code"] == 127 and "cannot run -c" in out["observation"]["stderr"]
    out = await run(http, "id -u; pwd", action={"user": "0:0", "workdir": "/made/here"})
    assert out["observation"]["stdout"] == "0\n/made/here\n"


async def test_a_one_shot_writes_and_returns_files(http: httpx.AsyncClient) -> None:
    files = {"in/data.txt": "relative", "/tmp/abs.txt": "absolute"}
    out = await run(
        http,
        "cat in/data.txt /tmp/abs.txt > out.txt; ls -l in/data.txt; exit 3",
        action={"files": files, "fetch_files": ["out.txt", "/etc/motd", "missing"]},
    )
    obs = out["observation"]
    assert obs["exit_code"] == 3 and out["error"]["blame"] == "program" and out["error"]["code"] == "program_exit"
    assert " agent agent " in obs["stdout"]  # written as the image's user
    import base64

    assert base64.b64decode(obs["files"]["out.txt"]) == b"relativeabsolute"
    assert base64.b64decode(obs["files"]["/etc/motd"]) == b"shared by every sandbox\n"
    assert obs["files_missing"] == {"missing": "No such file or directory"}


async def test_bad_steps_are_the_clients_and_named(http: httpx.AsyncClient) -> None:
    async def refused(action: dict[str, Any], status: int, says: str) -> None:
        r = await http.post("/rollout/step", json={"runner": "container", "action": action})
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["blame"] == "client" and says in err["message"], err

    await refused({"cmd": "true"}, 422, "a one-shot names its image")
    await refused({"image": "nowhere:1", "cmd": "true"}, 404, "no image 'nowhere:1'")
    await refused({"image": IMAGE, "user": "nosuch"}, 422, "user 'nosuch' is not in the image's /etc/passwd")
    await refused({"image": IMAGE, "user": "agent:nogroup2"}, 422, "group 'nogroup2' is not in the image's /etc/group")
    await refused({"image": IMAGE, "workdir": "/etc/motd"}, 422, "is not a directory in the image")
    await refused({"image": IMAGE, "workdir": "relative"}, 422, "workdir must be an absolute path")
    await refused({"image": IMAGE, "env": {"A=B": "1"}}, 422, "is not a variable name")
    await refused({"image": IMAGE, "files": {"../up": "x"}}, 422, "must stay inside the working directory")
    r = await http.post("/sessions", json={"runner": "container", "options": {"image": "nowhere:1"}})
    assert r.status_code == 404 and r.json()["error"]["blame"] == "client", r.text
    r = await http.post("/sessions", json={"runner": "container", "options": {"image": IMAGE, "user": "ghost"}})
    assert r.status_code == 422 and "user 'ghost'" in r.json()["error"]["message"], r.text


# ---------------------------------------------------------------------------------------------- sessions


@pytest.mark.vm  # overlayfs in a user namespace, the id map, cgroup v2 limits: the guest's too
async def test_a_session_is_one_shell(http: httpx.AsyncClient) -> None:
    sid = await session(http, env={"MODE": "test"})
    out = await shell(http, sid, "echo $MODE $GREETING; export A=1; B=2; cd /tmp; echo kept > note")
    assert out["observation"]["stdout"] == "test hi\n" and out["observation"]["session_alive"]
    out = await shell(http, sid, "echo A=$A B=$B; pwd; cat note; unset GREETING; exit 4")
    assert out["observation"]["stdout"] == "A=1 B=\n/tmp\nkept\n" and out["observation"]["exit_code"] == 4
    assert out["error"]["code"] == "program_exit"
    out = await shell(http, sid, "echo ${GREETING-unset}; cat", action={"stdin": "piped"})  # exit 4: state kept
    assert out["observation"]["stdout"] == "hi\npiped"
    out = await shell(http, sid, "unset GREETING; cat staged.txt", action={"files": {"staged.txt": "in cwd"}})
    assert out["observation"]["stdout"] == "in cwd"  # /tmp: where the session is
    out = await shell(http, sid, "echo ${GREETING-unset}")
    assert out["observation"]["stdout"] == "unset\n"
    assert (await http.delete(f"/sessions/{sid}")).status_code in (200, 204)


async def test_a_session_command_past_its_time_ends_but_the_session_stays(http: httpx.AsyncClient) -> None:
    sid = await session(http)
    await shell(http, sid, "export KEPT=yes; cd /tmp")
    out = await shell(http, sid, "sleep 30 & sleep 30", timeout_s=1)
    obs = out["observation"]
    assert obs["timed_out"] and obs["session_alive"] and out["error"]["code"] == "program_timeout", out
    # The command and what it left running ended with it: the shell and this command's own processes remain
    # (asked again for a while: under load a killed process can be listed until its parent has reaped it).
    for _ in range(20):
        out = await shell(http, sid, "echo $KEPT; pwd; ls /proc | grep -c '^[0-9]' || true")
        lines = out["observation"]["stdout"].split()
        if int(lines[-1]) <= 4:
            break
        await asyncio.sleep(0.25)
    assert lines[:2] == ["yes", "/tmp"] and int(lines[-1]) <= 4, out
    out = await shell(http, sid, "sleep 60 > /dev/null 2>&1 & echo started")
    assert out["observation"]["stdout"] == "started\n"  # a background job: the command returns at once
    out = await shell(http, sid, "ls /proc | grep -c '^[0-9]'")
    assert int(out["observation"]["stdout"]) >= 3  # the harness, the job, this command


async def test_session_steps_refuse_one_shot_fields(http: httpx.AsyncClient) -> None:
    sid = await session(http)
    for action, says in (
        ({"cmd": "true", "env": {"A": "1"}}, "action.env is for one-shots"),
        ({"cmd": "true", "fetch_files": ["x"]}, "action.fetch_files is for one-shots"),
        ({"cmd": "true", "image": "other:1"}, "runs image 'agent/work:1'"),
    ):
        r = await http.post("/rollout/step", json={"runner": "container", "session_id": sid, "action": action})
        assert r.status_code == 422 and says in r.json()["error"]["message"], r.text
    assert (await shell(http, sid, "echo still"))["observation"]["stdout"] == "still\n"


async def cell(http: httpx.AsyncClient, sid: str, code: str, **fields: Any) -> dict[str, Any]:
    return await step_ok(http, "container", {"code": code, **fields.pop("action", {})}, session_id=sid, **fields)


@pytest.mark.vm  # the kernel's pipes, signals and group under cgroup v2 too
async def test_python_cells_run_in_the_images_own_interpreter_and_keep_its_globals(http: httpx.AsyncClient) -> None:
    r = await http.post("/sessions", json={"runner": "container", "options": {"image": SWE}})
    assert r.status_code == 201, r.text
    sid = r.json()["session_id"]
    out = await cell(http, sid, "import sys, os\nx = 41\nprint(sys.version_info[:2], os.getcwd(), os.getuid())",
                     timeout_s=1)  # fmt: skip
    assert out["ok"], out["observation"]["stderr"]
    assert out["observation"]["stdout"] == f"({PYTHON[6:].replace('.', ', ')}) /repo 1000\n", out
    out = await cell(http, sid, "from calc import add\nprint(x + 1, add(5, 3), input())", action={"stdin": "in\n"})
    assert out["observation"]["stdout"] == "42 2 in\n", out  # the image's module, beside the cell's cwd
    out = await cell(http, sid, "def f():\n    raise ValueError('bad')\nf()")
    obs = out["observation"]
    assert obs["exit_code"] == 1 and out["error"]["code"] == "program_exit", out
    assert "ValueError: bad" in obs["stderr"] and 'File "<cell 3>", line 2, in f' in obs["stderr"], obs["stderr"]
    assert "cellhost" not in obs["stderr"] and "serve" not in obs["stderr"], obs["stderr"]
    out = await cell(http, sid, "raise SystemExit(5)")
    assert out["observation"]["exit_code"] == 5
    out = await cell(http, sid, "while True:\n    x += 0", timeout_s=1)
    assert out["error"]["code"] == "program_timeout" and out["observation"]["session_alive"], out
    assert "KeyboardInterrupt" in out["observation"]["stderr"]
    out = await cell(http, sid, "print(x)")  # interrupted, not killed: its globals stay
    assert out["observation"]["stdout"] == "41\n", out
    # A kernel lives through many cells: its CPU in all passes the first cell's limit (1 s here) unharmed.
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6:\n    pass\nprint(x)"
    for _ in range(3):
        out = await cell(http, sid, burn, timeout_s=5)
        assert out["ok"] and out["observation"]["stdout"] == "41\n", out
    out = await cell(http, sid, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass",
                     timeout_s=1)  # fmt: skip
    assert out["error"]["code"] == "program_timeout" and out["observation"]["session_alive"], out
    out = await cell(http, sid, "print(globals().get('x', 'gone'))")  # killed at last: a new kernel
    assert out["observation"]["stdout"] == "gone\n", out
    out = await shell(http, sid, "echo shell still; pwd")  # commands and cells share the session
    assert out["observation"]["stdout"] == "shell still\n/repo\n"
    out = await cell(http, sid, "import os\nos._exit(3)")
    assert out["observation"]["exit_code"] == 3 and "kernel ended" in out["observation"]["stderr"], out
    assert (await cell(http, sid, "print('again')"))["observation"]["stdout"] == "again\n"
    assert (await http.delete(f"/sessions/{sid}")).status_code in (200, 204)
    sid = await session(http)  # an image without python: the cell says so, the session stays
    out = await cell(http, sid, "print(1)")
    assert out["observation"]["exit_code"] == 127 and "need python3" in out["observation"]["stderr"], out
    r = await http.post("/rollout/step", json={"runner": "container", "action": {"image": SWE, "code": "print(1)"}})
    assert r.status_code == 422 and "python cells run in sessions" in r.json()["error"]["message"], r.text
    r = await http.post("/rollout/step", json={"runner": "container", "session_id": sid,
                                               "action": {"code": "1", "cmd": "true"}})  # fmt: skip
    assert r.status_code == 422 and "not both" in r.text, r.text


async def test_a_cell_that_breaks_its_kernels_channel_ends_only_its_kernel(http: httpx.AsyncClient) -> None:
    """What a red team did to the kernel's status channel (fds 3 and 4) and at its limits: each is the program's,
    ends at most its kernel (the next cell starts a new one, with the right result), never the session, and
    never shifts a later cell's result (a forged status once made every later cell answer for the one before)."""
    r = await http.post("/sessions", json={"runner": "container", "options": {"image": SWE}})
    sid = r.json()["session_id"]
    forged = "import os\nos.write(4, bytes(12))\nimport time\ntime.sleep(0.5)\nraise ValueError('late')"
    out = await cell(http, sid, forged, timeout_s=10)
    obs = out["observation"]
    assert obs["exit_code"] == 137 and "status channel" in obs["stderr"] and obs["session_alive"], out
    for code, want in (("print('second')", "second\n"), ("print('third')", "third\n")):
        out = await cell(http, sid, code)
        assert out["ok"] and out["observation"]["stdout"] == want, out
    out = await cell(http, sid, "import os\nos.dup2(os.open('/dev/null', os.O_WRONLY), 4)", timeout_s=10)
    obs = out["observation"]
    assert obs["exit_code"] == 137 and not obs["timed_out"] and obs["session_alive"], out
    held = (  # a process of its own keeps the channel open; the kernel ignores the interrupt
        "import os, signal, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(20)\n    os._exit(0)\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(100)"
    )
    out = await cell(http, sid, held, timeout_s=1)
    assert out["error"]["code"] == "program_timeout" and out["observation"]["session_alive"], out
    assert (await cell(http, sid, "print('alive')"))["observation"]["stdout"] == "alive\n"
    for step in ({"code": "data = b'x' * (1 << 30)"}, {"cmd": "python3 -c \"b'x' * (1 << 30)\""}):
        out = await step_ok(http, "container", step, session_id=sid, timeout_s=20)
        assert out["error"]["code"] == "program_killed" and out["observation"]["killed_by"] == "memory", out
        assert out["error"]["blame"] == "program" and out["observation"]["session_alive"], out
    assert (await cell(http, sid, "print('after the bombs')"))["observation"]["stdout"] == "after the bombs\n"
    assert (await http.delete(f"/sessions/{sid}")).status_code in (200, 204)


def session_pids() -> list[tuple[int, int]]:
    """Processes and limit of each container session's group of the node (cgroup v1 or v2)."""
    found = []
    for current in glob.glob("/sys/fs/cgroup/**/sessions/x*/pids.current", recursive=True):
        with contextlib.suppress(OSError, ValueError):
            limit = Path(current).with_name("pids.max").read_text().strip()
            found.append((int(Path(current).read_text()), int(limit) if limit != "max" else -1))
    return found


async def test_a_session_whose_processes_fill_its_pids_limit_stays_and_says_why(http: httpx.AsyncClient) -> None:
    """A fork bomb's processes that left its command's group hold the session's pids limit: the next command
    cannot start (126, the program's, with why), the session stays (its executor once died of it), and a cell
    of its running kernel can end them."""
    r = await http.post("/sessions", json={"runner": "container", "options": {"image": SWE}})
    sid = r.json()["session_id"]
    assert (await cell(http, sid, "import os, signal"))["ok"]  # the kernel runs before the bomb
    bomb = (  # every process forks on, out of its command's group, and takes back any pid that frees
        "import os, time\nwhile True:\n    try:\n        if os.fork() == 0:\n            os.setsid()\n"
        "    except OSError:\n        time.sleep(0.05)\n"
    )
    out = await shell(http, sid, f"python3 -c '{bomb}'", timeout_s=2)
    assert out["error"]["code"] == "program_timeout", out
    for _ in range(100):  # until its group is full (its refillers take back what its command's end freed)
        if any(used == limit for used, limit in session_pids()):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"the bomb did not fill its session's pids limit: {session_pids()}")
    out = await shell(http, sid, "echo hi")
    obs = out["observation"]
    assert obs["exit_code"] == 126 and "process limit" in obs["stderr"] and obs["session_alive"], out
    assert out["error"]["blame"] == "program" and "pids" in obs["limits_hit"], out
    assert (await cell(http, sid, "os.kill(-1, signal.SIGKILL)"))["observation"]["session_alive"]
    for _ in range(200):  # killed processes hold their pids until they have died and been reaped (a busy machine)
        if not any(used >= limit - 1 for used, limit in session_pids()):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"the killed bomb still holds its session's pids: {session_pids()}")
    out = await shell(http, sid, "echo hi")
    assert out["observation"]["stdout"] == "hi\n", out
    assert (await http.delete(f"/sessions/{sid}")).status_code in (200, 204)


# ---------------------------------------------------------------------------------------------- isolation


async def test_sandboxes_of_one_image_see_nothing_of_each_other(http: httpx.AsyncClient) -> None:
    out = await run(http, "echo mine > /etc/motd; echo new > /work/new; cat /etc/motd", action={"user": "root"})
    assert out["observation"]["stdout"] == "mine\n", out
    out = await run(http, "cat /etc/motd; ls /work")  # a one-shot's writes went with it
    assert out["observation"]["stdout"] == "shared by every sandbox\nhello.txt\n"
    a, b = await session(http), await session(http)
    await shell(http, a, "echo a > /work/only-a; sleep 300 > /dev/null 2>&1 &")
    out = await shell(http, b, "ls /work; ls /proc | grep -c '^[0-9]'; cat /proc/net/dev | tail -n +3 | cut -d: -f1")
    files, procs, *interfaces = out["observation"]["stdout"].split()
    assert files == "hello.txt" and int(procs) <= 4 and interfaces == ["lo"], out
    assert (await shell(http, a, "cat /work/only-a"))["observation"]["stdout"] == "a\n"


@pytest.mark.vm  # overlayfs in a user namespace, the id map, cgroup v2 limits: the guest's too
async def test_a_hostile_command_stays_in_its_sandbox(http: httpx.AsyncClient) -> None:
    out = await run(
        http,
        "cat /proc/self/uid_map; cat /proc/1/environ >/dev/null 2>&1 || echo no-environ;"
        " ls /proc/1/root/ >/dev/null 2>&1 || echo no-root; ls /opt/sandboxd 2>&1 | head -1;"
        " ls /usr/bin/python3 >/dev/null 2>&1 || echo no-host-python; echo x > /dev/null && echo devnull;"
        " touch /dev/planted 2>/dev/null || echo dev-read-only",
        action={"user": "root"},
    )
    lines = out["observation"]["stdout"].splitlines()
    assert lines[0].split() == ["0", str(IDS.base), "65536"], lines  # root inside is an unprivileged host uid
    assert lines[1:3] == ["no-environ", "no-root"] and "No such file" in lines[3], lines
    assert lines[4:] == ["no-host-python", "devnull", "dev-read-only"], lines


# ---------------------------------------------------------------------------------------------- limits


@pytest.mark.vm  # overlayfs in a user namespace, the id map, cgroup v2 limits: the guest's too
async def test_limits_and_verdicts_are_the_jail_cores(http: httpx.AsyncClient) -> None:
    out = await run(http, "sleep 10", timeout_s=1)
    assert out["error"]["code"] == "program_timeout" and "time" in out["observation"]["limits_hit"], out
    fill = "for i in 1 2 3 4 5 6; do head -c 40000000 /dev/zero > /tmp/f$i || exit 9; done"  # under RLIMIT_FSIZE
    out = await run(http, fill, limits={"memory_mb": 64})
    assert out["error"]["code"] == "program_killed" and out["observation"]["killed_by"] == "memory", out
    out = await run(http, fill)  # past the 128 MB writable layer, within the 256 MB of memory
    assert out["observation"]["exit_code"] == 9 and "No space left" in out["observation"]["stderr"], out
    out = await run(http, "f() { f | f & }; f; sleep 2", timeout_s=5)  # its own pids limit: never the node's
    assert "pids" in out["observation"]["limits_hit"] and (out["error"] or {}).get("blame", "program") == "program"
    out = await run(http, "head -c 50000000 /dev/zero")
    assert out["observation"]["killed_by"] == "output" and out["error"]["code"] == "program_killed", out
    assert (await run(http, "echo fine"))["observation"]["stdout"] == "fine\n"  # the slots recovered


async def test_concurrent_one_shots_of_one_image(http: httpx.AsyncClient) -> None:
    outs = await asyncio.gather(*(run(http, f"echo {i} > /tmp/me; sleep 0.2; cat /tmp/me") for i in range(12)))
    assert [o["observation"]["stdout"] for o in outs] == [f"{i}\n" for i in range(12)]


# ---------------------------------------------------------------------------------------------- a SWE-style task


async def test_a_swe_task_is_graded_by_its_tests_in_32_sessions_at_once(http: httpx.AsyncClient) -> None:
    """32 agents on one task image: each applies its patch with git, runs the repository's tests, and its
    reward is their exit status; each sees only its own changes."""
    patches = [FIX if i % 2 == 0 else WRONG for i in range(32)]

    async def agent(patch: str) -> tuple[int, str]:
        r = await http.post("/sessions", json={"runner": "container", "options": {"image": SWE}})
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        try:
            applied = await shell(
                http, sid, "git apply fix.patch && cat calc.py", action={"files": {"fix.patch": patch}}
            )
            assert applied["observation"]["exit_code"] == 0, applied
            graded = await shell(http, sid, "python3 -m unittest -q 2>&1 | tail -1", timeout_s=30)
            status = await shell(http, sid, "python3 -m unittest -q >/dev/null 2>&1; echo $?", timeout_s=30)
            return int(status["observation"]["stdout"]), applied["observation"]["stdout"] + graded["observation"][
                "stdout"
            ]
        finally:
            await http.delete(f"/sessions/{sid}")

    results = await asyncio.gather(*(agent(p) for p in patches))
    rewards = [1.0 if code == 0 else 0.0 for code, _ in results]
    assert rewards == [1.0 if i % 2 == 0 else 0.0 for i in range(32)], results
    for i, (_, out) in enumerate(results):
        assert ("a + b" if i % 2 == 0 else "a * b") in out and ("OK" if i % 2 == 0 else "FAILED") in out, out
    untouched = await run(http, "cat calc.py", action={"image": SWE})  # the image itself is as it was
    assert untouched["observation"]["stdout"] == "def add(a, b):\n    return a - b\n"


async def test_an_image_removed_under_a_running_sandbox_keeps_its_layers_until_it_ends(
    http: httpx.AsyncClient, store: ImageStore
) -> None:
    """``sandboxd image rm`` of an image a session runs: new sandboxes of it are refused at once; its layers stay
    for the session (its files still read), and go with the next import once nothing stacks them."""
    mine = layer(("file", "only-here.txt", b"the removed image's own file\n"))
    with tempfile.TemporaryDirectory(dir="/var/tmp") as work:
        image = store.import_image(host_image(Path(work) / "oci", "tmp/removed:1", [mine]))
    own = image.layers[-1].removeprefix("sha256:")
    sid = await session(http, image="tmp/removed:1")
    assert store.remove("tmp/removed:1") == [own]  # the base layer is other images' too: kept anyway
    assert (store.root / "layers" / own).is_dir()
    out = await shell(http, sid, "cat /only-here.txt")
    assert out["observation"]["stdout"] == "the removed image's own file\n", out
    r = await http.post("/sessions", json={"runner": "container", "options": {"image": "tmp/removed:1"}})
    assert r.status_code == 404, r.text
    assert (await http.delete(f"/sessions/{sid}")).status_code in (200, 204)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as work:
        store.import_image(host_image(Path(work) / "oci", "tmp/next:1", [layer(("file", "x", b"x"))]))
    assert not (store.root / "layers" / own).exists()  # collected once free
    store.remove("tmp/next:1")


# ---------------------------------------------------------------------------------------------- a red team's


async def test_what_a_red_team_found_is_refused_and_blamed_on_whom_it_is(http: httpx.AsyncClient, node: str) -> None:
    # Per-user kernel objects are charged up to the host's root: a sandbox gets none of them.
    probe = (
        "import ctypes, resource; libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.inotify_init1(0), ctypes.get_errno(), libc.mq_open(b'/q', 0o102, 0o600, None), ctypes.get_errno())\n"
        "print(resource.getrlimit(resource.RLIMIT_SIGPENDING), resource.getrlimit(resource.RLIMIT_MSGQUEUE))"
    )
    out = await run(http, ["python3", "-c", probe], action={"image": SWE, "user": "root"})
    assert out["observation"]["stdout"] == "-1 1 -1 1\n(64, 64) (0, 0)\n", out["observation"]["stderr"]

    async def refused(body: dict[str, Any], status: int, says: str, path: str = "/rollout/step") -> None:
        r = await http.post(path, json=body)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["blame"] == "client" and says in err["message"], err

    step = {"runner": "container"}
    await refused(
        {**step, "action": {"image": IMAGE, "cmd": "true #" + "\x01" * 200_000}}, 413, "as the sandbox receives"
    )
    await refused({**step, "action": {"image": IMAGE, "env": {"BIG": "x" * 300_000}}}, 422, "env holds")
    await refused({**step, "action": {"image": IMAGE, "fetch_files": ["a\x00b"]}}, 422, "names no file")
    await refused({**step, "action": {"image": IMAGE, "workdir": "/proc/x"}}, 422, "the working directory '/proc/x'")
    await refused({**step, "action": {"image": ODD, "cmd": "true"}}, 422, "/etc/passwd is not a regular file")
    files = {"/proc/self/comm": "pwned"}
    await refused(
        {**step, "action": {"image": IMAGE, "files": files, "user": "root"}}, 422, "not a file of the sandbox's own"
    )
    big = {"runner": "container", "options": {"image": IMAGE, "env": {"B": "x" * 100_000}}}
    await refused(big, 413, "a session's options take at most", "/sessions")
    # Nothing of that cost the node a jail, a link or its readiness.
    assert (await http.get("/readyz")).status_code == 200
    assert (await run(http, "echo fine"))["observation"]["stdout"] == "fine\n"
    # A variable name the shell cannot export is left out, not a broken session.
    sid = await session(http, env={"é": "1", "OK": "2"})
    assert (await shell(http, sid, "echo $OK"))["observation"]["stdout"] == "2\n"
