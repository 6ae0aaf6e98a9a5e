"""The error tree, each node mapped once to an HTTP status and to whose fault it is.

::

    SandboxdError
    ├── ClientError                      the caller's request is wrong (blame: client)
    │   ├── BadRequest           422     a field is invalid beyond what pydantic checks
    │   ├── PayloadTooLarge      413     code, stdin or files over the configured cap
    │   ├── RequestTimeout       408     the request's body did not arrive whole within body_timeout_s
    │   ├── HeadersTooLarge      431     the request line and headers over max_header_bytes
    │   ├── UnknownSession       404     no such session (never existed, closed, reaped)
    │   ├── SessionBusy          409     a step is already running in that session
    │   ├── SessionExpired       410     the session reached its TTL during the step and was ended
    │   ├── SessionClosed        410     the client closed the session (or its run) during the step
    │   ├── AlreadyExists        409     a path or name that must be new is taken (E2B's make_dir)
    │   ├── NotServed            501     a peer's API call this node does not serve (E2B's pause, watch)
    │   ├── UnknownRunner        422     runner kind not enabled on this node
    │   ├── NotFound             404     a path that names nothing here (e.g. /envs/<a kind not run here>)
    │   ├── Unauthorized         401     no API key, or one this node does not know
    │   └── Forbidden            403     an operation this caller may not ask for (drain from off the node)
    └── InfraError               500     the service failed, not the program (blame: infra)
        ├── Saturated            429     admission queue or a runner's session cap full; Retry-After
        ├── DeadlineExceeded     504     the step waited in the queue past its deadline
        ├── SandboxSetupError    503     a jail or its cgroup could not be made
        ├── Starting             503     the step's kind is still starting on its worker (slow, or missing a privilege)
        ├── WorkerDied           502     the worker running the step died mid-step
        ├── SessionLost          410     the session's sandbox is gone (worker or node died, killed)
        ├── ShuttingDown         503     the node is draining
        ├── AtCapacity           503     a front process serves all the connections it may (max_connections)
        ├── StoreUnavailable     503     the shared store (Redis) did not answer; one-shots still run
        ├── NodeIdConflict       503     another live node holds this node's id: it makes no sessions
        ├── NodePressure         503     a limit above the sandbox's own (node, pod) or starvation stopped it
        └── NodeUnreachable      502     the node that owns the session did not answer (retry)

Trainers must mask infrastructure failures instead of scoring them as a zero
reward, so every result names its ``blame`` and a stable ``code``. A program that
fails (non-zero exit, its own timeout, killed at a limit) is *not* an error here:
that is an observation, returned with HTTP 200.

Errors cross process boundaries (worker or node process -> front, node -> node in a cluster),
so each class registers itself under its ``code`` when it is defined, and
``to_dict``/``from_dict`` carry every field (retry hint, worker, session): the
class that arrives is the class that was raised, with the same status.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

Blame = Literal["client", "infra"]

_BY_CODE: dict[str, type[SandboxdError]] = {}


class SandboxdError(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"
    blame: ClassVar[Blame] = "infra"
    default_retry_after_s: ClassVar[float | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:  # a class that only refines another keeps its parent's code
            other = _BY_CODE.get(cls.code)
            if other is not None and other is not cls:
                raise TypeError(f"error code {cls.code!r} is taken by {other.__qualname__}")
            _BY_CODE[cls.code] = cls

    # Set by a runner whose failed session operation (a fork) ended that session: the worker forgets it.
    session_ended: bool = False

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float | None = None,
        worker: int | None = None,
        session_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = self.default_retry_after_s if retry_after_s is None else retry_after_s
        self.worker = worker
        self.session_id = session_id

    def to_dict(self) -> dict[str, Any]:
        """Every field, for the wire; ``from_dict`` rebuilds the same class from it."""
        return {
            "code": self.code,
            "blame": self.blame,
            "message": self.message,
            "retry_after_s": self.retry_after_s,
            "worker": self.worker,
            "session_id": self.session_id,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


def from_dict(data: dict[str, Any]) -> SandboxdError:
    """Rebuild an error that crossed a process or node boundary; unknown codes are infra errors."""
    cls = _BY_CODE.get(str(data.get("code")), InfraError)
    retry = data.get("retry_after_s")
    worker = data.get("worker")
    return cls(
        str(data.get("message", "")),
        retry_after_s=float(retry) if isinstance(retry, int | float) else None,
        worker=worker if isinstance(worker, int) else None,
        session_id=data.get("session_id") if isinstance(data.get("session_id"), str) else None,
    )


def registered() -> dict[str, type[SandboxdError]]:
    """Every error class by code (tests check that each survives a round trip)."""
    return dict(_BY_CODE)


class ClientError(SandboxdError):
    status = 400
    code = "client_error"
    blame: ClassVar[Blame] = "client"


class BadRequest(ClientError):
    status = 422
    code = "bad_request"


class PayloadTooLarge(ClientError):
    status = 413
    code = "payload_too_large"


class RequestTimeout(ClientError):
    status = 408
    code = "request_timeout"


class HeadersTooLarge(ClientError):
    status = 431
    code = "headers_too_large"


class UnknownSession(ClientError):
    status = 404
    code = "unknown_session"


class SessionBusy(ClientError):
    status = 409
    code = "session_busy"


class SessionExpired(ClientError):
    """The session's lifetime (its ``ttl_s``, at most the node's ``session_ttl_s``) ran out during a step: the
    service ended it, by the limit the session was created with. Not the program's failure (it was stopped,
    not failed), nor the service's (it did what the session's lifetime said)."""

    status = 410
    code = "session_expired"


class SessionClosed(ClientError):
    """The client closed the session (``DELETE``, or by label with its run) while a step ran in it: the step was
    stopped by its own client, so neither the program's failure nor the service's."""

    status = 410
    code = "session_closed"


class AlreadyExists(ClientError):
    status = 409
    code = "already_exists"


class NotServed(ClientError):
    """What a peer's API offers and this node does not (yet): said plainly, never faked."""

    status = 501
    code = "not_served"


class UnknownRunner(ClientError):
    status = 422
    code = "unknown_runner"


class NotFound(ClientError):
    status = 404
    code = "not_found"


class Unauthorized(ClientError):
    status = 401
    code = "unauthorized"


class Forbidden(ClientError):
    status = 403
    code = "forbidden"


class InfraError(SandboxdError):
    status = 500
    code = "infra"
    blame: ClassVar[Blame] = "infra"


class Saturated(InfraError):
    """Refused for lack of capacity; always carries a retry hint (HTTP Retry-After)."""

    status = 429
    code = "saturated"
    default_retry_after_s = 1.0


class DeadlineExceeded(InfraError):
    status = 504
    code = "deadline_exceeded"


class SandboxSetupError(InfraError):
    status = 503
    code = "sandbox_setup_failed"


class Starting(InfraError):
    status = 503
    code = "starting"
    default_retry_after_s = 2.0


class WorkerDied(InfraError):
    status = 502
    code = "worker_died"


class SessionLost(InfraError):
    status = 410
    code = "session_lost"


class ShuttingDown(InfraError):
    status = 503
    code = "shutting_down"


class AtCapacity(InfraError):
    """The front process that took the connection serves ``max_connections`` connections or requests already;
    another front (or node) may not: retry."""

    status = 503
    code = "at_capacity"
    default_retry_after_s = 1.0


class StoreUnavailable(InfraError):
    """The shared store (Redis) did not answer in time: the operation that needed it is refused, never hung."""

    status = 503
    code = "store_unavailable"
    default_retry_after_s = 1.0


class NodeIdConflict(InfraError):
    """Another live node holds this node's ``SANDBOXD_NODE_ID``: this one stays out of the service (not ready)
    and makes no sessions until that node's registry entry expires; retry on another node."""

    status = 503
    code = "node_id_conflict"
    default_retry_after_s = 1.0


class NodePressure(InfraError):
    """The sandbox was stopped by something above its own limits: the node's or its pod's memory or pids
    limit (the kernel reports it in the sandbox's own counters too, so each kill is checked against the
    sandbox's own limit), or neighbours keeping it off the CPU past its time limit. Retry: the program
    did not fail."""

    status = 503
    code = "node_pressure"
    default_retry_after_s = 1.0


class NodeUnreachable(InfraError):
    """The session's owner is registered as alive but did not take the forwarded request (restarting, or cut
    off): retry; once its heartbeat runs out its sessions answer 410."""

    status = 502
    code = "node_unreachable"
    default_retry_after_s = 1.0
