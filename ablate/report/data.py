"""What `ablate report` reads: one probe of the shared FS (`ablate.remote.probe.report`: the `snapshot`
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.config.project import Project
from ablate.remote.probe import read_metrics
from ablate.results.reconcile import default_results_dir
from ablate.sweep import classify as cls
from ablate.sweep.cells import Cell

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
    events: dict[str, list[dict[str, Any]]]  # "<host>.<queue>" -> events
    heartbeats: dict[str, Any]
    manifests: dict[str, Any]  # name -> the snapshot's manifest identity ({"sha256", "task", ...})
    fs_metrics: dict[str, Any]  # name -> {"values", "error"} read next to the durable copy
    record: dict[str, Any] | None  # gate/reconcile.json
    states: dict[str, str] = field(default_factory=dict)
    details: dict[str, cls.CellState] = field(default_factory=dict)
    metrics: dict[str, CellResult] = field(default_factory=dict)
    speeds: dict[str, float] = field(default_factory=dict)  # host -> speed
    unreachable: dict[str, str] = field(default_factory=dict)

    def task_of(self, name: str) -> str | None:
        rc = self.roster.get(name)
        if rc is not None:
            return rc.cell.task
        task = (self.manifests.get(name) or {}).get("task")
        return task if isinstance(task, str) else None


def roster_cells(queues: Mapping[str, Any]) -> dict[str, RosterCell]:
    """Every cell line of the queues (`classify.all_queues`), first occurrence wins."""
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
        fs_sha = (data.manifests.get(name) or {}).get("sha256")
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

    fs = shared_fs(project)
    with ThreadPoolExecutor(max_workers=1) as pool:
        asked = pool.submit(cls.ask_hosts, project, list(project.hosts))
        snap: Mapping[str, Any] = fs.probe("report", {"root": fs.root, "metrics": project.artifacts.metrics})
        sessions, unreachable = asked.result()
    record = snap.get("reconcile") if isinstance(snap.get("reconcile"), dict) else None
    queues = cls.all_queues(project, snap)
    details = cls.classify(queues, snap, sessions, sweep=project.sweep,
                           cfg_sha=cls.cfg_hashes(project, queues),
                           verification=cls.Verification.from_record(record),
                           stale_after=cls.stale_after(project), hung_after=project.monitor.hung_after)
    data = SweepData(
        sweep=project.sweep, now=float(snap["now"]), roster=roster_cells(queues),
        events=dict(snap.get("events") or {}), heartbeats=dict(snap.get("heartbeats") or {}),
        manifests={n: m for n, m in (snap.get("manifests") or {}).items() if isinstance(m, dict)},
        fs_metrics=dict(snap.get("metrics") or {}), record=record,
        states={n: st.state for n, st in details.items()}, details=details,
        speeds={h.name: h.speed for h in project.hosts.values()}, unreachable=unreachable,
    )
    data.metrics = cell_metrics(project, data)
    return data
