"""API keys: each key is a tenant; sessions, idempotency keys and quotas belong to it.

Keys are compared by their SHA-256 (a dict lookup, no early-exit string
compare on the secret), and only a short hash of the key ever names the
tenant in records, logs and metrics: a key is never stored or printed.
Without keys (the embedded default, loopback only) every client is the one
tenant ``anonymous``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping

from starlette.requests import HTTPConnection

from sandboxd.cluster.forward import CALLER, FORWARDED_BY, Caller
from sandboxd.config import NodeSettings
from sandboxd.errors import Unauthorized
from sandboxd.ids import tenant_of_key

ANONYMOUS = "anonymous"


def _key(header: str) -> str:
    """The key of ``Bearer <key>``, or the password of ``Basic base64(any:<key>)``.

    Basic is for clients that cannot set headers but take a URL: OpenEnv's official
    client builds its WebSocket from the base URL, and a URL's user info
    (``http://key:<key>@node:8080/envs/textgame``) becomes a Basic header, so the key
    travels as a header and never in a path or a query string that logs would keep.
    """
    scheme, _, value = header.partition(" ")
    value = value.strip()
    if scheme.lower() == "bearer":
        return value
    if scheme.lower() == "basic" and value:
        try:
            decoded = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return ""
        return decoded.partition(":")[2]
    return ""


E2B_TOKEN_CONTEXT = b"sandboxd e2b access token\0"  # what a key is hashed with to sign its sandboxes' tokens
# The caller of an E2B data-plane call that carries no credential, where the operator serves sandboxes made with
# ``secure: false`` (``e2b_insecure_sandboxes``): the sandbox it names says its tenant, if it is such a sandbox
# (``SandboxCalls.caller``). No key's tenant has this name (theirs are ``t_<hex>``).
BY_SANDBOX_ID = "\0by-sandbox-id"
NO_TOKEN = (
    "this sandbox call carries no access token (X-Access-Token or E2B-Traffic-Access-Token), and e2b-code-interpreter "
    "before 2.0 sends none with run_code"
)


class Auth:
    def __init__(self, settings: NodeSettings) -> None:
        keys = settings.all_api_keys()
        self.tenants = {hashlib.sha256(k.encode()).digest(): tenant_of_key(k) for k in keys}
        # Per tenant, the secret its E2B sandboxes' access tokens are signed with: derived from its key, so every
        # front process and every node of a cluster (they share the keys) checks a token without shared state.
        self.signing = {tenant_of_key(k): hashlib.sha256(E2B_TOKEN_CONTEXT + k.encode()).digest() for k in keys}
        self.e2b_by_id = settings.e2b_insecure_sandboxes

    @property
    def enabled(self) -> bool:
        return bool(self.tenants)

    async def __call__(self, request: HTTPConnection) -> str:
        """A FastAPI dependency; async so that ``CALLER`` is set in the request's own context (FastAPI runs a
        sync dependency in a thread, whose context the route never sees)."""
        return self.tenant_of(request)

    def tenant_of(self, request: HTTPConnection) -> str:
        """The tenant of this request or WebSocket; ``Unauthorized`` (401) otherwise.

        Also records the caller's credential in ``CALLER``: a request for a session another node owns is
        forwarded with it, and that node authenticates the caller itself.
        """
        CALLER.set(Caller(request.headers.get("authorization"), request.headers.get(FORWARDED_BY)))
        return self.tenant_of_header(request.headers.get("authorization", ""))

    def tenant_of_header(self, authorization: str) -> str:
        """The tenant an ``Authorization`` header's value names; ``Unauthorized`` otherwise."""
        if not self.tenants:
            return ANONYMOUS
        token = _key(authorization)
        if not token:
            raise Unauthorized("this node needs an API key: send 'Authorization: Bearer <key>'")
        return self.tenant_of_key(token)

    def tenant_of_e2b(self, headers: Mapping[str, str], data_plane: bool) -> str:
        """The tenant of a request that may carry the E2B SDK's credentials, by one rule for the front door, the
        E2B routes and envd's services: on a sandbox's data plane its access token (an ``Authorization`` beside
        it names envd's user, Basic "user:", not a key); else ``X-API-Key`` when no ``Authorization`` is sent;
        else ``Authorization``. Header names are lower case, as every caller's mapping gives them."""
        token = headers.get("x-access-token") or headers.get("e2b-traffic-access-token")
        if token is not None and data_plane:
            return self.tenant_of_access_token(token, headers.get("e2b-sandbox-id") or "")
        key = headers.get("x-api-key")
        authorization = headers.get("authorization")
        if data_plane and authorization is not None and not _key(authorization):
            authorization = None  # envd's user (Basic "user:", every envd call of the SDK's), not a key
        if key is not None and authorization is None:
            return self.tenant_of_key(key)
        if data_plane and key is None and authorization is None and self.enabled:
            if self.e2b_by_id:
                return BY_SANDBOX_ID
            raise Unauthorized(
                f"{NO_TOKEN}: every sandbox here is secure (the node's SANDBOXD_E2B_INSECURE_SANDBOXES is off: "
                "sandboxes created with secure: false, reached by their id alone, are not served)"
            )
        return self.tenant_of_header(authorization or "")

    def tenant_of_key(self, key: str) -> str:
        if not self.tenants:
            return ANONYMOUS
        tenant = self.tenants.get(hashlib.sha256(key.encode()).digest())
        if tenant is None:
            raise Unauthorized("unknown API key")
        return tenant

    def access_token(self, tenant: str, sandbox_id: str) -> str:
        """An E2B sandbox's ``envdAccessToken``: its tenant and a MAC of its id under the tenant's key. It opens
        that sandbox's data plane (code, files, processes) and nothing else."""
        secret = self.signing.get(tenant, b"")
        return f"{tenant}.{hmac.new(secret, sandbox_id.encode(), hashlib.sha256).hexdigest()}"

    def tenant_of_access_token(self, token: str, sandbox_id: str) -> str:
        """The tenant of a sandbox's access token, if it is that sandbox's; ``Unauthorized`` otherwise."""
        if not self.tenants:
            return ANONYMOUS
        tenant, _, _ = token.partition(".")
        if tenant not in self.signing or not hmac.compare_digest(token, self.access_token(tenant, sandbox_id)):
            raise Unauthorized("the access token is not this sandbox's")
        return tenant
