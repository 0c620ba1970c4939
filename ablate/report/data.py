"""What `ablate report` reads: one probe of the shared FS (`ablate.remote.host.probe.report`: the `snapshot`
that classification reads, plus every published result's metrics numbers and the last reconcile
record) and, at the same time, each host's tmux sessions; then the local queue files (the roster,
with the FS copies of queues this laptop lacks) and the pulled copies of the metrics.

Each roster cell's state is `ablate.sweep.classify`'s (verified, synced, running, crashed, ...), from the
same snapshot, so the report and `ablate remediate` never disagree.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.config.project import Project
from ablate.remote.host.probe import read_metrics
from ablate.results.common import default_results_dir
from ablate.sweep import classify as cls
from ablate.sweep.cells import Cell
from ablate.sweep.classify import classify_state
from ablate.sweep.snapshot import Event, Heartbeat, Result, load

Number = int | float


@dataclass(frozen=True)
class RosterCell:
    name: str
    cell: Cell
    queue: str


@dataclass
class CellResult:
    """One cell's metrics and where they were read from."""

    values: dict[str, Number] | None
    source: str | None  # "local" (pulled copy) | "fs" (durable copy) | None
    error: str | None = None


@dataclass
class SweepData:
    sweep: str
    now: float  # the FS's clock at the probe
    roster: dict[str, RosterCell]  # name -> cell, roster order
    events: Mapping[str, tuple[Event, ...]]  # "<host>.<queue>" -> events
    heartbeats: Mapping[str, Heartbeat]
    manifests: Mapping[str, Result]  # name -> the published result's manifest identity
    fs_metrics: dict[str, Any]  # name -> {"values", "error"} read next to the durable copy
    record: Mapping[str, Any] | None  # gate/reconcile.json
    states: dict[str, str] = field(default_factory=dict)
    details: dict[str, cls.CellState] = field(default_factory=dict)
    metrics: dict[str, CellResult] = field(default_factory=dict)
    speeds: dict[str, float] = field(default_factory=dict)  # host -> speed
    unreachable: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # malformed files seen on the shared FS

    def task_of(self, name: str) -> str | None:
        rc = self.roster.get(name)
        if rc is not None:
            return rc.cell.task
        result = self.manifests.get(name)
        return result.task if result is not None else None


def roster_cells(queues: Mapping[str, Any]) -> dict[str, RosterCell]:
    """Every cell line of the queues (`SweepState.queues`), first occurrence wins."""
    out: dict[str, RosterCell] = {}
    for qname, q in queues.items():
        for ln in q.cells:
            if ln.cell is not None:
                out.setdefault(ln.cell.name, RosterCell(ln.cell.name, ln.cell, qname))
    return out


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def cell_metrics(project: Project, data: SweepData) -> dict[str, CellResult]:
    """Per roster cell: the pulled copy's metrics when it is the FS's result (same MANIFEST.json)
    or the FS has none; else the numbers the probe read next to the durable copy."""
    metrics_file = project.artifacts.metrics
    results_dir = default_results_dir(project)
    out: dict[str, CellResult] = {}
    for name in data.roster:
        fs = data.fs_metrics.get(name)
        result = data.manifests.get(name)
        fs_sha = result.sha256 if result is not None else None
        local_dir = results_dir / name
        local_ok = metrics_file is not None and (local_dir / metrics_file).is_file()
        if local_ok and fs is not None and _sha256(local_dir / "MANIFEST.json") != fs_sha:
            local_ok = False  # the pulled copy is of an older result: the FS holds the truth
        if local_ok and metrics_file is not None:
            values, error = read_metrics(os.fspath(local_dir / metrics_file))
            out[name] = CellResult(values, "local", error)
        elif fs is not None:
            out[name] = CellResult(fs.get("values"), "fs", fs.get("error"))
        else:
            out[name] = CellResult(None, None, None)
    return out


def gather(project: Project) -> SweepData:
    """One probe round trip for the shared FS, each host's tmux asked alongside (as status)."""
    from ablate.transport import shared_fs

    state = load(project, shared_fs(project), op="report", args={"metrics": project.artifacts.metrics})
    got = classify_state(project, state)
    snap = state.snap
    data = SweepData(
        sweep=project.sweep, now=snap.now, roster=roster_cells(state.queues),
        events=snap.events, heartbeats=snap.heartbeats, manifests=snap.results,
        fs_metrics=dict(snap.extra.get("metrics") or {}), record=snap.reconcile,
        states={n: st.state for n, st in got.cells.items()}, details=got.cells,
        speeds={h.name: h.speed for h in project.hosts.values()}, unreachable=state.unreachable,
        warnings=list(state.warnings),
    )
    data.metrics = cell_metrics(project, data)
    return data
