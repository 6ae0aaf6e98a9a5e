"""What a client gets when a step or a request fails before, around or instead of its program.

Built where the failure is met (a worker, or a front process for what it refuses itself), in the shape of
a step's result, so every surface renders one thing and every answer says whose failure it was.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel

from sandboxd.errors import SandboxdError


def failed_answer(
    exc: SandboxdError,
    elapsed_s: float,
    runner: str | None,
    session_id: str | None,
    worker: int | None,
    observation: BaseModel | None = None,
) -> tuple[dict[str, Any], bytes]:
    """A step that failed before, around or instead of its program, as the client gets it (its status, blame)."""
    result = {
        "ok": False,
        "status": exc.status,
        "observation": None if observation is None else observation.model_dump(mode="json"),
        "error": {"blame": exc.blame, "code": exc.code, "message": exc.message, "retry_after_s": exc.retry_after_s},
        "latency_ms": round(elapsed_s * 1000, 3),
        "worker": worker,
        "runner": runner,
        "session_id": session_id,
    }
    header: dict[str, Any] = {"status": exc.status, "blame": exc.blame}
    if exc.retry_after_s is not None:
        header["retry"] = exc.retry_after_s
    return header, orjson.dumps(result)


def error_body(exc: SandboxdError) -> bytes:
    """sandboxd's own error shape for a request that is not a step: the same body as a failed step result."""
    err = {"blame": exc.blame, "code": exc.code, "message": exc.message, "retry_after_s": exc.retry_after_s}
    return orjson.dumps({"ok": False, "status": exc.status, "error": err})
