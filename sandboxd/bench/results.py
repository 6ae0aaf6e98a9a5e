"""Bench results from many machines: directories or s3:// prefixes, one view per machine.

A location may hold one run, several runs of one machine, or the runs of a
whole comparison (every machine uploading under one prefix): every
``summary.json`` below it is read, and runs are grouped by the machine they
state (instance type, arch, vCPUs, CPU model). For each machine and workload
the newest run that measured it counts, so re-running one workload on a
machine replaces only that workload's figures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sandboxd.bench import s3


class ResultsError(Exception):
    """A location with no results in it, or results that cannot be read; the message names it."""


@dataclass(frozen=True)
class Machine:
    instance_type: str
    arch: str
    vcpus: int
    cpu_model: str

    @classmethod
    def of(cls, instance: dict[str, Any]) -> Machine:
        return cls(instance["instance_type"], instance["arch"], int(instance["vcpus"]), instance.get("cpu_model", "?"))

    def describe(self) -> str:
        return f"{self.instance_type} ({self.arch}, {self.vcpus} vCPU, {self.cpu_model})"


@dataclass
class MachineResults:
    machine: Machine
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # workload -> levels of the newest run
    sources: dict[str, str] = field(default_factory=dict)  # workload -> where that run's summary.json is
    generated_at: dict[str, str] = field(default_factory=dict)


def _summaries(location: str, endpoint_url: str | None) -> list[tuple[str, dict[str, Any]]]:
    if s3.is_s3(location):
        try:
            return s3.read_summaries(location, endpoint_url)
        except s3.S3Error as exc:
            raise ResultsError(str(exc)) from exc
    root = Path(location)
    if not root.is_dir():
        raise ResultsError(f"{location}: no such directory")
    paths = sorted(root.rglob(s3.SUMMARY))
    if not paths:
        raise ResultsError(f"no {s3.SUMMARY} under {location} (run `sandboxd bench --out {location}` first)")
    out = []
    for p in paths:
        try:
            out.append((str(p), json.loads(p.read_text())))
        except (OSError, ValueError) as exc:
            raise ResultsError(f"{p}: {exc}") from exc
    return out


def _when(doc: Any) -> datetime:
    """When a run was made, comparable across machines in different time zones (unknown: oldest)."""
    oldest = datetime.min.replace(tzinfo=UTC)
    if not isinstance(doc, dict) or not isinstance(doc.get("generated_at"), str):
        return oldest
    try:
        when = datetime.strptime(doc["generated_at"], "%Y-%m-%dT%H:%M:%S%z")
    except ValueError:
        try:
            when = datetime.fromisoformat(doc["generated_at"])
        except ValueError:
            return oldest
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def load(locations: list[str], endpoint_url: str | None = None) -> list[MachineResults]:
    """Every machine measured under ``locations``, in the order first seen."""
    docs = [d for loc in locations for d in _summaries(loc, endpoint_url)]
    docs.sort(key=lambda sd: _when(sd[1]))  # oldest first: newer runs overwrite
    machines: dict[Machine, MachineResults] = {}
    for source, doc in docs:
        try:
            m = Machine.of(doc["instance"])
            benchmarks = doc["benchmarks"]
            if not isinstance(benchmarks, dict) or not all(isinstance(v, list) for v in benchmarks.values()):
                raise TypeError("benchmarks is not a mapping of workload to levels")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ResultsError(f"{source} is not a sandboxd bench summary ({type(exc).__name__}: {exc})") from exc
        mr = machines.setdefault(m, MachineResults(m))
        for wl, all_runs in benchmarks.items():
            runs = [r for r in all_runs if not r.get("failed")]  # a FAILED level measured errors, not a node
            if runs:
                mr.runs[wl] = runs
                mr.sources[wl] = source
                mr.generated_at[wl] = doc.get("generated_at", "")
    return list(machines.values())
