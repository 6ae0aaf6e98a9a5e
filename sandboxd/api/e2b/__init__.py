"""The E2B SDK's API (``e2b``, ``e2b-code-interpreter``), served by a node: point ``E2B_API_URL`` and
``E2B_SANDBOX_URL`` at it and the official SDKs run unchanged.

An E2B sandbox is a python session: one jail with its interpreter (the code interpreter's default context)
and its working directory. Its metadata are the session's labels; its timeout is the session's TTL, moved by
``set_timeout``; its ``envdAccessToken`` opens its data plane and nothing else (``front/auth.py``). Extra code
contexts are python sessions of their own, labelled with their sandbox and closed with it.

The control plane (``control.py``: the API key's calls: create, list, kill, ...) and a sandbox's data plane
(``data.py``: its access token's calls: code, contexts, files; ``envd.py``: envd's Connect-RPC processes and
filesystem) share what they know of a sandbox (``sandboxes.py``) and E2B's error shape (``shapes.py``).
Everything else under E2B's paths (pause, snapshots, fork, templates, volumes, network, metrics) is refused
in E2B's ``{code, message}`` shape, which every SDK raises as its own exception.

A custom template (``Sandbox.create(template=NAME)``, NAME not one of the code interpreter's) is an image of the
node's store where the container kind runs: the sandbox is a container session of it, and the image's own
python3 (``jailside/cellhost.py``) runs the same cells, run_code's and envd's, with ``/home/user`` its real
home and the whole root its to write. An image without python3 is refused at create, by name.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import APIRouter
from starlette.routing import Route

from sandboxd.api.e2b import control, data
from sandboxd.api.e2b.envd import connect_apps
from sandboxd.api.e2b.names import sandbox_in_host
from sandboxd.api.e2b.paths import CONTROL_PREFIXES, DATA_EXACT, DATA_PREFIXES, is_data_plane, is_e2b
from sandboxd.api.e2b.sandboxes import Sandboxes
from sandboxd.api.e2b.shapes import e2b_error, e2b_error_at
from sandboxd.front.auth import Auth
from sandboxd.front.gateway import Gateway
from sandboxd.front.surfaces import Surface

CONNECT_METHODS = {
    "/process.Process/": ("Start", "Connect", "List", "SendSignal", "SendInput", "CloseStdin", "Update", "StreamInput"),
    "/filesystem.Filesystem/": (
        "Stat",
        "MakeDir",
        "Move",
        "ListDir",
        "Remove",
        "WatchDir",
        "CreateWatcher",
        "GetWatcherEvents",
        "RemoveWatcher",
    ),
}
SANDBOX_ID = b"e2b-sandbox-id"


def _tenant(auth: Auth, headers: Mapping[str, str], path: bytes) -> str:
    return auth.tenant_of_e2b(headers, data_plane=is_data_plane(path))


def _sandbox_of_host(path: bytes, host: bytes, credentials: Mapping[bytes, str]) -> tuple[bytes, bytes] | None:
    """E2B's addressing (e2b 1.x's only one): a data-plane call names its sandbox by its host,
    ``<port>-<sandbox id>.<domain>``; the front door adds it as the header every layer reads."""
    if SANDBOX_ID in credentials or not is_data_plane(path):
        return None
    named = sandbox_in_host(host)
    return (SANDBOX_ID, named[1]) if named is not None else None


SURFACE = Surface(
    "e2b",
    e2b_error,
    prefixes=CONTROL_PREFIXES + DATA_PREFIXES,
    exact=DATA_EXACT,
    owns=is_e2b,
    # its key, a sandbox's access token (either name), and the sandbox a call is for
    credentials=frozenset({b"x-api-key", b"x-access-token", b"e2b-traffic-access-token", SANDBOX_ID}),
    tenant=_tenant,
    host=_sandbox_of_host,
    render_at=e2b_error_at,
)


def router(gateway: Gateway, auth: Auth) -> APIRouter:
    """Both planes' routes, and envd's Connect-RPC services (the SDK's own generated services)."""
    sandboxes = Sandboxes(gateway, auth)
    api = APIRouter()
    api.include_router(control.router(sandboxes))
    api.include_router(data.router(sandboxes))
    for prefix, app in connect_apps(sandboxes.calls).items():
        api.routes.extend(Route(prefix + name, app, methods=["POST"]) for name in CONNECT_METHODS[prefix])
    return api
