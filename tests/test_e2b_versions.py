"""The E2B SDK releases users run, against one node: the same flows (tests/e2b_sdk/sdk_flows.py: lifecycle,
connect, commands and files, a code reward as ms-swift computes it, interrupts, contexts, refusals) with the
pinned pair (the project's venv: constraints.txt) and with the newest release (its own venv:
constraints-e2b-latest.txt; it needs other connectrpc and protobuf-py lines). Each run is the SDK's own
process with only E2B's environment variables pointing at the node; the test says which releases it ran."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import running_container_node
from tests.imagebuild import image_store, python_template
from tests.tlsfront import TlsFront

pytestmark = [pytest.mark.node, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parent.parent
FLOWS = ROOT / "tests" / "e2b_sdk" / "sdk_flows.py"
KEY = "e2b_" + "c3" * 20
DOMAIN = "sandboxes.e2b.test"


def pinned(name: str, constraints: Path) -> str:
    found = re.search(rf"^{re.escape(name)}==(\S+)$", constraints.read_text(), re.M)
    assert found, f"{name} is not pinned in {constraints.name}"
    return found.group(1)


def sdk_process(python: Path, constraints: Path) -> tuple[dict[str, str], str]:
    """An SDK release's own process: the machine's environment without E2B's, sandboxd's, pytest's or a
    proxy's variables (only what the test sets points it at the node), and the release it must report."""
    assert python.exists(), f"{python}: scripts/setup.sh --test installs it"
    expect = f"{pinned('e2b', constraints)}/{pinned('e2b-code-interpreter', constraints)}"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("E2B_", "SANDBOXD_", "PYTEST_")) and k != "PYTHONPATH" and "proxy" not in k.lower()
    }
    return env, expect


RELEASES = {
    "pinned": (Path(sys.executable), ROOT / "constraints.txt"),
    "latest": (ROOT / ".venv-e2b-latest" / "bin" / "python", ROOT / "constraints-e2b-latest.txt"),
}


TEMPLATE = "flows/py-app:1"  # a custom template (tests/imagebuild.py), for the flow that creates one


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    with image_store("sandboxd-e2b-versions-") as (root, store):
        store.import_image(python_template(root / "template", TEMPLATE))
        # Sandboxes made with secure: false are served here, for the 1.x line (the 2.x SDKs make secure ones).
        with running_container_node(
            store.root, runners='["python", "container"]', api_keys=f'["{KEY}"]', e2b_insecure_sandboxes="1"
        ) as base:
            yield base


# Reached by E2B_DOMAIN alone: what is left when E2B_API_URL/E2B_SANDBOX_URL go (deprecated from 2.60).
BY_DOMAIN = "release_asked or create_connect or commands_files or ms_swift or contexts or custom_template"


@pytest.mark.parametrize("addressing", ["urls", "domain"])
@pytest.mark.parametrize("release", list(RELEASES))
def test_the_sdk_flows(node: str, release: str, addressing: str, tmp_path: Path) -> None:
    """``urls``: every flow, the node named by E2B_API_URL and E2B_SANDBOX_URL. ``domain``: the main flows with
    only ``E2B_DOMAIN`` set, as a self-hosted E2B is reached: ``https://api.<domain>`` and
    ``https://<port>-<sandbox id>.<domain>``, through a TLS terminator holding a test CA's wildcard certificate
    (``SSL_CERT_FILE``) and a proxy (``HTTPS_PROXY``) that stands in for wildcard DNS."""
    python, constraints = RELEASES[release]
    env, expect = sdk_process(python, constraints)
    env.update(E2B_API_KEY=KEY, E2B_EXPECT_VERSION=expect, E2B_TEST_TEMPLATE=TEMPLATE)
    here = str(FLOWS.parent)  # nothing of the project's pytest set-up: the SDK's process is a user's program
    command = [str(python), "-m", "pytest", str(FLOWS), "-q", "-rf", "-p", "no:cacheprovider", "-c", "/dev/null"]
    command += ["--rootdir", here, "--confcutdir", here]
    with contextlib.ExitStack() as stack:
        if addressing == "urls":
            env.update(E2B_API_URL=node, E2B_SANDBOX_URL=node)
        else:
            front = stack.enter_context(TlsFront(node, DOMAIN, tmp_path))
            env.update(E2B_DOMAIN=DOMAIN, HTTPS_PROXY=front.url, SSL_CERT_FILE=str(front.ca))
            command += ["-k", BY_DOMAIN]
        out = subprocess.run(command, cwd=FLOWS.parent, env=env, capture_output=True, text=True, timeout=540)
    print(f"E2B SDK {release} (e2b/e2b-code-interpreter {expect}), by {addressing}:\n{out.stdout[-4000:]}")
    assert out.returncode == 0, f"e2b {expect}:\n{out.stdout[-6000:]}\n{out.stderr[-2000:]}"
    if addressing == "domain":  # every call went through the front, to the names E2B's addressing gives
        assert "api." + DOMAIN in front.tunnels, front.tunnels
        hosts = {name.split("-", 1)[0] for name in front.tunnels if name != "api." + DOMAIN}
        assert hosts == {"49999", "49983"}, front.tunnels


def test_the_javascript_sdk(node: str) -> None:
    """npm ``e2b`` / ``@e2b/code-interpreter`` (tests/e2b_js/package-lock.json) with the machine's node."""
    here = ROOT / "tests" / "e2b_js"
    assert (here / "node_modules" / "e2b").is_dir(), "scripts/setup.sh --test installs it (npm ci)"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "SANDBOXD_"))}
    env.update(E2B_API_KEY=KEY, E2B_API_URL=node, E2B_SANDBOX_URL=node)
    out = subprocess.run(["node", "flow.mjs"], cwd=here, env=env, capture_output=True, text=True, timeout=300)
    print(out.stdout)
    assert out.returncode == 0 and out.stdout.endswith("all passed\n"), f"{out.stdout[-4000:]}\n{out.stderr[-4000:]}"


LINE_1X = (ROOT / ".venv-e2b-1x" / "bin" / "python", ROOT / "constraints-e2b-1x.txt")
FLOWS_1X = ROOT / "tests" / "e2b_sdk" / "flows_1x.py"


def test_the_1x_line_and_rllms_tool(node: str, tmp_path: Path) -> None:
    """e2b 1.x (tests/e2b_sdk/flows_1x.py), with rllm's E2B tool: by ``E2B_DOMAIN``, the only way 1.x knows,
    through the TLS terminator; 1.x's data plane ignores proxies, so the SDK's process resolves the domain's
    names to the terminator (tests/e2b_sdk/wildcard_dns), as wildcard DNS would."""
    python, constraints = LINE_1X
    env, expect = sdk_process(python, constraints)
    here = str(FLOWS_1X.parent)
    paths = [here + "/wildcard_dns", str(ROOT / "tests" / "peers" / "rllm_tools")]
    command = [str(python), "-m", "pytest", str(FLOWS_1X), "-q", "-rf", "-p", "no:cacheprovider", "-c", "/dev/null"]
    command += ["--rootdir", here, "--confcutdir", here]
    with TlsFront(node, DOMAIN, tmp_path) as front:
        env.update(
            E2B_API_KEY=KEY,
            E2B_EXPECT_VERSION=expect,
            E2B_DOMAIN=DOMAIN,
            SSL_CERT_FILE=str(front.ca),
            PYTHONPATH=os.pathsep.join(paths),
            WILDCARD_DOMAIN=DOMAIN,
            WILDCARD_PORT=str(front.direct_port),
        )
        out = subprocess.run(command, cwd=here, env=env, capture_output=True, text=True, timeout=540)
    print(f"E2B SDK 1.x (e2b/e2b-code-interpreter {expect}), by domain:\n{out.stdout[-4000:]}")
    assert out.returncode == 0, f"e2b {expect}:\n{out.stdout[-6000:]}\n{out.stderr[-2000:]}"
    hosts = {name.split("-", 1)[0] for name in front.tunnels if name != "api." + DOMAIN}
    assert "api." + DOMAIN in front.tunnels and hosts == {"49999", "49983"}, front.tunnels
