"""What each API surface declares once, read by the app and by the front door alike.

A surface (sandboxd's own, SandboxFusion's ``/run_code``, OpenEnv's ``/envs``, E2B's API, MCP, the operations
paths) answers errors in its clients' shape, owns some paths, serves some of them to anyone, and may take
credentials in headers of its own. Its routes render their errors with ``render``; the front door refuses a
request before any route runs (too large, too slow, no key, at capacity) and must answer in the same shape,
or a client parses a shape it has never seen: SDKs crash on a body without their ``code``, verl retries only
a 504. Both read the one declaration, which the app builds from the surfaces it serves (``app.py``); adding a
surface is its package and one entry there. A path no surface owns gets sandboxd's own shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import orjson
from starlette.responses import Response

from sandboxd.errors import SandboxdError
from sandboxd.front.auth import Auth

ErrorRenderer = Callable[[SandboxdError], Response]
# The tenant of a request carrying a surface's own credential headers: (auth, lower-case headers, path).
TenantRule = Callable[[Auth, Mapping[str, str], bytes], str]
# A header a request's Host implies for a path (E2B names a sandbox by its host name), or None.
HostRule = Callable[[bytes, bytes, Mapping[bytes, str]], tuple[bytes, bytes] | None]


class DropConnection(Exception):
    """Raised by an answer that has started: the connection closes without the rest of it. E2B's proxy drops the
    connection of a sandbox that ends during a request, and the SDKs read exactly that as "the sandbox was
    killed while the request was in progress"."""


def json_response(data: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json", headers=headers)


def retry_headers(retry_after_s: float | None) -> dict[str, str] | None:
    """HTTP Retry-After in whole seconds, never 0 (clients would retry in a hot loop)."""
    return {"Retry-After": str(max(1, int(retry_after_s + 0.999)))} if retry_after_s is not None else None


def native_error(exc: SandboxdError) -> Response:
    """sandboxd's own shape: the same body as a failed step result."""
    err = {"blame": exc.blame, "code": exc.code, "message": exc.message, "retry_after_s": exc.retry_after_s}
    body = {"ok": False, "status": exc.status, "error": err}
    return json_response(body, exc.status, retry_headers(exc.retry_after_s))


def _nothing(_: bytes) -> bool:
    return False


@dataclass(frozen=True)
class Surface:
    """One surface's declaration. ``prefixes`` and ``exact`` say which paths are its own (``owns`` narrows
    them when a prefix alone would take too many); ``public`` and ``public_exact`` which of them anyone may
    call; ``credentials`` the headers besides ``Authorization`` that carry its callers' credentials, read by
    ``tenant``; ``host`` a header the request's ``Host`` implies."""

    name: str
    render: ErrorRenderer
    prefixes: tuple[bytes, ...] = ()
    exact: frozenset[bytes] = frozenset()
    owns: Callable[[bytes], bool] | None = None
    public_exact: frozenset[bytes] = frozenset()
    public: Callable[[bytes], bool] = _nothing  # asked only of its own paths
    credentials: frozenset[bytes] = frozenset()
    tenant: TenantRule | None = None
    host: HostRule | None = None
    render_at: Callable[[SandboxdError, bytes], Response] | None = None  # where a path's shape is not ``render``'s

    def has(self, path: bytes) -> bool:
        if path not in self.exact and not (self.prefixes and path.startswith(self.prefixes)):
            return False
        return self.owns is None or self.owns(path)


class Surfaces:
    """The surfaces one app serves, as the front door asks of them per request: kept as sets and one
    ``startswith`` per surface, because the public check runs on every request."""

    def __init__(self, surfaces: Sequence[Surface]) -> None:
        self.all = tuple(surfaces)
        self.public_exact = frozenset().union(*(s.public_exact for s in self.all))
        self.credentials = {name: s for s in self.all for name in s.credentials}
        self.host_rules = tuple(s.host for s in self.all if s.host is not None)
        names = [s.name for s in self.all]
        duplicated = {n for n in names if names.count(n) > 1}
        if duplicated:
            raise ValueError(f"surfaces declared twice: {sorted(duplicated)}")
        claimed = [name for s in self.all for name in s.credentials]
        if len(claimed) != len(set(claimed)):
            raise ValueError("two surfaces declare the same credential header")

    def owner(self, path: bytes) -> Surface | None:
        for surface in self.all:
            if surface.has(path):
                return surface
        return None

    def is_public(self, path: bytes) -> bool:
        if path in self.public_exact:
            return True
        owner = self.owner(path)
        return owner is not None and owner.public(path)

    def render(self, exc: SandboxdError, path: bytes) -> Response:
        """The answer a route of ``path``'s surface would give for ``exc``."""
        owner = self.owner(path)
        if owner is None:
            return native_error(exc)
        return owner.render_at(exc, path) if owner.render_at is not None else owner.render(exc)

    def tenant(self, auth: Auth, authorization: str | None, credentials: Mapping[bytes, str], path: bytes) -> str:
        """The tenant of a request's credentials: a surface's own headers by its rule, else ``Authorization``."""
        if credentials:
            surface = self.credentials[next(iter(credentials))]
            if surface.tenant is not None:
                headers = {name.decode(): value for name, value in credentials.items()}
                if authorization is not None:
                    headers["authorization"] = authorization
                return surface.tenant(auth, headers, path)
        return auth.tenant_of_header(authorization or "")
