"""A container step at the edge: which image, what to run, and what it did (``ExecutionObservation``)."""

from __future__ import annotations

import posixpath
import re
import shlex

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandboxd.runners.jail.models import MAX_PATH_BYTES, ExecutionObservation, StepFiles, check_path_length

ENV_NAME = re.compile(r"[^=\x00]{1,256}")
USER = re.compile(r"[A-Za-z0-9_.\-]{1,64}(:[A-Za-z0-9_.\-]{1,64})?")
MAX_ENV = 256
MAX_ARGS = 4096


MAX_ENV_BYTES = 256 << 10  # names and values of one step's (or session's) variables


def _check_env(env: dict[str, str]) -> dict[str, str]:
    size = sum(
        len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass")) for k, v in env.items()
    )
    if size > MAX_ENV_BYTES:
        raise ValueError(f"env holds {size} bytes; at most {MAX_ENV_BYTES}")
    for key, value in env.items():
        if not ENV_NAME.fullmatch(key):
            raise ValueError(f"env: {key[:40]!r} is not a variable name (no '=' or NUL, 1..256 bytes)")
        if "\x00" in value:
            raise ValueError(f"env[{key!r}] holds a NUL byte")
    return env


def _check_workdir(workdir: str | None) -> str | None:
    if workdir is not None and (not workdir.startswith("/") or "\x00" in workdir or len(workdir) > MAX_PATH_BYTES):
        raise ValueError(f"workdir must be an absolute path of at most {MAX_PATH_BYTES} bytes: {workdir[:40]!r}")
    return workdir


class ContainerFiles(StepFiles):
    """Files written before the command runs: relative to the working directory, or absolute (the whole root
    is the sandbox's own writable layer over the image)."""

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: dict[str, str]) -> dict[str, str]:
        for path in files:
            norm = posixpath.normpath(path)
            if not path or norm in ("/", ".", "//") or "\x00" in path:
                raise ValueError(f"file path names no file: {path!r}")
            if not path.startswith("/") and (norm == ".." or norm.startswith("../")):
                raise ValueError(f"a relative file path must stay inside the working directory: {path!r}")
            check_path_length(path, norm)
        return files


class ContainerAction(ContainerFiles):
    """One command in a sandbox of an image: a one-shot (``image`` required), or a session's next command
    (its image, user and environment are the session's)."""

    model_config = ConfigDict(extra="forbid")

    image: str | None = Field(
        None, max_length=255, description="The image (`sandboxd image list`); one-shots only: a session has its own."
    )
    cmd: str | list[str] | None = Field(
        None,
        description="A string: a shell command, run by the image's /bin/sh -c (no Entrypoint). A list: the "
        "arguments, after the image's Entrypoint, replacing its Cmd (as `docker run IMAGE ARGS...`). Absent: the "
        "image's Entrypoint and Cmd. A session step takes a string (a list is quoted into one).",
    )
    code: str | None = Field(
        None,
        description="Sessions: a python cell instead of a command, run by the image's own python3 (started on the "
        "session's first cell, as its user, in its environment), whose globals the next cell sees, as in a python "
        "session: an uncaught exception is exit code 1 with its traceback on stderr.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_ENV,
        description="One-shots: variables over the image's Env. (A session's are its options'; a command exports "
        "its own.)",
    )
    user: str | None = Field(
        None, description="One-shots: the user (`name`, `uid`, `name:group`, `uid:gid`) instead of the image's User."
    )
    workdir: str | None = Field(
        None, description="One-shots: the working directory instead of the image's WorkingDir (made if missing)."
    )
    stdin: str = Field("", description="The command's standard input.")
    fetch_files: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="One-shots: files returned after the command ends (relative to the working directory, or "
        "absolute), base64 in `observation.files`.",
    )

    _env = field_validator("env")(classmethod(lambda cls, v: _check_env(v)))
    _workdir = field_validator("workdir")(classmethod(lambda cls, v: _check_workdir(v)))

    @field_validator("fetch_files")
    @classmethod
    def _fetch(cls, paths: list[str]) -> list[str]:
        for path in paths:
            if not path or "\x00" in path:
                raise ValueError(f"fetch_files: {path[:40]!r} names no file")
            check_path_length(path, posixpath.normpath(path))
        return paths

    @field_validator("user")
    @classmethod
    def _user(cls, user: str | None) -> str | None:
        if user is not None and not USER.fullmatch(user):
            raise ValueError(f"user must be name, uid, name:group or uid:gid: {user[:40]!r}")
        return user

    @field_validator("cmd")
    @classmethod
    def _cmd(cls, cmd: str | list[str] | None) -> str | list[str] | None:
        if isinstance(cmd, list) and (len(cmd) > MAX_ARGS or any("\x00" in a for a in cmd)):
            raise ValueError(f"cmd: at most {MAX_ARGS} arguments, none holding a NUL byte")
        if isinstance(cmd, str) and "\x00" in cmd:
            raise ValueError("cmd holds a NUL byte")
        return cmd

    @model_validator(mode="after")
    def _one_program(self) -> ContainerAction:
        if self.code is not None and self.cmd is not None:
            raise ValueError("a step gives cmd (a command) or code (a python cell), not both")
        return self

    def command(self) -> str:
        """A session's command: the string as it is, a list quoted into one."""
        if isinstance(self.cmd, list):
            return shlex.join(self.cmd)
        return self.cmd or ""


class ContainerSessionOptions(BaseModel):
    """``options`` of ``POST /sessions`` for container: the image and how its shell starts."""

    model_config = ConfigDict(extra="forbid")

    image: str = Field(..., max_length=255, description="The image the session's root is made of.")
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV, description="Variables over the image's Env.")
    user: str | None = Field(None, description="The user instead of the image's User.")
    workdir: str | None = Field(None, description="Where the shell starts instead of the image's WorkingDir.")

    _env = field_validator("env")(classmethod(lambda cls, v: _check_env(v)))
    _workdir = field_validator("workdir")(classmethod(lambda cls, v: _check_workdir(v)))
    _user = field_validator("user")(classmethod(lambda cls, v: ContainerAction._user(v)))


class ContainerObservation(ExecutionObservation):
    """What the command did, measured outside the sandbox."""

    image_id: str | None = Field(None, description="The image's id (its config's digest) the sandbox ran.")
