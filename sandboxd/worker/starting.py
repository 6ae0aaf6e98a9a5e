"""A runner kind that does not start: why, said so an operator can act on it, and how long to wait before
trying again.

A node must not die of what is only slow (a machine at load 38 timed the SQL fork server and a template's
imports out), nor crash-loop on what is missing (a read-only cgroup tree in an unprivileged container: a
crash-looping pod cannot be exec'd into for ``sandboxd doctor``). So a worker keeps each kind starting, says
why in its health (the node's ``/readyz`` 503 names it) and in its log, and tries again.
"""

from __future__ import annotations

import errno

# Seconds before each retry of a kind's start (then the last, for ever): soon for what was only slow, then
# slowly for what waits on an operator.
START_RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
START_PATIENCE_MAX = 32  # a kind's start timeouts double with each attempt, up to this many times its own
PRIVILEGE = {errno.EACCES: "permission denied", errno.EPERM: "not permitted", errno.EROFS: "read-only file system"}


def start_failure(exc: BaseException) -> str:
    """One line naming why a kind did not start: the innermost cause an operator can act on (a privilege the
    node lacks, with the path), not a traceback."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    for e in seen:
        if isinstance(e, OSError) and e.errno in PRIVILEGE:
            where = f" on {e.filename}" if e.filename else ""
            return (
                f"missing privilege: {PRIVILEGE[e.errno]}{where} ({seen[0]}); the node needs the capabilities and "
                "writable cgroups docs/deploy.md lists (`sandboxd doctor` says which are missing)"
            )
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 600 else text[:600] + "..."
