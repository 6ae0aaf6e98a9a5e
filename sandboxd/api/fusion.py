"""SandboxFusion's wire contract: ``POST /run_code`` and ``GET /v1/ping``, so verl, SkyRL and
tinker-cookbook code (and the official ``sandbox-fusion`` client) work with a URL change.

What callers of this contract rely on, and how it is kept here:

- Execution outcomes are HTTP 200 with ``status`` Success | Failed | SandboxError,
  decided exactly as SandboxFusion does (any result "Error" -> SandboxError; else any
  "TimeLimitExceeded" -> Failed; else a non-zero return code -> Failed; else
  Success). "Error" and SandboxError are kept for infrastructure failures: a program
  that crashes, runs out of memory or time is "Failed", never a sandbox error, and
  an infrastructure failure is never a plain "Failed" (which a trainer would score
  as a wrong answer).
- No enum value is added (the official client validates them strictly): our
  diagnostics (``blame``, ``killed_by``, ``limits_hit``, memory) are extra keys.
- verl retries HTTP 504 only and scores any other failure as wrong: so this route
  never answers 429. It waits for a free sandbox (retrying our admission control)
  and answers 504 only when the request's own deadline would pass:
  ``compile_timeout + fusion_queue_grace_s`` of waiting, after which ``run_timeout``
  of running still fits in the time verl's client allows (compile + run + 10 s).
  A node that is shutting down answers 504 too, so the retry lands elsewhere. A run is timed on its
  own time (the CPU it was kept from by other sandboxes is given back: docs/security.md), but never past
  the moment verl's client stops listening: a run the node starved until then is a 504 ``node_pressure``
  (retried), not a read timeout and not a score.
- The client's own mistakes (no ``code``, a language this node does not run, a
  timeout above the node's maximum) are 4xx with FastAPI's ``{"detail": ...}``, the
  shape SandboxFusion's FastAPI app gives them.
"""

import asyncio
import random
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from sandboxd.api.surface import surface_router
from sandboxd.csvtext import as_csv
from sandboxd.errors import (
    AtCapacity,
    BadRequest,
    DeadlineExceeded,
    NodePressure,
    SandboxdError,
    Saturated,
    ShuttingDown,
)
from sandboxd.front.auth import Auth
from sandboxd.front.gateway import Gateway
from sandboxd.front.surfaces import Surface, json_response
from sandboxd.models import Limits, StepRequest, StepResult
from sandboxd.runners.python.config import PythonRunnerConfig

NATIVE = ("python", "sql")  # run by their own kinds; the ``code`` kind's languages (when enabled) too
MIN_MEMORY_MB = 16  # the smallest sandbox the runner makes (Limits.memory_mb)
MAX_FETCH_FILES = 1000  # as the python runner's fetch_files


class RunCodeRequest(BaseModel):
    """SandboxFusion's request; fields it has that we do not use (``args``) and unknown ones are ignored."""

    model_config = ConfigDict(extra="ignore")

    code: str = Field(..., description="The program (for sql: the query).")
    language: str = Field(
        "python",
        description="python, sql, and with the code runner cpp, c, java, go, rust, nodejs (js), bash, pytest; "
        "verl's tutorial sends none: python.",
    )
    compile_timeout: float = Field(
        10.0, ge=0, description="Seconds a compilation may take (compiled languages); part of the deadline."
    )
    run_timeout: float = Field(10.0, gt=0, description="Seconds the program may run.")
    memory_limit_MB: int = Field(-1, description="-1 = the node's default; more than the node's maximum gets it.")
    stdin: str | None = None
    files: dict[str, str | None] = Field(default_factory=dict, description="Path -> base64 content, written first.")
    fetch_files: list[str] = Field(
        default_factory=list, max_length=MAX_FETCH_FILES, description="Paths returned (base64) after the run."
    )


CLIENT_PATIENCE_S = 10.0  # what verl's client waits past compile_timeout + run_timeout (its API_TIMEOUT)
ANSWER_MARGIN_S = 1.0  # answered this much before it gives up


def fusion_error(exc: SandboxdError) -> Response:
    """Errors that are not execution outcomes, in the shape of SandboxFusion's FastAPI app."""
    if isinstance(exc, (DeadlineExceeded, Saturated, AtCapacity, ShuttingDown, NodePressure)):
        return json_response({"detail": exc.message}, 504)  # verl retries 504, and only 504
    if exc.blame == "infra":
        return json_response(_sandbox_error(exc.message), 200)
    return json_response({"detail": exc.message}, exc.status)


SURFACE = Surface(
    "sandboxfusion",
    fusion_error,
    prefixes=(b"/run_code",),
    exact=frozenset({b"/v1/ping"}),
    public_exact=frozenset({b"/v1/ping"}),  # its clients' health check, before any key
)


def _sandbox_error(message: str, **extra: Any) -> dict[str, Any]:
    return {
        "status": "SandboxError",
        "message": message,
        "compile_result": None,
        "run_result": None,
        "executor_pod_name": None,
        "files": {},
        "blame": "infra",
        **extra,
    }


def script_name(files: dict[str, str | None]) -> str:
    """The file the code runs as, named as SandboxFusion's ``NamedTemporaryFile`` names it (``tmp<8>.py``):
    programs that use ``__file__`` (copy themselves, find data beside them) find a file there."""
    taken = set(files)
    while True:
        name = "tmp" + "".join(random.choices("abcdefghijklmnopqrstuvwxyz0123456789_", k=8)) + ".py"
        if name not in taken:
            return name


def run_status(results: list[dict[str, Any] | None]) -> str:
    """SandboxFusion's own rule, in its order."""
    done = [r for r in results if r is not None]
    if any(r["status"] == "Error" for r in done):
        return "SandboxError"
    if any(r["status"] == "TimeLimitExceeded" for r in done):
        return "Failed"
    if any(r["return_code"] is not None and r["return_code"] != 0 for r in done):
        return "Failed"
    return "Success"


def python_result(res: StepResult, memory_mb: int) -> dict[str, Any]:
    obs = res.observation or {}
    timed_out = bool(obs.get("timed_out"))
    signal = obs.get("signal")
    code = None if timed_out else (-signal if signal else obs.get("exit_code"))  # -9: Python's own convention
    return {
        "status": "TimeLimitExceeded" if timed_out else "Finished",
        "execution_time": round(res.latency_ms / 1000, 4),
        "cpu_time": round(obs["cpu_ms"] / 1000, 4) if obs.get("cpu_ms") is not None else None,
        "return_code": code,
        "stdout": obs.get("stdout", ""),
        "stderr": obs.get("stderr", ""),
        "killed_by": obs.get("killed_by"),
        "limits_hit": obs.get("limits_hit", []),
        "max_rss_kb": obs.get("max_rss_kb"),
        "memory_limit_mb": memory_mb,
        "stdout_truncated": obs.get("stdout_truncated", False),
        "stderr_truncated": obs.get("stderr_truncated", False),
    }


def code_results(res: StepResult, memory_mb: int) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """SandboxFusion's ``compile_result`` and ``run_result`` from a ``code`` step: a compilation that failed
    is ``Finished`` with its non-zero return code (or ``TimeLimitExceeded``) and no run, as SandboxFusion
    reports it (verl maps that to its compile-error code, -4)."""
    obs = res.observation or {}
    compiled = obs.get("compile")
    compile_result = None
    compile_ms = 0.0
    if compiled is not None:
        compile_ms = float(compiled.get("wall_ms") or 0.0)
        timed_out = bool(compiled.get("timed_out"))
        compile_result = {
            "status": "TimeLimitExceeded" if timed_out else "Finished",
            "execution_time": round(compile_ms / 1000, 4),
            "cpu_time": round(compiled["cpu_ms"] / 1000, 4) if compiled.get("cpu_ms") is not None else None,
            "return_code": None if timed_out else compiled.get("exit_code"),
            "stdout": compiled.get("stdout", ""),
            "stderr": compiled.get("stderr", ""),
            "killed_by": compiled.get("killed_by"),
            "cached": bool(compiled.get("cached")),
        }
        if res.error is not None and res.error.code == "compile_error":
            return compile_result, None
    run = python_result(res, memory_mb)
    run["execution_time"] = round(max(res.latency_ms - compile_ms, 0.0) / 1000, 4)
    return compile_result, run


def sql_result(res: StepResult) -> dict[str, Any]:
    """Rows as CSV with a header line on stdout; an SQL error is the program's: return code 1, message on stderr."""
    obs = res.observation or {}
    if obs.get("timed_out"):
        status, code, out, err = "TimeLimitExceeded", None, "", obs.get("error") or ""
    elif obs.get("error"):
        status, code, out, err = "Finished", 1, "", obs["error"]
    else:
        status, code, out, err = "Finished", 0, as_csv(obs.get("columns", []), obs.get("rows", [])), ""
        if obs.get("truncated"):
            err = f"sandboxd: result truncated to {len(obs.get('rows', []))} rows\n"
    return {
        "status": status,
        "execution_time": round(res.latency_ms / 1000, 4),
        "return_code": code,
        "stdout": out,
        "stderr": err,
        "row_count": obs.get("row_count"),
    }


class FusionRunner:
    """Runs one /run_code request on the gateway: waits for room instead of refusing, within its deadline."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._names: list[str] | None = None

    async def _until_admitted(self, run: Any, deadline: float) -> Any:
        """Retry our admission control (429) until the deadline; the queue itself waits up to it."""
        while True:
            try:
                res = await run()
            except Saturated:
                if time.monotonic() >= deadline:
                    raise
            else:
                refused = isinstance(res, StepResult) and res.error is not None and res.error.code == "saturated"
                if not refused:
                    return res
                if time.monotonic() >= deadline:
                    raise Saturated(res.error.message)
            await asyncio.sleep(min(random.uniform(0.05, 0.2), max(deadline - time.monotonic(), 0)))

    def _check(self, res: StepResult) -> None:
        """A step that failed before or around its program: the client's error, or an infrastructure failure."""
        if (exc := res.not_the_programs()) is not None:
            raise exc

    def _python(self) -> PythonRunnerConfig:
        cfg = self.gateway.settings.runner_config("python")
        assert isinstance(cfg, PythonRunnerConfig)
        return cfg

    async def run(self, req: RunCodeRequest, tenant: str) -> dict[str, Any]:
        settings = self.gateway.settings
        languages = await self._languages()
        if req.language not in languages:
            raise BadRequest(
                f"language {req.language!r} is not available on this node (available: {', '.join(languages)})"
            )
        # Never longer than any step may wait here (queue_timeout_s): a huge compile_timeout holds no connection.
        wait_s = min(req.compile_timeout + settings.fusion_queue_grace_s, settings.queue_timeout_s)
        deadline = time.monotonic() + wait_s
        # verl's client gives up after compile + run + 10 s: a run the node starves (it is timed on its own time,
        # docs/security.md) is answered 504, which verl retries, before that, never left to a read timeout.
        answer_by = time.monotonic() + req.compile_timeout + req.run_timeout + CLIENT_PATIENCE_S - ANSWER_MARGIN_S
        if req.language == "sql":
            if req.files or req.fetch_files:
                raise BadRequest("files and fetch_files are not supported for language 'sql'")
            step = StepRequest(runner="sql", action={"query": req.code}, timeout_s=req.run_timeout)
            res = await self._until_admitted(lambda: self.gateway.step(step, tenant, deadline, answer_by), deadline)
            self._check(res)
            result = sql_result(res)
            return self._response(result, {}, "", res)
        if req.language not in NATIVE:
            return await self._code(req, tenant, deadline, answer_by)
        memory_mb = self._python().memory_mb
        if 0 < req.memory_limit_MB < MIN_MEMORY_MB:
            raise BadRequest(f"memory_limit_MB: {req.memory_limit_MB} is below the smallest sandbox ({MIN_MEMORY_MB})")
        if req.memory_limit_MB > 0:
            memory_mb = min(req.memory_limit_MB, memory_mb)
        action: dict[str, Any] = {
            "code": req.code,
            "stdin": req.stdin or "",
            "files": {p: c or "" for p, c in req.files.items()},
            "file_encoding": "base64",
            "script": script_name(req.files),
        }
        if req.fetch_files:
            action["fetch_files"] = req.fetch_files
        limits = Limits(memory_mb=memory_mb)
        step = StepRequest(runner="python", action=action, timeout_s=req.run_timeout, limits=limits)
        res = await self._until_admitted(lambda: self.gateway.step(step, tenant, deadline, answer_by), deadline)
        self._check(res)
        obs = res.observation or {}
        missing = obs.get("files_missing") or {}
        note = "; ".join(f"{path}: {why}" for path, why in missing.items())
        return self._response(
            python_result(res, memory_mb), obs.get("files") or {}, note and f"fetch_files: {note}", res
        )

    async def _languages(self) -> list[str]:
        """What this node runs (once per process: the code kind's toolchains are probed off the event loop)."""
        if self._names is None:
            kinds = self.gateway.kinds
            names = [lang for lang in NATIVE if lang in kinds]
            if "code" in kinds:
                from sandboxd.runners.code.config import CodeRunnerConfig
                from sandboxd.runners.code.runner import node_toolchains

                cfg = self.gateway.settings.runner_config("code")
                assert isinstance(cfg, CodeRunnerConfig)
                chains = await asyncio.to_thread(node_toolchains, cfg)
                names += sorted(n for n in chains if n not in NATIVE)
            self._names = names
        return self._names

    async def _code(self, req: RunCodeRequest, tenant: str, deadline: float, answer_by: float) -> dict[str, Any]:
        """A language of the ``code`` kind: compiled (with its cache) and run in one step."""
        from sandboxd.runners.code.config import CodeRunnerConfig

        cfg = self.gateway.settings.runner_config("code")
        assert isinstance(cfg, CodeRunnerConfig)
        if req.fetch_files:
            raise BadRequest(f"fetch_files is supported for python here, not for {req.language!r}")
        if 0 < req.memory_limit_MB < MIN_MEMORY_MB:
            raise BadRequest(f"memory_limit_MB: {req.memory_limit_MB} is below the smallest sandbox ({MIN_MEMORY_MB})")
        memory_mb = min(req.memory_limit_MB, cfg.memory_mb) if req.memory_limit_MB > 0 else cfg.memory_mb
        action: dict[str, Any] = {
            "language": req.language,
            "code": req.code,
            "stdin": req.stdin or "",
            "files": {p: c or "" for p, c in req.files.items()},
            "file_encoding": "base64",
            "compile_timeout_s": min(max(req.compile_timeout, 0.1), cfg.compile_timeout_s),
        }
        step = StepRequest(runner="code", action=action, timeout_s=req.run_timeout, limits=Limits(memory_mb=memory_mb))
        res = await self._until_admitted(lambda: self.gateway.step(step, tenant, deadline, answer_by), deadline)
        self._check(res)
        compile_result, run_result = code_results(res, memory_mb)
        return self._response(run_result, {}, "", res, compile_result)

    def _response(
        self,
        result: dict[str, Any] | None,
        files: dict[str, str],
        note: str,
        res: StepResult,
        compile_result: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        status = run_status([compile_result, result])
        return {
            "status": status,
            "message": note,
            "compile_result": compile_result,
            "run_result": result,
            "executor_pod_name": self.gateway.settings.node_id,
            "files": files,
            "blame": None if status == "Success" else "program",
            "worker": res.worker,
        }


def router(gateway: Gateway, auth: Auth) -> APIRouter:
    api = surface_router(SURFACE.render)
    runner = FusionRunner(gateway)
    Tenant = Annotated[str, Depends(auth)]

    @api.post("/run_code", tags=["sandboxfusion"])
    async def run_code(req: RunCodeRequest, tenant: Tenant) -> Response:
        """SandboxFusion's ``/run_code``: python (jailed), sql (DuckDB), and the code runner's languages (cpp,
        java, go, rust, nodejs, bash, pytest, ...: compiled once, cached); always 200 for execution outcomes."""
        return json_response(await runner.run(req, tenant))

    @api.get("/v1/ping", tags=["sandboxfusion"])
    async def ping() -> Response:
        """SandboxFusion's liveness probe: "pong"."""
        return json_response("pong")

    return api
