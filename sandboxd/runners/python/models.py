"""Edge models of the Python runner: what a step's ``action`` may contain, and what it returns."""

from __future__ import annotations

import posixpath

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandboxd.runners.jail.models import MAX_FILES, MAX_PATH_BYTES, ExecutionObservation, StepFiles


class PythonAction(StepFiles):
    """Run ``code`` as a Python program (one-shot) or as the next cell of a session."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(..., description="Python source; runs as __main__.")
    stdin: str = Field("", description="Standard input of the program.")
    script: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\.py$",
        description="One-shot steps: run the code as this file of the working directory, as `python <script>` "
        "would (it is written there; `__file__`, `sys.argv[0]` and `sys.path[0]` name it). Without it the code "
        "runs as `python -c` would (`sys.path[0]` is the working directory, no `__file__`).",
    )
    env: str | None = Field(
        None,
        pattern=r"^[a-z][a-z0-9_-]{0,31}$",
        description="The Python environment (package tree) the program imports from: one the node has built "
        "(`GET /runners/python` lists them); omitted, the node's `default_environment`. A session's environment "
        "is its first step's.",
    )
    grade: bool = Field(
        False,
        description="Session steps: run `code` not in the session but in a fresh one-shot sandbox whose working "
        "directory holds a copy of the session's files (and `files` over them): a grader that nothing the "
        "policy's code did to its interpreter can reach. The session is left as it was.",
    )
    fetch_files: list[str] = Field(
        default_factory=list,
        max_length=MAX_FILES,
        description="One-shot steps: files returned (base64, in `observation.files`) after the program ended: "
        "relative paths in the working directory, or absolute ones anywhere the sandbox sees. One that cannot be "
        "read (absent, not a regular file, past the node's `max_fetch_bytes` in all) is named in "
        "`observation.files_missing` with the reason; the program's verdict never depends on it.",
    )

    @field_validator("fetch_files")
    @classmethod
    def _fetchable(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path or "\x00" in path:
                raise ValueError(f"fetch_files: {path!r} is not a path")
            if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
                raise ValueError(f"fetch_files: path longer than {MAX_PATH_BYTES} bytes: {path[:40]!r}...")
            norm = posixpath.normpath(path)
            if not path.startswith("/") and (norm == ".." or norm.startswith("../")):
                raise ValueError(f"fetch_files: relative path {path!r} leaves the working directory")
        return paths

    @model_validator(mode="after")
    def _script_is_not_a_file(self) -> PythonAction:
        if self.script is not None and self.script in {posixpath.normpath(p) for p in self.files}:
            raise ValueError(f"script: {self.script!r} is also one of the step's files")
        return self


class PythonObservation(ExecutionObservation):
    """What one execution did, as measured outside the sandbox (never as the program reports it)."""

    session_files_skipped: dict[str, str] | None = Field(
        None,
        description="Grade steps: the session's files not copied into the grader's sandbox (symbolic links, "
        "FIFOs, past the size budget), and why.",
    )


class PythonSessionOptions(BaseModel):
    """``options`` of ``POST /sessions`` for python."""

    model_config = ConfigDict(extra="forbid")

    keep_processes: bool = Field(
        False,
        description="Processes a cell starts keep running after it (background servers, E2B's background "
        "commands); by default whatever a cell leaves running is killed when it ends, since a session's state "
        "is its interpreter's. Either way they are bounded by the session's pids and memory limits and end "
        "with the session.",
    )
