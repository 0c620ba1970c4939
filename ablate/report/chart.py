"""Per task and metric, the groups' means as an inline SVG bar chart: a bar per group that has the
metric (the baseline group grey), an error bar at mean ± 1 sample std where n >= 2, a dot per cell,
and `*` over a bar whose difference to the baseline has a 95 % interval (Welch) excluding zero. A
group without the metric keeps its slot, labelled with what is missing: nothing is dropped.

Every mark carries its numbers (`rect.group-bar`: data-group, data-mean, data-std, data-n,
data-cells; `line.error-bar`: data-low, data-high; `circle.seed-point`: data-cell, data-value), so
the DOM is checkable; a `<title>` gives the details on hover."""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape

from ablate.report.export import MARK, fmt_mean
from ablate.report.groups import Group, GroupTable
from ablate.report.svg import nice_step

BAR = "#4C78A8"
BASE_BAR = "#9AA5B1"
INK = "#222"
HEIGHT = 250
TOP = 22
BOTTOM = 44
LEFT = 70
RIGHT = 14
SLOT = 104
MIN_WIDTH = 360

LEGEND = ("Bars: each group's mean; error bars: \u00b1 1 sample standard deviation (groups with n \u2265 2); "
          "dots: single cells; grey bar: the baseline group; {mark} the 95 % confidence interval of the "
          "difference to the baseline (Welch) excludes 0; n = cells with the metric / cells in the group.")


def _tick(v: float) -> str:
    return f"{v:.6g}" if abs(v) > 1e-12 else "0"


def _extent(groups: list[Group], m: str) -> tuple[float, float]:
    pts = [0.0]
    for g in groups:
        s = g.stats[m]
        pts += [v for _, v in g.values[m]]
        if s.mean is not None and s.std is not None:
            pts += [s.mean - s.std, s.mean + s.std]
    lo, hi = min(pts), max(pts)
    if not math.isfinite(lo) or not math.isfinite(hi):
        return 0.0, 1.0
    if hi == lo:
        hi = lo + 1.0
    span = hi - lo
    return (lo - 0.06 * span if lo < 0 else lo), (hi + 0.1 * span if hi > 0 else hi)


def _group_marks(g: Group, m: str, cx: float, ys: Callable[[float], float]) -> list[str]:
    s = g.stats[m]
    out = []
    fits = int((SLOT - 6) / 6.6)  # characters of 11px text in a slot
    label = g.name if len(g.name) <= fits else g.name[: max(3, fits - 1)] + "\u2026"
    out.append(f'<text class="group-label" x="{cx:.1f}" y="{HEIGHT - BOTTOM + 16}" font-size="11" '
               f'text-anchor="middle" fill="{INK}"><title>{escape(g.name)}</title>{escape(label)}</text>'
               f'<text class="group-n" x="{cx:.1f}" y="{HEIGHT - BOTTOM + 30}" font-size="10" '
               f'text-anchor="middle" fill="#555">n={s.n}/{len(g.cells)}</text>')
    if s.mean is None:
        out.append(f'<text class="no-data" data-group="{escape(g.name)}" x="{cx:.1f}" '
                   f'y="{ys(0.0) - 6:.1f}" font-size="10" text-anchor="middle" fill="#B00020">'
                   f'no data ({len(g.cells)} missing)</text>')
        return out
    w = SLOT * 0.56
    y0, y1 = ys(max(s.mean, 0.0)), ys(min(s.mean, 0.0))
    missing = f"; without it: {', '.join(c for c in g.cells if c not in dict(g.values[m]))}" \
        if s.n < len(g.cells) else ""
    tip = f"{g.name}: {m} {fmt_mean(s)} (n={s.n} of {len(g.cells)} cells{missing})"
    out.append(f'<rect class="group-bar{" baseline" if g.baseline else ""}" data-group="{escape(g.name)}" '
               f'data-mean="{s.mean!r}" data-std="{"" if s.std is None else repr(s.std)}" data-n="{s.n}" '
               f'data-cells="{len(g.cells)}" x="{cx - w / 2:.1f}" y="{y0:.1f}" width="{w:.1f}" '
               f'height="{max(y1 - y0, 1.0):.1f}" fill="{BASE_BAR if g.baseline else BAR}">'
               f"<title>{escape(tip)}</title></rect>")
    top = ys(s.mean if s.mean > 0 else 0.0)
    if s.std is not None:
        lo, hi = s.mean - s.std, s.mean + s.std
        out.append(f'<line class="error-bar" data-group="{escape(g.name)}" data-low="{lo!r}" '
                   f'data-high="{hi!r}" x1="{cx:.1f}" y1="{ys(lo):.1f}" x2="{cx:.1f}" y2="{ys(hi):.1f}" '
                   f'stroke="{INK}" stroke-width="1.5"/>')
        for v in (lo, hi):
            out.append(f'<line class="error-cap" x1="{cx - 7:.1f}" y1="{ys(v):.1f}" x2="{cx + 7:.1f}" '
                       f'y2="{ys(v):.1f}" stroke="{INK}" stroke-width="1.5"/>')
        top = min(top, ys(hi))
    k = len(g.values[m])
    gap = min(7.0, w * 0.8 / max(k, 1))
    for j, (cell, v) in enumerate(g.values[m]):
        x = cx + (j - (k - 1) / 2) * gap
        out.append(f'<circle class="seed-point" data-cell="{escape(cell)}" data-value="{v!r}" '
                   f'cx="{x:.1f}" cy="{ys(v):.1f}" r="2.8" fill="{INK}" fill-opacity="0.75" stroke="#fff" '
                   f'stroke-width="0.6"><title>{escape(cell)}: {v:.6g}</title></circle>')
        top = min(top, ys(v))
    d = g.diffs.get(m)
    if d is not None and d.excludes_zero:
        out.append(f'<text class="sig-mark" data-group="{escape(g.name)}" x="{cx:.1f}" y="{top - 4:.1f}" '
                   f'font-size="15" font-weight="700" text-anchor="middle" fill="{INK}">{MARK}</text>')
    return out


def group_chart(t: GroupTable, m: str) -> str:
    groups = t.groups
    if not any(g.stats[m].n for g in groups):
        return f'<p class="empty">No cell of task {escape(t.task)} has {escape(m)} yet.</p>'
    lo, hi = _extent(groups, m)
    width = max(MIN_WIDTH, LEFT + SLOT * len(groups) + RIGHT)
    plot_h = HEIGHT - TOP - BOTTOM

    def ys(v: float) -> float:
        return TOP + (hi - v) / (hi - lo) * plot_h

    goal = t.goals.get(m)
    better = f" ({'lower' if goal == 'min' else 'higher'} is better)" if goal else ""
    out = [f'<svg class="group-chart" data-task="{escape(t.task)}" data-metric="{escape(m)}" '
           f'xmlns="http://www.w3.org/2000/svg" width="{width}" height="{HEIGHT}" '
           f'viewBox="0 0 {width} {HEIGHT}" role="img" '
           f'aria-label="{escape(m)} per group of task {escape(t.task)}">',
           f'<text x="{LEFT}" y="14" font-size="12" font-weight="600" fill="{INK}">{escape(m)}'
           f'<tspan font-weight="400" fill="#555">{escape(better)}</tspan></text>']
    step = nice_step(hi - lo, 5)
    v = math.ceil(lo / step) * step
    while v <= hi + 1e-12 * abs(hi):
        out.append(f'<line x1="{LEFT}" y1="{ys(v):.1f}" x2="{width - RIGHT}" y2="{ys(v):.1f}" '
                   f'stroke="#e4e4e4"/>'
                   f'<text x="{LEFT - 6}" y="{ys(v) + 3.5:.1f}" font-size="10" text-anchor="end" '
                   f'fill="#555">{_tick(v)}</text>')
        v += step
    out.append(f'<line class="zero" x1="{LEFT}" y1="{ys(0.0):.1f}" x2="{width - RIGHT}" y2="{ys(0.0):.1f}" '
               f'stroke="#888"/>')
    for i, g in enumerate(groups):
        out += _group_marks(g, m, LEFT + SLOT * (i + 0.5), ys)
    out.append("</svg>")
    return "\n".join(out)
