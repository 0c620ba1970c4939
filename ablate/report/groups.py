"""The ablation table over seeds: the cells of a task that differ only in their seed are one group,
one row with mean ± std and n per metric, and the difference to the baseline group with Welch's
95 % interval (`ablate.report.stats`).

Grouping (`report.group_by`, default `seed`): two cells of a task with the same epochs whose config
files (read here, on the laptop, YAML) are equal once that key is taken out are one group; the key
may be dotted (`train.seed`) for a nested one. A config without the key groups by the cell name's
`_seed<k>` / `_s<k>` suffix instead (the group's name is the name without it). `group_by: none`:
every cell is its own group.

Nothing is dropped: a group counts its cells that have no metrics yet (missing: never ran, running,
crashed, ...) and those whose metrics are not verified by the last reconcile (synced); the numbers
are over the cells that have them (n per metric).

The baseline group is the one holding the task's baseline cell (`report.baseline`, as in the
per-cell table).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ablate.report.data import RosterCell
from ablate.report.stats import Diff, Summary, welch
from ablate.report.table import TaskTable

SEED_SUFFIX = re.compile(r"^(?P<stem>.+?)_(?:seed|s)(?P<seed>\d+)$")
_MISSING = object()


@dataclass(frozen=True)
class CfgRead:
    """A cell's config file as read here: its data, or why it could not be read."""

    data: Any = None
    error: str | None = None


@dataclass
class Group:
    name: str
    by: str  # "config" (same config but the key) | "suffix" (name suffix) | "cell" (alone)
    cells: list[str]  # roster order
    seeds: list[str]  # per cell, as written in its config or name ("" when unknown)
    states: list[str]  # per cell
    baseline: bool = False
    stats: dict[str, Summary] = field(default_factory=dict)  # metric -> over the cells that have it
    values: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # metric -> (cell, value)
    diffs: dict[str, Diff] = field(default_factory=dict)  # metric -> vs the baseline group

    @property
    def done(self) -> list[str]:
        """Cells with metrics."""
        have = {c for vs in self.values.values() for c, _ in vs}
        return [c for c in self.cells if c in have]

    @property
    def missing(self) -> list[str]:
        """Cells without metrics (yet), with their states."""
        done = set(self.done)
        return [c for c in self.cells if c not in done]

    @property
    def unverified(self) -> list[str]:
        """Cells whose metrics the last reconcile did not verify."""
        done = set(self.done)
        return [c for c, s in zip(self.cells, self.states, strict=True) if c in done and s != "verified"]

    def state_of(self, cell: str) -> str:
        return self.states[self.cells.index(cell)]

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.name, "by": self.by, "baseline": self.baseline, "cells": self.cells,
            "seeds": self.seeds, "done": len(self.done),
            "missing": {c: self.state_of(c) for c in self.missing}, "unverified": self.unverified,
            "metrics": {m: {"n": s.n, "mean": s.mean, "std": s.std, **_diff_json(self.diffs.get(m))}
                        for m, s in self.stats.items()},
        }


def _diff_json(d: Diff | None) -> dict[str, Any]:
    if d is None:
        return {}
    return {"delta": d.delta, "ci": None if d.low is None else [d.low, d.high], "df": d.df,
            "excludes_zero": d.excludes_zero, "no_ci": d.why}


@dataclass
class GroupTable:
    task: str
    metrics: list[str]
    goals: dict[str, str | None]
    groups: list[Group]
    baseline: str | None  # the baseline group's name
    best: dict[str, set[str]] = field(default_factory=dict)  # metric -> groups with the best mean
    notes: list[str] = field(default_factory=list)

    def group(self, name: str) -> Group:
        return next(g for g in self.groups if g.name == name)


def read_cfgs(root: Path, roster: Mapping[str, RosterCell]) -> dict[str, CfgRead]:
    """Each roster cell's config file (relative paths from the project dir), read as YAML."""
    by_path: dict[str, CfgRead] = {}
    out = {}
    for name, rc in roster.items():
        cfg = rc.cell.cfg
        if cfg not in by_path:
            path = Path(cfg) if cfg.startswith("/") else root / cfg
            try:
                by_path[cfg] = CfgRead(yaml.safe_load(path.read_text(encoding="utf-8")))
            except FileNotFoundError:
                by_path[cfg] = CfgRead(error="not found here")
            except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                by_path[cfg] = CfgRead(error=f"not readable as YAML ({first})")
        out[name] = by_path[cfg]
    return out


def take_key(data: Any, key: str) -> tuple[Any, Any]:
    """(value of the dotted `key` in `data`, `data` without it); value `_MISSING` when absent."""
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(p), dict):
            return _MISSING, data
        node = node[p]
    if not isinstance(node, dict) or parts[-1] not in node:
        return _MISSING, data
    rest = copy.deepcopy(data)
    inner = rest
    for p in parts[:-1]:
        inner = inner[p]
    value = inner.pop(parts[-1])
    return value, rest


def _canon(data: Any) -> str:
    """One string per config content: mappings in any key order (keys of any YAML type) alike."""
    if isinstance(data, dict):
        return "{" + ",".join(sorted(f"{k!r}:{_canon(v)}" for k, v in data.items())) + "}"
    if isinstance(data, list):
        return "[" + ",".join(_canon(v) for v in data) + "]"
    return repr(data)


def group_key(rc: RosterCell, cfg: CfgRead | None, group_by: str | None) -> tuple[tuple[str, ...], str, str]:
    """(what makes two cells of a task one group, how: config | suffix | cell, the seed shown)."""
    if group_by is None:
        return ("cell", rc.name), "cell", ""
    if cfg is not None and cfg.error is None:
        seed, rest = take_key(cfg.data, group_by)
        if seed is not _MISSING:
            return ("config", str(rc.cell.epochs), _canon(rest)), "config", str(seed)
    m = SEED_SUFFIX.match(rc.name)
    if m:
        return ("suffix", str(rc.cell.epochs), m.group("stem")), "suffix", m.group("seed")
    return ("cell", rc.name), "cell", ""


def _names(keys: Sequence[tuple[str, ...]], members: Mapping[tuple[str, ...], list[str]]) -> list[str]:
    """Each group's name: its first cell's name without the seed suffix; where two groups would
    share a name, their first cells' names (unique in the roster)."""
    stems = []
    for k in keys:
        first = members[k][0]
        m = SEED_SUFFIX.match(first)
        stems.append(m.group("stem") if m and k[0] != "cell" else first)
    return [s if stems.count(s) == 1 else members[k][0] for k, s in zip(keys, stems, strict=True)]


def _best(groups: Sequence[Group], goals: Mapping[str, str | None]) -> dict[str, set[str]]:
    best = {}
    for m, goal in goals.items():
        have = {g.name: mean for g in groups if (mean := g.stats[m].mean) is not None}
        if goal is None or not have:
            continue
        target = min(have.values()) if goal == "min" else max(have.values())
        best[m] = {n for n, v in have.items() if v == target}
    return best


def group_task(t: TaskTable, roster: Mapping[str, RosterCell], cfgs: Mapping[str, CfgRead],
               group_by: str | None) -> GroupTable:
    """The groups of one per-cell TaskTable: same metrics, goals and baseline cell."""
    members: dict[tuple[str, ...], list[str]] = {}
    how: dict[tuple[str, ...], str] = {}
    seeds: dict[str, str] = {}
    unread = []
    for row in t.rows:
        rc, cfg = roster[row.cell], cfgs.get(row.cell)
        if group_by is not None and cfg is not None and cfg.error is not None:
            unread.append(f"{row.cell} ({rc.cell.cfg}: {cfg.error})")
        key, how_, seeds[row.cell] = group_key(rc, cfg, group_by)
        members.setdefault(key, []).append(row.cell)
        how[key] = how_
    rows = {r.cell: r for r in t.rows}
    groups = []
    for key, name in zip(members, _names(list(members), members), strict=True):
        cells = members[key]
        g = Group(name, how[key], cells, [seeds[c] for c in cells], [rows[c].state for c in cells],
                  baseline=t.baseline in cells)
        for m in t.metrics:
            g.values[m] = [(c, float(rows[c].values[m])) for c in cells if m in rows[c].values]
            g.stats[m] = Summary.of([v for _, v in g.values[m]])
        groups.append(g)
    base = next((g for g in groups if g.baseline), None)
    for g in groups:
        for m in t.metrics:
            d = welch(g.stats[m], base.stats[m]) if base is not None and g is not base else None
            if d is not None:
                g.diffs[m] = d
    table = GroupTable(t.task, list(t.metrics), dict(t.goals), groups, base.name if base else None,
                       _best(groups, t.goals))
    if unread:
        table.notes.append(f"task {t.task}: config not read here, grouped by the name's seed suffix: "
                           + ", ".join(unread[:5]) + (" ..." if len(unread) > 5 else ""))
    if group_by is not None and len(groups) > 1 and all(len(g.cells) == 1 for g in groups):
        table.notes.append(f"task {t.task}: no two cells differ only in {group_by!r} (or a _seed<k> / "
                           "_s<k> name suffix): one cell per row")
    return table


def build_groups(tables: Sequence[TaskTable], roster: Mapping[str, RosterCell],
                 cfgs: Mapping[str, CfgRead], group_by: str | None) -> list[GroupTable]:
    return [group_task(t, roster, cfgs, group_by) for t in tables]
