"""Session ids, readable on both sides of the wire: the node that owns a session is named in its id.

Client-side code (``sandboxd.client``) routes a session's steps straight to its owner with this, so it
lives apart from the server's stores and imports nothing but the standard library.
"""

from __future__ import annotations

import secrets

from sandboxd.constants import SESSION_ID_BYTES


def new_session_id(node_id: str) -> str:
    """``s_<random>.<node_id>``: the random part has no dot, so the owner is everything after the first."""
    return f"s_{secrets.token_urlsafe(SESSION_ID_BYTES)}.{node_id}"


def owner_of(session_id: str) -> str | None:
    """The node id a session id names, or None for an id that is not one of ours."""
    head, dot, node = session_id.partition(".")
    return node if dot and head.startswith("s_") and node else None
