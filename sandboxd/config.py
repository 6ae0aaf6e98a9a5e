"""Process settings: one settings object, ``SANDBOXD_`` environment variables.

Node-wide fields live on ``NodeSettings``; each registered runner kind adds one
nested section of its own config model, so ``SANDBOXD_PYTHON__SLOTS_PER_WORKER=8``
reaches the Python runner's ``slots_per_worker`` without the core naming it.
``settings_model()`` builds that class from the registry; ``load_settings()``
validates the environment against it once at start-up, inside ``create_app``
(never a module global), so tests can give each server its own.
docs/configuration.md is generated from these models (``sandboxd config-docs``).
"""

from __future__ import annotations

import functools
import os
import re
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, cast

from pydantic import Field, create_model, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sandboxd.runners.base import RunnerConfig, RunnerKind

NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def _default_runtime_dir() -> str:
    return str(Path(tempfile.gettempdir()) / f"sandboxd-{os.getpid()}")


def default_node_id() -> str:
    """The host name, cut to what a session id can carry (letters, digits, ``_.-``, 63 chars)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname()).strip("-.") or "node"
    return name[:63]


class NodeSettings(BaseSettings):
    """Everything a node needs to start; validated once at start-up."""

    model_config = SettingsConfigDict(env_prefix="SANDBOXD_", env_nested_delimiter="__", extra="forbid")

    kinds: ClassVar[Mapping[str, RunnerKind]] = {}

    node_id: str = Field(
        default_factory=default_node_id,
        description="Stable name of this node, carried in its session ids; default: the host name.",
    )
    host: str = Field("127.0.0.1", description="Address the gateway listens on.")
    port: int = Field(8080, ge=0, le=65535, description="Port the gateway listens on (0 = any free port).")
    workers: int = Field(0, ge=0, le=512, description="Worker processes; 0 = one per vCPU.")
    runners: list[str] = Field(
        default_factory=list,
        description="Runner kinds enabled on this node; empty = every registered kind that is on by default.",
    )
    queue_max: int = Field(
        1024, ge=0, description="Steps allowed to wait for a slot; beyond this a step gets 429 with Retry-After."
    )
    queue_timeout_s: float = Field(
        30.0, gt=0, description="Longest a step may wait for a slot before it fails with 504 (infra)."
    )
    default_timeout_s: float = Field(10.0, gt=0, description="Execution time limit of a step that gives none.")
    max_timeout_s: float = Field(300.0, gt=0, description="Largest timeout_s a step may ask for.")
    max_batch: int = Field(1024, ge=1, description="Most steps in one POST /rollout/steps.")
    session_ttl_s: float = Field(3600.0, gt=0, description="A session is closed this long after it was created.")
    session_idle_s: float = Field(600.0, gt=0, description="A session is closed after this long without a step.")
    reap_interval_s: float = Field(1.0, gt=0, description="How often expired sessions are looked for.")
    idempotency_ttl_s: float = Field(
        900.0, gt=0, description="How long a result is kept for retries with the same idempotency_key."
    )
    idempotency_max_entries: int = Field(
        100_000, ge=0, description="Most remembered idempotent results (oldest dropped first)."
    )
    worker_ping_interval_s: float = Field(2.0, gt=0, description="Health-check interval of each worker.")
    worker_ping_timeout_s: float = Field(
        10.0, gt=0, description="A worker that does not answer a ping this long is replaced."
    )
    shutdown_grace_s: float = Field(10.0, ge=0, description="On shutdown, running steps get this long to finish.")
    runtime_dir: str = Field(
        default_factory=_default_runtime_dir, description="Scratch directory (sockets, jail logs)."
    )
    log_level: str = Field("info", description="Log level of the gateway and workers.")

    @field_validator("node_id")
    @classmethod
    def _node_id(cls, value: str) -> str:
        if not NODE_ID.match(value):
            raise ValueError(f"node_id must match {NODE_ID.pattern} (it is part of every session id)")
        return value

    @model_validator(mode="after")
    def _check(self) -> NodeSettings:
        if self.default_timeout_s > self.max_timeout_s:
            raise ValueError("default_timeout_s must not exceed max_timeout_s")
        if not self.runners:
            self.runners = [name for name, kind in self.kinds.items() if kind.default_enabled]
        unknown = [k for k in self.runners if k not in self.kinds]
        if unknown:
            raise ValueError(f"unknown runner kinds {unknown}; registered: {sorted(self.kinds)}")
        if len(set(self.runners)) != len(self.runners):
            raise ValueError(f"runners lists a kind twice: {self.runners}")
        return self

    def runner_config(self, kind: str) -> RunnerConfig:
        """The config section of ``kind`` (one field per registered kind)."""
        cfg = getattr(self, kind)
        assert isinstance(cfg, RunnerConfig)
        return cfg

    def worker_count(self) -> int:
        return self.workers or (
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        )


def build_settings_model(kinds: Mapping[str, RunnerKind]) -> type[NodeSettings]:
    """``NodeSettings`` plus one nested section per kind (its config model, its defaults)."""
    clash = set(kinds) & set(NodeSettings.model_fields)
    if clash:
        raise ValueError(f"runner kinds {sorted(clash)} clash with node settings of the same name")
    fields: dict[str, Any] = {
        name: (kind.config, Field(default_factory=kind.config, description=kind.title or kind.config.__doc__))
        for name, kind in kinds.items()
    }
    model = cast(type[NodeSettings], create_model("Settings", __base__=NodeSettings, **fields))
    model.kinds = dict(kinds)
    return model


@functools.cache
def settings_model() -> type[NodeSettings]:
    """The settings class of this process's registry."""
    from sandboxd.registry import kinds

    return build_settings_model(kinds())


def load_settings(**overrides: Any) -> NodeSettings:
    """Settings from ``SANDBOXD_*`` (and overrides), validated; raises pydantic's ``ValidationError``."""
    return settings_model()(**overrides)
