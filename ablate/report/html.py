"""The report page: `template.html` filled with the summary, the timeline SVG, the roster and one
ablation table per task. Everything inline (CSS, JS, SVG): the page opens without a network.

Every table cell that holds a number carries it in `data-value` exactly as the CSV writes it, so
sorting and the tests read the same numbers the spreadsheet gets."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from html import escape
from string import Template

from ablate import __version__
from ablate import resources as packaged
from ablate.report.chart import LEGEND, group_chart
from ablate.report.data import Number, SweepData
from ablate.report.export import MARK, NO_DIFF, fmt_ci, fmt_delta, fmt_mean, metric_n
from ablate.report.groups import Group, GroupTable
from ablate.report.stats import LEVEL
from ablate.report.svg import human_secs, timeline_svg
from ablate.report.table import TaskTable, fmt_csv
from ablate.report.timeline import Run, Timeline
from ablate.sweep.classify import check_counts, counts_text

STATE_HELP = ("verified = checked by the last reconcile and unchanged since (checked: the weakest check of "
              "its checkpoint files, loaded > structure (parsed, never run) > hash (size and sha256 only); "
              "hover it for every file); synced = a durable copy on the shared FS, not yet verified; the "
              "others (running, crashed, oom, interrupted, lost, never_ran, ...) as `ablate remediate` "
              "classifies them; hover a state for the reason")


def _asset(name: str) -> str:
    return packaged.read("ablate.report", name).decode("utf-8")


def fmt_num(v: Number) -> str:
    return str(v) if isinstance(v, int) else f"{v:.6g}"


def _td_num(v: Number | None, cls: str = "num", shown: str | None = None, title: str = "") -> str:
    if v is None:
        return f'<td class="{cls}" data-value=""></td>'
    t = f' title="{escape(title)}"' if title else ""
    return f'<td class="{cls}" data-value="{fmt_csv(v)}"{t}>{escape(shown or fmt_num(v))}</td>'


def _td(text: str, value: str | None = None, cls: str = "") -> str:
    c = f' class="{cls}"' if cls else ""
    return f'<td{c} data-value="{escape(text if value is None else value)}">{escape(text)}</td>'


def _state(state: str, why: str = "") -> str:
    title = f' title="{escape(why)}"' if why else ""
    return (f'<td data-value="{escape(state)}"><span class="state state-{escape(state)}"{title}>'
            f'{escape(state)}</span></td>')


def _head(cols: Sequence[tuple[str, str]]) -> str:
    return "<thead><tr>" + "".join(f'<th data-type="{t}" aria-sort="none">{escape(c)}</th>'
                                   for c, t in cols) + "</tr></thead>"


def _why(data: SweepData, name: str) -> str:
    st = data.details.get(name)
    return st.reason if st is not None else ""


def _checked(data: SweepData, name: str) -> str:
    """A verified cell's weakest checkpoint check; its title counts every file's (the record's)."""
    st = data.details.get(name)
    by = st.verified_by if st is not None and st.state == "verified" else None
    if by is None:
        return _td("")
    cells = (data.record or {}).get("cells")
    files = (cells.get(name) if isinstance(cells, dict) else None) or {}
    checked = files.get("checked") if isinstance(files, dict) else None
    title = f"its files: {counts_text(check_counts(checked.values()))}" if isinstance(checked, dict) else ""
    t = f' title="{escape(title)}"' if title else ""
    return f'<td class="checked checked-{escape(by)}" data-value="{escape(by)}"{t}>{escape(by)}</td>'


def roster_table(data: SweepData, tl: Timeline) -> str:
    runs: dict[str, list[Run]] = {}
    for r in tl.runs:
        runs.setdefault(r.cell, []).append(r)
    cols = [("cell", "text"), ("task", "text"), ("epochs", "num"), ("cfg", "text"), ("state", "text"),
            ("runs", "num"), ("last run", "text"), ("where", "text"), ("duration", "num"),
            ("checked", "text")]
    rows = []
    for name, rc in data.roster.items():
        mine = runs.get(name, [])
        last = mine[-1] if mine else None
        outcome = "never ran" if last is None else (
            f"failed rc={last.rc}" if last.outcome == "failed" else last.outcome)
        rows.append(
            f'<tr data-cell="{escape(name)}">' + _td(name) + _td(rc.cell.task) + _td_num(rc.cell.epochs)
            + _td(rc.cell.cfg) + _state(data.states.get(name, "missing"), _why(data, name))
            + _td_num(len(mine))
            + _td(outcome) + _td(last.lane if last else "")
            + _td_num(round(last.dur, 3) if last else None, shown=human_secs(last.dur) if last else None)
            + _checked(data, name) + "</tr>")
    return (f'<table id="roster" class="sortable roster">{_head(cols)}<tbody>' + "\n".join(rows)
            + "</tbody></table>")


def _delta_cell(t: TaskTable, m: str, d: Number | None, base: Number | None) -> str:
    if d is None:
        return _td_num(None, "num delta")
    goal = t.goals.get(m)
    judge = "" if goal is None or d == 0 else (" better" if (d < 0) == (goal == "min") else " worse")
    pct = f"{d / base * 100:+.1f}% vs baseline" if base not in (None, 0) else ""
    shown = "0" if d == 0 else (f"{d:+d}" if isinstance(d, int) else f"{d:+.4g}")
    return _td_num(d, "num delta" + judge, shown=shown, title=pct)


def ablation_table(t: TaskTable) -> str:
    with_delta = t.baseline is not None
    cols = [("cell", "text"), ("state", "text")]
    for m in t.metrics:
        cols.append((m, "num"))
        if with_delta:
            cols.append((f"\u0394 {m}", "num"))
    base_vals = next((r.values for r in t.rows if r.baseline), {})
    body = []
    for r in t.rows:
        cls = ' class="baseline"' if r.baseline else ""
        name = r.cell + (" (baseline)" if r.baseline else "")
        cells = [_td(name, r.cell), _state(r.state)]
        for m in t.metrics:
            best = " best" if r.cell in t.best.get(m, set()) else ""
            cells.append(_td_num(r.values.get(m), "num metric" + best))
            if with_delta:
                cells.append(_delta_cell(t, m, r.deltas.get(m), base_vals.get(m)))
        body.append(f'<tr data-cell="{escape(r.cell)}"{cls}>' + "".join(cells) + "</tr>")
    goals = ", ".join(f"{m}: {'lower' if g == 'min' else 'higher'} is better"
                      for m, g in t.goals.items() if g)
    note = f'<p class="note">{escape(t.note)}</p>' if t.note else ""
    return (f'<section class="task" data-task="{escape(t.task)}"><h3>Task <code>{escape(t.task)}</code> '
            f'<span class="count">{len(t.rows)} cells'
            f'{f", baseline {escape(t.baseline)}" if t.baseline else ""}</span></h3>{note}'
            f'<table id="ablation-{escape(t.task)}" class="sortable ablation" data-task="{escape(t.task)}">'
            f'{_head(cols)}<tbody>' + "\n".join(body) + "</tbody></table>"
            + (f'<p class="hint">\u2605 best per metric ({escape(goals)})</p>' if goals else "")
            + "</section>")


def _group_delta(t: GroupTable, g: Group, m: str) -> str:
    d = g.diffs.get(m)
    if g.baseline:
        return f'<td class="num delta" data-value="0">{NO_DIFF}</td>'
    if d is None:
        return _td_num(None, "num delta")
    attrs = " ".join(f'data-{k}="{"" if v is None else repr(v)}"'
                     for k, v in (("value", d.delta), ("low", d.low), ("high", d.high), ("df", d.df)))
    if d.low is None:
        return (f'<td class="num delta no-ci" {attrs} title="no confidence interval: {escape(d.why or "")}">'
                f'{escape(fmt_delta(t, g, m, d))} <span class="why">({escape(d.why or "")})</span></td>')
    goal = t.goals.get(m)
    judge = "" if goal is None or not d.excludes_zero else (
        " better" if (d.delta < 0) == (goal == "min") else " worse")
    mark = f' <span class="sig">{MARK}</span>' if d.excludes_zero else ""
    return (f'<td class="num delta{" significant" if d.excludes_zero else ""}{judge}" {attrs} '
            f'title="Welch df {d.df:.3g}, standard error {d.se:.3g}">{escape(fmt_delta(t, g, m, d))} '
            f'<span class="ci">{escape(fmt_ci(d))}</span>{mark}</td>')


def group_table(t: GroupTable) -> str:
    with_delta = t.baseline is not None
    cols = [("group", "text"), ("cells", "num"), ("missing", "num"), ("not verified", "num"),
            ("seeds", "text")]
    for m in t.metrics:
        cols.append((f"{m} (mean \u00b1 std)", "num"))
        if with_delta:
            cols.append((f"\u0394 {m} [{LEVEL:.0%} CI]", "num"))
    body = []
    for g in t.groups:
        missing = ", ".join(f"{c} ({g.state_of(c)})" for c in g.missing)
        unverified = ", ".join(f"{c} ({g.state_of(c)})" for c in g.unverified)
        cells = [_td(g.name + (" (baseline)" if g.baseline else ""), g.name),
                 f'<td class="num" data-value="{len(g.done)}" title="{escape(" ".join(g.cells))}">'
                 f"{len(g.done)}/{len(g.cells)}</td>",
                 _td_num(len(g.missing), "num missing" + (" some" if g.missing else ""), title=missing),
                 _td_num(len(g.unverified), "num unverified" + (" some" if g.unverified else ""),
                         title=unverified),
                 _td(", ".join(s for s in g.seeds if s))]
        for m in t.metrics:
            s = g.stats[m]
            best = " best" if g.name in t.best.get(m, set()) else ""
            if s.mean is None:
                cells.append('<td class="num metric" data-value="" data-n="0"></td>')
            else:
                cells.append(f'<td class="num metric{best}" data-value="{s.mean!r}" '
                             f'data-std="{"" if s.std is None else repr(s.std)}" data-n="{s.n}">'
                             f"{escape(fmt_mean(s) + metric_n(g, m))}</td>")
            if with_delta:
                cells.append(_group_delta(t, g, m))
        cls = ' class="baseline"' if g.baseline else ""
        body.append(f'<tr data-group="{escape(g.name)}"{cls}>' + "".join(cells) + "</tr>")
    return (f'<table id="groups-{escape(t.task)}" class="sortable groups" data-task="{escape(t.task)}">'
            f'{_head(cols)}<tbody>' + "\n".join(body) + "</tbody></table>")


def group_section(t: GroupTable) -> str:
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in t.notes)
    base = f", baseline group {escape(t.baseline)}" if t.baseline else ", no baseline group"
    charts = "".join(f'<figure class="chart">{group_chart(t, m)}</figure>' for m in t.metrics)
    return (f'<section class="task-groups" data-task="{escape(t.task)}">'
            f'<h3>Task <code>{escape(t.task)}</code> '
            f'<span class="count">{len(t.groups)} groups of {sum(len(g.cells) for g in t.groups)} cells'
            f'{base}</span></h3>{notes}{group_table(t)}'
            f'<div class="charts">{charts}</div>'
            f'<p class="hint chart-legend">{escape(LEGEND.format(mark=MARK))}</p></section>')


def _legend(colors: Mapping[str, str]) -> str:
    items = [f'<span><span class="swatch" style="background:{c}"></span>{escape(t)}</span>'
             for t, c in sorted(colors.items())]
    items += ['<span><span class="swatch failed"></span>failed (rc \u2260 0)</span>',
              '<span><span class="swatch interrupted"></span>interrupted</span>',
              '<span><span class="swatch running"></span>running</span>',
              '<span><span class="swatch stolen"></span>stolen (\u21c4, from another queue)</span>',
              "<span>#k = k-th run of a re-run cell</span>",
              '<span>black line: makespan; '
              '<span style="color:#B00020">dashed red: its lower bound</span></span>']
    return "".join(items)


def makespan_line(tl: Timeline) -> str:
    if not tl.runs:
        return "No runs yet."
    bound = (f"lower bound {human_secs(tl.lower_bound)} ({tl.ratio:.2f}\u00d7 the bound)"
             if tl.lower_bound and tl.ratio else "no lower bound yet (no cell finished with rc 0)")
    return (f"Makespan {human_secs(tl.makespan)}, {bound}, from the measured durations of the "
            f"successful runs and the hosts' speeds.")


GROUPS_HELP = (f"Cells of a task that differ only in their seed are one row (report.group_by); mean \u00b1 "
               f"sample std over the cells that have the metric; \u0394 = group mean \u2212 baseline group "
               f"mean with its {LEVEL:.0%} confidence interval (Welch); {MARK} the interval excludes 0 "
               f"(coloured when that is better or worse); a bold value is the best mean. Cells without "
               f"metrics are counted as missing, never dropped.")


def render_page(data: SweepData, tl: Timeline, tables: Sequence[TaskTable], groups: Sequence[GroupTable],
                colors: Mapping[str, str], summary: Sequence[str], notes: Sequence[str],
                files: Mapping[str, str]) -> str:
    notes_html = ("<section id=\"notes\"><h2>Notes</h2><ul class=\"notes\">"
                  + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul></section>") if notes else ""
    ablation_help = ("Per task, each cell's final metrics from its metrics file (the pulled copy when "
                     "it matches the shared FS, else the durable copy); \u0394 = cell \u2212 baseline. "
                     "Click a column header to sort.")
    return Template(_asset("template.html")).substitute(
        version=escape(__version__), sweep=escape(data.sweep),
        generated=time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime()),
        summary="".join(f"<li>{escape(s)}</li>" for s in summary),
        makespan=escape(makespan_line(tl)), timeline=timeline_svg(tl, dict(colors)),
        legend=_legend(colors), png=escape(files["png"]), csv=escape(files["csv"]),
        md=escape(files["md"]), tex=escape(files["tex"]), groups_csv=escape(files["groups_csv"]),
        roster_count=len(data.roster), state_help=escape(STATE_HELP), roster=roster_table(data, tl),
        ablation_help=escape(ablation_help), groups_help=escape(GROUPS_HELP),
        groups="\n".join(group_section(t) for t in groups) or '<p class="empty">The roster is empty.</p>',
        tables="\n".join(ablation_table(t) for t in tables) or '<p class="empty">The roster is empty.</p>',
        notes=notes_html, css=_asset("report.css"), js=_asset("report.js"),
    )
