"""What every jailed kind's steps share at the edge: the files a step writes into its sandbox, and what one
execution did, measured outside the sandbox. The kinds' own models extend them (``python``, ``code``)."""

from __future__ import annotations

import base64
import binascii
import posixpath
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

MAX_FILES = 1000  # entries in `files`; each one is a file the sandbox must create
MAX_NAME_BYTES = 255  # one path component (NAME_MAX)
MAX_PATH_BYTES = 1024


def check_relative_paths(files: dict[str, str]) -> dict[str, str]:
    """Anything the sandbox could not create is the client's error here, never the program's or ours."""
    for path in files:
        norm = posixpath.normpath(path)
        if not path or path.startswith("/") or norm in (".", "..") or norm.startswith("../") or "\x00" in path:
            raise ValueError(f"file path must be relative and stay inside the workdir: {path!r}")
        check_path_length(path, norm)
    return files


def check_path_length(path: str, norm: str) -> None:
    """A path the kernel takes: at most ``MAX_PATH_BYTES``, each component at most ``MAX_NAME_BYTES``."""
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise ValueError(f"file path longer than {MAX_PATH_BYTES} bytes: {path[:40]!r}...")
    long = [p for p in norm.split("/") if len(p.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES]
    if long:
        raise ValueError(f"file name component longer than {MAX_NAME_BYTES} bytes: {long[0][:40]!r}...")


class StepFiles(BaseModel):
    """The files a step writes into its sandbox's working directory (python and code actions alike)."""

    files: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_FILES,
        description="Files written into the working directory before the program runs (compiles): relative path -> "
        "content "
        f"(at most {MAX_FILES}; names of at most {MAX_NAME_BYTES} bytes per component, {MAX_PATH_BYTES} in all).",
    )
    file_encoding: Literal["utf-8", "base64"] = Field(
        "utf-8", description="How `files` contents are written: UTF-8 text, or base64 of the bytes (binary files)."
    )

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: dict[str, str]) -> dict[str, str]:
        return check_relative_paths(files)

    @model_validator(mode="after")
    def _creatable(self) -> StepFiles:
        """Every file can be made: no path is a directory of another (``data`` and ``data/in.txt``), and no
        two name the same file (``a/../b`` and ``b``). Otherwise the program would start without them."""
        seen: dict[str, str] = {}
        for path in self.files:
            norm = posixpath.normpath(path)
            if norm in seen:
                raise ValueError(f"files: {path!r} and {seen[norm]!r} are the same file")
            seen[norm] = path
        for norm, path in seen.items():
            parent = posixpath.dirname(norm)
            while parent not in ("", "/"):  # "/": an absolute path's (a container's files), its own dirname
                if parent in seen:
                    raise ValueError(f"files: {seen[parent]!r} is a file, so {path!r} cannot be made inside it")
                parent = posixpath.dirname(parent)
        return self

    @model_validator(mode="after")
    def _decodable(self) -> StepFiles:
        if self.file_encoding == "base64":
            for path, content in self.files.items():
                try:
                    base64.b64decode(content, validate=True)
                except (binascii.Error, ValueError):
                    raise ValueError(f"files[{path!r}] is not valid base64") from None
        return self

    def file_bytes(self) -> list[tuple[str, bytes]]:
        """Each file's path and the bytes to write (decoded once the model is valid)."""
        if self.file_encoding == "base64":
            return [(p, base64.b64decode(c)) for p, c in self.files.items()]
        return [(p, c.encode()) for p, c in self.files.items()]


class ExecutionObservation(BaseModel):
    """What one execution did, as measured outside the sandbox (never as the program reports it)."""

    exit_code: int | None = Field(None, description="Exit status; None when killed by a signal.")
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = Field(False, description="Killed at its timeout_s.")
    killed_by: str | None = Field(
        None,
        description="time | memory | output, when a limit killed it; protocol when a session's program wrote "
        "to its control channel (the session ends).",
    )
    limits_hit: list[str] = Field(default_factory=list, description="Limits it ran into (memory, pids, time, output).")
    signal: int | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    cpu_ms: float | None = None
    max_rss_kb: int | None = None
    session_alive: bool | None = Field(None, description="Sessions: false when this step ended the session's process.")
    files: dict[str, str] | None = Field(
        None, description="With `fetch_files`: each returned file's content, base64, by the path asked for."
    )
    files_missing: dict[str, str] | None = Field(
        None, description="With `fetch_files`: each path not returned, and why."
    )
