"""Admission checks every jailed kind makes at the gateway, before a step is placed: its program, stdin and
files within the node's caps (413), its per-step limits within the node's maxima (422)."""

from __future__ import annotations

from sandboxd.errors import BadRequest, PayloadTooLarge
from sandboxd.runners.base import StepLimits
from sandboxd.runners.jail.config import JailConfig
from sandboxd.runners.jail.models import StepFiles


def check_payload(action: StepFiles, code: str, stdin: str, cfg: JailConfig, code_field: str = "code") -> None:
    """A program (``code_field``: where the action has it), its stdin and its files within this node's caps
    (every jailed kind's steps alike), or a 413."""
    for what, size, cap in (
        (code_field, len(code.encode()), cfg.max_code_bytes),
        ("stdin", len(stdin.encode()), cfg.max_stdin_bytes),
        ("files", sum(len(data) for _, data in action.file_bytes()), cfg.max_files_bytes),
    ):
        if size > cap:
            raise PayloadTooLarge(f"action.{what} is {size} bytes; this node takes at most {cap}")


def check_limits(limits: StepLimits, cfg: JailConfig) -> None:
    """Per-step limits above this node's maxima are the client's error."""
    if limits.memory_mb is not None and limits.memory_mb > cfg.memory_mb:
        raise BadRequest(f"limits.memory_mb: {limits.memory_mb} exceeds this node's maximum {cfg.memory_mb}")
    if limits.max_output_bytes is not None and limits.max_output_bytes > cfg.max_output_bytes:
        raise BadRequest(
            f"limits.max_output_bytes: {limits.max_output_bytes} exceeds this node's maximum {cfg.max_output_bytes}"
        )
