"""API surfaces: each is a router that calls the front process's ``Gateway`` and renders results and errors in
its own shape.

``native`` (rollout steps, sessions, runner descriptions) and ``ops``
(health, readiness, metrics) are sandboxd's own; wire-compatible surfaces
(SandboxFusion's ``/run_code``, OpenEnv, MCP, E2B) are added the same way: a
module with its declaration (``SURFACE``: error shape, paths, public paths,
credentials; ``front/surfaces.py``) and a ``router(gateway, auth)`` built with
``surface_router(SURFACE.render)``, both registered in ``app.py``.
"""
