"""The sites pages may visit: served by the runner itself, through Playwright's request interception.

Every request a page makes (document, script, fetch, image, form post...)
arrives here before it leaves the browser. A request for ``http://<site>.sandboxd/<path>``
of a known site is answered from that site's directory; anything else is
aborted, whatever its address: the host's loopback, the gateway, another node,
a cloud metadata address, the internet. (The browser also runs in an empty
network namespace, so what is not intercepted, e.g. a WebSocket, has nowhere
to go either.) The bundled "Bench Shop" is ``shop``; operators add static
site directories by name.
"""

from __future__ import annotations

import mimetypes
import posixpath
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from playwright.async_api import Route

SITE_SUFFIX = ".sandboxd"
BUNDLED = {"shop": Path(__file__).parent / "sites" / "shop"}
MAX_FILE_BYTES = 16 << 20
BLANK_PATH = "/__sandboxd_blank__"  # an empty page on every site, for resetting a context between trajectories


@dataclass
class Sites:
    roots: dict[str, Path]
    _cache: dict[tuple[str, str], tuple[bytes, str] | None] = field(default_factory=dict)
    blocked: int = 0
    served: int = 0

    @classmethod
    def configured(cls, extra: dict[str, str]) -> Sites:
        roots = dict(BUNDLED)
        roots.update({name: Path(path) for name, path in extra.items()})
        for name, root in roots.items():
            if not root.is_dir():
                raise ValueError(f"site {name!r}: {root} is not a directory")
        return cls(roots)

    def origin_of(self, url: str) -> str | None:
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        if parts.scheme == "http" and host.endswith(SITE_SUFFIX) and host[: -len(SITE_SUFFIX)] in self.roots:
            return f"http://{host}"
        return None

    def url(self, site: str, path: str) -> str:
        if site not in self.roots:
            raise KeyError(site)
        return f"http://{site}{SITE_SUFFIX}{path if path.startswith('/') else '/' + path}"

    def _file(self, site: str, path: str) -> tuple[bytes, str] | None:
        key = (site, path)
        if key not in self._cache:
            rel = posixpath.normpath("/" + path).lstrip("/") or "index.html"
            root = self.roots[site].resolve()
            target = (root / rel).resolve()
            if target.is_dir():
                target = target / "index.html"
            found = None
            if target.is_relative_to(root) and target.is_file() and target.stat().st_size <= MAX_FILE_BYTES:
                kind = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
                found = (target.read_bytes(), kind)
            self._cache[key] = found
        return self._cache[key]

    async def handle(self, route: Route) -> None:
        parts = urlsplit(route.request.url)
        host = (parts.hostname or "").lower()
        site = host[: -len(SITE_SUFFIX)] if host.endswith(SITE_SUFFIX) else None
        if parts.scheme != "http" or site not in self.roots or parts.port not in (None, 80):
            self.blocked += 1
            await route.abort("blockedbyclient")
            return
        if parts.path == BLANK_PATH:
            await route.fulfill(status=200, body=b"<!doctype html><title></title>", content_type="text/html")
            return
        found = self._file(site, parts.path)
        self.served += 1
        if found is None:
            await route.fulfill(status=404, body=b"not found", content_type="text/plain")
            return
        body, kind = found
        await route.fulfill(status=200, body=body, content_type=kind, headers={"cache-control": "no-store"})
