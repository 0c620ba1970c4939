"""The timeline as a PNG (matplotlib, Agg: no display needed), the same marks as the SVG."""

from __future__ import annotations

from pathlib import Path

from ablate.report.svg import human_secs
from ablate.report.timeline import UNKNOWN_TASK, Timeline

# outcome -> (edge colour, edge width, hatch, alpha)
_STYLE: dict[str, tuple[str, float, str | None, float]] = {
    "ok": ("#222222", 0.5, None, 1.0), "failed": ("#B00020", 2.0, "xx", 1.0),
    "interrupted": ("#555555", 1.0, "//", 1.0), "running": ("#222222", 1.0, None, 0.5)}


def timeline_png(tl: Timeline, colors: dict[str, str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    lanes = tl.lanes or []
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.45 * max(1, len(lanes))), dpi=100)
    try:
        row = {ln.key: i for i, ln in enumerate(lanes)}
        span = max(tl.makespan, tl.lower_bound or 0.0, 1e-3)
        for r in tl.runs:
            y = row[r.lane]
            edge, width, hatch, alpha = _STYLE[r.outcome]
            ax.barh(y, max(r.dur, 1e-3), left=r.start - tl.t0, height=0.62,
                    color=colors.get(r.task or "", UNKNOWN_TASK), edgecolor=edge, hatch=hatch, alpha=alpha,
                    linewidth=1.5 if r.stolen_from else width,
                    linestyle="--" if r.stolen_from else (":" if r.outcome == "running" else "-"))
            if r.dur >= span / 25:  # a label on a sliver would only cover its neighbours
                label = r.cell + (f" #{r.attempt}" if r.attempts > 1 else "")
                label += " <-" if r.stolen_from else ""
                ax.text(r.start - tl.t0, y, " " + label, va="center", ha="left", fontsize=7, clip_on=True)
        if tl.runs:
            ax.axvline(tl.makespan, color="#000", linewidth=1.2)
            ax.text(tl.makespan, -0.7, f"makespan {human_secs(tl.makespan)}", fontsize=8, ha="right")
            if tl.lower_bound:
                ax.axvline(tl.lower_bound, color="#B00020", linewidth=1.2, linestyle="--")
                ax.text(tl.lower_bound, len(lanes) - 0.3, f"lower bound {human_secs(tl.lower_bound)}",
                        fontsize=8, color="#B00020", ha="right")
        ax.set_yticks(range(len(lanes)), [f"{ln.label} (x{ln.speed:g})" for ln in lanes])
        ax.set_ylim(len(lanes) - 0.4, -0.9)
        ax.set_xlim(0, span * 1.02)
        ax.set_xlabel("seconds since the first cell started")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", color="#ddd")
        handles = [Patch(facecolor=c, edgecolor="#222", label=t) for t, c in sorted(colors.items())]
        handles += [Patch(facecolor="white", edgecolor="#B00020", hatch="xx", label="failed"),
                    Patch(facecolor="white", edgecolor="#555555", hatch="//", label="interrupted"),
                    Patch(facecolor="white", edgecolor="#222", linestyle="--", linewidth=1.5,
                          label="stolen (<-)")]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
        fig.tight_layout()
        tmp = path.with_name(f".{path.name}.tmp")
        fig.savefig(tmp, format="png")
        tmp.replace(path)
    finally:
        plt.close(fig)
