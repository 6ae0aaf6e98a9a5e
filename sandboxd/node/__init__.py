"""The node process: workers, the session ledger, idempotency keys, drain, readiness, the cluster."""
