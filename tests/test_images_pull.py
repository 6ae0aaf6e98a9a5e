"""``sandboxd image pull`` from a real registry with basic auth: Debian's ``docker-registry`` (the
distribution project's registry) on a loopback port, an image pushed there by ``skopeo``, pulled back by the
CLI as an operator would, its layers and whiteouts as the registry holds them."""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxd.images.pull import default_name
from sandboxd.images.store import ImageStore
from sandboxd.localnode import free_port
from tests.test_images import BASE, IDS, LIMITS, TOP, oci_layout, sha

USER, PASSWORD = "trainer", "s3cret-" + secrets.token_hex(4)


def bcrypt(password: str) -> str:
    """The registry's htpasswd wants bcrypt: libcrypt's (libxcrypt), whatever the interpreter's version."""
    libcrypt = ctypes.CDLL("libcrypt.so.1")
    libcrypt.crypt.restype = ctypes.c_char_p
    salt = b"$2b$05$" + secrets.token_hex(11).encode()[:22]
    hashed: bytes = libcrypt.crypt(password.encode(), salt)
    assert hashed.startswith(b"$2b$"), hashed
    return hashed.decode()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("registry")
    (root / "htpasswd").write_text(f"{USER}:{bcrypt(PASSWORD)}\n")
    port = free_port()
    (root / "config.yml").write_text(
        f"""version: 0.1
log: {{level: warn}}
storage: {{filesystem: {{rootdirectory: {root / "data"}}}}}
http: {{addr: "127.0.0.1:{port}"}}
auth: {{htpasswd: {{realm: sandboxd-tests, path: {root / "htpasswd"}}}}}
"""
    )
    with open(root / "registry.log", "wb") as log:
        proc = subprocess.Popen(["docker-registry", "serve", str(root / "config.yml")], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            assert proc.poll() is None and time.monotonic() < deadline, (root / "registry.log").read_text()
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def push(layout: Path, ref: str) -> None:
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--dest-tls-verify=false",
            "--dest-creds",
            f"{USER}:{PASSWORD}",
            f"oci:{layout}",
            f"docker://{ref}",
        ],
        check=True,
        capture_output=True,
    )


def cli(store: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "SANDBOXD_IMAGES_DIR": str(store), **env}
    return subprocess.run(
        [sys.executable, "-m", "sandboxd", "image", *args], capture_output=True, text=True, env=environ, timeout=120
    )


def test_a_pull_with_credentials_brings_the_registrys_layers(registry: str, tmp_path: Path) -> None:
    ref = f"{registry}/team/app:1"
    push(oci_layout(tmp_path / "oci", [BASE, TOP], WorkingDir="/data", Cmd=["sh"]), ref)
    store = tmp_path / "store"
    r = cli(store, "pull", ref, "--insecure", "--creds", f"{USER}:{PASSWORD}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{ref}: 2 layers") and PASSWORD not in r.stdout + r.stderr
    image = ImageStore(store, LIMITS, IDS).get(ref)
    assert image.layers == [sha(BASE), sha(TOP)] and image.run.working_dir == "/data" and image.run.cmd == ["sh"]
    top = ImageStore(store, LIMITS, IDS).layer_dir(sha(TOP))
    assert stat.S_ISCHR(os.lstat(top / "etc" / "b").st_mode)  # the whiteout, as the registry's layer holds it
    # The same through the environment's credentials, under another name; the layers are shared.
    r = cli(store, "pull", ref, "--insecure", "--name", "app:again", SANDBOXD_REGISTRY_CREDS=f"{USER}:{PASSWORD}")
    assert r.returncode == 0, r.stderr
    assert "app:again" in cli(store, "list").stdout


def test_a_pull_the_registry_refuses_is_the_callers_and_leaves_nothing(registry: str, tmp_path: Path) -> None:
    ref = f"{registry}/team/private:1"
    push(oci_layout(tmp_path / "oci", [BASE]), ref)
    store = tmp_path / "store"
    for args, says in (
        (["--creds", f"{USER}:wrong"], "unauthorized"),
        ([], "unauthorized"),
        (["--creds", f"{USER}:{PASSWORD}", "--name", "Not A Name"], "image name"),
    ):
        r = cli(store, "pull", ref, "--insecure", *args)
        assert r.returncode == 1 and says in r.stderr.lower() and f"{USER}:wrong" not in r.stderr, (args, r.stderr)
    r = cli(store, "pull", f"{registry}/team/absent:1", "--insecure", "--creds", f"{USER}:{PASSWORD}")
    assert r.returncode == 1 and "image pull:" in r.stderr, r.stderr
    assert cli(store, "list").stdout.startswith("no images")
    assert not any((store / "layers").iterdir()) and not any((store / "pulls").iterdir())


def test_names_of_pulled_images() -> None:
    assert default_name("Registry.example:5000/Team/App") == "registry.example:5000/team/app:latest"
    assert default_name("docker.io/library/python:3.12-slim") == "docker.io/library/python:3.12-slim"
    assert default_name("ghcr.io/x/y@sha256:" + "a" * 64).endswith("@sha256:" + "a" * 64)
