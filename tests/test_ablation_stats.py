"""The table over seeds without a sweep: the Student-t quantile and Welch's interval against known
values, the grouping of real config files, the markdown / LaTeX / CSV it is written as, and
`report.group_by` in ablate.yaml. The report of a real sweep grouped over seeds, in headless
Chromium, is in tests/test_report_seed_groups.py."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from ablate.config.project import load_project
from ablate.config.settings import ReportSettings
from ablate.errors import ConfigError
from ablate.report.data import CellResult, RosterCell
from ablate.report.export import decimals, fmt_mean, groups_csv, tex_escape, to_latex, to_markdown
from ablate.report.groups import GroupTable, build_groups, read_cfgs, take_key
from ablate.report.stats import Summary, betainc, t_cdf, t_quantile, welch
from ablate.report.table import build_tables
from ablate.sweep.cells import Cell
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject

# --------------------------------------------------------------------------- the t distribution


@pytest.mark.parametrize(("df", "table"), [(1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228),
                                           (30, 2.042), (120, 1.980), (1e9, 1.960)])
def test_t_quantile_matches_the_printed_tables(df: float, table: float) -> None:
    assert round(t_quantile(0.975, df), 3) == table


# scipy.stats.t.ppf(p, df), scipy 1.17 (scipy is not a dependency: the numbers are written here)
SCIPY_T = [(0.975, 0.5, 164.55767348048818), (0.9, 0.5, 10.27032441023451),
           (0.975, 2.5, 3.5746548420036817), (0.9, 2.5, 1.7302509288071766),
           (0.975, 3.7, 2.8675207071911895), (0.9, 3.7, 1.5575658388615072),
           (0.975, 7.3, 2.345066736547703), (0.9, 7.3, 1.4089223177480423),
           (0.975, 1e6, 1.959966356814107)]


@pytest.mark.parametrize(("p", "df", "want"), SCIPY_T)
def test_t_quantile_at_fractional_degrees_of_freedom(p: float, df: float, want: float) -> None:
    assert t_quantile(p, df) == pytest.approx(want, rel=1e-8)
    assert t_quantile(1 - p, df) == pytest.approx(-want, rel=1e-8)  # symmetric


def test_t_quantile_closed_forms_and_limits() -> None:
    for p in (0.55, 0.8, 0.975, 0.999):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)  # Cauchy
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10)
    assert t_quantile(0.5, 4.2) == 0.0
    assert t_quantile(0.975, 1e8) == pytest.approx(1.959963984540054, rel=1e-12)  # the normal one
    for bad_p, bad_df in ((0.0, 3.0), (1.0, 3.0), (0.9, 0.0), (0.9, -1.0)):
        with pytest.raises(ValueError):
            t_quantile(bad_p, bad_df)


@pytest.mark.parametrize("df", [0.7, 2.5, 3.7, 11.3])
def test_the_quantile_inverts_the_t_density_integrated_numerically(df: float) -> None:
    """Independent of the incomplete beta: Simpson's rule over the density from 0 to the quantile."""
    q = t_quantile(0.975, df)
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    xs = np.linspace(0.0, q, 20_001)
    ys = c * (1 + xs ** 2 / df) ** (-(df + 1) / 2)
    h = xs[1] - xs[0]
    area = h / 3 * (ys[0] + ys[-1] + 4 * ys[1:-1:2].sum() + 2 * ys[2:-1:2].sum())
    assert 0.5 + area == pytest.approx(0.975, abs=1e-9)
    assert t_cdf(q, df) == pytest.approx(0.975, abs=1e-12)
    assert t_cdf(-q, df) == pytest.approx(0.025, abs=1e-12)


def test_incomplete_beta_closed_forms() -> None:
    for x in (0.0, 0.01, 0.3, 0.5, 0.77, 0.999, 1.0):
        assert betainc(1, 1, x) == pytest.approx(x, abs=1e-14)
        assert betainc(3.5, 1, x) == pytest.approx(x ** 3.5, abs=1e-13)
        assert betainc(1, 2.5, x) == pytest.approx(1 - (1 - x) ** 2.5, abs=1e-13)
        assert betainc(2.2, 0.5, x) == pytest.approx(1 - betainc(0.5, 2.2, 1 - x), abs=1e-13)
    assert betainc(0.5, 0.5, 0.25) == pytest.approx(2 / math.pi * math.asin(0.5), abs=1e-13)  # arcsine law


# --------------------------------------------------------------------------- mean, std, Welch


def test_summary_is_numpys_mean_and_sample_std() -> None:
    xs = [0.7312, 0.6954, 0.7511, 0.7102, 0.7420]
    s = Summary.of(xs)
    assert s.n == 5 and s.mean == pytest.approx(np.mean(xs), rel=1e-15)
    assert s.std == pytest.approx(np.std(xs, ddof=1), rel=1e-12)
    assert Summary.of([3]) == Summary(1, 3.0, None) and Summary.of([]) == Summary(0, None, None)


# scipy.stats.ttest_ind(a, b, equal_var=False): .df and .confidence_interval(0.95), scipy 1.17
WELCH = [([1.0, 2.0, 3.5, 4.0], [2.0, 4.0, 6.5], 3.1129604833865794, -6.13322817906606, 3.0498948457327257),
         ([10.1, 10.3, 10.2], [9.0, 9.2, 9.1, 8.9], 4.95918367346938, 0.9268288518661214, 1.3731711481338793),
         ([0.52, 0.61, 0.49, 0.58, 0.55], [0.50, 0.57], 1.8086220789685745, -0.18021227817374263,
          0.21021227817374288)]


@pytest.mark.parametrize(("a", "b", "df", "low", "high"), WELCH)
def test_welch_interval(a: list[float], b: list[float], df: float, low: float, high: float) -> None:
    d = welch(Summary.of(a), Summary.of(b))
    assert d is not None and d.why is None
    # by hand: the Welch-Satterthwaite degrees of freedom and the standard error
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    welch_df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    assert d.df == pytest.approx(welch_df, rel=1e-12)
    assert d.se == pytest.approx(math.sqrt(va + vb), rel=1e-12)
    assert d.delta == pytest.approx(np.mean(a) - np.mean(b), rel=1e-12)
    assert (d.df, d.low, d.high) == (pytest.approx(df, rel=1e-10), pytest.approx(low, rel=1e-8),
                                     pytest.approx(high, rel=1e-8))
    assert d.excludes_zero == (low > 0 or high < 0)


def test_welch_without_an_interval_says_why() -> None:
    three, one = Summary.of([1.0, 2.0, 4.0]), Summary.of([5.0])
    d = welch(one, three)
    assert d is not None and d.delta == pytest.approx(5 - 7 / 3) and d.low is None and d.why == "n=1"
    d = welch(three, one)
    assert d is not None and d.why == "baseline n=1" and not d.excludes_zero
    d = welch(Summary.of([2.0, 2.0]), Summary.of([1.0, 1.0, 1.0]))
    assert d is not None and d.delta == 1.0 and d.why == "std 0" and not d.excludes_zero
    assert welch(Summary.of([]), three) is None and welch(three, Summary.of([])) is None


# --------------------------------------------------------------------------- grouping real configs


class Sweep:
    """Config files written to disk, a roster over them, metrics per cell, and the tables."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.roster: dict[str, RosterCell] = {}
        self.metrics: dict[str, CellResult] = {}
        self.states: dict[str, str] = {}

    def cell(self, name: str, body: Any, task: str = "t", epochs: int = 3, value: float | None = None,
             state: str = "verified", folder: str = "cfgs") -> None:
        rel = f"{folder}/{name}.yaml"
        (self.root / folder).mkdir(parents=True, exist_ok=True)
        if body is not None:
            (self.root / rel).write_text(yaml.safe_dump(body))
        self.roster[name] = RosterCell(name, Cell(rel, task, epochs), "q")
        self.metrics[name] = CellResult({"loss": value} if value is not None else None, "local")
        self.states[name] = state if value is not None else "never_ran"

    def groups(self, group_by: str | None = "seed", baseline: str = "*base*") -> list[GroupTable]:
        settings = ReportSettings((baseline,), "loss", "min", group_by)
        tables = build_tables(self.roster, self.states, self.metrics, settings, ())
        cfgs = read_cfgs(self.root, self.roster) if group_by else {}
        return build_groups(tables, self.roster, cfgs, group_by)


def _names(t: GroupTable) -> dict[str, list[str]]:
    return {g.name: g.cells for g in t.groups}


def test_cells_whose_configs_differ_only_in_the_seed_are_one_group(tmp_path: Path) -> None:
    s = Sweep(tmp_path)
    for k, v in enumerate((1.0, 1.2, 1.1)):
        s.cell(f"base_{k}", {"lr": 0.1, "model": {"width": 4}, "seed": k}, value=v)  # any names
    for k, v in enumerate((2.0, 2.3, 2.1)):
        s.cell(f"lr_s{k}", {"seed": k, "model": {"width": 4}, "lr": 0.5}, value=v)  # key order: no matter
    s.cell("lr_s3", {"seed": 3, "model": {"width": 4}, "lr": 0.5})  # not run yet
    s.cell("lr_long_s0", {"seed": 0, "model": {"width": 4}, "lr": 0.5}, epochs=9, value=1.0)  # other epochs
    s.cell("deep_s0", {"seed": 0, "model": {"width": 8}, "lr": 0.1}, value=0.9, state="synced")
    s.cell("base_x", {"lr": 0.1, "model": {"width": 4}, "seed": 0}, task="u", value=5.0)  # other task
    t, u = s.groups()
    assert _names(t) == {"base_0": ["base_0", "base_1", "base_2"],  # no suffix: the first cell's name
                         "lr": ["lr_s0", "lr_s1", "lr_s2", "lr_s3"], "lr_long": ["lr_long_s0"],
                         "deep": ["deep_s0"]}
    assert _names(u) == {"base_x": ["base_x"]}
    assert t.baseline == "base_0" and [g.by for g in t.groups] == ["config"] * 4
    lr = t.group("lr")
    assert lr.seeds == ["0", "1", "2", "3"] and lr.missing == ["lr_s3"]
    assert lr.state_of("lr_s3") == "never_ran"
    assert lr.done == ["lr_s0", "lr_s1", "lr_s2"] and lr.unverified == []
    assert t.group("deep").unverified == ["deep_s0"]
    assert lr.stats["loss"] == Summary(3, pytest.approx(np.mean([2.0, 2.3, 2.1])),
                                       pytest.approx(np.std([2.0, 2.3, 2.1], ddof=1)))
    d = lr.diffs["loss"]
    assert d.delta == pytest.approx(np.mean([2.0, 2.3, 2.1]) - np.mean([1.0, 1.2, 1.1]))
    assert d.excludes_zero and d.low is not None and d.low > 0
    assert t.group("deep").diffs["loss"].why == "n=1" and "loss" not in t.group("base_0").diffs
    assert t.best == {"loss": {"deep"}} and not t.notes
    assert t.group("lr").to_json()["missing"] == {"lr_s3": "never_ran"}


def test_a_nested_seed_key_and_the_name_suffix_when_the_key_is_absent(tmp_path: Path) -> None:
    s = Sweep(tmp_path)
    s.cell("base_seed0", {"train": {"seed": 0, "lr": 0.1}}, value=1.0)
    s.cell("base_seed1", {"train": {"seed": 1, "lr": 0.1}}, value=1.4)
    s.cell("aug_s0", {"aug": True, "noise": 0.1}, value=0.8)  # no seed key: the suffix decides ...
    s.cell("aug_s1", {"aug": True, "noise": 0.2}, value=0.9)  # ... even though the configs differ
    s.cell("plain", {"aug": False}, value=0.7)
    t, = s.groups("train.seed")
    assert _names(t) == {"base": ["base_seed0", "base_seed1"], "aug": ["aug_s0", "aug_s1"],
                         "plain": ["plain"]}
    assert [g.by for g in t.groups] == ["config", "suffix", "cell"]
    assert t.group("aug").seeds == ["0", "1"] and t.group("base").seeds == ["0", "1"]
    assert take_key({"a": {"b": 1, "c": 2}}, "a.b") == (1, {"a": {"c": 2}})
    assert take_key({"a": 3}, "a.b")[1] == {"a": 3}


def test_a_seed_suffix_does_not_join_cells_whose_configs_differ_beyond_the_seed(tmp_path: Path) -> None:
    s = Sweep(tmp_path)
    s.cell("base", {"lr": 0.1, "seed": 0}, value=1.0)
    s.cell("y_s0", {"lr": 0.1, "seed": 0}, value=1.0, folder="a")
    s.cell("y_s1", {"lr": 0.3, "seed": 1}, value=2.0, folder="a")  # another lr: not a replicate
    t, = s.groups()
    # y_s0 has base's very config (a repeat run is a replicate too); y_s1 alone, named without its suffix
    assert _names(t) == {"base": ["base", "y_s0"], "y": ["y_s1"]}
    s2 = Sweep(tmp_path / "2")
    s2.cell("x_s0", {"lr": 0.1, "seed": 0}, value=1.0)
    s2.cell("x_s1", {"lr": 0.3, "seed": 1}, value=2.0)
    t, = s2.groups()
    assert _names(t) == {"x_s0": ["x_s0"], "x_s1": ["x_s1"]}  # both would be "x": their own names
    assert any("no two cells differ only in 'seed'" in n for n in t.notes)


def test_a_config_not_readable_here_falls_back_to_the_name_and_says_so(tmp_path: Path) -> None:
    s = Sweep(tmp_path)
    s.cell("base_s0", None, value=1.0)  # never written: not on this laptop
    s.cell("base_s1", None, value=1.5)
    s.cell("odd", {"a": 1}, value=1.0)
    (tmp_path / "cfgs" / "odd.yaml").write_text("a: [unclosed\n")
    t, = s.groups()
    assert _names(t) == {"base": ["base_s0", "base_s1"], "odd": ["odd"]}
    note = next(n for n in t.notes if "config not read here" in n)
    assert "base_s0 (cfgs/base_s0.yaml: not found here)" in note
    assert "odd (cfgs/odd.yaml: not readable as YAML" in note


def test_group_by_none_gives_every_cell_its_own_row(tmp_path: Path) -> None:
    s = Sweep(tmp_path)
    s.cell("base_s0", {"seed": 0}, value=1.0)
    s.cell("base_s1", {"seed": 1}, value=2.0)
    t, = s.groups(None)
    assert _names(t) == {"base_s0": ["base_s0"], "base_s1": ["base_s1"]}
    assert t.group("base_s1").diffs["loss"].why == "n=1" and not t.notes


# --------------------------------------------------------------------------- the files


def _table(tmp_path: Path) -> GroupTable:
    s = Sweep(tmp_path)
    for k, v in enumerate((0.512, 0.534, 0.521)):
        s.cell(f"base_s{k}", {"seed": k, "lr": 0.1}, value=v)
    for k, v in enumerate((0.731, 0.695, 0.751)):
        s.cell(f"drop_path_s{k}", {"seed": k, "lr": 0.1, "drop": 0.1}, value=v)
    s.cell("drop_path_s3", {"seed": 3, "lr": 0.1, "drop": 0.1})
    s.cell("tiny_s0", {"seed": 0, "lr": 0.1, "tiny": True}, value=0.53)
    t, = s.groups()
    return t


def test_markdown_shows_mean_std_n_the_interval_its_marker_and_whats_missing(tmp_path: Path) -> None:
    t = _table(tmp_path)
    md = to_markdown([t], "sweep|1")
    lines = md.splitlines()
    assert lines[0] == "# Ablation over seeds: sweep sweep\\|1"
    rows = [ln for ln in lines if ln.startswith("| ")]
    assert rows[0] == "| group | n | loss | \u0394 loss (95% CI) |"
    assert rows[1] == "| base (baseline) | 3/3 | **0.522 \u00b1 0.011** | \u2014 |"
    d = t.group("drop_path").diffs["loss"]
    assert d.low is not None and d.high is not None
    interval = f"+{d.delta:.3f} [+{d.low:.3f}, +{d.high:.3f}] *"
    assert rows[2] == f"| drop_path | 3/4 | 0.726 \u00b1 0.028 | {interval} |"
    assert rows[3] == "| tiny | 1/1 | 0.53 | +0.008 (no CI: n=1) |"
    assert "drop_path: 1 of 4 cells without metrics: drop_path_s3 (never_ran)" in md
    assert "\\* the interval excludes 0" in md


def test_latex_is_booktabs_with_escaped_names_and_one_cell_per_column(tmp_path: Path) -> None:
    t = _table(tmp_path)
    t.metrics = ["loss"]
    t.task = "seg_50%&more"
    tex = to_latex([t], "s1")
    assert tex.isascii() and tex.count("{") == tex.count("}")
    assert "\\begin{tabular}{lrrr}" in tex
    assert tex.count("\\toprule") == tex.count("\\midrule") == tex.count("\\bottomrule") == 1
    assert "\\texttt{seg\\_50\\%\\&more}" in tex and "\\label{tab:ablation-seg_50--more}" in tex
    body = tex[tex.index("\\midrule") + 8:tex.index("\\bottomrule")].strip().splitlines()
    assert body[0] == "base (baseline) & 3/3 & \\textbf{0.522 $\\pm$ 0.011} & --- \\\\"
    assert body[1].startswith("drop\\_path & 3/4 & 0.726 $\\pm$ 0.028 & $+$0.") and "$^{*}$" in body[1]
    assert body[2] == "tiny & 1/1 & 0.53 & $+$0.008 {\\footnotesize (n=1)} \\\\"
    assert all(ln.count("&") == 3 for ln in body)
    assert tex_escape("a_b\\c~^{}#$") == ("a\\_b\\textbackslash{}c\\textasciitilde{}\\textasciicircum{}"
                                         "\\{\\}\\#\\$")


def test_the_groups_csv_has_full_precision(tmp_path: Path) -> None:
    t = _table(tmp_path)
    rows = list(csv.DictReader(io.StringIO(groups_csv([t]))))
    assert [r["group"] for r in rows] == ["base", "drop_path", "tiny"]
    dp = rows[1]
    assert (dp["cells"], dp["seeds"], dp["done"], dp["total"], dp["missing"]) == (
        "drop_path_s0 drop_path_s1 drop_path_s2 drop_path_s3", "0 1 2 3", "3", "4", "drop_path_s3")
    d = t.group("drop_path").diffs["loss"]
    assert float(dp["loss_mean"]) == np.mean([0.731, 0.695, 0.751])
    got = (float(dp["loss_ci_low"]), float(dp["loss_ci_high"]), float(dp["loss_df"]))
    assert got == (d.low, d.high, d.df)
    assert dp["loss_excludes_zero"] == "yes" and rows[0]["loss_delta"] == "" and rows[0]["baseline"] == "yes"


def test_shown_decimals_give_the_spread_two_significant_digits() -> None:
    assert [decimals(x) for x in (0.0123, 0.123, 1.5, 12.0, 340.0, 0.0, None)] == [3, 2, 1, 0, 0, None, None]
    assert fmt_mean(Summary(3, 0.73123, 0.0123)) == "0.731 \u00b1 0.012"
    assert fmt_mean(Summary(3, -0.0004, 0.0123)) == "0.000 \u00b1 0.012"  # no "-0.000"
    assert fmt_mean(Summary(1, 1234.5678, None)) == "1235"


# --------------------------------------------------------------------------- ablate.yaml


@pytest.mark.parametrize(("value", "want"), [(None, "seed"), ("seed", "seed"), ("train.seed", "train.seed"),
                                             ("none", None), ("None", None), (False, None)])
def test_group_by_values(local_project: LocalProject, value: Any, want: str | None) -> None:
    local_project.write_config(report={} if value is None else {"group_by": value})
    assert load_project(local_project.root).report.group_by == want


@pytest.mark.parametrize("value", [["seed"], 3, True, "", "a b", "train..seed", {"key": "seed"}])
def test_a_bad_group_by_is_refused_in_one_line_with_the_fix(local_project: LocalProject, value: Any) -> None:
    local_project.write_config(report={"group_by": value})
    with pytest.raises(ConfigError) as ei:
        load_project(local_project.root)
    msg = ei.value.message
    assert msg.startswith(f"{local_project.root / 'ablate.yaml'}: report.group_by: must be the config key")
    assert "none to give every cell its own row" in msg and "\n" not in msg and repr(value) in msg


def test_a_bad_group_by_exits_2_from_the_cli(local_project: LocalProject, cli: Cli) -> None:
    local_project.write_config(report={"group_by": ["seed"]})
    code, out, err = cli(local_project, "report")
    assert code == 2 and out == "" and len(err.splitlines()) == 1
    assert err.startswith("ablate: error: ") and "report.group_by" in err
