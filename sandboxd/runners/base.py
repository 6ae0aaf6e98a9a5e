"""The one small protocol every runner kind implements, and what a kind declares.

A runner kind is one package under ``sandboxd/runners/`` (or any importable
package of a third party) whose ``KIND`` is a ``RunnerKind``: its config model,
action model, observation model, and the import string of its runner class.
The gateway imports only the light parts (pydantic models) to validate actions
at the edge; the runner class, with its heavy dependencies (nsjail, DuckDB,
Playwright), is imported in the worker processes that host it, and only there.

A step returns a ``StepOutcome``: a typed observation plus the program's own
verdict. Nothing downstream guesses from observation keys whether the program
failed; the runner says so.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, Self

from pydantic import BaseModel, ConfigDict, Field

from sandboxd.errors import BadRequest, SandboxdError, Saturated
from sandboxd.runners.starvation import Density


class SlotLender(Protocol):
    """More of a kind's slots for the step that holds one, for work it can spread (a program's test cases).

    A kind that declares ``Capabilities(borrows_slots=True)`` gets one in its one-shot steps' limits; the
    others' steps go without (no per-step work for kinds that never borrow)."""

    def borrow(self) -> bool:
        """One more slot, now, if one is free, nobody waits, and the step's tenant is below its fair share."""
        ...

    def give_back(self) -> None:
        """Return one borrowed slot."""
        ...


@dataclass(frozen=True)
class StepLimits:
    """Per-step limits after the gateway checked them against the node's maxima."""

    timeout_s: float
    memory_mb: int | None = None
    max_output_bytes: int | None = None
    lender: SlotLender | None = field(default=None, compare=False)  # one-shot steps, from the worker's admission
    # The longest a step may run in all (the node's max_timeout_s): a kind that runs several executions per
    # step (test cases) keeps their sum within it.
    budget_s: float = math.inf
    # When the caller stops listening (monotonic; /run_code's clients time out on their own): a step the node
    # keeps off the CPU is given its time back only until then, and is the node's failure at it.
    answer_by: float | None = None
    tenant: str = ""  # whose step it is: what a kind keeps between steps (a compile cache) is kept per tenant
    # A one-shot's queue deadline (monotonic): a kind that waits for room of its own (the browser's gate)
    # waits until then at most, and answers 504 after.
    admit_by: float | None = None


@dataclass(frozen=True)
class ProgramFailure:
    """The program's own failure: a result to score, never the service's fault."""

    code: str  # stable: program_exit, program_timeout, program_killed, action_error, ...
    message: str


@dataclass(frozen=True)
class StepOutcome:
    """What a runner's step produced.

    ``session_alive`` false means the session's sandbox ended with this step
    (its program exited or was killed), so the gateway closes the session.
    ``killed_by`` and ``limits_hit`` feed the metrics.
    """

    observation: BaseModel
    failure: ProgramFailure | None = None
    session_alive: bool = True
    killed_by: str | None = None
    limits_hit: tuple[str, ...] = ()
    # The node failed the step after part of it ran (a browser action it starved twice): the step is answered
    # as this error (its status, blame infra), with the observation of what was done by then.
    infra: SandboxdError | None = None


@dataclass(frozen=True)
class RunnerContext:
    """What a worker gives every runner it builds."""

    runtime_dir: Path  # scratch space of this node (sockets, jail logs)
    # e.g. "node1-4242-w0-python": unique per worker process and kind (``of_kind``), for cgroup and file names.
    # Two kinds of one worker start at once: a name they shared would give them one slot group's limits and
    # counters, and one jail config file each would overwrite.
    name: str
    worker_index: int
    images_dir: Path | None = None  # the node's image store (``sandboxd/images``), for kinds that run images
    image_uid_base: int = 0  # where the store's owners are on the host (``images.unpack.IdRange``)
    # The worker's density, shared by all its kinds: what a step's wall cap allows for (``starvation.py``).
    density: Density = field(default_factory=Density)

    def of_kind(self, kind: str) -> RunnerContext:
        """The context of ``kind``'s runner in this worker: everything it names is its own."""
        return dataclasses.replace(self, name=f"{self.name}-{kind}")


@dataclass(frozen=True)
class Reservation:
    """Memory and pids a sandbox may take at its limits: what the node's budget is charged for it."""

    memory_bytes: int = 0
    pids: int = 0

    def __add__(self, other: Reservation) -> Reservation:
        return Reservation(self.memory_bytes + other.memory_bytes, self.pids + other.pids)

    def times(self, n: int) -> Reservation:
        return Reservation(self.memory_bytes * n, self.pids * n)


class RunnerConfig(BaseModel):
    """Base of every kind's config: ``extra="forbid"``, a docstring on every field."""

    model_config = ConfigDict(extra="forbid")

    max_action_bytes: int = Field(1 << 20, ge=64, description="Largest action of one step, as JSON; more is a 413.")
    instances_per_node: int = Field(
        0,
        ge=0,
        description="Placement: 0 = an instance in every worker; N = in the first N workers only "
        "(for kinds whose instances are heavy, e.g. a browser).",
    )

    def pool_reservation(self) -> Reservation:
        """What one instance holds whatever its load (its warm sandboxes at their limits), for the node's
        budget (``node/ledger.py``); none by default (a kind that runs in the worker itself)."""
        return Reservation()

    def session_reservation(self) -> Reservation:
        """What one session may take at its limits beyond the pool's, reserved while it lives."""
        return Reservation()

    def cores_at_once(self) -> float:
        """The cores' worth of sandboxes one instance runs at once by its slots (its quota each): its share of
        its worker's density (``starvation.Density``); none for a kind that runs in the worker itself."""
        return 0.0

    START_TIMEOUTS: ClassVar[tuple[str, ...]] = ()  # the fields that bound how long its start may take

    def patient(self, factor: float) -> Self:
        """This config with its start timeouts (``START_TIMEOUTS``) ``factor`` times longer: a worker's later
        attempt to start a kind that timed out on a loaded machine waits longer each time."""
        if factor == 1 or not self.START_TIMEOUTS:
            return self
        return self.model_copy(update={f: getattr(self, f) * factor for f in self.START_TIMEOUTS})


class Runner(Protocol):
    """What a worker needs of a runner kind. All methods but ``capacity`` are coroutines."""

    def capacity(self) -> int:
        """Concurrent one-shot steps this instance takes."""
        ...

    async def start(self) -> None:
        """Warm the pools; return when the runner can take steps."""
        ...

    async def step(self, action: Any, session_id: str | None, limits: StepLimits) -> StepOutcome:
        """Run one validated action (an instance of the kind's action model)."""
        ...

    async def open_session(self, session_id: str, options: dict[str, Any]) -> None:
        """Create the per-session state; ``Saturated`` at the session cap."""
        ...

    async def close_session(self, session_id: str) -> None:
        """Free the session's state; unknown ids are ignored (idempotent)."""
        ...

    async def health(self) -> dict[str, Any]:
        """Pool occupancy and counters (``capacity``, ``free_slots``, ``sessions``...), for /readyz and metrics."""
        ...

    async def close(self) -> None:
        """Stop everything this runner started; nothing may be left running."""
        ...


class ForkingRunner(Runner, Protocol):
    """A runner whose sessions can be forked: the optional capability behind ``POST /sessions/{id}/fork``."""

    async def fork_session(self, source_id: str, new_ids: list[str]) -> list[str]:
        """Open ``new_ids``, each starting from a copy of ``source_id``'s state; the source goes on untouched.

        All or nothing: at the session cap (``Saturated``) or on any failure no copy is left open. Returns
        notes on what could not be copied (e.g. a page's live JavaScript state), for the client to read.
        """
        ...


class InterruptingRunner(Runner, Protocol):
    """A runner whose session steps can be interrupted from outside: a kernel's interrupt, for a client that
    stopped waiting for its cell (E2B's ``run_code`` timing out), so the next one does not queue behind it."""

    async def interrupt_session(self, session_id: str) -> bool:
        """Interrupt the step ``session_id`` runs now, its state kept; False when none runs."""
        ...


class BurstingRunner(Runner, Protocol):
    """A runner with slots beyond its capacity for tenants below their fair share (the worker's admission)."""

    def burst_capacity(self) -> int:
        """Burst slots this instance takes."""
        ...


@dataclass(frozen=True)
class Capabilities:
    """What a kind's runner does beyond the ``Runner`` protocol, declared with the kind: the core reads this,
    never the runner's attributes, and a worker refuses to start a runner that lacks a method it declares."""

    fork: bool = False  # ``ForkingRunner.fork_session``: POST /sessions/{id}/fork
    interrupt: bool = False  # ``InterruptingRunner.interrupt_session``: a client that stopped waiting for a step
    burst: bool = False  # ``BurstingRunner.burst_capacity``: slots for tenants below their fair share
    borrows_slots: bool = False  # its one-shot steps get a ``SlotLender`` (test cases spread over free slots)

    def missing_from(self, runner: object) -> list[str]:
        """The methods this declaration promises that ``runner`` lacks."""
        wanted = [("fork_session", self.fork), ("interrupt_session", self.interrupt), ("burst_capacity", self.burst)]
        return [name for name, declared in wanted if declared and not callable(getattr(runner, name, None))]


def refuse_fork_at_cap(kind: str, held: int, n: int, cap: int, session_id: str) -> None:
    """A group of copies fits whole or not at all: a partial GRPO group is no group."""
    if held + n > cap:
        raise Saturated(
            f"{kind} sessions on this worker: {held} held + {n} copies would pass its cap of {cap}",
            retry_after_s=5.0,
            session_id=session_id,
        )


AdmitHook = Callable[[Any, StepLimits, Any], None]


@dataclass(frozen=True)
class RunnerKind:
    """A runner kind's declaration: everything the core learns about it, in one object.

    ``admit(action, limits, config)`` runs at the gateway before a step is
    placed: checks that need the node's configuration (payload caps, limits
    above the kind's maximum) and raise a ``ClientError``.
    ``default_enabled`` false keeps a kind off unless ``runners`` names it.
    ``describe(config)`` adds kind-specific fields to ``GET /runners/{kind}`` (e.g. the
    tools listing in the OpenAI function-calling shape, the python environments built).
    ``capabilities`` says what its runner does beyond the protocol (forks, interrupts, burst slots).
    """

    name: str
    config: type[RunnerConfig]
    action: type[BaseModel]
    observation: type[BaseModel]
    runner: str  # "module:Class", imported in the workers only
    title: str = ""
    default_enabled: bool = True  # on when SANDBOXD_RUNNERS is not set
    admit: AdmitHook | None = None
    describe: Callable[[Any], dict[str, Any]] | None = None
    session_options: type[BaseModel] | None = None
    capabilities: Capabilities = Capabilities()
    # Its MCP tool's name (``run_<name>`` when empty); the tool's parameters are its action model's fields.
    tool: str = ""
    # Why this kind's sessions cannot be forked, when it does not declare ``fork`` (a 422 says it).
    no_fork: str = ""
    # Why this kind has no sessions at all (one-shot steps only), or empty: ``POST /sessions`` is a 422 saying it.
    no_sessions: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def runner_class(self) -> Callable[[Any, RunnerContext], Runner]:
        cls: Callable[[Any, RunnerContext], Runner] = import_string(self.runner)
        return cls

    def parse_action(self, raw: dict[str, Any]) -> BaseModel:
        """The action as the kind's model; a ``BadRequest`` naming each bad field otherwise."""
        return _parse(self.action, raw, "action")

    def parse_options(self, raw: dict[str, Any]) -> None:
        """Session options checked against the kind's model, when it declares one (others ignore options)."""
        if self.session_options is not None:
            _parse(self.session_options, raw, "options")

    def hosted_by(self, worker_index: int, config: RunnerConfig) -> bool:
        """Placement: does worker ``worker_index`` run an instance of this kind?"""
        return config.instances_per_node == 0 or worker_index < config.instances_per_node


def refuse_at_session_cap(kind: str, held: int, cap: int, session_id: str, retry_after_s: float = 5.0) -> None:
    """Every kind refuses a new session the same way at its cap: 429 with a retry hint, blame infra."""
    if held >= cap:
        raise Saturated(
            f"{kind}: this worker holds {held} sessions (max_sessions_per_worker {cap}); retry later",
            retry_after_s=retry_after_s,
            session_id=session_id,
        )


def _parse(model: type[BaseModel], raw: dict[str, Any], prefix: str) -> BaseModel:
    from pydantic import ValidationError

    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise BadRequest(validation_message(exc, prefix)) from None


def validation_message(exc: Any, prefix: str) -> str:
    """One line per invalid field, with its dotted location, from a pydantic ``ValidationError``."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in (prefix, *err.get("loc", ())) if p != "")
        parts.append(f"{loc}: {err.get('msg')}")
    return "; ".join(parts)


def import_string(spec: str) -> Any:
    """``"package.module:attr"`` -> the attribute (uvicorn's importer, in one line)."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ImportError(f"import string {spec!r} must look like 'package.module:attribute'")
    return getattr(importlib.import_module(module), attr)
