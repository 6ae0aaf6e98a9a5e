"""Where a node keeps what outlives one request: the session table and idempotency records.

Each is a small async protocol with an in-memory implementation (the embedded
default: one process tree, no Redis). A shared implementation (Redis, for many
nodes) implements the same protocol; the gateway does not change.
"""
