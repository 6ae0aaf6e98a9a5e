"""An E2B sandbox's id is one lowercase DNS label, because that is how E2B addresses a sandbox: the SDKs (and
e2b 1.x, which knows no other way) reach it at ``https://<port>-<sandbox id>.<E2B_DOMAIN>``, and a TLS
wildcard certificate covers one label only. A session id is not one: its node id may hold dots, capitals and
underscores.

So the facade names a sandbox ``<random>-<worker>-<incarnation>-<node tag>``: the session id's own parts, with
the node id replaced by a short hash of it (``node_tag``), which any node maps back through the nodes it knows
(itself and the cluster's registry). The names are translated where the facade meets the SDK (paths, headers,
bodies); inside, everything is the session id. A sandbox's access token is a MAC of its name, so the front
door checks it without knowing the cluster.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from collections.abc import Collection
from typing import TYPE_CHECKING

from sandboxd.errors import UnknownSession
from sandboxd.ids import owner_of

if TYPE_CHECKING:
    from sandboxd.front.gateway import Gateway

# The session id's parts (sandboxd/ids.py): lowercase base32 random part, worker index, hex incarnation.
SESSION = re.compile(r"s_([a-z2-7]{1,40})~(\d{1,4})~([0-9a-f]{0,16})\.(.+)")
NAME = re.compile(r"([a-z2-7]{1,40})-(\d{1,4})-([0-9a-f]{0,16})-([a-z2-7]{8})")


@functools.lru_cache(maxsize=1024)
def node_tag(node_id: str) -> str:
    """Eight base32 characters of the node id's hash: 40 bits, so two nodes of one cluster never share one."""
    return base64.b32encode(hashlib.sha256(node_id.encode()).digest()[:5]).decode().lower()


def sandbox_name(session_id: str) -> str:
    """The E2B id of a sandbox that is the session ``session_id``. A session made before ids were DNS labels (a
    node of an earlier release, in a cluster being upgraded) keeps its session id: reachable by URL, not by
    domain."""
    match = SESSION.fullmatch(session_id)
    if match is None:
        return session_id
    random, worker, incarnation, node = match.groups()
    return f"{random}-{worker}-{incarnation}-{node_tag(node)}"


def session_of(name: str, nodes: Collection[str]) -> str | None:
    """The session an E2B id names, if it is one of ours and its node is among ``nodes`` (else None: as unknown
    to the caller as an id never issued). A session id itself (an earlier release's sandbox) names itself."""
    match = NAME.fullmatch(name)
    if match is None:
        return name if owner_of(name) in nodes else None
    random, worker, incarnation, tag = match.groups()
    node = next((n for n in nodes if node_tag(n) == tag), None)
    return None if node is None else f"s_{random}~{worker}~{incarnation}.{node}"


def session_named(gateway: Gateway, name: str) -> str:
    """The session an E2B id names, among the nodes ``gateway`` knows; a sandbox not found otherwise."""
    session_id = session_of(name, known_nodes(gateway))
    if session_id is None:
        raise UnknownSession(f"sandbox {name[:80]!r} not found")
    return session_id


SESSION_IN_TEXT = re.compile(r"s_[a-z2-7]{1,40}~\d{1,4}~[0-9a-f]{0,16}\.[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")


def public_message(message: str, session_id: str | None) -> str:
    """An error's message as the SDK's caller should read it: every sandbox (or context) by its E2B id, never by
    a session id inside (which names its worker, its start and its node), whichever layer wrote the message
    and whether or not it said which session it was about."""
    if session_id:
        message = message.replace(session_id, sandbox_name(session_id))
    return SESSION_IN_TEXT.sub(lambda m: sandbox_name(m.group(0)), message)


def known_nodes(gateway: Gateway) -> list[str]:
    """This node, then the cluster's nodes alive and those seen alive before (a session of a node that died is
    found, and answers as lost)."""
    cluster = gateway.cluster
    if cluster is None:
        return [gateway.node_id]
    return [gateway.node_id, *cluster.registry.peers, *cluster.registry.known]


def sandbox_in_host(host: bytes) -> tuple[bytes, bytes] | None:
    """The port and sandbox id a ``Host`` header names (``<port>-<sandbox id>.<domain>[:port]``), or None for
    any other host (``api.<domain>``, an address, a name without the port's prefix)."""
    label = host.split(b".", 1)[0]
    port, dash, name = label.partition(b"-")
    if not dash or not port.isdigit() or len(port) > 5 or not name or b"." not in host:
        return None
    return port, name.lower()
