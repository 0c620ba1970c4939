"""`ablate report` over seeds, on a small real sweep opened in headless Chromium: cells grouped
into one row per group (by the config's `seed` key or the name's suffix), mean ± std and the
difference to the baseline group with its Welch 95 % interval (computed here from the textbook
formulas), what is missing or not verified; the bar charts with their error bars, rendered; the
same rows in ablation.md, ablation.tex and ablation_groups.csv; `group_by: none`."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from ablate.config.project import load_project
from ablate.report.stats import t_quantile
from ablate.results.pull import pull
from ablate.results.reconcile import reconcile
from ablate.run.launch import launch
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject, drained
from tests.helpers.report_page import chromium, image, need_chromium_fixture, parse, table_rows
from tests.helpers.tmux import require_tmux

_need_chromium = need_chromium_fixture()


def _seed_sweep(lp: LocalProject) -> None:
    """recon: baseline and noisy (ten times the label noise) over seeds 0-2 (the `seed` key of their
    configs), wide over seeds 0-2 of which one never runs (q4 is never launched) and one lands
    after the reconcile (synced, not verified). det: det_base_s0/_s1, whose configs have no `seed`
    key (grouped by the name suffix; they differ in `noise`), and det_b alone."""
    lp.write_config(steal=False)
    lp.queue("q1", ["# ablate: host=h1",
                    *(lp.cfg(f"cfgs/recon/baseline_s{k}.yaml", lr=0.4, noise=0.1, seed=k) + " recon"
                      for k in range(3)),
                    *(lp.cfg(f"cfgs/recon/noisy_s{k}.yaml", lr=0.4, noise=1.0, seed=k) + " recon"
                      for k in range(3))])
    for k, noise in ((0, 0.1), (1, 0.3)):
        path = lp.root / "cfgs" / "det" / f"det_base_s{k}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({"lr": 0.05, "hidden": 6, "noise": noise}))
    lp.queue("q2", ["# ablate: host=h2", "cfgs/det/det_base_s0.yaml det", "cfgs/det/det_base_s1.yaml det",
                    lp.cfg("cfgs/det/det_b.yaml", lr=0.2, hidden=6) + " det",
                    lp.cfg("cfgs/recon/wide_s0.yaml", lr=0.4, noise=0.1, hidden=8, seed=0) + " recon"])
    lp.queue("q4", ["# ablate: host=h2",
                    lp.cfg("cfgs/recon/wide_s1.yaml", lr=0.4, noise=0.1, hidden=8, seed=1) + " recon"])
    project = load_project(lp.root)
    launch(project, "q1", "h1")
    launch(project, "q2", "h2")
    drained(lp, "h1", "q1")
    drained(lp, "h2", "q2")
    assert pull(project).ok
    assert reconcile(project).verified == 10
    lp.queue("q3", ["# ablate: host=h1",
                    lp.cfg("cfgs/recon/wide_s2.yaml", lr=0.4, noise=0.1, hidden=8, seed=2) + " recon"])
    launch(load_project(lp.root), "q3", "h1")
    drained(lp, "h1", "q3")


def _welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """(delta, low, high), written out here from the textbook formulas."""
    import numpy as np

    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(0.975, float(df)) * float(np.sqrt(va + vb))
    delta = float(np.mean(a) - np.mean(b))
    return delta, delta - half, delta + half


def _painted(img: Any, box: tuple[float, float, float, float], colour: str, tol: int = 40) -> int:
    """How many pixels of the screenshot inside box (x0, y0, x1, y1) are within `tol` of `colour`."""
    x0, y0, x1, y1 = (round(v) for v in box)
    px = (img[max(0, y0):y1 + 1, max(0, x0):x1 + 1, :3] * 255).round().astype("int16")
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return int((abs(px - rgb).sum(axis=2) <= tol).sum())


@pytest.mark.tmux
def test_report_groups_seeds_into_one_row_with_welch_intervals_in_headless_chromium(
        local_project: LocalProject, cli: Cli, tmp_path: Path) -> None:
    import numpy as np

    require_tmux()
    lp = local_project
    _seed_sweep(lp)
    res = cli.json(lp, "report")
    out = lp.root / "reports" / "t1"
    assert (res["md"], res["tex"], res["groups_csv"]) == (
        str(out / "ablation.md"), str(out / "ablation.tex"), str(out / "ablation_groups.csv"))

    # ---- what the files on the shared FS say, computed here
    vals: dict[str, dict[str, float]] = {}
    for d in (lp.shared / "final_ckpts").iterdir():
        m = json.loads((d / "metrics.json").read_text())
        vals[d.name] = {k: float(v) for k, v in m.items()}
    assert set(vals) == {f"{g}_s{k}" for g in ("baseline", "noisy") for k in range(3)} | {
        "det_base_s0", "det_base_s1", "det_b", "wide_s0", "wide_s2"}
    members = {"recon": {"baseline": ["baseline_s0", "baseline_s1", "baseline_s2"],
                         "noisy": ["noisy_s0", "noisy_s1", "noisy_s2"],
                         "wide": ["wide_s0", "wide_s2", "wide_s1"]},  # roster order: q2, q3, q4
               "det": {"det_base": ["det_base_s0", "det_base_s1"], "det_b": ["det_b"]}}
    base = {"recon": "baseline", "det": "det_base"}

    def xs(task: str, group: str, metric: str) -> list[float]:
        return [vals[c][metric] for c in members[task][group] if c in vals]

    # ---- the JSON: groups, how they were formed, what is missing
    for task, groups in members.items():
        got = res["tasks"][task]
        assert got["group_by"] == "seed" and got["baseline_group"] == base[task]
        assert [g["group"] for g in got["groups"]] == list(groups)
        assert {g["group"]: g["cells"] for g in got["groups"]} == groups
    by = {(t, g["group"]): g for t in members for g in res["tasks"][t]["groups"]}
    assert by["recon", "baseline"]["by"] == "config" and by["recon", "baseline"]["seeds"] == ["0", "1", "2"]
    assert by["det", "det_base"]["by"] == "suffix" and by["det", "det_base"]["seeds"] == ["0", "1"]
    assert by["recon", "wide"]["missing"] == {"wide_s1": "never_ran"}
    assert by["recon", "wide"]["unverified"] == ["wide_s2"] and by["recon", "wide"]["done"] == 2
    assert by["det", "det_b"]["metrics"]["val_loss"]["no_ci"] == "n=1"
    line = next(ln for ln in cli(lp, "report")[1].splitlines() if ln.startswith("over seeds: "))
    assert line.endswith("ablation_groups.csv (5 groups of 12 cells, 1 cell without metrics)"), line

    # ---- the page in a real browser: the grouped table
    html_path = out / "report.html"
    dom = parse(chromium(tmp_path, "--dump-dom", html_path.as_uri()).stdout)
    significant = {}
    for task, groups in members.items():
        head, rows = table_rows(dom.by_id(f"groups-{task}"))
        assert head[:5] == ["group", "cells", "missing", "not verified", "seeds"]
        assert head[5:] == [x for m in ("val_loss", "train_loss", "epochs")
                            for x in (f"{m} (mean \u00b1 std)", f"\u0394 {m} [95% CI]")]
        assert [r[0].attrs["data-value"] for r in rows] == list(groups)
        for r in rows:
            group = r[0].attrs["data-value"]
            assert r[1].text == f"{len(xs(task, group, 'val_loss'))}/{len(groups[group])}"
            assert int(r[2].attrs["data-value"]) == (1 if group == "wide" else 0)
            assert int(r[3].attrs["data-value"]) == (1 if group == "wide" else 0)
            for i, m in enumerate(("val_loss", "train_loss", "epochs")):
                cell, delta = r[5 + 2 * i], r[6 + 2 * i]
                a = xs(task, group, m)
                assert float(cell.attrs["data-value"]) == pytest.approx(np.mean(a), rel=1e-12)
                assert int(cell.attrs["data-n"]) == len(a)
                std = float(np.std(a, ddof=1)) if len(a) > 1 else None
                assert (float(cell.attrs["data-std"]) if cell.attrs["data-std"] else None) == (
                    pytest.approx(std, rel=1e-9, abs=1e-15) if std is not None else None)
                if group == base[task]:
                    assert delta.text == "\u2014"
                    continue
                b = xs(task, base[task], m)
                if len(a) < 2 or np.std(a) == 0:
                    assert delta.attrs["data-low"] == "" and "sig" not in delta.classes
                    assert float(delta.attrs["data-value"]) == pytest.approx(np.mean(a) - np.mean(b))
                    continue
                d, lo, hi = _welch(a, b)
                assert float(delta.attrs["data-value"]) == pytest.approx(d, rel=1e-12)
                assert float(delta.attrs["data-low"]) == pytest.approx(lo, rel=1e-9)
                assert float(delta.attrs["data-high"]) == pytest.approx(hi, rel=1e-9)
                significant[task, group, m] = lo > 0 or hi < 0
                assert ("*" in delta.text) == significant[task, group, m], (task, group, m, delta.text)
                assert ("significant" in delta.classes) == significant[task, group, m]
    # ten times the label noise: a loss clearly above the baseline's; a wider model: within the noise
    noisy = next(tr for tr in dom.by_id("groups-recon").find_all("tr")
                 if tr.attrs.get("data-group") == "noisy")
    assert significant["recon", "noisy", "val_loss"] and "worse" in noisy.find_all("td")[6].classes
    assert not all(significant.values())  # ... and some differences are within the noise

    # ---- the bar charts: one per task and metric, a bar per group, error bars where n >= 2
    charts = {(c.attrs["data-task"], c.attrs["data-metric"]): c for c in dom.find_all("svg", "group-chart")}
    assert set(charts) == {(t, m) for t in members for m in ("val_loss", "train_loss", "epochs")}
    for (task, m), svg in charts.items():
        groups = members[task]
        bars = {b.attrs["data-group"]: b for b in svg.find_all("rect", "group-bar")}
        assert list(bars) == list(groups)
        for g, bar in bars.items():
            assert float(bar.attrs["data-mean"]) == pytest.approx(np.mean(xs(task, g, m)), rel=1e-12)
            assert bar.attrs["data-n"] == str(len(xs(task, g, m))) and bar.attrs["data-cells"] == str(
                len(groups[g]))
            assert ("baseline" in bar.classes) == (g == base[task])
        errs = {e.attrs["data-group"]: e for e in svg.find_all("line", "error-bar")}
        assert set(errs) == {g for g in groups if len(xs(task, g, m)) >= 2}
        for g, e in errs.items():
            mean, std = np.mean(xs(task, g, m)), np.std(xs(task, g, m), ddof=1)
            assert float(e.attrs["data-low"]) == pytest.approx(mean - std, rel=1e-9, abs=1e-12)
            assert float(e.attrs["data-high"]) == pytest.approx(mean + std, rel=1e-9, abs=1e-12)
            assert float(e.attrs["y1"]) >= float(e.attrs["y2"])  # SVG y grows downwards: low below high
        points = sorted((p.attrs["data-cell"], float(p.attrs["data-value"]))
                        for p in svg.find_all("circle", "seed-point"))
        assert points == sorted((c, vals[c][m]) for g in groups.values() for c in g if c in vals)
        marks = {x.attrs["data-group"] for x in svg.find_all("text", "sig-mark")}
        assert marks == {g for (t, g, mm), sig in significant.items() if t == task and mm == m and sig}
    legend = dom.find_all("p", "chart-legend")[0].text
    assert "1 sample standard deviation" in legend and "Welch" in legend

    # ---- the chart really renders: each bar's colour on screen inside its rect (beside the dots and
    # the error bar drawn over its middle), each error bar's ink along its line
    page = html_path.read_text()
    start = page.index('<svg class="group-chart" data-task="recon" data-metric="val_loss"')
    alone = tmp_path / "chart.html"
    alone.write_text('<!DOCTYPE html><html><body style="margin:0;background:#fff">'
                     + page[start:page.index("</svg>", start) + 6] + "</body></html>")
    shot = tmp_path / "chart.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=700,300", alone.as_uri())
    img = image(shot)
    svg = charts["recon", "val_loss"]
    assert _painted(img, (0, 0, 699, 299), "#4C78A8", tol=0) > 500  # the tall bar, solid
    for bar in svg.find_all("rect", "group-bar"):
        x, y, w, h = (float(bar.attrs[k]) for k in ("x", "y", "width", "height"))
        left = (x, y - 0.5, x + w / 2 - 12, y + h + 0.5)  # the bar's left part: no dot, no error bar
        assert _painted(img, left, bar.attrs["fill"]) >= max(4, 0.5 * (w / 2 - 12) * h), bar.attrs
    for e in svg.find_all("line", "error-bar"):
        x, y1, y2 = float(e.attrs["x1"]), float(e.attrs["y1"]), float(e.attrs["y2"])
        column = (img[round(y2):round(y1) + 1, round(x) - 1:round(x) + 2, :3] * 255).sum(axis=2)
        dark_rows = int((column.min(axis=1) < 300).sum())  # ink (#222, anti-aliased) on white or a bar
        assert dark_rows >= 0.9 * (y1 - y2), e.attrs

    # ---- ablation.md: the same rows, numbers and markers
    md = (out / "ablation.md").read_text()
    recon = md[md.index("## Task recon"):]
    lines = [ln for ln in recon.splitlines() if ln.startswith("| ")]
    assert lines[0].startswith("| group | n | val_loss | \u0394 val_loss (95% CI) |")
    rows_md = {ln.split(" | ")[0][2:]: [c.strip() for c in ln.strip("| ").split(" | ")] for ln in lines[1:]}
    assert list(rows_md) == ["baseline (baseline)", "noisy", "wide"]
    assert rows_md["wide"][1] == "2/3" and rows_md["baseline (baseline)"][3] == "\u2014"
    for g in ("noisy", "wide"):
        mean_std = rows_md[g][2].strip("*")
        mean, std = (float(x) for x in mean_std.split(" \u00b1 "))
        decimals = len(mean_std.split(" \u00b1 ")[1].split(".")[1])
        assert mean == pytest.approx(np.mean(xs("recon", g, "val_loss")), abs=0.51 * 10 ** -decimals)
        assert std == pytest.approx(np.std(xs("recon", g, "val_loss"), ddof=1), abs=0.51 * 10 ** -decimals)
        assert rows_md[g][3].endswith(" *") == significant["recon", g, "val_loss"]
    assert "* the interval excludes 0" in recon and "wide_s1 (never_ran)" in recon
    assert "wide_s2 (synced)" in recon and "no CI: n=1" in md[md.index("## Task det"):]

    # ---- ablation.tex: booktabs, escaped names, one row per group with every column
    tex = (out / "ablation.tex").read_text()
    assert tex.count("\\begin{tabular}{lrrrrrrr}") == 2 and tex.count("\\toprule") == 2
    assert tex.count("\\midrule") == 2 and tex.count("\\bottomrule") == 2
    assert tex.count("{") == tex.count("}") and "det\\_base (baseline)" in tex and tex.isascii()
    assert "det_b" not in tex.replace("\\_", "")
    at = tex.index("% task recon")
    body = tex[tex.index("\\midrule", at):tex.index("\\bottomrule", at)]
    body_rows = [ln for ln in body.splitlines()[1:] if ln.strip()]
    assert len(body_rows) == 3 and all(ln.replace("\\&", "").count("&") == 7 for ln in body_rows)
    assert all("$\\pm$" in ln for ln in body_rows) and body_rows[2].startswith("wide & 2/3 & ")
    assert "$^{*}$" in body_rows[1] and "$^{*}$" not in body_rows[2].split("&")[3]

    # ---- ablation_groups.csv: full precision; ablation.csv: still one row per cell
    gcsv = {(r["task"], r["group"]): r
            for r in csv.DictReader(io.StringIO((out / "ablation_groups.csv").read_text()))}
    assert set(gcsv) == {(t, g) for t in members for g in members[t]}
    w = gcsv["recon", "wide"]
    assert (w["done"], w["total"], w["missing"], w["unverified"]) == ("2", "3", "wide_s1", "wide_s2")
    assert float(w["val_loss_mean"]) == pytest.approx(np.mean(xs("recon", "wide", "val_loss")), rel=1e-12)
    d, lo, hi = _welch(xs("recon", "noisy", "val_loss"), xs("recon", "baseline", "val_loss"))
    ls = gcsv["recon", "noisy"]
    assert (float(ls["val_loss_delta"]), float(ls["val_loss_ci_low"]), float(ls["val_loss_ci_high"])) == (
        pytest.approx(d, rel=1e-12), pytest.approx(lo, rel=1e-9), pytest.approx(hi, rel=1e-9))
    assert ls["val_loss_excludes_zero"] == "yes"
    cells = list(csv.DictReader(io.StringIO((out / "ablation.csv").read_text())))
    assert len(cells) == 12 and {r["cell"] for r in cells} >= {"wide_s1", "wide_s2", "det_b"}

    # ---- group_by: none gives every cell its own row (no intervals: n=1 everywhere)
    cfg = yaml.safe_load((lp.root / "ablate.yaml").read_text())
    cfg["report"] = {"group_by": "none"}
    (lp.root / "ablate.yaml").write_text(yaml.safe_dump(cfg))
    alone_res = cli.json(lp, "report")["tasks"]["recon"]
    assert alone_res["group_by"] is None
    assert [g["group"] for g in alone_res["groups"]] == [r["cell"] for r in cells if r["task"] == "recon"]
    assert all(g["metrics"]["val_loss"].get("ci") is None for g in alone_res["groups"])
