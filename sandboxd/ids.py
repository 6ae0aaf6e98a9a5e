"""Session ids, readable on both sides of the wire: who owns a session is named in its id.

``s_<random>~<worker>~<incarnation>.<node_id>``: the node that owns it (any node forwards a session's
requests there), and on that node the worker process that holds it and which start of that worker made
it (any front process sends a session's steps straight to it, and knows at once, without asking anyone,
that a session whose worker has been replaced since is lost). Client-side code (``sandboxd.client``)
routes steps to the owner node with ``owner_of``, so this module imports nothing but the standard library.
"""

from __future__ import annotations

import base64
import hashlib
import secrets

from sandboxd.constants import SESSION_ID_BYTES


def new_session_id(node_id: str, worker: int = 0, incarnation: str = "0") -> str:
    """The random part has no dot and no ``~``, so the node is everything after the first dot. It is lowercase
    base32 (a-z, 2-7): with the worker and its hex incarnation it fits one DNS label, which is how an E2B sandbox
    is addressed (``<port>-<sandbox id>.<domain>``, ``api/e2b/names.py``), and a host name has no case."""
    return f"s_{random_part()}~{worker}~{incarnation}.{node_id}"


def random_part() -> str:
    return base64.b32encode(secrets.token_bytes(SESSION_ID_BYTES)).decode().rstrip("=").lower()


def owner_of(session_id: str) -> str | None:
    """The node id a session id names, or None for an id that is not one of ours."""
    head, dot, node = session_id.partition(".")
    return node if dot and head.startswith("s_") and node else None


def worker_of(session_id: str) -> tuple[int, str] | None:
    """The worker index and worker incarnation a session id names, or None for an id that is not one of ours."""
    head = session_id.partition(".")[0]
    parts = head.split("~")
    index = parts[1] if len(parts) == 3 else ""
    # ASCII digits only: str.isdigit() is also true of superscripts (int() refuses them) and of full-width
    # digits (int() reads them as 0-9).
    if not head.startswith("s_") or not (index.isascii() and index.isdigit()) or len(index) > 4:
        return None
    return int(index), parts[2]


def tenant_of_key(key: str) -> str:
    """The name of an API key's tenant in records, logs and metrics (a short hash: the key is never stored)."""
    return "t_" + hashlib.sha256(key.encode()).hexdigest()[:16]
