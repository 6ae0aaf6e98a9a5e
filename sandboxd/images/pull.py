"""An image from a registry into the node's store: ``skopeo copy`` (Debian's package, the ecosystem's tool)
to an OCI layout in the store's own ``tmp/``, then the import every image takes (``store.py``): digests
checked, layers unpacked once, owners shifted.

Credentials are skopeo's: ``--creds USER:PASSWORD`` (or ``SANDBOXD_REGISTRY_CREDS``), or an auth file in the
containers' or Docker's ``config.json`` shape (``--authfile``, or ``REGISTRY_AUTH_FILE``: a Kubernetes
``kubernetes.io/dockerconfigjson`` secret mounted as a file is one). The platform asked for is the node's own
(``--override-arch``): an index of many platforms gives this node's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from sandboxd.errors import BadRequest, SandboxSetupError
from sandboxd.images.sources import ARCH
from sandboxd.images.store import Image, ImageStore, Progress

REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-/:@]{0,254}")
PULL_TIMEOUT_S = 3600.0
# What skopeo says when the registry refused or does not have the image: the caller's to fix, not the node's.
CLIENT_SAYS = (
    "unauthorized",
    "authentication required",
    "manifest unknown",
    "not found",
    "denied",
    "invalid reference",
)


def default_name(ref: str) -> str:
    """The store's name for ``ref``: the reference itself, lowercased, ``:latest`` when it names no tag."""
    name = ref.lower()
    last = name.rsplit("/", 1)[-1]
    if ":" not in last and "@" not in last:
        name += ":latest"
    return name


def pull(
    store: ImageStore,
    ref: str,
    name: str | None = None,
    creds: str | None = None,
    authfile: str | None = None,
    tls_verify: bool = True,
    progress: Progress | None = None,
) -> Image:
    """Copy ``ref`` (``registry/repository:tag`` or ``@sha256:...``) from its registry and import it;
    ``progress`` gets skopeo's lines (a blob each) and then the import's (a layer each)."""
    if not REF.fullmatch(ref) or "//" in ref:
        raise BadRequest(f"image reference {ref[:80]!r}: registry/repository[:tag|@digest]")
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        raise SandboxSetupError("sandboxd image pull needs skopeo (Debian's package of that name)")
    store.prepare()
    # Not under tmp/, which every import collects: another pull may be downloading for minutes.
    (store.root / "pulls").mkdir(mode=0o700, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=store.root / "pulls"))
    try:
        cmd = [skopeo, "--override-arch", ARCH, "--override-os", "linux", "copy", "--retry-times", "2"]
        cmd.append(f"--src-tls-verify={'true' if tls_verify else 'false'}")
        if creds:
            cmd += ["--src-creds", creds]
        if authfile:
            if not Path(authfile).is_file():
                raise BadRequest(f"--authfile {authfile}: no such file")
            cmd += ["--src-authfile", authfile]
        cmd += [f"docker://{ref}", f"oci:{work / 'layout'}:{ref.rsplit('/', 1)[-1]}"]
        env = {k: v for k, v in os.environ.items() if k != "SANDBOXD_REGISTRY_CREDS"}
        returncode, lines = _copy(cmd, env, progress, creds)
        if returncode is None:
            raise SandboxSetupError(f"pulling {ref} took longer than {PULL_TIMEOUT_S:.0f} s") from None
        if returncode != 0:
            said = (lines or ["(nothing)"])[-1]
            if creds:
                said = said.replace(creds, "***")
            if any(word in said.lower() for word in CLIENT_SAYS):
                raise BadRequest(f"pulling {ref}: {said}")
            raise SandboxSetupError(f"pulling {ref}: skopeo failed ({returncode}): {said}")
        return store.import_image(work / "layout", name or default_name(ref), progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _copy(
    cmd: list[str], env: dict[str, str], progress: Progress | None, creds: str | None
) -> tuple[int | None, list[str]]:
    """Run skopeo, its lines passed to ``progress`` as they come (credentials never); its status (None: it ran
    past ``PULL_TIMEOUT_S`` and was killed) and its last lines."""
    deadline = time.monotonic() + PULL_TIMEOUT_S
    tail: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        assert proc.stdout is not None
        killer = threading.Timer(PULL_TIMEOUT_S, proc.kill)
        killer.start()
        try:
            for raw in proc.stdout:
                line = raw.rstrip()
                if creds:
                    line = line.replace(creds, "***")
                if line:
                    tail = [*tail[-9:], line]
                    if progress is not None:
                        progress(line)
            proc.wait()
        finally:
            killer.cancel()
    return (None if time.monotonic() > deadline else proc.returncode), tail
