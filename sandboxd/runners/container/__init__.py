"""The ``container`` runner kind: sandboxes whose root is a container image of the node's store
(``sandboxd image import``), one-shots and shell sessions, on the jail core."""

from __future__ import annotations

from typing import Any

from sandboxd.runners.base import Capabilities, RunnerKind, StepLimits
from sandboxd.runners.container.config import ContainerRunnerConfig
from sandboxd.runners.container.models import ContainerAction, ContainerObservation, ContainerSessionOptions
from sandboxd.runners.jail.admit import check_limits, check_payload


def _admit(action: Any, limits: StepLimits, cfg: Any) -> None:
    """Payload caps (the command, stdin and files) and limits within the node's."""
    assert isinstance(action, ContainerAction)
    check_payload(action, action.command() if action.cmd is not None else "", action.stdin, cfg, "cmd")
    check_limits(limits, cfg)


KIND = RunnerKind(
    name="container",
    title="Commands in sandboxes whose root is a container image (sandboxd image import): one-shots and shells",
    config=ContainerRunnerConfig,
    action=ContainerAction,
    observation=ContainerObservation,
    session_options=ContainerSessionOptions,
    runner="sandboxd.runners.container.runner:ContainerRunner",
    capabilities=Capabilities(interrupt=True, burst=True),
    admit=_admit,
    default_enabled=False,
    no_fork="a container session's state is its writable layer and processes; forks are the python kind's",
)
