"""What ``sandboxd bench`` measures: one node, several, or a Service URL, and the key they take.

Every node off loopback has API keys, so a bench an operator can point at a fleet must send one; and a key
is a credential: it is read from the environment (``SANDBOXD_API_KEY``), a file (``--api-key-file``) or the
URL form the node accepts (``http://key:<key>@node``), never from a command-line value (``ps`` shows those),
and never written anywhere: results, reports, logs and uploads name a target by its ``display`` form,
which has no user information.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

KEY_ENV = "SANDBOXD_API_KEY"


class TargetError(ValueError):
    """A target or key that cannot be used; the message names it (never the key)."""


def _clean(url: str) -> tuple[str, str | None]:
    """``url`` without its user information, and the key it carried (the password, else the user name)."""
    parts = urlsplit(url.strip())
    shown = urlunsplit((parts.scheme, parts.hostname or "", parts.path, "", ""))
    if parts.scheme == "https":
        raise TargetError(
            f"--target {shown!r}: the load generator speaks plain http:// (drive the nodes' own port, from inside "
            "their network, not a TLS front)"
        )
    if parts.scheme != "http" or not parts.hostname:
        raise TargetError(f"--target {shown!r} is not an http:// URL of a node")
    key = parts.password or parts.username or None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", "")), key


@dataclass(frozen=True)
class Target:
    """The nodes a bench drives (their URLs without credentials) and the key every request carries."""

    urls: tuple[str, ...]
    api_key: str | None = field(default=None, repr=False)

    @classmethod
    def parse(cls, values: list[str], key_file: str | None = None, environ: dict[str, str] | None = None) -> Target:
        """``values``: ``--target`` as given (repeatable; each may be comma-separated). The key: the URL's own,
        else ``key_file``'s first line, else ``SANDBOXD_API_KEY``; URLs naming two different keys are refused."""
        urls: list[str] = []
        keys: set[str] = set()
        for value in values:
            for part in value.split(","):
                if part.strip():
                    url, key = _clean(part)
                    urls.append(url)
                    if key:
                        keys.add(key)
        if not urls:
            raise TargetError("--target names no node")
        if len(keys) > 1:
            raise TargetError("the --target URLs carry different keys: a bench sends one")
        key = keys.pop() if keys else None
        if key is None and key_file:
            try:
                lines = Path(key_file).read_text().split()
            except OSError as exc:
                raise TargetError(f"--api-key-file {key_file}: {exc.strerror or exc}") from exc
            if not lines:
                raise TargetError(f"--api-key-file {key_file} is empty")
            key = lines[0]
        if key is None:
            key = (os.environ if environ is None else environ).get(KEY_ENV) or None
        return cls(tuple(dict.fromkeys(urls)), key)

    @classmethod
    def of(cls, target: str | Target) -> Target:
        """A target given as a plain string (comma-separated URLs, as the comparison scripts pass them)."""
        return target if isinstance(target, Target) else cls.parse([target], environ={})

    @property
    def first(self) -> str:
        return self.urls[0]

    @property
    def display(self) -> str:
        """How results and the console name it: URLs only, never a key."""
        return ",".join(self.urls)

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def url_of(self, loop: int) -> str:
        """The node loop number ``loop`` (counted over every load process) keeps to: spread evenly."""
        return self.urls[loop % len(self.urls)]

    @property
    def local(self) -> bool:
        return all((urlsplit(u).hostname or "") in ("127.0.0.1", "localhost", "::1") for u in self.urls)
