"""Edge models of the Python runner: what a step's ``action`` may contain."""

from __future__ import annotations

import posixpath

from pydantic import BaseModel, ConfigDict, Field, field_validator


class PythonAction(BaseModel):
    """Run ``code`` as a Python program (one-shot) or as the next cell of a session."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(..., description="Python source; runs as __main__.")
    stdin: str = Field("", description="Standard input of the program.")
    files: dict[str, str] = Field(
        default_factory=dict,
        description="Files written into the working directory before the code runs: relative path -> UTF-8 content.",
    )

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: dict[str, str]) -> dict[str, str]:
        for path in files:
            norm = posixpath.normpath(path)
            if not path or path.startswith("/") or norm.startswith("..") or "\x00" in path or norm == ".":
                raise ValueError(f"file path must be relative and stay inside the workdir: {path!r}")
        return files
