"""Wildcard DNS for one test domain, in the E2B SDK's own process: ``<anything>.$WILDCARD_DOMAIN:443`` resolves
to the TLS terminator on loopback (tests/tlsfront.py, ``direct_port``), as a wildcard record and an Ingress would
serve it. The SDK still connects to, verifies and sends the names E2B's addressing gives; only the lookup is
answered here (e2b 1.x's data-plane clients ignore proxies, so the CONNECT proxy cannot stand in for DNS)."""

import os
import socket

_DOMAIN = os.environ.get("WILDCARD_DOMAIN", "")
_PORT = int(os.environ.get("WILDCARD_PORT", "0"))
_lookup = socket.getaddrinfo


def _getaddrinfo(host, port, *args, **kwargs):  # type: ignore[no-untyped-def]
    name = host.decode() if isinstance(host, bytes) else host
    if _DOMAIN and isinstance(name, str) and name.endswith("." + _DOMAIN) and str(port) == "443":
        return _lookup("127.0.0.1", _PORT, *args, **kwargs)
    return _lookup(host, port, *args, **kwargs)


socket.getaddrinfo = _getaddrinfo
