"""Request and response models of the API surfaces and of the node's own processes (the edge: pydantic, strict)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from sandboxd.errors import SandboxdError, from_dict

Blame = Literal["program", "client", "infra"]


class Limits(BaseModel):
    """Per-step limits; each is clamped to the node's configured maximum."""

    model_config = ConfigDict(extra="forbid")

    memory_mb: int | None = Field(None, ge=16, description="Memory cap of this step's sandbox (at most the node's).")
    max_output_bytes: int | None = Field(None, ge=1, description="Bytes of stdout/stderr kept (at most the node's).")


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runner: str = Field(..., min_length=1, max_length=64, description="Runner kind, e.g. 'python'.")
    action: dict[str, Any] = Field(
        ..., description="What to run: the runner kind's action (GET /runners/{kind} gives its schema)."
    )
    session_id: str | None = Field(
        None, max_length=128, description="Run inside this session (state persists); none = one-shot, fresh sandbox."
    )
    timeout_s: float | None = Field(
        None, gt=0, description="Execution time limit (default: the node's default_timeout_s)."
    )
    limits: Limits | None = None
    idempotency_key: str | None = Field(
        None, min_length=1, max_length=256, description="Retries with the same key return the first result."
    )
    rollout_id: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="The rollout this step belongs to: when steps queue, the oldest rollout's go first "
        "(scheduling 'oldest_rollout'); steps without one keep arrival order.",
    )


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: list[StepRequest] = Field(
        ..., min_length=1, description="Run concurrently; results come back in this order."
    )


class ErrorInfo(BaseModel):
    blame: Blame = Field(
        ...,
        description=(
            "program: the code failed; infra: the service failed (mask it, don't score it); "
            "client: the request was wrong."
        ),
    )
    code: str = Field(
        ..., description="Stable machine-readable reason, e.g. program_exit, program_timeout, saturated, worker_died."
    )
    message: str
    retry_after_s: float | None = None


class StepResult(BaseModel):
    ok: bool = Field(..., description="True when the step ran and the program succeeded (exit 0, not killed).")
    status: int = Field(200, description="HTTP status this result would have on its own (useful inside a batch).")
    observation: dict[str, Any] | None = Field(
        None, description="The runner kind's observation (GET /runners/{kind} gives its schema)."
    )
    error: ErrorInfo | None = None
    latency_ms: float
    worker: int | None = None
    runner: str | None = None
    session_id: str | None = None

    def not_the_programs(self) -> SandboxdError | None:
        """The failure, rebuilt as its error class, when it is not the program's (the client's or ours).

        Surfaces with their own error shapes (SandboxFusion, OpenEnv, MCP) raise or render it; a
        program's own failure stays a result.
        """
        if self.error is None or self.error.blame == "program":
            return None
        return from_dict(self.error.model_dump() | {"worker": self.worker, "session_id": self.session_id})


class BatchResult(BaseModel):
    results: list[StepResult]


LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./-]{0,62}")
MAX_LABELS = 16
MAX_LABEL_VALUE = 256


def _checked_labels(labels: dict[str, str]) -> dict[str, str]:
    """Labels select sessions by run (``run_id``), job or trainer: few, short, printable, so selecting thousands
    of sessions stays a scan of small dicts and a label never carries a payload."""
    if len(labels) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels, got {len(labels)}")
    for key, value in labels.items():
        if not LABEL_KEY.fullmatch(key):
            raise ValueError(f"label name {key[:80]!r}: 1-63 of A-Z a-z 0-9 _ . / -, starting with a letter or digit")
        if len(value) > MAX_LABEL_VALUE or not value.isprintable():
            raise ValueError(f"label {key!r}: its value must be printable and at most {MAX_LABEL_VALUE} characters")
    return labels


Labels = Annotated[dict[str, str], AfterValidator(_checked_labels)]


class SessionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    runner: str = Field("python", min_length=1, max_length=64)
    ttl_s: float | None = Field(None, gt=0, description="Session lifetime (at most the node's session_ttl_s).")
    idle_timeout_s: float | None = Field(
        None, gt=0, description="Closed after this long without a step (at most the node's)."
    )
    options: dict[str, Any] = Field(default_factory=dict, description="Runner-specific session options.")
    labels: Labels = Field(
        default_factory=dict,
        description='Names to select the session by later (e.g. {"run_id": "grpo-17"}): list, renew and close '
        "every session of a run in one call. Forked copies keep their source's labels.",
    )
    idempotency_key: str | None = Field(None, min_length=1, max_length=256)


class SessionInfo(BaseModel):
    session_id: str = Field(
        ..., description="s_<random>~<worker>~<incarnation>.<node_id>: the node that owns it is part of the id."
    )
    runner: str
    node_id: str
    worker: int
    created_at: float
    expires_in_s: float
    idle_expires_in_s: float
    steps: int
    labels: dict[str, str] = Field(default_factory=dict)


class SessionTimeout(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(
        ...,
        gt=0,
        le=7 * 86400,
        description="The session ends this long from now (within the node's session_ttl_s counted from its creation).",
    )


class SessionSelect(BaseModel):
    """Sessions of the caller's tenant that carry all these labels (on every node of a cluster)."""

    model_config = ConfigDict(extra="forbid")

    labels: Labels = Field(..., min_length=1, description="Every one must match (at least one label).")


class SessionKeepalive(SessionSelect):
    idle_timeout_s: float | None = Field(
        None,
        gt=0,
        description="Also set the sessions' idle timeout (at most the node's). A trainer renews every third of "
        "it; when it dies, its sessions end one idle timeout after its last renewal.",
    )


class SessionsSelected(BaseModel):
    """How many sessions a call closed or renewed, and the nodes that could not be asked (their sessions were
    not touched: call again)."""

    count: int
    unreached: list[str] = Field(default_factory=list)


class SessionList(BaseModel):
    sessions: list[SessionInfo]
    unreached: list[str] = Field(default_factory=list)


class SessionStatusRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_ids: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(..., min_length=1, max_length=1_000)


class SessionState(BaseModel):
    state: Literal["live", "lost", "ended", "unknown"] = Field(
        ..., description="live; lost (its sandbox died: 410 to steps); ended (closed, expired); unknown (never ours)."
    )
    why: str | None = Field(None, description="Why it is lost or ended, when known.")
    session: SessionInfo | None = None


class SessionStatuses(BaseModel):
    sessions: dict[str, SessionState]


class SessionFork(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int = Field(..., ge=1, le=1024, description="How many copies (at most the node's fork_max_copies).")
    ttl_s: float | None = Field(None, gt=0, description="Each copy's lifetime (at most the node's session_ttl_s).")
    idle_timeout_s: float | None = Field(None, gt=0, description="Each copy's idle timeout (at most the node's).")


class ForkResult(BaseModel):
    source_id: str = Field(..., description="The session that was copied; it goes on untouched.")
    sessions: list[SessionInfo] = Field(..., description="The copies, each a session of its own.")
    notes: list[str] = Field(
        default_factory=list, description="What the runner could not copy (e.g. a page's live JavaScript state)."
    )


class ErrorBody(BaseModel):
    """Every error of the native surface, whatever its status: the shape of a failed step result."""

    ok: Literal[False] = False
    status: int
    error: ErrorInfo


STEP_STATUSES = {
    401: "no API key, or an unknown one (client)",
    404: "unknown session, or another tenant's (client)",
    408: "the request body stalled (client)",
    409: "a step is already running in that session (client)",
    410: "the session's sandbox was lost (infra)",
    413: "request, action, code, stdin or files over the node's cap (client)",
    422: "invalid request or action; the message names each field (client)",
    429: "saturated: queue, session cap or tenant quota full; Retry-After (infra)",
    500: "a bug of sandboxd's (infra)",
    502: "the worker running the step died, or the session's node did not answer a forward (infra)",
    503: "sandbox set-up failed, the node is draining or at max_connections, or Redis is down (infra)",
    504: "waited in the queue past the deadline (infra)",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the error statuses a route can answer, each with the one error body."""
    return {s: {"model": ErrorBody, "description": STEP_STATUSES[s]} for s in statuses}
