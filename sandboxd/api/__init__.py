"""API surfaces: each is a router that calls the front process's ``Gateway`` and renders results and errors in
its own shape.

``native`` (rollout steps, sessions, runner descriptions) and ``ops``
(health, readiness, metrics) are sandboxd's own; wire-compatible surfaces
(SandboxFusion's ``/run_code``, OpenEnv, MCP) are added the same way: a module
with a ``router(gateway)`` function, built with ``surface_router`` and its own
error renderer, included in ``app.py``.
"""
