"""What both planes of the E2B facade know of a sandbox: how one is named, found, described and settled.

A sandbox is a session carrying ``TEMPLATE_LABEL``: a python session for the code interpreter's templates, a
container session of the image a custom template names. Everything else (a native session, an extra code
context) is not a sandbox, and is answered as one never issued.
"""

from __future__ import annotations

import datetime
from typing import Any

from sandboxd.api.e2b import names
from sandboxd.api.e2b.envd import SandboxCalls
from sandboxd.api.e2b.labels import OPEN_LABEL, OWN_PREFIX, TEMPLATE_LABEL
from sandboxd.api.e2b.names import sandbox_name
from sandboxd.constants import SESSION_HOME
from sandboxd.errors import BadRequest, SandboxdError, UnknownSession
from sandboxd.front.auth import Auth
from sandboxd.front.gateway import Gateway
from sandboxd.models import SessionInfo, StepRequest, _checked_labels

TEMPLATES = ("base", "code-interpreter-v1", "code-interpreter")  # what the SDKs create by default
CONTAINER = "container"  # the kind a custom template's sandbox is: a session of the image the template names
ENVD_VERSION = "0.5.2"  # the envd features served (closing stdin: 0.5.2); not octet-stream uploads (0.5.7)
HOME = SESSION_HOME  # E2B's home: a sandbox's working directory, its /tmp under that name too


def iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


def metadata_of(labels: dict[str, str]) -> dict[str, str]:
    """A sandbox's metadata: its labels but the facade's own."""
    return {k: v for k, v in labels.items() if not k.startswith(OWN_PREFIX)}


class Sandboxes:
    """The node's sandboxes as the E2B SDK sees them, for both planes' routes."""

    def __init__(self, gateway: Gateway, auth: Auth) -> None:
        self.gateway = gateway
        self.auth = auth
        self.calls = SandboxCalls(gateway, auth)
        # Each kind's sandbox size (what ``described`` reports): a python session's, or a template's container.
        kinds = [kind for kind in ("python", CONTAINER) if kind in gateway.kinds]
        self.sizes = {kind: gateway.settings.runner_config(kind) for kind in kinds}

    def session_named(self, name: str) -> str:
        return names.session_named(self.gateway, name)

    async def info(self, tenant: str, sandbox_id: str) -> SessionInfo:
        """The sandbox ``sandbox_id`` (a session id) if it is one of the tenant's sandboxes; else as unknown."""
        try:
            info = await self.gateway.session_info(sandbox_id, tenant)
        except SandboxdError as exc:
            exc.session_id = exc.session_id or sandbox_id  # named by its E2B id to the caller
            raise
        if TEMPLATE_LABEL not in info.labels:  # a session of the native API, or a context: not a sandbox
            raise UnknownSession(f"sandbox {sandbox_name(sandbox_id)!r} not found", session_id=sandbox_id)
        return info

    def described(self, info: SessionInfo, tenant: str, detail: bool = True) -> dict[str, Any]:
        """A sandbox as E2B's API describes one (``detail``: as ``get`` and ``list`` do, more than a create)."""
        name = sandbox_name(info.session_id)
        # A sandbox reached by its id alone has no token, as on E2B (the SDK then sends none)
        token = None if OPEN_LABEL in info.labels and self.auth.e2b_by_id else self.auth.access_token(tenant, name)
        body: dict[str, Any] = {
            "templateID": info.labels.get(TEMPLATE_LABEL, "base"),
            "sandboxID": name,
            "clientID": info.node_id,
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": token,
            "trafficAccessToken": token,  # what the code interpreter sends: the same token
        }
        if detail:
            size = self.sizes.get(info.runner)  # its kind's sandbox: a python session's, or a template's container
            cpus = max(1, int(getattr(size, "cpu_cores", 1)))
            body.update(
                startedAt=iso(info.created_at),
                endAt=iso(datetime.datetime.now(datetime.UTC).timestamp() + info.expires_in_s),
                cpuCount=cpus,
                memoryMB=int(getattr(size, "memory_mb", 512)),
                diskSizeMB=int(getattr(size, "tmpfs_mb", 64)),
                state="running",
                metadata=metadata_of(info.labels),
            )
        return body

    async def settle(self, session_id: str, tenant: str, env_vars: dict[str, str], runner: str = "python") -> None:
        """A new interpreter as E2B's starts: in the home (its /tmp, bound at /home/user in session jails; a
        container's own /home/user), with HOME and the sandbox's envVars set, and a ``.profile`` there that keeps
        the interpreter's PATH for the login shell every ``commands.run`` is (Debian's /etc/profile would put the
        system's python3 first, and no ``python`` at all; an image's own ``.profile`` is left as it is). A session
        that cannot be settled is closed and the create refused."""
        env = {"HOME": HOME, **env_vars}
        code = (
            f"import os as _o, shlex as _s; _o.chdir({HOME!r}); _o.environ.update({env!r})\n"
            f"if {runner != CONTAINER!r} or not _o.path.exists('.profile'):\n"
            "    with open('.profile', 'w') as _f:\n"
            "        _f.write('# what a login shell reads (commands.run): the sandbox\\'s python first, as "
            "run_code\\'s\\n' 'export PATH=' + _s.quote(_o.environ['PATH']) + '\\n')\n"
            "del _o, _s\nglobals().pop('_f', None)\n"
        )
        step = StepRequest(runner=runner, action={"code": code}, session_id=session_id)
        result = await self.gateway.step(step, tenant)
        if not result.ok:
            await self.gateway.close_session(session_id, tenant, "its envVars could not be set")
            why = result.error.message if result.error else ""
            seen = result.observation or {}
            if runner == CONTAINER and seen.get("exit_code") == 127:
                raise BadRequest(
                    "the template's image has no python3 on its PATH: an E2B sandbox here runs its code, commands "
                    "and files through it (the native API's container sessions run images without one)"
                )
            raise BadRequest(f"envVars could not be set: {why}; {str(seen.get('stderr'))[-300:]}")

    @staticmethod
    def labels_of(metadata: dict[str, str], template: str) -> dict[str, str]:
        """A new sandbox's labels: its metadata (none under the facade's prefix) and its template."""
        if reserved := [k for k in metadata if k.startswith(OWN_PREFIX)]:
            raise BadRequest(f"metadata: {reserved[0]!r}: names under {OWN_PREFIX} are the facade's own")
        try:
            return _checked_labels({**metadata, TEMPLATE_LABEL: template})
        except ValueError as exc:
            raise BadRequest(f"metadata: {exc}") from None
