"""E2B custom templates: ``Sandbox.create(template=NAME)`` with the official SDKs makes a container session of
the node's image NAME, whose own python runs the code interpreter's cells and envd's calls. The image is built
here from this host's programs (``tests/imagebuild.py``: ``python_template``): bash, coreutils, the system's
python3, and an application module of its own that only its interpreter can import. The newest SDK release
runs the same template in tests/e2b_sdk/sdk_flows.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import CommandExitException, SandboxException
from e2b import Sandbox as BaseSandbox
from e2b_code_interpreter import Sandbox

from sandboxd.images.store import ImageStore
from tests.conftest import point_e2b_at, running_container_node
from tests.imagebuild import base_layer, host_image, image_store, python_template

pytestmark = [pytest.mark.node, pytest.mark.timeout(300)]

KEY = "e2b_" + "c3" * 20
TEMPLATE = "agents/py-app:1"
NO_PYTHON = "agents/shell-only:1"


@pytest.fixture(scope="module")
def store() -> Iterator[ImageStore]:
    with image_store("sandboxd-templates-") as (root, store):
        store.import_image(python_template(root / "tmpl", TEMPLATE))
        store.import_image(host_image(root / "bare", NO_PYTHON, [], base_layer(), Env=["PATH=/usr/bin:/bin"]))
        yield store


@pytest.fixture(scope="module")
def node(store: ImageStore) -> Iterator[str]:
    with running_container_node(store.root, api_keys=f'["{KEY}"]') as base:
        yield base


@pytest.fixture(autouse=True)
def e2b_env(node: str, monkeypatch: pytest.MonkeyPatch) -> None:
    point_e2b_at(node, KEY, monkeypatch)


@pytest.mark.vm
def test_code_runs_in_the_templates_own_python_with_its_state() -> None:
    sbx = Sandbox.create(template=TEMPLATE, envs={"GREETING": "hi"}, metadata={"task": "t1"})
    try:
        info = sbx.get_info()
        assert info.template_id == TEMPLATE and info.memory_mb == 256, info  # the container kind's size
        first = sbx.run_code("import greeter, os, sys\nx = 41\nprint(greeter.greet('agent'))")
        assert first.error is None and first.logs.stdout == ["hello agent from the image\n"], first
        assert sbx.run_code("x + 1").text == "42"  # state across cells; the last expression is the result
        where = sbx.run_code("os.getcwd(), os.environ['HOME'], os.environ['GREETING'], os.getuid()")
        assert where.text == "('/home/user', '/home/user', 'hi', 1000)", where
        assert sbx.run_code("sys.executable").text == "/usr/bin/python3"  # the image's interpreter, on its PATH
        failed = sbx.run_code("def f():\n    raise ValueError('bad input')\nf()")
        assert failed.error is not None and failed.error.name == "ValueError" and failed.error.value == "bad input"
        assert sbx.run_code("x").text == "41"  # an error keeps the state
    finally:
        sbx.kill()


def test_commands_and_files_are_the_images() -> None:
    sbx = BaseSandbox.create(template=TEMPLATE)
    try:
        ok = sbx.commands.run("echo $FROM_PROFILE; pwd; id -un; ls /opt/app")
        assert ok.stdout == "image\n/home/user\nagent\ngreeter.py\n", ok  # the image's own .profile is kept
        with pytest.raises(CommandExitException) as failed:
            sbx.commands.run("echo nope >&2; exit 3")
        assert failed.value.exit_code == 3 and failed.value.stderr == "nope\n"
        server = sbx.commands.run("exec sleep 300", background=True)
        assert server.pid in {p.pid for p in sbx.commands.list()}
        assert server.kill() is True
        sbx.files.write("/home/user/notes.txt", "héllo\n")
        assert sbx.files.read("notes.txt") == "héllo\n"
        assert sbx.commands.run("cat notes.txt").stdout == "héllo\n"
        sbx.files.write("/tmp/elsewhere.txt", "anywhere the user may write")  # the whole root is the sandbox's
        assert sbx.commands.run("cat /tmp/elsewhere.txt").stdout == "anywhere the user may write"
        with pytest.raises(SandboxException):
            sbx.files.write("/opt/app/greeter.py", "x")  # root's file: the image's permissions hold
        names = {e.name for e in sbx.files.list("/home/user")}
        assert names == {"notes.txt", ".profile"}, names  # the facade's own state is hidden
        other = BaseSandbox.create(template=TEMPLATE)  # a second sandbox of the template sees none of it
        try:
            assert not other.files.exists("notes.txt")
            assert other.commands.run("cat /tmp/elsewhere.txt || echo absent").stdout.endswith("absent\n")
        finally:
            other.kill()
        listed = {s.sandbox_id: s.template_id for s in BaseSandbox.list().next_items()}
        assert listed.get(sbx.sandbox_id) == TEMPLATE, listed
    finally:
        sbx.kill()


def test_templates_that_cannot_be_served_are_refused_by_name() -> None:
    with pytest.raises(SandboxException, match="no image 'agents/missing:1'"):
        Sandbox.create(template="agents/missing:1")
    with pytest.raises(SandboxException, match="no python3"):
        Sandbox.create(template=NO_PYTHON)
    assert BaseSandbox.list().next_items() == []  # the refused ones left nothing behind
