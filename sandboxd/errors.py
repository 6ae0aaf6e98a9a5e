"""The error tree, each node mapped once to an HTTP status and to whose fault it is.

::

    SandboxdError
    ├── ClientError                      the caller's request is wrong (blame: client)
    │   ├── BadRequest           422     a field is invalid beyond what pydantic checks
    │   ├── PayloadTooLarge      413     code, stdin or files over the configured cap
    │   ├── UnknownSession       404     no such session (never existed, closed, reaped)
    │   ├── SessionBusy          409     a step is already running in that session
    │   └── UnknownRunner        422     runner kind not enabled on this node
    └── InfraError                       the service failed, not the program (blame: infra)
        ├── Saturated            429     admission queue full; carries Retry-After
        ├── DeadlineExceeded     504     the step waited in the queue past its deadline
        ├── SandboxSetupError    503     a jail or its cgroup could not be made
        ├── WorkerDied           502     the worker running the step died mid-step
        ├── SessionLost          410     the session's sandbox is gone (worker died, killed)
        └── ShuttingDown         503     the node is draining

Trainers must mask infrastructure failures instead of scoring them as a zero
reward, so every result names its ``blame`` and a stable ``code``. A program that
fails (non-zero exit, its own timeout, killed at a limit) is *not* an error here:
that is an observation, returned with HTTP 200.
"""

from __future__ import annotations

from typing import ClassVar, Literal

Blame = Literal["client", "infra"]


class SandboxdError(Exception):
    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"
    blame: ClassVar[Blame] = "infra"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_dict(self) -> dict[str, object]:
        return {"code": self.code, "blame": self.blame, "message": self.message}


class ClientError(SandboxdError):
    status = 400
    code = "bad_request"
    blame: ClassVar[Blame] = "client"


class BadRequest(ClientError):
    status = 422
    code = "bad_request"


class PayloadTooLarge(ClientError):
    status = 413
    code = "payload_too_large"


class UnknownSession(ClientError):
    status = 404
    code = "unknown_session"


class SessionBusy(ClientError):
    status = 409
    code = "session_busy"


class UnknownRunner(ClientError):
    status = 422
    code = "unknown_runner"


class InfraError(SandboxdError):
    status = 500
    code = "infra"
    blame: ClassVar[Blame] = "infra"


class Saturated(InfraError):
    status = 429
    code = "saturated"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(InfraError):
    status = 504
    code = "deadline_exceeded"


class SandboxSetupError(InfraError):
    status = 503
    code = "sandbox_setup_failed"


class WorkerDied(InfraError):
    status = 502
    code = "worker_died"


class SessionLost(InfraError):
    status = 410
    code = "session_lost"


class ShuttingDown(InfraError):
    status = 503
    code = "shutting_down"


BY_CODE: dict[str, type[SandboxdError]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        PayloadTooLarge,
        UnknownSession,
        SessionBusy,
        UnknownRunner,
        DeadlineExceeded,
        SandboxSetupError,
        WorkerDied,
        SessionLost,
        ShuttingDown,
        InfraError,
    )
}


def from_dict(data: dict[str, object]) -> SandboxdError:
    """Rebuild an error that crossed the worker/gateway boundary."""
    cls = BY_CODE.get(str(data.get("code")), InfraError)
    return cls(str(data.get("message", "")))
