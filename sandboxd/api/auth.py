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


class Auth:
    def __init__(self, settings: NodeSettings) -> None:
        self.tenants = {hashlib.sha256(k.encode()).digest(): tenant_of_key(k) for k in settings.all_api_keys()}

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
        tenant = self.tenants.get(hashlib.sha256(token.encode()).digest())
        if tenant is None:
            raise Unauthorized("unknown API key")
        return tenant
