"""The official E2B SDKs (``e2b``, ``e2b-code-interpreter``, pinned) against a real node's E2B facade: only
``E2B_API_URL``/``E2B_SANDBOX_URL`` point at the node. What is served works as E2B documents it; what is not
is refused by the SDK's own exceptions with a message that says so."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    NotFoundException,
    SandboxException,
    SandboxQuery,
)
from e2b import Sandbox as BaseSandbox
from e2b_code_interpreter import AsyncSandbox, Sandbox
from e2b_code_interpreter import TimeoutException as CodeTimeout
from e2b_code_interpreter.charts import BarChart, BoxAndWhiskerChart, LineChart, PieChart, SuperChart

from tests.conftest import point_e2b_at, running_node

pytestmark = [pytest.mark.node, pytest.mark.timeout(180)]

KEY_A = "e2b_" + "a1" * 20
KEY_B = "e2b_" + "b2" * 20
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    with running_node(
        runners='["python"]', workers=1, reap_interval_s=0.5, api_keys=f'["{KEY_A}", "{KEY_B}", "plain-key-0123456789"]'
    ) as base:
        yield base


@pytest.fixture(autouse=True)
def e2b_env(node: str, monkeypatch: pytest.MonkeyPatch) -> None:
    point_e2b_at(node, KEY_A, monkeypatch)


def test_code_runs_with_state_rich_results_and_errors() -> None:
    sbx = Sandbox.create(metadata={"run_id": "t1"}, envs={"GREETING": "hello"})
    try:
        first = sbx.run_code("x = 41\nprint('out'); import sys; print('err', file=sys.stderr)")
        assert first.error is None and first.logs.stdout == ["out\n"] and first.logs.stderr == ["err\n"]
        assert sbx.run_code("x + 1").text == "42"  # state across calls, the last expression is the result
        assert sbx.run_code("import os; os.environ['GREETING']").text == "hello"  # E2B gives strings unquoted
        assert sbx.run_code("import os; os.getcwd(), os.environ['HOME']").text == "('/home/user', '/home/user')"
        failed = sbx.run_code("def f():\n    return 1 / 0\nf()")
        assert failed.error is not None and failed.error.name == "ZeroDivisionError"
        assert "division by zero" in failed.error.value and "return 1 / 0" in failed.error.traceback
        chart = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()")
        pngs = [r.png for r in chart.results if r.png]
        assert len(pngs) == 1 and base64.b64decode(pngs[0]).startswith(PNG_MAGIC), chart
        html = sbx.run_code("class T:\n    def _repr_html_(self):\n        return '<b>t</b>'\nT()")
        assert html.results[0].html == "<b>t</b>" and html.results[0].is_main_result
        counted = sbx.run_code("1")
        assert counted.execution_count is not None and counted.execution_count >= 6
        per_call = sbx.run_code("print(1)", envs={"ONLY_HERE": "1"})
        assert per_call.logs.stdout == ["1\n"]
        assert sbx.run_code("import os; 'ONLY_HERE' in os.environ").text == "False"
    finally:
        sbx.kill()


def test_display_and_images_are_shown_as_a_kernel_shows_them() -> None:
    """IPython's ``display`` (imported, or a kernel's name without import), raw MIME bundles, PIL's ``show`` and
    ``save``, a figure passed to display: each a result of the cell, in order, the last expression last."""
    sbx = Sandbox.create()
    try:
        code = (
            "from IPython.display import display, HTML, Markdown\n"
            "display(HTML('<i>a</i>'))\n"
            "display({'text/latex': r'\\alpha'}, raw=True)\n"
            "import numpy\nfrom PIL import Image\n"
            "image = Image.fromarray((numpy.ones((4, 4, 3)) * 200).astype('uint8'))\n"
            "image.show()\nimage.save('pixel.png')\n"
            "import matplotlib.pyplot as plt\nfig = plt.figure(); plt.plot([1, 2]); display(fig); plt.close(fig)\n"
            "Markdown('**m**')"
        )
        shown = sbx.run_code(code)
        assert shown.error is None, shown.error
        formats = [list(r.formats()) for r in shown.results]
        assert formats[:2] == [["text", "html"], ["latex"]], formats
        assert all("png" in f for f in formats[2:4]), formats  # show(), save()
        assert "png" in formats[4] and formats[5] == ["text", "markdown"], formats
        assert [r.is_main_result for r in shown.results] == [False] * 5 + [True]
        assert base64.b64decode(shown.results[2].png or "").startswith(PNG_MAGIC)
        assert sbx.run_code("display('plain')").results[0].text == "plain"  # no import: a kernel's name
        assert sbx.files.exists("pixel.png")
    finally:
        sbx.kill()


CHARTS = """
import matplotlib.pyplot as plt
fig, axs = plt.subplots(2, 2)
fig.suptitle('Four')
axs[0][0].bar(['A', 'B'], [3, 5], label='sold')
axs[0][0].set_title('Bars')
axs[0][0].set_xlabel('Author')
axs[0][0].set_ylabel('Books (k)')
axs[0][1].boxplot([[85, 90, 78, 92, 88], [95, 89, 76, 91, 84, 87]], tick_labels=['A', 'B'])
axs[1][0].pie([90, 10], labels=['No', 'Yes'])
axs[1][1].plot([1, 2, 3], ['x', 'y', 'x'], label='walk')
plt.show()
"""


def test_charts_are_extracted_as_e2bs_kernel_extracts_them() -> None:
    """E2B's ``Result.chart``: what a matplotlib figure shows, as data, in the SDK's own chart types."""
    sbx = Sandbox.create()
    try:
        shown = sbx.run_code(CHARTS)
        assert shown.error is None, shown.error
        chart = shown.results[0].chart
        assert isinstance(chart, SuperChart) and chart.title == "Four", chart
        bars, boxes, pie, line = chart.elements
        assert isinstance(bars, BarChart) and (bars.title, bars.x_label, bars.y_unit) == ("Bars", "Author", "k")
        assert [(b.label, b.value, b.group) for b in bars.elements] == [("A", 3, "sold"), ("B", 5, "sold")]
        assert isinstance(boxes, BoxAndWhiskerChart)
        stats = [
            (b.label, b.min, b.first_quartile, b.median, b.third_quartile, b.max, b.outliers) for b in boxes.elements
        ]
        assert stats == [("A", 78, 85, 88, 90, 92, []), ("B", 84, 84.75, 88, 90.5, 95, [76])], stats
        assert isinstance(pie, PieChart) and [(p.label, p.angle) for p in pie.elements] == [("No", 324), ("Yes", 36)]
        assert isinstance(line, LineChart) and line.y_scale == "categorical"
        assert line.elements[0].label == "walk" and line.elements[0].points == [(1.0, "x"), (2.0, "y"), (3.0, "x")]
        assert base64.b64decode(shown.results[0].png or "").startswith(PNG_MAGIC)
    finally:
        sbx.kill()


def test_javascript_and_bash_contexts_keep_their_state() -> None:
    """JavaScript (node, as a notebook's kernel: declarations persist, top-level await, ES module imports) and
    bash, each a process the sandbox keeps across cells; the sandbox's envs, per-cell envs, its home."""
    sbx = Sandbox.create(envs={"GREETING": "hi"})
    try:
        assert sbx.run_code("let n = 41; console.log('js')", language="js").logs.stdout == ["js\n"]
        assert sbx.run_code("n + 1", language="javascript").text == "42"
        imported = sbx.run_code("import { readFileSync } from 'fs'\ntypeof readFileSync", language="js")
        assert imported.text == "function", imported
        assert sbx.run_code("await Promise.resolve(process.cwd())", language="js").text == "/home/user"
        assert sbx.run_code("process.env.GREETING", language="js").text == "hi"
        assert sbx.run_code("process.env.ONCE", language="js", envs={"ONCE": "1"}).text == "1"
        assert sbx.run_code("process.env.ONCE || 'gone'", language="js").text == "gone"
        failed = sbx.run_code("null.x", language="js")
        assert failed.error is not None and failed.error.name == "TypeError", failed
        assert sbx.run_code("n", language="js").text == "41"  # an error does not restart it
        typed = sbx.run_code("const message: string = 'typed'; console.log(message)\nmessage.length", language="ts")
        assert typed.logs.stdout == ["typed\n"] and typed.text == "5", typed
        java = sbx.run_code('int k = 6;\nSystem.out.println("java");\nk * 7', language="java")
        assert java.logs.stdout == ["java\n"] and java.text == "42", java
        assert sbx.run_code('System.getProperty("GREETING") + k', language="java").text == "hi6"
        assert sbx.run_code('System.getProperty("ONCE")', language="java", envs={"ONCE": "1"}).text == "1"
        assert sbx.run_code('System.getProperty("user.dir")', language="java").text == "/home/user"
        assert sbx.run_code('int bad = "s";', language="java").error.name == "CompilationException"
        bash = sbx.run_code("mkdir -p data && cd data && X=7 && pwd", language="bash")
        assert bash.logs.stdout == ["/home/user/data\n"], bash
        assert sbx.run_code("echo $X $FOO", language="bash", envs={"FOO": "bar"}).logs.stdout == ["7 bar\n"]
        assert sbx.run_code("echo ${FOO:-unset} $GREETING", language="bash").logs.stdout == ["unset hi\n"]
        ctx = sbx.create_code_context(language="js")
        assert ctx.language == "javascript" and sbx.run_code("typeof n", context=ctx).text == "undefined"
        sbx.run_code("const own = 'ctx'", context=ctx)
        assert sbx.run_code("own", context=ctx).text == "ctx"  # its kernel lives across its cells
        listed = sbx.list_code_contexts()
        assert {"python", "javascript", "typescript", "bash", "java"} <= {c.language for c in listed}, listed
        own_js = next(c for c in listed if c.language == "javascript" and c.id != ctx.id)
        sbx.run_code("py_state = 1")
        sbx.restart_code_context(own_js)  # the sandbox's JavaScript kernel only
        assert sbx.run_code("typeof n", language="js").text == "undefined"
        assert sbx.run_code("py_state").text == "1"
        with pytest.raises(Exception, match="not served"):
            sbx.run_code("print(1)", language="r")
    finally:
        sbx.kill()


def test_what_a_red_team_did_to_cells_and_kernels() -> None:
    """A cell's answer survives NaN and a failing figure; a JavaScript cell's own names (``const fs``, a
    ``function shown``) are its own, not the kernel's; a JavaScript cell's output larger than a pipe never spills
    into the next cell; a bash cell that reads stdin gets EOF, not the protocol."""
    sbx = Sandbox.create()
    try:
        nan = sbx.run_code("import math\n[1.0, math.nan]")
        assert nan.error is None and nan.results[0].text == "[1.0, nan]", nan
        lost = sbx.run_code(
            "from IPython.display import display\nimport math\ndisplay([math.inf])\nraise ValueError('mine')"
        )
        assert lost.error is not None and lost.error.name == "ValueError", lost
        bad = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.title(r'$\\frac{1$')")
        assert bad.error is not None, bad
        assert sbx.run_code("41 + 1").text == "42"  # the broken figure was closed with its cell
        assert sbx.run_code("const fs = require('fs'); typeof fs.readFileSync", language="js").text == "function"
        sbx.run_code("function shown(v) { return 'FAKE' }", language="js")
        assert sbx.run_code("1 + 1", language="js").text == "2"
        big = sbx.run_code("console.log('x'.repeat(200000)); 5", language="js")
        assert "".join(big.logs.stdout) == "x" * 200000 + "\n" and big.text == "5"
        after = sbx.run_code("6", language="js")
        assert after.logs.stdout == [] and after.text == "6", after.logs.stdout[:1]
        read = sbx.run_code("read line; echo got:$line", language="bash", timeout=20)
        assert read.logs.stdout == ["got:\n"], read
        assert sbx.run_code("echo 'unbalanced", language="bash").error is not None
        assert sbx.run_code("echo fine", language="bash").logs.stdout == ["fine\n"]
    finally:
        sbx.kill()


def test_a_sandbox_killed_during_a_cell_drops_its_connection_as_e2bs_does() -> None:
    """E2B's proxy drops the connection of a sandbox that ends mid-request; the SDK reads exactly that as "killed
    while the request was in progress" (E2B's own test_killed.py), not as a timeout."""
    sbx = Sandbox.create()
    timer = threading.Timer(1.5, sbx.kill)
    timer.start()
    try:
        with pytest.raises(CodeTimeout, match="killed while the request was in progress"):
            sbx.run_code("import time; time.sleep(300)", timeout=300)
    finally:
        timer.cancel()
    assert not sbx.is_running()


def test_contexts_are_separate_interpreters_of_one_sandbox() -> None:
    sbx = Sandbox.create()
    try:
        ctx = sbx.create_code_context()
        assert sbx.run_code("y = 5", context=ctx).error is None
        assert sbx.run_code("y", context=ctx).text == "5"
        missing = sbx.run_code("y")
        assert missing.error is not None and missing.error.name == "NameError"
        listed = [c.id for c in sbx.list_code_contexts()]
        # ids as the sandbox's own: E2B ids (its default context is the sandbox's id, as before ids were labels)
        assert listed[0] == sbx.sandbox_id and ctx.id in listed and not any("~" in c for c in listed), listed
        default = next(c for c in sbx.list_code_contexts() if c.id == sbx.sandbox_id)
        assert sbx.run_code("z = 1", context=default).error is None and sbx.run_code("z").text == "1"
        with pytest.raises(SandboxException, match="not served here"):
            sbx.run_code("1", language="r")
    finally:
        sbx.kill()
    with pytest.raises(NotFoundException):  # the context ended with its sandbox
        BaseSandbox.get_info(ctx.id)


def test_list_by_metadata_get_info_and_kill() -> None:
    one = Sandbox.create(metadata={"run_id": "list-1", "role": "a"})
    two = Sandbox.create(metadata={"run_id": "list-2"})
    try:
        found = BaseSandbox.list(query=SandboxQuery(metadata={"run_id": "list-1"})).next_items()
        assert [s.sandbox_id for s in found] == [one.sandbox_id]
        assert found[0].metadata == {"run_id": "list-1", "role": "a"}
        everything = {s.sandbox_id for s in BaseSandbox.list().next_items()}
        assert {one.sandbox_id, two.sandbox_id} <= everything
        info = one.get_info()
        assert info.sandbox_id == one.sandbox_id and info.metadata["role"] == "a"
        assert info.end_at > info.started_at
        assert BaseSandbox.list(api_key=KEY_B).next_items() == []  # another tenant sees none of them
    finally:
        assert one.kill() is True
        two.kill()
    assert one.is_running() is False
    assert BaseSandbox.kill(one.sandbox_id) is False  # already gone: the SDK's "not found"


def test_timeout_is_extended_and_expires() -> None:
    sbx = Sandbox.create(timeout=60)
    sbx.set_timeout(2)
    sbx.run_code("z = 1")
    deadline = time.monotonic() + 15
    while sbx.is_running() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not sbx.is_running()
    with pytest.raises(CodeTimeout):  # E2B's answer for a sandbox that timed out
        sbx.run_code("z")
    longer = Sandbox.create(timeout=2)
    try:
        longer.set_timeout(60)
        time.sleep(3)
        assert longer.run_code("2 + 2").text == "4"
        connected = Sandbox.connect(longer.sandbox_id)
        assert connected.run_code("3 + 3").text == "6"
    finally:
        longer.kill()


def test_keys_and_tokens_open_only_their_own() -> None:
    sbx = Sandbox.create()
    try:
        with pytest.raises(AuthenticationException):
            Sandbox.create(api_key="e2b_" + "00" * 20)
        with pytest.raises(NotFoundException):
            BaseSandbox.get_info(sbx.sandbox_id, api_key=KEY_B)  # another tenant's sandbox: not found
        assert BaseSandbox.kill(sbx.sandbox_id, api_key=KEY_B) is False
        other = Sandbox.create(api_key=KEY_B)
        try:
            # B's own sandbox's token does not open A's sandbox.
            headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": other._envd_access_token or ""}
            r = httpx.post(f"{sbx.connection_config._sandbox_url}/execute", json={"code": "1"}, headers=headers)
            assert r.status_code == 401, r.text
        finally:
            other.kill()
        # A sandbox's token opens its data plane and nothing else of the tenant's.
        token = {"X-Access-Token": sbx._envd_access_token or "", "E2b-Sandbox-Id": sbx.sandbox_id}
        base = sbx.connection_config._sandbox_url
        r = httpx.post(f"{base}/rollout/step", json={"runner": "python", "action": {"code": "1"}}, headers=token)
        assert r.status_code == 401, r.text
        r = httpx.post(f"{base}/sandboxes", json={"templateID": "base"}, headers=token)
        assert r.status_code == 401, r.text
        assert sbx.run_code("'still mine'").text == "still mine"
    finally:
        sbx.kill()


def test_another_tenants_sandbox_answers_as_an_unknown_one_and_never_names_its_session(node: str) -> None:
    """Found by a red team: tenant B naming A's sandbox with B's own key got a 502 spelling A's session id (its
    worker, its start, its node). Every plane answers B as for a sandbox never issued, by its public id only."""
    sbx = Sandbox.create()
    name = sbx.sandbox_id
    fake = name[:3] + ("a" if name[3] != "a" else "b") + name[4:]  # same shape, never issued
    try:
        for sandbox_id in (name, fake):
            headers = {"X-API-Key": KEY_B, "E2b-Sandbox-Id": sandbox_id}
            calls = [
                httpx.post(f"{node}/execute", json={"code": "1"}, headers=headers, timeout=30),
                httpx.get(f"{node}/health", headers=headers, timeout=30),
                httpx.get(f"{node}/sandboxes/{sandbox_id}", headers={"X-API-Key": KEY_B}, timeout=30),
                httpx.post(
                    f"{node}/process.Process/List",
                    content=b"{}",
                    headers={**headers, "content-type": "application/json", "connect-protocol-version": "1"},
                    timeout=30,
                ),
            ]
            for r in calls:  # E2B's shapes: 404 on the control plane, 502 on the data plane, Connect's unavailable
                assert r.status_code in (404, 502, 503), (sandbox_id, r.status_code, r.text)
                assert "s_" not in r.text and "~" not in r.text and ".vm" not in r.text, r.text
        # The same answers, whichever of the two it was (the id aside).
        connect = {"content-type": "application/json", "connect-protocol-version": "1"}
        for method, path, extra in (
            ("POST", "/execute", {"json": {"code": "1"}}),
            ("GET", "/health", {}),
            ("POST", "/process.Process/List", {"content": b"{}"}),
        ):
            kw: dict[str, Any] = {**extra, "timeout": 30}
            a = httpx.request(
                method, f"{node}{path}", headers={"X-API-Key": KEY_B, "E2b-Sandbox-Id": name, **connect}, **kw
            )
            b = httpx.request(
                method, f"{node}{path}", headers={"X-API-Key": KEY_B, "E2b-Sandbox-Id": fake, **connect}, **kw
            )
            assert (a.status_code, a.text.replace(name, "ID")) == (b.status_code, b.text.replace(fake, "ID")), (
                a.text,
                b.text,
            )
        assert sbx.run_code("'still mine'").text == "still mine"
    finally:
        sbx.kill()


def test_a_sandbox_is_addressed_by_its_host_name_as_e2b_1x_does(node: str) -> None:
    """``<port>-<sandbox id>.<domain>`` and no ``E2b-Sandbox-Id`` (e2b 1.x; any client behind an Ingress): the
    host names the sandbox, for the front door's check and the route alike; its token opens only that one; a
    call with no token at all says what is missing (e2b-code-interpreter 1.x sends none with run_code)."""
    a, b = Sandbox.create(), Sandbox.create()

    def call(path: str, host: str, token: str | None, **headers: str) -> httpx.Response:
        sent = {"Host": host, **headers} | ({"X-Access-Token": token} if token else {})
        return httpx.post(f"{node}{path}", json={"code": "6 * 7"}, headers=sent, timeout=30)

    def results(r: httpx.Response) -> list[str]:
        return [line["text"] for line in map(json.loads, r.text.splitlines()) if line.get("type") == "result"]

    try:
        ran = call("/execute", f"49999-{a.sandbox_id}.e2b.example", a._envd_access_token)
        assert ran.status_code == 200 and results(ran) == ["42"], ran.text
        up = httpx.get(
            f"{node}/health",
            headers={"Host": f"49983-{b.sandbox_id}.E2B.example:443", "X-Access-Token": b._envd_access_token or ""},
        )
        assert up.status_code == 204, up.text
        wrong = call("/execute", f"49999-{b.sandbox_id}.e2b.example", a._envd_access_token)
        assert wrong.status_code == 401 and wrong.json()["code"] == 401, wrong.text
        bare = call("/execute", f"49999-{a.sandbox_id}.e2b.example", None)
        assert bare.status_code == 401 and "no access token" in bare.json()["message"], bare.text
        # the header, when sent (every 2.x SDK), is what names the sandbox
        both = call(
            "/execute", f"49999-{a.sandbox_id}.e2b.example", b._envd_access_token, **{"E2b-Sandbox-Id": b.sandbox_id}
        )
        assert both.status_code == 200 and results(both) == ["42"], both.text
    finally:
        a.kill()
        b.kill()
    ended = call("/execute", f"49999-{a.sandbox_id}.e2b.example", a._envd_access_token)
    message = ended.json()["message"]  # the sandbox by its E2B id, never by the session id inside (its node)
    assert ended.status_code == 502 and "not found" in message and a.sandbox_id in message and "~" not in message


def test_commands_run_stream_and_background_processes_are_killed() -> None:
    sbx = BaseSandbox.create()
    try:
        ok = sbx.commands.run("echo out; echo err >&2; ls /usr/bin/env")
        assert (ok.exit_code, ok.stdout, ok.stderr) == (0, "out\n/usr/bin/env\n", "err\n")
        with pytest.raises(CommandExitException) as failed:
            sbx.commands.run("echo nope >&2; exit 3")
        assert failed.value.exit_code == 3 and failed.value.stderr == "nope\n"
        seen: list[tuple[float, str]] = []
        sbx.commands.run(
            "for i in 1 2 3; do echo line $i; sleep 0.3; done", on_stdout=lambda s: seen.append((time.monotonic(), s))
        )
        assert [line for _, line in seen] == ["line 1\n", "line 2\n", "line 3\n"]
        assert seen[-1][0] - seen[0][0] > 0.4  # streamed as printed, not all at the end
        assert sbx.commands.run("echo $GREETING", envs={"GREETING": "hi"}).stdout == "hi\n"
        server = sbx.commands.run("echo up; exec sleep 300", background=True)
        deadline = time.monotonic() + 10
        while server.pid not in {p.pid for p in sbx.commands.list()} and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.pid in {p.pid for p in sbx.commands.list()}
        assert server.kill() is True
        with pytest.raises(CommandExitException) as killed:
            server.wait()
        assert killed.value.exit_code != 0
        assert server.pid not in {p.pid for p in sbx.commands.list()}
        # The processes it started die with the sandbox, whatever they do.
        sbx.commands.run("sleep 300", background=True)
        fed = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.send_stdin(fed.pid, "fed through stdin\n")
        sbx.commands.close_stdin(fed.pid)
        assert fed.wait().stdout == "fed through stdin\n"
    finally:
        sbx.kill()


def test_files_round_trip_text_binary_and_directories() -> None:
    sbx = BaseSandbox.create()
    try:
        sbx.files.write("/home/user/notes.txt", "héllo\n")
        assert sbx.files.read("/home/user/notes.txt") == "héllo\n"
        blob = bytes(range(256)) * (10 * 4096)  # 10 MiB, every byte value
        sbx.files.write("data/blob.bin", blob)
        assert bytes(sbx.files.read("data/blob.bin", format="bytes")) == blob
        assert sbx.commands.run("wc -c < data/blob.bin").stdout.strip() == str(len(blob))  # commands see them
        assert sbx.commands.run("pwd; cat /home/user/notes.txt").stdout == "/home/user\nhéllo\n"
        names = {(e.name, e.type.value if e.type else None) for e in sbx.files.list("/home/user")}
        # the facade's own state is hidden; .profile keeps the sandbox's python first for commands (a real file)
        assert names == {("notes.txt", "file"), ("data", "dir"), (".profile", "file")}
        assert sbx.files.exists("notes.txt") and not sbx.files.exists("missing.txt")
        assert sbx.files.make_dir("a/b") is True
        sbx.files.rename("notes.txt", "a/b/moved.txt")
        info = sbx.files.get_info("a/b/moved.txt")
        assert info.path == "/home/user/a/b/moved.txt" and info.size == len("héllo\n".encode())
        sbx.files.remove("a")
        assert not sbx.files.exists("a/b/moved.txt")
        with pytest.raises(FileNotFoundException):
            sbx.files.read("gone.txt")
        with pytest.raises(Exception, match="writable"):
            sbx.files.write("/etc/passwd", "root::0:0::/:/bin/sh\n")
        assert "root:x:0:0" in sbx.files.read("/etc/passwd")  # the system is there, read-only
        assert sbx.files.read("../../proc/self/status").startswith("Name:")  # its own /proc, not the host's
    finally:
        sbx.kill()


def test_a_sandboxs_own_processes_cannot_forge_its_commands_results() -> None:
    """Exit codes come from the kernel (waitpid), not from files the sandbox's processes can write: a red team
    planted 0 for later commands, then filled /tmp so every status file came out empty (read as 0)."""
    sbx = BaseSandbox.create()
    try:
        sbx.commands.run(
            "for d in /tmp/.sandboxd-e2b/*; do :; done; mkdir -p /tmp/.sandboxd-e2b; "
            "for i in $(seq 1 50); do echo 0 > /tmp/.sandboxd-e2b/$i.code; done"
        )
        with pytest.raises(CommandExitException) as planted:
            sbx.commands.run("echo graded; exit 5")
        assert planted.value.exit_code == 5 and planted.value.stdout == "graded\n"
        sbx.commands.run("head -c 70000000 /dev/zero > /tmp/fill || true")  # the 64 MiB home is full now
        with pytest.raises(CommandExitException) as full:
            sbx.commands.run("exit 3")
        assert full.value.exit_code == 3 and "full" in (full.value.error or "")
        sbx.files.remove("fill")
        killed = sbx.commands.run("exec sleep 300", background=True)
        killed.kill()
        with pytest.raises(CommandExitException) as signalled:
            killed.wait()
        assert signalled.value.exit_code == -1 and signalled.value.error == "signal: SIGKILL"
    finally:
        sbx.kill()


def test_bad_input_is_the_clients_error(node: str) -> None:
    sbx = BaseSandbox.create()
    try:
        with pytest.raises(SandboxException, match="facade's own"):
            BaseSandbox.create(metadata={"sandboxd.e2b/sandbox": sbx.sandbox_id})
        r = httpx.get(f"{node}/v2/sandboxes?limit=abc", headers={"X-API-Key": KEY_A})
        assert r.status_code == 422 and "limit" in r.json()["message"], r.text
        r = httpx.post(
            f"{node}/sandboxes", json={"templateID": "base", "timeout": 10**400}, headers={"X-API-Key": KEY_A}
        )
        assert r.status_code == 422, r.text
        token = {"X-Access-Token": sbx._envd_access_token or "", "E2b-Sandbox-Id": sbx.sandbox_id}
        for content_type, body in (("application/proto", b"\xff\xff\xff"), ("application/json", b"{not json")):
            r = httpx.post(
                f"{node}/filesystem.Filesystem/Stat", content=body, headers={**token, "Content-Type": content_type}
            )
            assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text
        # A Connect call without its sandbox's token, refused at the front door or by its service: Connect's
        # shape, by its code's name (found by a red team: it was ``invalid_argument``, or E2B's ``{"code": 401}``).
        connect = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
        for creds in ({}, {"X-Access-Token": "not-its-token"}, {"X-API-Key": KEY_B}):
            r = httpx.post(
                f"{node}/process.Process/List",
                content=b"{}",
                headers={**connect, **creds, "E2b-Sandbox-Id": sbx.sandbox_id},
            )
            assert r.status_code in (401, 503) and isinstance(r.json()["code"], str), (creds, r.text)
            if r.status_code == 401:
                assert r.json()["code"] == "unauthenticated", (creds, r.text)
        assert httpx.post(f"{node}/process.Process/List", content=b"{}", headers=connect).json()["code"] in (
            "unauthenticated",
            "not_found",
        )
        native = httpx.post(f"{node}/sessions", json={"runner": "python"}, headers={"X-API-Key": KEY_A}).json()
        for method, path in (("GET", "/files?path=a"), ("GET", "/health"), ("POST", "/contexts")):
            r = httpx.request(  # the key's own native session is not a sandbox: no data plane of it
                method, f"{node}{path}", headers={"X-API-Key": KEY_A, "E2b-Sandbox-Id": native["session_id"]}
            )
            assert r.status_code == 502, (path, r.text)
        with pytest.raises(Exception, match="cannot be removed"):
            sbx.files.remove("/home/user")
        assert sbx.commands.run("echo still").stdout == "still\n"
    finally:
        sbx.kill()


def test_every_answer_under_e2bs_paths_has_e2bs_shape(node: str) -> None:
    """Served or not, with a key or without: ``{code, message}`` (the generated client reads ``code`` from every
    error body it parses; a body without it is a KeyError in the user's program), the code the status."""
    key = {"X-API-Key": KEY_A}
    cases = [
        ("POST", "/v2/sandboxes", {}, {"templateID": "base"}, 401),  # no key: refused at the front door
        ("GET", "/templates/aliases/base", key, None, 501),
        ("POST", "/v3/templates", key, {"name": "x"}, 501),
        ("GET", "/volumes", key, None, 501),
        ("PUT", "/v2/sandboxes", key, {}, 501),
        ("GET", "/sandboxes/none/metrics", key, None, 501),
        ("POST", "/v2/sandboxes", key, {"timeout": 30}, 422),  # no templateID
        ("POST", "/v2/sandboxes", key, {"templateID": "base", "volumeMounts": [{"name": "v", "path": "/d"}]}, 501),
        ("POST", "/v2/sandboxes/none/connect", key, {}, 404),
        ("DELETE", "/sandboxes/none", key, None, 404),
    ]
    for method, path, headers, body, status in cases:
        r = httpx.request(method, f"{node}{path}", headers=headers, json=body)
        doc = r.json()
        assert (r.status_code, doc["code"]) == (status, status) and doc["message"], (method, path, r.text)
        if status >= 500:
            assert r.headers.get("should-retry") == "false", (path, r.headers)  # SDK 2.46 on: not retried
    r = httpx.post(f"{node}/v2/sandboxes", json={"templateID": "base"}, headers={**key, "Idempotency-Key": "k-1"})
    again = httpx.post(f"{node}/v2/sandboxes", json={"templateID": "base"}, headers={**key, "Idempotency-Key": "k-1"})
    assert r.status_code == again.status_code == 201 and r.json()["sandboxID"] == again.json()["sandboxID"]
    connected = httpx.post(f"{node}/v2/sandboxes/{r.json()['sandboxID']}/connect", json={"timeout": 1}, headers=key)
    assert connected.status_code == 200 and connected.json()["envdAccessToken"] == r.json()["envdAccessToken"]
    time.sleep(1.5)  # connect never shortens a timeout: the sandbox (300 s) outlives the 1 s asked
    assert httpx.get(f"{node}/sandboxes/{r.json()['sandboxID']}", headers=key).status_code == 200
    assert httpx.delete(f"{node}/sandboxes/{r.json()['sandboxID']}", headers=key).status_code == 204


def test_what_is_not_served_is_refused_clearly() -> None:
    with pytest.raises(SandboxException, match="not served here"):
        Sandbox.create(template="my-custom-template")
    sbx = BaseSandbox.create()
    try:
        with pytest.raises(Exception, match="not served"):
            sbx.pause()
        with pytest.raises(Exception, match="not served"):
            sbx.files.watch_dir("/home/user")
        assert sbx.is_running()
    finally:
        sbx.kill()


async def test_the_async_sdk() -> None:
    sbx = await AsyncSandbox.create(metadata={"run_id": "async"})
    try:
        results = await asyncio.gather(*(sbx.run_code(f"{i} * 2") for i in range(1)))
        assert [r.text for r in results] == ["0"]
        await sbx.run_code("a = [1, 2]")
        assert (await sbx.run_code("sum(a)")).text == "3"
    finally:
        await sbx.kill()
