"""The timeline as inline SVG: a lane per (host, queue), a bar per run coloured by task; failed runs
cross-hatched with a red edge, interrupted ones hatched, running ones pale, stolen ones dashed with
the queue they came from, re-runs numbered; lines at the makespan and at its lower bound.

Every bar is a `<rect class="run">` carrying data-cell, data-lane, data-task, data-outcome,
data-attempt, data-stolen-from and data-start/data-end (seconds from the first start), so the DOM
is checkable; a `<title>` gives the details on hover."""

from __future__ import annotations

import math
from html import escape

from ablate.report.timeline import UNKNOWN_TASK, Run, Timeline

WIDTH = 1100
LABEL_W = 180
RIGHT = 30
TOP = 28
LANE_H = 30
BAR_H = 20
BOTTOM = 12

_DEFS = """<defs>
<pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
<line x1="0" y1="0" x2="0" y2="6" stroke="#000" stroke-opacity="0.45" stroke-width="2"/></pattern>
<pattern id="cross" width="8" height="8" patternUnits="userSpaceOnUse">
<path d="M0,0 L8,8 M8,0 L0,8" stroke="#B00020" stroke-opacity="0.8" stroke-width="1.5"/></pattern>
</defs>"""


def human_secs(s: float) -> str:
    if s < 60:
        return f"{s:.0f}s" if s >= 10 or s == int(s) else f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def nice_step(span: float, target: int = 8) -> float:
    raw = max(span, 1e-9) / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return float(m * mag)
    return float(10 * mag)


def _run_rect(r: Run, x0: float, x1: float, y: float, color: str, t0: float) -> str:
    w = max(x1 - x0, 2.0)
    attrs = (f'class="run" data-cell="{escape(r.cell)}" data-lane="{escape(r.lane)}" '
             f'data-task="{escape(r.task or "")}" data-outcome="{r.outcome}" data-attempt="{r.attempt}" '
             f'data-attempts="{r.attempts}" data-stolen-from="{escape(r.stolen_from or "")}" '
             f'data-rc="{"" if r.rc is None else r.rc}" data-start="{r.start - t0:.3f}" '
             f'data-end="{r.end - t0:.3f}"')
    style = {"ok": 'stroke="#222" stroke-width="0.5"',
             "failed": 'stroke="#B00020" stroke-width="2"',
             "interrupted": 'stroke="#555" stroke-width="1"',
             "running": 'stroke="#222" stroke-width="1" stroke-dasharray="2 2" fill-opacity="0.5"'}[r.outcome]
    if r.stolen_from:
        style = style.replace('stroke-width="0.5"', 'stroke-width="1.5"') + ' stroke-dasharray="5 3"'
    rc = "" if r.rc is None else f", rc {r.rc}"
    tip = (f"{r.cell} ({r.task or 'unknown task'}) on {r.lane}: {r.outcome}{rc}, {human_secs(r.dur)}"
           f"{', resumed' if r.resume else ''}"
           f"{f', run {r.attempt} of {r.attempts}' if r.attempts > 1 else ''}"
           f"{f', stolen from {r.stolen_from}' if r.stolen_from else ''}")
    parts = [f'<rect {attrs} x="{x0:.1f}" y="{y:.1f}" width="{w:.1f}" height="{BAR_H}" fill="{color}" '
             f'{style}><title>{escape(tip)}</title></rect>']
    if r.outcome in ("failed", "interrupted"):
        pat = "cross" if r.outcome == "failed" else "hatch"
        parts.append(f'<rect x="{x0:.1f}" y="{y:.1f}" width="{w:.1f}" height="{BAR_H}" '
                     f'fill="url(#{pat})" pointer-events="none"/>')
    label = r.cell + (f" #{r.attempt}" if r.attempts > 1 else "") + (" \u21c4" if r.stolen_from else "")
    if w > 40:
        parts.append(f'<text class="bar-label" x="{x0 + 3:.1f}" y="{y + BAR_H - 6:.1f}" font-size="11" '
                     f'fill="#000" clip-path="inset(0 0 0 0)">{escape(label[: max(3, int(w / 6.5))])}</text>')
    return "".join(parts)


def timeline_svg(tl: Timeline, colors: dict[str, str]) -> str:
    if not tl.runs:
        return '<p class="empty">No cell has started yet: no events on the shared FS.</p>'
    span = max(tl.makespan, tl.lower_bound or 0.0, 1e-6)
    plot_w = WIDTH - LABEL_W - RIGHT
    height = TOP + LANE_H * len(tl.lanes) + BOTTOM

    def x(t: float) -> float:
        return LABEL_W + (t - tl.t0) / span * plot_w

    out = [f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="timeline of the sweep">', _DEFS]
    step = nice_step(span)
    k = 0
    while k * step <= span + 1e-9:
        xx = LABEL_W + k * step / span * plot_w
        out.append(f'<line x1="{xx:.1f}" y1="{TOP - 4}" x2="{xx:.1f}" y2="{height - BOTTOM}" stroke="#ddd"/>'
                   f'<text x="{xx:.1f}" y="{TOP - 8}" font-size="10" text-anchor="middle" fill="#555">'
                   f'{human_secs(k * step)}</text>')
        k += 1
    lane_y = {}
    for i, lane in enumerate(tl.lanes):
        y = TOP + i * LANE_H
        lane_y[lane.key] = y + (LANE_H - BAR_H) / 2
        out.append(f'<g class="lane" data-lane="{escape(lane.key)}"><rect x="0" y="{y}" width="{WIDTH}" '
                   f'height="{LANE_H}" fill="{"#f7f7f7" if i % 2 else "#fff"}"/>'
                   f'<text x="6" y="{y + LANE_H / 2 + 4:.1f}" font-size="12" fill="#222">'
                   f'{escape(lane.label)} (\u00d7{lane.speed:g})</text></g>')
    for r in tl.runs:
        out.append(_run_rect(r, x(r.start), x(r.end), lane_y[r.lane], colors.get(r.task or "", UNKNOWN_TASK),
                             tl.t0))
    xm = x(tl.t0 + tl.makespan)
    out.append(f'<line class="makespan" x1="{xm:.1f}" y1="{TOP - 4}" x2="{xm:.1f}" y2="{height - BOTTOM}" '
               f'stroke="#000" stroke-width="1.5"><title>makespan {human_secs(tl.makespan)}</title></line>')
    if tl.lower_bound:
        xl = x(tl.t0 + tl.lower_bound)
        out.append(f'<line class="lower-bound" x1="{xl:.1f}" y1="{TOP - 4}" x2="{xl:.1f}" '
                   f'y2="{height - BOTTOM}" stroke="#B00020" stroke-width="1.5" stroke-dasharray="6 4">'
                   f'<title>lower bound {human_secs(tl.lower_bound)}</title></line>')
    out.append("</svg>")
    return "\n".join(out)
