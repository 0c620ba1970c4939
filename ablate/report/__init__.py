"""`ablate report`: a self-contained HTML report of the sweep, its timeline as a PNG beside it, the
ablation table per cell as a CSV, and the ablation table over seeds as markdown, LaTeX and CSV.

    report(project, out=None, log=None) -> ReportResult

Reads the shared FS in one probe round trip (`ablate.remote.host.probe.report`: events, heartbeats, every
published result's MANIFEST.json sha256 and metrics numbers, the last reconcile record), the local
queue files (the roster), the cells' config files (for the grouping over seeds) and the pulled
copies of the metrics (`./results/<sweep>/<name>/`). Writes `report.html`, `timeline.png`,
`ablation.csv` (per cell), `ablation.md`, `ablation.tex` and `ablation_groups.csv` (over seeds)
into `out` (default `./reports/<sweep>/`: outside `./results/<sweep>/`, where a `report/` dir would
read as an unexpected result and could collide with a cell named `report`). Nothing on the shared
FS is changed except the probe's clock file.

Parts: `data` (what is read, cell states), `timeline` (runs from events, makespan and its lower
bound), `table` (ablation table per cell, baselines, best, CSV), `groups` / `stats` (the table over
seeds: grouping, mean ± std, Welch intervals), `export` (its markdown, LaTeX and CSV), `svg` /
`plot` (the timeline drawn), `chart` (the groups' bar charts), `html` (the page from
`template.html`, `report.css`, `report.js`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.config.project import Project
from ablate.errors import AblateError
from ablate.report.data import SweepData, gather
from ablate.report.export import groups_csv, to_latex, to_markdown
from ablate.report.groups import GroupTable, build_groups, read_cfgs
from ablate.report.html import render_page
from ablate.report.plot import timeline_png
from ablate.report.svg import human_secs
from ablate.report.table import TaskTable, build_tables, to_csv
from ablate.report.timeline import Timeline, build_timeline, rerun_cells, steal_count, task_colors
from ablate.sweep.classify import state_counts
from ablate.sweep.runs import attempts_by_cell, attempts_lines, lost_total
from ablate.util.fmt import Log, duration
from ablate.util.fs import atomic_write

HTML_NAME = "report.html"
PNG_NAME = "timeline.png"
CSV_NAME = "ablation.csv"
MD_NAME = "ablation.md"
TEX_NAME = "ablation.tex"
GROUPS_CSV_NAME = "ablation_groups.csv"


@dataclass
class ReportResult:
    out: str
    html: str
    png: str
    csv: str
    md: str
    tex: str
    groups_csv: str
    roster: int
    states: dict[str, int]
    runs: int
    lanes: int
    makespan: float
    lower_bound: float | None
    reruns: list[str]
    stolen: int
    tasks: dict[str, dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    attempts: dict[str, dict[str, Any]] = field(default_factory=dict)  # cells run more than once

    def to_json(self) -> dict[str, Any]:
        return {"out": self.out, "html": self.html, "png": self.png, "csv": self.csv, "md": self.md,
                "tex": self.tex, "groups_csv": self.groups_csv, "roster": self.roster,
                "states": self.states, "runs": self.runs, "lanes": self.lanes, "makespan": self.makespan,
                "lower_bound": self.lower_bound, "reruns": self.reruns, "stolen": self.stolen,
                "attempts": self.attempts, "lost_secs": round(sum(
                    a["lost_secs"] or 0.0 for a in self.attempts.values()), 3),
                "tasks": self.tasks, "notes": self.notes}

    def lines(self) -> list[str]:
        states = ", ".join(f"{n} {s}" for s, n in self.states.items()) or "no cells"
        bound = f", lower bound {human_secs(self.lower_bound)}" if self.lower_bound else ""
        out = [f"report: {self.html}",
               f"timeline: {self.png} ({self.runs} runs on {self.lanes} queues, makespan "
               f"{human_secs(self.makespan)}{bound})",
               f"ablation table: {self.csv} ({self.roster} cells: {states})",
               f"over seeds: {self.md}, {self.tex}, {self.groups_csv} ({self._groups()})"]
        out += attempts_lines(self.attempts, prefix="re-run ")
        return out + [n if n.startswith("warning: ") else f"note: {n}" for n in self.notes]

    def _groups(self) -> str:
        groups = [g for t in self.tasks.values() for g in t["groups"]]
        missing = sum(len(g["missing"]) for g in groups)
        return (f"{len(groups)} groups of {sum(len(g['cells']) for g in groups)} cells"
                + (f", {missing} cell{'s' if missing > 1 else ''} without metrics" if missing else ""))


def default_out(project: Project) -> Path:
    return project.dir / "reports" / project.sweep


def _summary(data: SweepData, tl: Timeline, states: dict[str, int]) -> list[str]:
    rec = data.record or {}
    out = [f"{len(data.roster)} cells in the roster"]
    out += [f"{n} {s}" for s, n in states.items()]
    failed = sum(1 for r in tl.runs if r.outcome == "failed")
    out.append(f"{len(tl.runs)} runs on {len(tl.lanes)} queues")
    if failed:
        out.append(f"{failed} failed runs")
    reruns = rerun_cells(tl)
    if reruns:
        out.append(f"{len(reruns)} re-run cells")
    stolen = steal_count(tl)
    if stolen:
        out.append(f"{stolen} stolen runs")
    cut, lost = lost_total(tl.runs)
    if cut:
        out.append(f"{cut} cut runs: {duration(lost)} of work done again")
    if rec.get("t"):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(rec["t"])))
        out.append(f"last reconcile {when} ({rec.get('source', '?')}): "
                   f"{'complete' if rec.get('complete') else 'incomplete'}")
    else:
        out.append("never reconciled")
    return out


def _notes(project: Project, data: SweepData, tables: list[TaskTable], groups: list[GroupTable]) -> list[str]:
    notes = [t.note for t in tables if t.note] + [n for g in groups for n in g.notes]
    if project.artifacts.metrics is None:
        notes.append("no metrics file in ablate.yaml (artifacts.metrics): the ablation table has no numbers")
    for name, res in data.metrics.items():
        if res.error and res.source is not None:
            notes.append(f"{name}: metrics not read ({res.source} copy): {res.error}")
    extra = sorted(set(data.manifests) - set(data.roster))
    if extra:
        notes.append(f"{len(extra)} result(s) on the shared FS belong to no queue file here, not in the "
                     f"tables: {', '.join(extra[:10])}{' ...' if len(extra) > 10 else ''}")
    for host, why in data.unreachable.items():
        notes.append(f"host {host} did not answer ({why}): its cells' states rest on the shared FS alone")
    return notes + [f"warning: {w}" for w in data.warnings]


def report(project: Project, out: Path | None = None, log: Log | None = None) -> ReportResult:
    say = log or (lambda _m: None)
    out_dir = Path(out) if out is not None else default_out(project)
    if out_dir.exists() and not out_dir.is_dir():
        raise AblateError(f"--out {out_dir} is a file; give a directory for the report")
    say(f"reading the sweep {project.sweep} from the shared FS")
    data = gather(project)
    tasks = {name: data.task_of(name) for name in set(data.roster) | set(data.manifests)}
    for evs in data.events.values():
        for e in evs:
            if e.cell is not None:
                tasks.setdefault(e.cell, data.task_of(e.cell))
    tl = build_timeline(data.events, data.heartbeats, data.speeds, tasks, data.now)
    colors = task_colors(sorted({t for t in tasks.values() if t} | set(project.tasks)))
    tables = build_tables(data.roster, data.states, data.metrics, project.report,
                          project.artifacts.metrics_keys)
    group_by = project.report.group_by
    cfgs = read_cfgs(project.dir, data.roster) if group_by else {}
    groups = build_groups(tables, data.roster, cfgs, group_by)
    states = state_counts(data.details.values())  # in the order of classify.STATES
    notes = _notes(project, data, tables, groups)

    out_dir.mkdir(parents=True, exist_ok=True)
    html_path, png_path, csv_path = out_dir / HTML_NAME, out_dir / PNG_NAME, out_dir / CSV_NAME
    say(f"drawing the timeline: {len(tl.runs)} runs on {len(tl.lanes)} queues")
    timeline_png(tl, colors, png_path, f"sweep {project.sweep}: {len(tl.runs)} runs")
    atomic_write(csv_path, to_csv(tables).encode())
    md_path, tex_path, gcsv_path = out_dir / MD_NAME, out_dir / TEX_NAME, out_dir / GROUPS_CSV_NAME
    atomic_write(md_path, to_markdown(groups, project.sweep).encode())
    atomic_write(tex_path, to_latex(groups, project.sweep).encode())
    atomic_write(gcsv_path, groups_csv(groups).encode())
    files = {"png": PNG_NAME, "csv": CSV_NAME, "md": MD_NAME, "tex": TEX_NAME, "groups_csv": GROUPS_CSV_NAME}
    page = render_page(data, tl, tables, groups, colors, _summary(data, tl, states), notes, files)
    atomic_write(html_path, page.encode())
    by_task = {g.task: g for g in groups}
    return ReportResult(
        out=str(out_dir), html=str(html_path), png=str(png_path), csv=str(csv_path), md=str(md_path),
        tex=str(tex_path), groups_csv=str(gcsv_path),
        roster=len(data.roster), states=states, runs=len(tl.runs), lanes=len(tl.lanes),
        makespan=tl.makespan, lower_bound=tl.lower_bound, reruns=rerun_cells(tl), stolen=steal_count(tl),
        tasks={t.task: {"cells": len(t.rows), "baseline": t.baseline, "metrics": t.metrics,
                        "best": {m: sorted(c) for m, c in t.best.items()},
                        "group_by": group_by, "baseline_group": by_task[t.task].baseline,
                        "groups": [g.to_json() for g in by_task[t.task].groups]} for t in tables},
        notes=notes, attempts=attempts_by_cell(tl.runs),
    )
