"""Edge models of the browser runner: a step is one action or a list; each returns a result."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Selector = Annotated[str, Field(min_length=1, max_length=2000, description="A Playwright selector.")]


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timeout_ms: int | None = Field(None, ge=1, le=120_000, description="This action's limit (default: the node's).")


class Goto(_Action):
    action: Literal["goto"]
    path: str = Field("/", max_length=4000, description="Path on the site, e.g. /product.html?id=3.")
    site: str | None = Field(None, max_length=64, description="Site name (default: the step's or session's).")


class Click(_Action):
    action: Literal["click"]
    selector: Selector


class Fill(_Action):
    action: Literal["fill", "type"]
    selector: Selector
    text: str = Field(..., max_length=100_000)


class Press(_Action):
    action: Literal["press"]
    key: str = Field(..., min_length=1, max_length=64, description="e.g. Enter, ArrowDown, Control+A.")
    selector: Selector | None = None


class Scroll(_Action):
    action: Literal["scroll"]
    y: int = Field(0, ge=-100_000, le=100_000)
    x: int = Field(0, ge=-100_000, le=100_000)


class SelectOption(_Action):
    action: Literal["select_option"]
    selector: Selector
    value: str = Field(..., max_length=1000)


class Check(_Action):
    action: Literal["check", "uncheck"]
    selector: Selector


class WaitFor(_Action):
    action: Literal["wait_for"]
    selector: Selector | None = None
    state: Literal["attached", "detached", "visible", "hidden"] = "visible"
    ms: int | None = Field(
        None,
        ge=0,
        le=60_000,
        description="Without a selector: just wait this long (its own time limit: within `timeout_ms` when given, "
        "and the step's).",
    )


class Text(_Action):
    action: Literal["text"]
    selector: Selector | None = Field(None, description="Default: the whole page (body).")


class AriaSnapshot(_Action):
    action: Literal["aria_snapshot"]
    selector: Selector | None = Field(None, description="Default: the whole page (body).")


class Screenshot(_Action):
    action: Literal["screenshot"]
    format: Literal["png", "jpeg"] = "png"
    quality: int | None = Field(None, ge=1, le=100, description="JPEG only.")
    full_page: bool = False
    return_image: bool = Field(True, description="False: take it but return no bytes (the public suite's B4 does so).")


class History(_Action):
    action: Literal["back", "forward", "reload"]


BrowserAction = Annotated[
    Goto | Click | Fill | Press | Scroll | SelectOption | Check | WaitFor | Text | AriaSnapshot | Screenshot | History,
    Field(discriminator="action"),
]


class BrowserStep(BaseModel):
    """One action, or ``{"actions": [...]}`` run in order; a failed action is recorded and the next one runs."""

    model_config = ConfigDict(extra="forbid")

    actions: list[BrowserAction] = Field(..., min_length=1, max_length=200)
    site: str = Field("shop", max_length=64, description="Site of relative gotos (one-shot; sessions keep theirs).")
    stop_on_error: bool = Field(False, description="Stop at the first failed action.")

    @model_validator(mode="before")
    @classmethod
    def _single(cls, data: Any) -> Any:
        if isinstance(data, dict) and "action" in data:
            return {"actions": [data]}
        return data


class ActionResult(BaseModel):
    action: str
    ok: bool
    error: str | None = None
    elapsed_ms: float
    url: str
    title: str | None = None
    value: str | None = Field(None, description="text / aria_snapshot: the text; screenshot: base64 image.")


class BrowserObservation(BaseModel):
    results: list[ActionResult]
    actions_done: int
    actions_failed: int
    url: str
    title: str | None = None
    page_crashed: bool = False
    wall_ms: float


class BrowserSessionOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    site: str = Field("shop", max_length=64, description="The site relative gotos of this session go to.")
