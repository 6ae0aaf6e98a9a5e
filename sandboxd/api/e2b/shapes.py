"""E2B's error shapes, one per plane: what every SDK parses, whichever layer refused."""

from __future__ import annotations

from starlette.responses import Response

from sandboxd.api.e2b.names import public_message
from sandboxd.errors import SandboxdError, SessionClosed, SessionExpired, SessionLost, UnknownSession
from sandboxd.front.surfaces import json_response, retry_headers

GONE = (UnknownSession, SessionLost, SessionClosed, SessionExpired)


def e2b_error(exc: SandboxdError) -> Response:
    """E2B's error shape, ``{"code": <status>, "message": ...}``, which every SDK parses (a body without ``code``
    crashes the generated client with ``KeyError``). On the control plane a sandbox that is gone, killed or
    timed out is a 404, as E2B's API says of it (``kill`` then returns False, ``connect`` raises
    ``SandboxNotFoundException``); a refusal no retry can change says so (``Should-Retry``: SDK 2.46 on
    retries 429/502/503/504 three times unless told not to)."""
    status = 404 if isinstance(exc, GONE) else exc.status
    headers = retry_headers(exc.retry_after_s) or {}
    if exc.retry_after_s is None and status >= 500:
        headers["Should-Retry"] = "false"
    return json_response({"code": status, "message": public_message(exc.message, exc.session_id)}, status, headers)


def data_error(exc: SandboxdError) -> Response:
    """On a sandbox's data plane, a sandbox that is gone, or was killed or timed out during the call, answers
    502, as E2B's proxy does for an ended sandbox; its message says the sandbox "was not found", the words SDK
    2.46 on read to raise ``SandboxNotRunningException`` (older ones raise a timeout)."""
    if isinstance(exc, GONE):
        body = {"code": 502, "message": f"The sandbox was not found: {public_message(exc.message, exc.session_id)}"}
        return json_response(body, 502)
    return e2b_error(exc)


CONNECT_PREFIXES = (b"/process.Process/", b"/filesystem.Filesystem/")
# A refusal's status as Connect's code (connectrpc.com/docs/protocol, its HTTP mapping read backwards).
CONNECT_CODE_OF_STATUS = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    408: "deadline_exceeded",
    409: "aborted",
    413: "resource_exhausted",
    429: "resource_exhausted",
    431: "resource_exhausted",
    501: "unimplemented",
    502: "unavailable",
    503: "unavailable",
    504: "deadline_exceeded",
}


def e2b_error_at(exc: SandboxdError, path: bytes) -> Response:
    """A refusal before any route ran (no key, too large, at capacity), in the shape of the path's client: on
    envd's Connect services Connect's own, ``{"code": "<name>", "message": ...}`` (its SDKs read the code by
    name: ``unauthenticated`` for a call without a token, not ``invalid_argument``), else E2B's."""
    if not path.startswith(CONNECT_PREFIXES):
        return e2b_error(exc)
    code = CONNECT_CODE_OF_STATUS.get(exc.status, "unavailable" if exc.status >= 500 else "invalid_argument")
    body = {"code": code, "message": public_message(exc.message, exc.session_id)}
    return json_response(body, exc.status, retry_headers(exc.retry_after_s))
