"""The E2B API's request bodies as the SDKs send them: fields a later SDK adds are ignored, as E2B's API does.

No ``from __future__ import annotations``: FastAPI reads these models in the routes' signatures at run time.
"""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_TIMEOUT_S = 300  # the SDK's own default
MAX_TIMEOUT_S = 7 * 86400  # what a timeout may say at all (the node's session_ttl_s caps what it gets)


class Network(BaseModel):
    """A create's ``network``: egress rules and public traffic. Only what cannot be honoured matters here."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    allow_out: list[str] | None = Field(None, alias="allowOut")


class NewSandbox(BaseModel):
    """``POST /sandboxes`` (SDK 1.x to 2.45) and ``POST /v2/sandboxes`` (2.46 on) as the SDKs send them: the v2
    body leaves ``timeout`` out unless the caller set one. Fields a later SDK adds are ignored, as E2B's API
    does; the ones asking for what a sandbox here cannot do are refused by name (``refused``)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    template_id: str = Field(alias="templateID", max_length=256)
    timeout: int = Field(DEFAULT_TIMEOUT_S, ge=1, le=MAX_TIMEOUT_S)
    metadata: dict[str, str] | None = None  # JS sends null where Python sends {}
    env_vars: dict[str, str] | None = Field(None, alias="envVars")
    auto_pause: bool = Field(False, alias="autoPause")
    mcp: dict[str, Any] | None = None
    volume_mounts: list[Any] | None = Field(None, alias="volumeMounts")
    network: Network | None = None
    # False: reached by its id alone (e2b 1.x's default), served only where the operator allows it
    secure: bool | None = None

    def refused(self) -> str | None:
        """Why this create asks for what is not served (each the SDK's ``SandboxException`` by a 501)."""
        if self.auto_pause:
            return "autoPause is not served: a sandbox here is a live process, not a snapshot"
        if self.mcp:
            return "mcp is not served: sandboxes here have no network and no mcp-gateway template"
        if self.volume_mounts:
            return "volumeMounts are not served: a sandbox's files live in its own memory"
        if self.network is not None and self.network.allow_out:
            return "network.allowOut is not served: sandboxes here have no network at all"
        return None


class Timeout(BaseModel):
    model_config = ConfigDict(extra="ignore")
    timeout: int = Field(..., ge=0, le=MAX_TIMEOUT_S)


class Connect(BaseModel):
    """``POST /v2/sandboxes/{id}/connect``: ``{}`` or ``{"timeout": N}`` (``memory`` is a resume's, ignored)."""

    model_config = ConfigDict(extra="ignore")
    timeout: int = Field(DEFAULT_TIMEOUT_S, ge=0, le=MAX_TIMEOUT_S)


class Refresh(BaseModel):
    model_config = ConfigDict(extra="ignore")
    duration: int = Field(DEFAULT_TIMEOUT_S, ge=0, le=MAX_TIMEOUT_S)


class Execute(BaseModel):
    model_config = ConfigDict(extra="ignore")
    code: str
    context_id: str | None = None
    language: str | None = None
    env_vars: dict[str, str] | None = None


class NewContext(BaseModel):
    model_config = ConfigDict(extra="ignore")
    language: str | None = None
    cwd: str | None = None
