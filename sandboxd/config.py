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
import shutil
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, cast

from pydantic import Field, create_model, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sandboxd.runners.base import RunnerConfig, RunnerKind

NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
# vCPUs of workers one front process feeds at the lightest steps (measured: docs/deploy.md).
VCPUS_PER_FRONT = 8


def vcpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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
    host: str = Field("127.0.0.1", description="Address the node listens on (its front processes accept there).")
    port: int = Field(8080, ge=0, le=65535, description="Port the node listens on (0 = any free port).")
    workers: int = Field(0, ge=0, le=512, description="Worker processes; 0 = one per vCPU.")
    fronts: int = Field(
        0,
        ge=0,
        le=128,
        description="Front processes taking HTTP on the node's port (each takes any request); 0 = one per "
        f"{VCPUS_PER_FRONT} workers, at least one (docs/deploy.md: what one front process feeds).",
    )
    node_socket: str = Field(
        "",
        description="Set by sandboxd serve and the gunicorn config for their front processes: the node process "
        "to join. Empty: an app on its own starts a node process of its own.",
    )
    probe_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="A port of its own for /healthz and /readyz, served by the node process, which client "
        "connections cannot starve (Kubernetes probes); 0 = none (the main port answers them too).",
    )
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
    scheduling: Literal["fifo", "oldest_rollout"] = Field(
        "fifo",
        description="Order of queued steps: 'fifo' by arrival, or 'oldest_rollout': steps that carry a "
        "rollout_id go in order of their rollout's start (capped by rollout_max_boost_s), others by arrival. "
        "FIFO by default: on B9 at saturation oldest_rollout did not lower rollout p99 with a 10 s cap, and "
        "with a 300 s cap it did (-32%) but starved young rollouts into 504s (bench/rollout_scheduling.py).",
    )
    rollout_max_boost_s: float = Field(
        10.0,
        ge=0,
        description="Most a rollout's age can put its steps ahead of a step that just arrived. Also how long "
        "a step can be overtaken, so keep it well under queue_timeout_s (measured: 300 s starved young "
        "rollouts into 504s at saturation).",
    )
    fusion_queue_grace_s: float = Field(
        5.0,
        ge=0,
        description="SandboxFusion /run_code: how long past its compile_timeout a request may wait for a free "
        "sandbox before it gets 504 (never 429: verl retries 504 only), and never longer than queue_timeout_s. "
        "Its run_timeout still fits in the compile + run + 10 s verl's client waits.",
    )
    images_dir: str = Field(
        "/var/lib/sandboxd/images",
        description="The node's image store (sandboxd image import/list/rm): each layer unpacked once, shared "
        "by the images that have it. Owned by root and the uid base's group, 0710: a container's jail may pass, "
        "the host's other users may not.",
    )
    image_max_layer_bytes: int = Field(
        16 << 30, ge=1 << 20, description="Most bytes of file contents one image layer may unpack to."
    )
    image_max_layer_entries: int = Field(
        1_000_000, ge=100, description="Most entries (files, directories, links) in one image layer."
    )
    image_uid_base: int = Field(
        2_000_000_000,
        ge=65536,
        le=(1 << 32) - 2 - 65536,
        description="Host uid (and gid) of an image's root: an image's owner N is this plus N on the host, and a "
        "container's user namespace maps its 0..65535 onto that range, so its root is unprivileged on the host. "
        "Keep it clear of every uid the host or its other containers use; the store records it.",
    )
    default_timeout_s: float = Field(10.0, gt=0, description="Execution time limit of a step that gives none.")
    max_timeout_s: float = Field(300.0, gt=0, description="Largest timeout_s a step may ask for.")
    max_batch: int = Field(1024, ge=1, description="Most steps in one POST /rollout/steps.")
    session_ttl_s: float = Field(3600.0, gt=0, description="A session is closed this long after it was created.")
    session_idle_s: float = Field(600.0, gt=0, description="A session is closed after this long without a step.")
    fork_max_copies: int = Field(
        64, ge=1, le=1024, description="Most copies one POST /sessions/{id}/fork may ask for (a GRPO group)."
    )
    reap_interval_s: float = Field(1.0, gt=0, description="How often expired sessions are looked for.")
    idempotency_ttl_s: float = Field(
        900.0, gt=0, description="How long a result is kept for retries with the same idempotency_key."
    )
    idempotency_max_entries: int = Field(
        100_000, ge=0, description="Most remembered idempotent results (oldest dropped first)."
    )
    worker_start_timeout_s: float = Field(
        120.0,
        gt=0,
        description="A worker not listening this long after it was started (its jails and warm templates ready) is "
        "killed: the node does not start, or replaces it again. The node's front processes get as long to join it. "
        "Raise it on slow machines (an emulated guest).",
    )
    worker_ping_interval_s: float = Field(2.0, gt=0, description="Health-check interval of each worker.")
    worker_ping_timeout_s: float = Field(
        10.0, gt=0, description="A worker that does not answer a ping this long is replaced."
    )
    shutdown_grace_s: float = Field(10.0, ge=0, description="On shutdown, running steps get this long to finish.")
    shutdown_drain_s: float = Field(
        0.0,
        ge=0,
        description="After SIGTERM, keep the port open at least this long, answering new work with 503 "
        "shutting_down and /readyz with 503, so load balancers see the node leave (Kubernetes: a few seconds).",
    )
    runtime_dir: str = Field(
        "",
        description="Scratch directory (sockets, jail logs); empty = a new private directory (0700, random name) "
        "under the system's temp dir, removed at shutdown.",
    )
    max_body_bytes: int = Field(
        64 << 20, ge=1024, description="Largest request body; refused with 413 while it is being read, not after."
    )
    max_header_bytes: int = Field(
        64 << 10,
        ge=4096,
        description="Largest request line plus headers of one request; refused with 431 as soon as it is passed.",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A connection must finish each request's headers this long after it opened (or the request "
        "began), or it is closed: idle connections cannot fill max_connections.",
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A request body must arrive whole this long after its headers, or it is refused with 408 "
        "(however it is trickled).",
    )
    max_connections: int = Field(
        4096, ge=16, description="Concurrent HTTP connections one front process serves; more are answered 503."
    )
    max_connections_per_address: int = Field(
        1024,
        ge=1,
        description="Connections one client address may hold to one front process before they authenticate; more "
        "are refused (429) at once. An authenticated connection counts for its tenant instead (many tenants "
        "often share an address: an ingress, a NAT, a mesh sidecar).",
    )
    max_connections_per_tenant: int = Field(
        1024,
        ge=1,
        description="Connections one tenant (API key) may hold to the node (all its front processes together); "
        "more are refused (429).",
    )
    ws_ping_interval_s: float = Field(
        20.0, gt=0, description="WebSockets (OpenEnv) are pinged this often and closed when a ping goes unanswered."
    )
    ws_idle_timeout_s: float = Field(
        600.0,
        gt=0,
        description="An OpenEnv WebSocket with no message this long is closed, and its session with it.",
    )
    api_keys: list[str] = Field(
        default_factory=list,
        description="Keys clients must send (Authorization: Bearer <key>, or Basic with the key as password for "
        "clients that only take a URL: http://key:<key>@node/...); each key is a tenant. "
        "Empty = no authentication (only allowed on a loopback address unless allow_insecure).",
    )
    api_keys_file: str = Field(
        "", description="A file with one API key per line (e.g. a mounted secret), added to api_keys."
    )
    allow_insecure: bool = Field(
        False, description="Serve a non-loopback address without API keys (never on a shared network)."
    )
    auth_ops: bool = Field(
        False, description="Require a key for /healthz, /readyz and /metrics too (probes and Prometheus need one)."
    )
    e2b_insecure_sandboxes: bool = Field(
        False,
        description="Serve E2B sandboxes created with secure: false as E2B does: their data plane (code, commands, "
        "files) is reached by the sandbox's id alone, with no access token, which e2b-code-interpreter 1.x never "
        "sends with run_code. The id becomes the credential: whoever learns it runs code there as the sandbox's "
        "tenant. Off: every sandbox is secure whatever its create asked, and a call without a token is a 401 that "
        "names this setting.",
    )
    tenant_max_sessions: int = Field(
        512, ge=1, description="Live sessions one tenant (API key) may hold on this node; more is a 429."
    )
    tenant_max_inflight: int = Field(
        1024,
        ge=1,
        description="Steps one tenant may have running or queued on this node (all its front processes together); "
        "more is a 429.",
    )
    memory_budget_mb: int = Field(
        0,
        ge=0,
        description="Memory the node's sandboxes may reserve at their limits (its pools' warm sandboxes and each "
        "session): 0 = what the node's cgroup (a pod's limit) or the host allows, less memory_reserve_mb. A new "
        "session past budget x overcommit is a 429, so that a limit above the sandboxes' own is not reached.",
    )
    memory_reserve_mb: int = Field(
        1024, ge=0, description="Memory kept for the node's own processes (fronts, workers, drivers)."
    )
    pids_budget: int = Field(
        0,
        ge=0,
        description="Processes and threads the node's sandboxes may reserve at their limits: 0 = what the node's "
        "cgroup, the kernel's pid_max and threads-max allow, less pids_reserve.",
    )
    pids_reserve: int = Field(1024, ge=0, description="Pids kept for the node's own processes.")
    overcommit: float = Field(
        8.0,
        ge=1.0,
        description="How many times its budget the node reserves: sessions rarely use their limits (an idle python "
        "session ~3 MB of 512). 1 = no sandbox can ever meet a limit above its own.",
    )
    tenant_weights: dict[str, float] = Field(
        default_factory=dict,
        description="Fair-share weight per API key (JSON, key -> weight > 0; others 1): when tenants compete for "
        "a kind's slots each gets slots in proportion, queued steps of the tenant furthest below its share go "
        "first, and a full queue refuses the tenant furthest above it.",
    )
    log_level: str = Field("info", description="Log level of every process of the node.")
    redis_url: str = Field(
        "",
        description="Redis (>= 7) shared by the nodes of one service: session directory, idempotency records, "
        "node registry. Empty = this node alone, everything in memory (the embedded default). "
        "E.g. redis://redis:6379/0; rediss:// for TLS.",
    )
    redis_prefix: str = Field(
        "sandboxd", pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="Prefix of every Redis key (one per service)."
    )
    redis_timeout_s: float = Field(
        1.0,
        gt=0,
        le=30,
        description="Longest a Redis command may take; past it the operation that needed it fails with 503 "
        "store_unavailable instead of hanging (one-shot steps never need Redis).",
    )
    node_url: str = Field(
        "",
        description="How the other nodes reach this one (http://host:port), for steps they forward to the "
        "sessions it owns. Needed with redis_url unless host is a specific address (then http://host:port). "
        "Kubernetes: the pod's address behind the headless Service.",
    )
    heartbeat_interval_s: float = Field(
        1.0, gt=0, description="How often a node renews its entry in the node registry and reads the others'."
    )
    heartbeat_ttl_s: float = Field(
        4.0,
        gt=0,
        description="A node whose entry was not renewed this long is gone: its sessions answer 410 session_lost "
        "on every node (after at most heartbeat_ttl_s + heartbeat_interval_s).",
    )
    forward_connect_timeout_s: float = Field(
        1.0, gt=0, description="Longest a node waits to connect to a session's owner before it says so (502)."
    )

    @field_validator("node_id")
    @classmethod
    def _node_id(cls, value: str) -> str:
        if not NODE_ID.match(value):
            raise ValueError(f"node_id must match {NODE_ID.pattern} (it is part of every session id)")
        return value

    @field_validator("tenant_weights")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        bad = [w for w in value.values() if not w > 0]
        if bad:
            raise ValueError(f"tenant_weights: every weight must be > 0 (got {bad[0]})")
        return value

    @model_validator(mode="after")
    def _check(self) -> NodeSettings:
        if self.default_timeout_s > self.max_timeout_s:
            raise ValueError("default_timeout_s must not exceed max_timeout_s")
        if not self.all_api_keys() and not self.allow_insecure and not _is_loopback(self.host):
            raise ValueError(
                f"host {self.host!r} is not a loopback address and no api_keys are set: anyone who can reach it "
                "could run code here. Set SANDBOXD_API_KEYS or SANDBOXD_API_KEYS_FILE, or SANDBOXD_ALLOW_INSECURE=true"
            )
        if not self.runners:
            self.runners = [name for name, kind in self.kinds.items() if kind.default_enabled]
        unknown = [k for k in self.runners if k not in self.kinds]
        if unknown:
            raise ValueError(f"unknown runner kinds {unknown}; registered: {sorted(self.kinds)}")
        if len(set(self.runners)) != len(self.runners):
            raise ValueError(f"runners lists a kind twice: {self.runners}")
        if self.heartbeat_ttl_s < 2 * self.heartbeat_interval_s:
            raise ValueError("heartbeat_ttl_s must be at least twice heartbeat_interval_s (one late beat is no death)")
        if self.redis_url and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis_url must start with redis://, rediss:// or unix:// (got {self.redis_url!r})")
        if self.node_url and not re.match(r"^http://[^/\s]+/?$", self.node_url):
            raise ValueError(
                f"node_url must be http://host:port with no path (got {self.node_url!r}): nodes forward to each "
                "other in plain HTTP on the cluster's network (TLS between nodes is the mesh's, if any)"
            )
        return self

    def all_api_keys(self) -> list[str]:
        """``api_keys`` plus the lines of ``api_keys_file`` (blank lines and ``#`` comments skipped)."""
        keys = list(self.api_keys)
        if self.api_keys_file:
            try:
                text = Path(self.api_keys_file).read_text()
            except OSError as exc:
                raise ValueError(f"api_keys_file {self.api_keys_file!r}: {exc.strerror}") from exc
            keys += [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
        short = [k for k in keys if len(k) < 16]
        if short:
            raise ValueError(f"{len(short)} API key(s) shorter than 16 characters: use long random keys")
        return keys

    def runner_config(self, kind: str) -> RunnerConfig:
        """The config section of ``kind`` (one field per registered kind)."""
        cfg = getattr(self, kind)
        assert isinstance(cfg, RunnerConfig)
        return cfg

    def advertised_url(self) -> str:
        """The URL other nodes forward to: ``node_url``, or ``http://host:port`` when host is one address."""
        if self.node_url:
            return self.node_url.rstrip("/")
        if self.host in ("0.0.0.0", "::", "") or self.port == 0:
            raise ValueError(
                "with redis_url set, this node must say how others reach it: set SANDBOXD_NODE_URL "
                f"(host {self.host!r} port {self.port} is not an address another node can dial)"
            )
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def worker_count(self) -> int:
        return self.workers or vcpus()

    def hosting(self, kind: str) -> list[int]:
        """The worker indexes that host ``kind`` (its placement: every worker, or the first N)."""
        placed, cfg = self.kinds[kind], self.runner_config(kind)
        return [i for i in range(self.worker_count()) if placed.hosted_by(i, cfg)]

    def front_count(self) -> int:
        """From the workers (a container sees every host CPU; ``workers`` says how many are the node's)."""
        return self.fronts or max(1, -(-self.worker_count() // VCPUS_PER_FRONT))


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_runtime_dir(settings: NodeSettings) -> Path:
    """The node's scratch directory: the configured one, or a new private one (0700, unpredictable name).

    Directories left by a node that was killed (its pid is in the name) are removed first.
    """
    if settings.runtime_dir:
        path = Path(settings.runtime_dir)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path
    base = Path(tempfile.gettempdir())
    for stale in base.glob("sandboxd-*-*"):
        pid = stale.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists() and stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"sandboxd-{os.getpid()}-"))


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
