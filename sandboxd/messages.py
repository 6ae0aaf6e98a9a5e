"""The requests a node's processes send each other over their links (``links.py``), one type per operation.

A link's frame header is a JSON object with an ``op`` and that operation's fields; these ``TypedDict``\\ s say
which fields each operation carries, so the sender and the handler agree by type, not by string keys read in
two places. They are plain dicts at run time: nothing is built or checked per message on the hot path (a step's
header is three fields). Each process dispatches on ``op`` through a table of its handlers
(``worker/service.py``, ``node/core.py``); what answers carry is the handlers' business (their return types).

Lifetimes travel under one name: ``ttl_s`` and ``idle_timeout_s``, as the API names them.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

# ------------------------------------------------------------------ front -> worker


class StepCall(TypedDict):
    """``step``: the body is the client's ``StepRequest`` JSON, as it came."""

    tenant: str
    t0: float  # when the front took it (monotonic): the step's latency and queue deadline start here
    step_key: NotRequired[str | None]  # a session step's key, for an interrupt that must name it
    deadline: NotRequired[float | None]  # a one-shot's queue deadline (monotonic)
    answer_by: NotRequired[float | None]  # when the caller stops listening (monotonic)


class SessionCall(TypedDict):
    """``info``: one session of the tenant's."""

    session_id: str
    tenant: str


class CloseCall(SessionCall):
    """``close``: the session ends; ``why`` is what its description says after."""

    why: NotRequired[str]


class DeadlineCall(SessionCall):
    """``deadline``: the session ends ``timeout_s`` from now (within the node's TTL)."""

    timeout_s: float


class InterruptCall(SessionCall):
    """``interrupt``: the step its caller named (``step_key``) is interrupted, never another's."""

    step_key: str | None


class OwnerCall(TypedDict):
    """``owner``: the tenant of a session that carries ``labels`` (a session reached by its id alone, as an E2B
    sandbox made with ``secure: false`` is); unknown for any other session."""

    session_id: str
    labels: dict[str, str]
    named: list[str]  # labels it must carry too, whatever their values


class StatusCall(TypedDict):
    """``status``: the states of the tenant's sessions named."""

    tenant: str
    session_ids: list[str]


class SelectCall(TypedDict):
    """``select``: list, renew or close the tenant's sessions that carry ``labels``."""

    tenant: str
    labels: dict[str, str]
    what: str  # list, renew, close
    idle_timeout_s: NotRequired[float | None]  # renew: the new idle timeout


class WorkerHello(TypedDict):
    """``hello``: who is on the other end (a front, or the node process)."""

    role: str
    index: NotRequired[int]


# ------------------------------------------------------------------ node -> worker


class OpenCall(TypedDict):
    """``open``: a new session the node placed here, its lifetimes resolved (at most the node's)."""

    session_id: str
    runner: str
    tenant: str
    options: dict[str, object]
    labels: dict[str, str]
    ttl_s: float
    idle_timeout_s: float


class ForkCall(TypedDict):
    """``fork``: ``new_ids`` sessions, copies of ``source``'s state; all or none."""

    source: str
    tenant: str
    new_ids: list[str]
    ttl_s: float
    idle_timeout_s: float


# ------------------------------------------------------------------ front -> node


class NodeHello(TypedDict):
    """``hello``: a front process joins its node."""

    index: int
    pid: int


class CreateCall(TypedDict):
    """``create``: a new session, placed by the node within the tenant's quota."""

    tenant: str
    runner: str
    options: dict[str, object]
    ttl_s: float | None
    idle_timeout_s: float | None
    labels: dict[str, str]


class NodeForkCall(TypedDict):
    """``fork``: ``n`` copies of a session, within the tenant's quota."""

    source: str
    tenant: str
    n: int
    ttl_s: float | None
    idle_timeout_s: float | None


class KvCall(TypedDict):
    """``kv``: the node's idempotency keys (claim, get, put, delete)."""

    key: str
    what: str
    value: NotRequired[str]
    ttl_ms: NotRequired[int]
