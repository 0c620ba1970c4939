"""The ablation table: per task, every roster cell's final metrics, the difference to the task's
baseline cell, and the best value per metric marked.

Baseline: the first cell of the task (roster order) whose name or cfg path matches one of
`report.baseline`'s globs (fnmatch; a glob with `/` is matched against the cfg path only). No match:
no difference columns for that task, and a note says why.

Best: the main metric (`report.metric`) goes by `report.goal`; another metric is marked only when
its name says which way is better (loss/error/... lower, accuracy/F1/... higher), never by guess.
The CSV holds the same rows and numbers as the HTML (full precision, `repr`), one table for all
tasks with a `task` column.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from ablate.config.settings import ReportSettings
from ablate.report.data import CellResult, Number, RosterCell

_LOWER = re.compile(r"(?i)(loss|err|error|wer|cer|mse|mae|rmse|nll|perplexity|ppl|fid|time|latency)")
_HIGHER = re.compile(r"(?i)(acc|accuracy|f1|map|bleu|rouge|psnr|ssim|auc|precision|recall|iou|dice|"
                     r"score|reward|top1|top5)")


@dataclass
class Row:
    cell: str
    cfg: str
    epochs: int
    state: str
    source: str | None  # where the metrics came from: local | fs | None
    values: dict[str, Number]
    deltas: dict[str, Number]
    baseline: bool
    error: str | None = None


@dataclass
class TaskTable:
    task: str
    metrics: list[str]  # column order
    rows: list[Row]
    baseline: str | None
    goals: dict[str, str | None]  # metric -> "min" | "max" | None (not marked)
    best: dict[str, set[str]] = field(default_factory=dict)  # metric -> cells holding the best value
    note: str | None = None


def metric_goal(metric: str, settings: ReportSettings) -> str | None:
    if metric == settings.metric:
        return settings.goal
    last = metric.rsplit(".", 1)[-1]
    if _LOWER.search(last):
        return "min"
    if _HIGHER.search(last):
        return "max"
    return None


def is_baseline(rc: RosterCell, globs: Sequence[str]) -> bool:
    for g in globs:
        if "/" in g:
            if fnmatchcase(rc.cell.cfg, g):
                return True
        elif fnmatchcase(rc.name, g) or fnmatchcase(rc.cell.cfg, g):
            return True
    return False


def _sub(a: Number, b: Number) -> Number:
    return a - b


def _columns(first: Sequence[str], values: Sequence[Mapping[str, Number]]) -> list[str]:
    seen: dict[str, None] = {k: None for k in first if any(k in v for v in values)}
    for v in values:
        for k in v:
            seen.setdefault(k, None)
    return list(seen)


def build_tables(roster: Mapping[str, RosterCell], states: Mapping[str, str],
                 metrics: Mapping[str, CellResult], settings: ReportSettings,
                 metrics_keys: Sequence[str]) -> list[TaskTable]:
    by_task: dict[str, list[RosterCell]] = {}
    for rc in roster.values():
        by_task.setdefault(rc.cell.task, []).append(rc)
    first = ([settings.metric] if settings.metric else []) + list(metrics_keys)
    tables = []
    for task in sorted(by_task):
        cells = by_task[task]
        values = {rc.name: dict((metrics.get(rc.name) or CellResult(None, None)).values or {})
                  for rc in cells}
        columns = _columns(first, list(values.values()))
        base = next((rc.name for rc in cells if is_baseline(rc, settings.baseline)), None)
        note = None
        if base is None:
            note = (f"no baseline cell for task {task}: no cell name or cfg path matches "
                    f"{', '.join(settings.baseline)} (set report.baseline in ablate.yaml)")
        elif not values[base]:
            note = f"baseline {base} has no metrics yet: no differences"
        rows = []
        for rc in cells:
            res = metrics.get(rc.name) or CellResult(None, None)
            vals = values[rc.name]
            deltas = ({m: _sub(vals[m], values[base][m]) for m in columns if m in vals and m in values[base]}
                      if base is not None else {})
            rows.append(Row(rc.name, rc.cell.cfg, rc.cell.epochs, states.get(rc.name, "missing"),
                            res.source, vals, deltas, rc.name == base, res.error))
        goals = {m: metric_goal(m, settings) for m in columns}
        table = TaskTable(task, columns, rows, base, goals, note=note)
        for m, goal in goals.items():
            have = [(r.values[m], r.cell) for r in rows if m in r.values]
            if goal is None or not have:
                continue
            target = min(v for v, _ in have) if goal == "min" else max(v for v, _ in have)
            table.best[m] = {c for v, c in have if v == target}
        tables.append(table)
    return tables


def fmt_csv(v: Number | None) -> str:
    if v is None:
        return ""
    return str(v) if isinstance(v, int) else repr(float(v))


def all_metrics(tables: Sequence[TaskTable]) -> list[str]:
    return _columns([], [{m: 0 for m in t.metrics} for t in tables])


def csv_header(tables: Sequence[TaskTable]) -> list[str]:
    head = ["task", "cell", "cfg", "epochs", "state", "baseline"]
    for m in all_metrics(tables):
        head += [m, f"{m}_vs_baseline"]
    return head


def csv_rows(tables: Sequence[TaskTable]) -> list[list[str]]:
    metrics = all_metrics(tables)
    out = []
    for t in tables:
        for r in t.rows:
            row = [t.task, r.cell, r.cfg, str(r.epochs), r.state, "yes" if r.baseline else ""]
            for m in metrics:
                row += [fmt_csv(r.values.get(m)), fmt_csv(r.deltas.get(m))]
            out.append(row)
    return out


def to_csv(tables: Sequence[TaskTable]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(csv_header(tables))
    w.writerows(csv_rows(tables))
    return buf.getvalue()
