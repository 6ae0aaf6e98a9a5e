"""The Python runner kind: nsjail jails with a warm zygote; code runs as uid nobody in fresh namespaces."""

from __future__ import annotations

from typing import Any

from sandboxd.errors import BadRequest
from sandboxd.runners.base import Capabilities, RunnerKind, StepLimits
from sandboxd.runners.jail.admit import check_limits, check_payload
from sandboxd.runners.python import environments
from sandboxd.runners.python.config import PythonRunnerConfig
from sandboxd.runners.python.models import PythonAction, PythonObservation, PythonSessionOptions


def admit(action: PythonAction, limits: StepLimits, cfg: PythonRunnerConfig) -> None:
    """Payload caps, the environment named, and per-step limits within this node's."""
    check_payload(action, action.code, action.stdin, cfg)
    if action.env is not None and action.env not in environments.served(cfg.environments_dir):
        built = ", ".join(environments.served(cfg.environments_dir)) or "none"
        raise BadRequest(f"action.env: no Python environment {action.env!r} on this node (built: {built})")
    check_limits(limits, cfg)


def _admit(action: Any, limits: StepLimits, cfg: Any) -> None:
    admit(action, limits, cfg)


def describe(cfg: PythonRunnerConfig) -> dict[str, Any]:
    """The environments a step may name, what each holds and what its template preloads."""
    built = environments.served(cfg.environments_dir)
    return {
        "default_environment": cfg.default_environment if cfg.default_environment in built else None,
        "environments": {
            name: {"python": env.python, "packages": list(env.packages), "preload": cfg.preload.get(name, [])}
            for name, env in built.items()
        },
    }


KIND = RunnerKind(
    name="python",
    title="Python programs in nsjail sandboxes (B1)",
    config=PythonRunnerConfig,
    action=PythonAction,
    observation=PythonObservation,
    session_options=PythonSessionOptions,
    runner="sandboxd.runners.python.runner:PythonRunner",
    capabilities=Capabilities(fork=True, interrupt=True, burst=True),
    admit=_admit,
    describe=describe,
)
