"""The grouped ablation table (`ablate.report.groups`) written out: `ablation.md` (GitHub markdown,
a table per task), `ablation.tex` (a booktabs `tabular` per task, in a `table` float) and
`ablation_groups.csv` (one row per group, full precision, for scripts); `ablation.csv` stays the
per-cell table (`ablate.report.table`).

Shown numbers: mean ± sample std with the decimals that give the std two significant digits; a
difference and its interval with the decimals of the difference's standard error (without an
interval, of a std at hand); `*` marks a difference whose 95 % Welch interval excludes zero; bold
is the best mean (by the metric's goal).
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Sequence

from ablate.report.groups import Group, GroupTable
from ablate.report.stats import LEVEL, Diff, Summary

MARK = "*"
NO_DIFF = "\u2014"  # the baseline's own row


def decimals(spread: float | None) -> int | None:
    """Decimals that show `spread` to two significant digits; None: no usable spread."""
    if spread is None or not math.isfinite(spread) or spread <= 0:
        return None
    d = 1 - math.floor(math.log10(spread))
    return max(0, d) if d <= 8 else None


def fmt_fixed(v: float, d: int | None, sign: bool = False) -> str:
    if d is None:
        return f"{v:+.4g}" if sign else f"{v:.4g}"
    v = round(v, d) + 0.0  # no "-0.00"
    return f"{v:+.{d}f}" if sign else f"{v:.{d}f}"


def fmt_mean(s: Summary) -> str:
    if s.mean is None:
        return ""
    d = decimals(s.std)
    return fmt_fixed(s.mean, d) + (f" \u00b1 {fmt_fixed(s.std, d)}" if s.std is not None else "")


def fmt_ci(d: Diff) -> str:
    k = decimals(d.se)
    return f"[{fmt_fixed(d.low or 0.0, k, True)}, {fmt_fixed(d.high or 0.0, k, True)}]"


def fmt_delta(t: GroupTable, g: Group, m: str, d: Diff) -> str:
    """With the standard error's decimals; without an interval, those of a std at hand (the group's
    or the baseline's), so the digits never claim more than the seeds can tell."""
    if d.low is not None:
        return fmt_fixed(d.delta, decimals(d.se), True)
    base = t.group(t.baseline).stats[m].std if t.baseline else None
    return fmt_fixed(d.delta, decimals(g.stats[m].std or base), True)


def n_cell(g: Group) -> str:
    return f"{len(g.done)}/{len(g.cells)}"


def metric_n(g: Group, m: str) -> str:
    """` (n=k)` when fewer cells have this metric than have metrics at all."""
    n = g.stats[m].n
    return f" (n={n})" if 0 < n < len(g.done) else ""


def footnotes(t: GroupTable) -> list[str]:
    """What the reader needs to trust the table: what n counts, the missing cells by name, the
    marker."""
    out = [f"n = cells with metrics / cells in the group; mean \u00b1 sample std over them; "
           f"\u0394 = group mean \u2212 baseline mean ({t.baseline or 'no baseline group'}) "
           f"with its {LEVEL:.0%} confidence interval (Welch); {MARK} the interval excludes 0; "
           f"bold: the best mean."]
    for g in t.groups:
        if g.missing:
            out.append(f"{g.name}: {len(g.missing)} of {len(g.cells)} cells without metrics: "
                       + ", ".join(f"{c} ({g.state_of(c)})" for c in g.missing))
        if g.unverified:
            out.append(f"{g.name}: {len(g.unverified)} not verified by the last reconcile: "
                       + ", ".join(f"{c} ({g.state_of(c)})" for c in g.unverified))
    return out + t.notes


# --------------------------------------------------------------------------- markdown


def _md(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*")


def _md_diff(t: GroupTable, g: Group, m: str) -> str:
    d = g.diffs.get(m)
    if g.baseline:
        return NO_DIFF
    if d is None:
        return ""
    if d.low is None:
        return f"{fmt_delta(t, g, m, d)} (no CI: {d.why})"
    return f"{fmt_delta(t, g, m, d)} {fmt_ci(d)}" + (f" {MARK}" if d.excludes_zero else "")


def _row(t: GroupTable, g: Group, name: Callable[[str], str], mean: Callable[[Summary], str],
         best: Callable[[str], str], diff: Callable[[GroupTable, Group, str], str]) -> list[str]:
    """One group's cells in a format: its name, n, then per metric the mean (the best in `best`'s
    emphasis) and, with a baseline, the difference to it."""
    row = [name(g.name) + (" (baseline)" if g.baseline else ""), n_cell(g)]
    for m in t.metrics:
        shown = mean(g.stats[m])
        if shown and g.name in t.best.get(m, set()):
            shown = best(shown)
        row.append(shown + metric_n(g, m))
        if t.baseline is not None:
            row.append(diff(t, g, m))
    return row


def to_markdown(tables: Sequence[GroupTable], sweep: str) -> str:
    out = [f"# Ablation over seeds: sweep {_md(sweep)}", ""]
    for t in tables:
        with_delta = t.baseline is not None
        out += [f"## Task {_md(t.task)}", ""]
        head = ["group", "n"]
        for m in t.metrics:
            head += [_md(m)] + ([f"\u0394 {_md(m)} ({LEVEL:.0%} CI)"] if with_delta else [])
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join([":--", "--:"] + ["--:"] * (len(head) - 2)) + "|")
        for g in t.groups:
            row = _row(t, g, _md, fmt_mean, lambda s: f"**{s}**", _md_diff)
            out.append("| " + " | ".join(row) + " |")
        legend, *more = footnotes(t)
        out += ["", _md(legend), ""] + [f"- {_md(n)}" for n in more] + ([""] if more else [])
    if not tables:
        out.append("The roster is empty.")
    return "\n".join(out).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- LaTeX

_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
        "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


_TEX_UNICODE = {"\u00b1": r"$\pm$", "\u0394": r"$\Delta$", "\u2212": "$-$", "\u2014": "---",
                "\u2265": r"$\geq$", "\u2026": r"\dots{}"}


def tex_escape(text: str) -> str:
    """Text for LaTeX: its special characters escaped, the few non-ASCII ones this report writes
    spelled in ASCII (a pdflatex preamble need not load anything but booktabs)."""
    return "".join(_TEX.get(ch) or _TEX_UNICODE.get(ch) or ch for ch in text)


def _tex_num(text: str) -> str:
    """A number written in text mode with a real minus (and plus) sign."""
    return text.replace("-", "$-$").replace("+", "$+$") if text else text


def _tex_mean(s: Summary) -> str:
    if s.mean is None:
        return ""
    d = decimals(s.std)
    mean = _tex_num(fmt_fixed(s.mean, d))
    return mean + (f" $\\pm$ {_tex_num(fmt_fixed(s.std, d))}" if s.std is not None else "")


def _tex_diff(t: GroupTable, g: Group, m: str) -> str:
    d = g.diffs.get(m)
    if g.baseline:
        return "---"
    if d is None:
        return ""
    if d.low is None:
        return f"{_tex_num(fmt_delta(t, g, m, d))} {{\\footnotesize ({tex_escape(d.why or '')})}}"
    mark = f"$^{{{MARK}}}$" if d.excludes_zero else ""
    return f"{_tex_num(fmt_delta(t, g, m, d))}{mark} {{\\footnotesize {_tex_num(fmt_ci(d))}}}"


def to_latex(tables: Sequence[GroupTable], sweep: str) -> str:
    out = [f"% The ablation over seeds of sweep {sweep}, written by ablate report.",
           "% Needs \\usepackage{booktabs} in the preamble; one table per task.", ""]
    for t in tables:
        with_delta = t.baseline is not None
        ncols = 2 + len(t.metrics) * (2 if with_delta else 1)
        head = ["Group", "$n$"]
        for m in t.metrics:
            head += [tex_escape(m)] + ([f"$\\Delta$ {tex_escape(m)}"] if with_delta else [])
        out += [f"% task {t.task}", "\\begin{table}[t]", "\\centering",
                f"\\begin{{tabular}}{{l{'r' * (ncols - 1)}}}", "\\toprule",
                " & ".join(head) + " \\\\", "\\midrule"]
        for g in t.groups:
            row = _row(t, g, tex_escape, _tex_mean, lambda s: f"\\textbf{{{s}}}", _tex_diff)
            out.append(" & ".join(row) + " \\\\")
        out.append("\\bottomrule")
        for note in footnotes(t):
            text = tex_escape(note).replace(f" {MARK} the interval", f" $^{{{MARK}}}$ the interval")
            out.append(f"\\multicolumn{{{ncols}}}{{l}}{{\\footnotesize {text}}} \\\\")
        out += ["\\end{tabular}",
                f"\\caption{{Ablation over seeds, task \\texttt{{{tex_escape(t.task)}}}: mean $\\pm$ "
                f"sample std; $\\Delta$ to the baseline group with its {LEVEL * 100:.0f}\\,\\% "
                "confidence interval (Welch).}",
                f"\\label{{tab:ablation-{re.sub(r'[^A-Za-z0-9_.:-]', '-', t.task)}}}", "\\end{table}", ""]
    return "\n".join(out).rstrip("\n") + "\n"


# --------------------------------------------------------------------------- CSV


def _num(v: float | None) -> str:
    return "" if v is None else repr(float(v))


def groups_csv(tables: Sequence[GroupTable]) -> str:
    metrics: dict[str, None] = {}
    for t in tables:
        metrics.update(dict.fromkeys(t.metrics))
    head = ["task", "group", "baseline", "cells", "seeds", "done", "total", "missing", "unverified"]
    for m in metrics:
        head += [f"{m}_{k}" for k in ("n", "mean", "std", "delta", "ci_low", "ci_high", "df",
                                       "excludes_zero")]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    for t in tables:
        for g in t.groups:
            row = [t.task, g.name, "yes" if g.baseline else "", " ".join(g.cells), " ".join(g.seeds),
                   str(len(g.done)), str(len(g.cells)), " ".join(g.missing), " ".join(g.unverified)]
            for m in metrics:
                s = g.stats.get(m)
                d = g.diffs.get(m)
                if s is None:
                    row += [""] * 8
                    continue
                row += [str(s.n), _num(s.mean), _num(s.std)]
                row += [_num(d.delta), _num(d.low), _num(d.high), _num(d.df),
                        "yes" if d.excludes_zero else ""] if d is not None else [""] * 5
            w.writerow(row)
    return buf.getvalue()
