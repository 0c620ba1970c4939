"""`ablate report` on a small real sweep (real tmux, the real tiny trainer, real checkpoints and
metrics, a real steal, a failed cell re-run, an interrupted cell), opened in headless Chromium; and
the timeline / table logic on hand-written events and metrics."""

from __future__ import annotations

import csv
import io
import json
import shlex
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml

from ablate.config.project import load_project
from ablate.config.settings import ReportSettings
from ablate.plan.balance import lower_bound
from ablate.remote.host import probe
from ablate.report.data import CellResult, RosterCell
from ablate.report.stats import t_quantile
from ablate.report.table import build_tables
from ablate.report.timeline import build_timeline
from ablate.results.pull import pull
from ablate.results.reconcile import reconcile
from ablate.results.remediate import remediate
from ablate.run.launch import launch
from ablate.run.stop import stop
from ablate.sweep.cells import Cell
from ablate.sweep.snapshot import Snapshot
from ablate.transport import close_all
from ablate.transport.local import LocalFS
from ablate.transport.sshfs import SSHFS
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject, drained, events
from tests.helpers.testbed_projects import make_project
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

CHROMIUM = "/usr/bin/chromium"


# --------------------------------------------------------------------------- a tiny DOM


class Node:
    def __init__(self, tag: str, attrs: dict[str, str], parent: Node | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node] = []
        self.text_parts: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self.text_parts + [c.text for c in self.children]).strip()

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def iter(self) -> list[Node]:
        out = [self]
        for c in self.children:
            out += c.iter()
        return out

    def find_all(self, tag: str, cls: str | None = None) -> list[Node]:
        return [n for n in self.iter() if n.tag == tag and (cls is None or cls in n.classes)]

    def by_id(self, ident: str) -> Node:
        found = [n for n in self.iter() if n.attrs.get("id") == ident]
        assert len(found) == 1, f"#{ident}: {len(found)} elements"
        return found[0]


class DomBuilder(HTMLParser):
    VOID = frozenset({"meta", "link", "br", "img", "input", "hr", "col", "source"})

    def __init__(self) -> None:
        super().__init__()
        self.root = Node("#root", {}, None)
        self.cur = self.root

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs}, self.cur)
        self.cur.children.append(node)
        if tag not in self.VOID:
            self.cur = node

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.cur.children.append(Node(tag, {k: v or "" for k, v in attrs}, self.cur))

    def handle_endtag(self, tag: str) -> None:
        n: Node | None = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.cur = n.parent

    def handle_data(self, data: str) -> None:
        self.cur.text_parts.append(data)


def parse(html: str) -> Node:
    b = DomBuilder()
    b.feed(html)
    return b.root


def table_rows(table: Node) -> tuple[list[str], list[list[Node]]]:
    head = [th.text for th in table.find_all("th")]
    rows = [tr.find_all("td") for tr in table.find_all("tbody")[0].find_all("tr")]
    return head, rows


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp / 'chromium-profile'}", *args]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, (argv, p.returncode, p.stderr[-2000:])
    return p


def image(path: Path) -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import image as mpimg

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return mpimg.imread(str(path))


def distinct_colours(img: Any) -> int:
    flat = (img[..., :3] * 255).round().astype("uint8").reshape(-1, 3)
    return len({tuple(px) for px in flat[:: max(1, len(flat) // 200_000)]})


# --------------------------------------------------------------------------- the real sweep


def _sweep(lp: LocalProject) -> None:
    """q1 (h1): three good cells and one that fails; q2 (h2, half speed): a long cell, then two
    that h1 steals once it drains. q1 is relaunched (it passes over the failed cell and steals
    again), `remediate --launch` re-runs the failed cell on h1 (it fails again),
    q2 is stopped (its long cell interrupted), everything is pulled and reconciled, and one more
    queue q3 runs a cell afterwards (synced, not verified)."""
    lp.queue("q1", ["# ablate: host=h1",
                    lp.cfg("cfgs/recon/baseline.yaml", lr=0.1) + " recon",
                    lp.cfg("cfgs/recon/lr_small.yaml", lr=0.02) + " recon",
                    lp.cfg("cfgs/det/det_a.yaml", lr=0.05, hidden=6) + " det",
                    lp.cfg("cfgs/recon/broken.yaml", exit_code=2) + " recon"])
    lp.queue("q2", ["# ablate: host=h2",
                    lp.cfg("cfgs/recon/slow.yaml", step_time=0.1) + " recon 400",
                    lp.cfg("cfgs/det/det_b.yaml", lr=0.2, hidden=6) + " det",
                    lp.cfg("cfgs/recon/wide.yaml", lr=0.1, hidden=8) + " recon"])
    project = load_project(lp.root)
    launch(project, "q2", "h2")
    wait_for(lambda: any(e["ev"] == "start" for e in events(lp, "h2", "q2")))
    launch(project, "q1", "h1")
    first = drained(lp, "h1", "q1")
    assert any(e["ev"] == "steal" for e in first), ("h1 was expected to steal from q2 while q2 ran its "
                                                    f"long cell; events: {first}")
    launch(project, "q1", "h1")  # passes over the failed cell (remediate's), steals again
    drained(lp, "h1", "q1", since=len(first))
    fix = remediate(project, hosts=["h1"], launch=True)  # the failed cell re-run, and failing again
    assert list(fix.targets) == ["broken"] and len(fix.queues) == 1, fix.to_json()
    drained(lp, "h1", fix.queues[0].queue)
    stop(project, "q2", "h2")
    assert pull(project).ok
    assert reconcile(project).verified == 5
    lp.queue("q3", ["# ablate: host=h1", lp.cfg("cfgs/recon/late.yaml", lr=0.05) + " recon"])
    launch(load_project(lp.root), "q3", "h1")
    drained(lp, "h1", "q3")


def _expected_runs(lp: LocalProject) -> list[tuple[str, str, str, str]]:
    """(cell, lane, outcome, stolen_from) of every `start` event, read straight from the files."""
    out = []
    for f in sorted((lp.shared / "events").glob("*.jsonl")):
        evs = [json.loads(x) for x in f.read_text().splitlines()]
        for i, e in enumerate(evs):
            if e["ev"] != "start":
                continue
            end = next((x for x in evs[i + 1:] if x["ev"] in ("end", "start", "queue_start", "stopped")),
                       None)
            if end is not None and end["ev"] == "end":
                outcome = "ok" if end["rc"] == 0 else "failed"
            else:
                outcome = "interrupted"
            out.append((e["cell"], f.stem, outcome, e.get("from_queue") or ""))
    return sorted(out)


def _metrics(lp: LocalProject, name: str) -> dict[str, Any] | None:
    path = lp.shared / "final_ckpts" / name / "metrics.json"
    return json.loads(path.read_text()) if path.exists() else None


@pytest.mark.tmux
def test_report_of_a_real_sweep_in_headless_chromium(
        local_project: LocalProject, cli: Cli, tmp_path: Path) -> None:
    require_tmux()
    lp = local_project
    _sweep(lp)

    code, out, err = cli(lp, "report", "--json")
    assert code == 0, err
    res = json.loads(out)
    report_dir = lp.root / "reports" / "t1"
    html_path, png_path = report_dir / "report.html", report_dir / "timeline.png"
    csv_path = report_dir / "ablation.csv"
    assert res["html"] == str(html_path) and res["png"] == str(png_path) and res["csv"] == str(csv_path)

    # ---- the scenario, from the events files alone
    expected = _expected_runs(lp)
    [rerun] = [f"h1.{p.stem.split('.', 1)[1]}" for p in (lp.shared / "events").glob("h1.remediate-*.jsonl")]
    assert expected == sorted([
        ("baseline", "h1.q1", "ok", ""), ("broken", "h1.q1", "failed", ""), ("broken", rerun, "failed", ""),
        ("det_a", "h1.q1", "ok", ""), ("det_b", "h1.q1", "ok", "q2"), ("late", "h1.q3", "ok", ""),
        ("lr_small", "h1.q1", "ok", ""), ("slow", "h2.q2", "interrupted", ""), ("wide", "h1.q1", "ok", "q2"),
    ])
    assert res["runs"] == 9 and res["reruns"] == ["broken"] and res["stolen"] == 2

    # makespan and its lower bound, computed here from the raw events and the hosts' speeds
    speed = {"h1": 1.0, "h2": 0.5}
    starts, ends, work = [], [], {}
    for f in (lp.shared / "events").glob("*.jsonl"):
        for e in (json.loads(x) for x in f.read_text().splitlines()):
            if e["ev"] == "start":
                starts.append(e["t"])
            if e["ev"] in ("end", "stopped"):
                ends.append(e["t"])
            if e["ev"] == "end" and e["rc"] == 0:
                work[e["cell"]] = e["dur"] * speed[e["host"]]
    assert res["makespan"] == pytest.approx(max(ends) - min(starts), abs=1e-6)
    assert res["lower_bound"] == pytest.approx(lower_bound(list(work.values()), [1.0, 0.5]), rel=1e-9)

    # ---- the page in a real browser; nothing it needs comes from a network
    html = html_path.read_text()
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in html
    # One browser run: the URL carries a sort (as a header click leaves it), applied by the page's JS.
    dom = parse(chromium(tmp_path, "--dump-dom", html_path.as_uri() + "#sort=ablation-recon:2:desc").stdout)

    bars = dom.find_all("rect", "run")
    got = sorted((b.attrs["data-cell"], b.attrs["data-lane"], b.attrs["data-outcome"],
                  b.attrs["data-stolen-from"]) for b in bars)
    assert got == expected  # one bar per run, coloured/marked by what happened
    broken = sorted(b.attrs["data-attempt"] + "/" + b.attrs["data-attempts"] for b in bars
                    if b.attrs["data-cell"] == "broken")
    assert broken == ["1/2", "2/2"]
    colours = {b.attrs["data-task"]: b.attrs["fill"] for b in bars}
    assert set(colours) == {"recon", "det"} and colours["recon"] != colours["det"]
    assert len(dom.find_all("line", "makespan")) == 1 and len(dom.find_all("line", "lower-bound")) == 1
    assert "lower bound" in dom.by_id("makespan").text

    head, rows = table_rows(dom.by_id("roster"))
    assert head[:5] == ["cell", "task", "epochs", "cfg", "state"]
    states = {r[0].text: r[4].attrs["data-value"] for r in rows}
    assert states == {"baseline": "verified", "lr_small": "verified", "det_a": "verified", "wide": "verified",
                      "det_b": "verified", "late": "synced", "broken": "crashed", "slow": "interrupted"}
    runs = {r[0].text: int(r[5].attrs["data-value"]) for r in rows}
    assert runs["broken"] == 2 and runs["slow"] == 1 and runs["late"] == 1

    # ---- the ablation table: numbers from the metrics files, differences to the baseline
    head, rows = table_rows(dom.by_id("ablation-recon"))
    assert head == ["cell", "state", "val_loss", "\u0394 val_loss", "train_loss", "\u0394 train_loss",
                    "epochs", "\u0394 epochs"]
    base = _metrics(lp, "baseline")
    assert base is not None
    recon = {}
    for r in rows:
        name = r[0].attrs["data-value"]
        recon[name] = r
        m = _metrics(lp, name)
        if m is None:
            assert name in ("broken", "slow") and all(td.attrs["data-value"] == "" for td in r[2:])
            continue
        for k, col in (("val_loss", 2), ("train_loss", 4), ("epochs", 6)):
            assert float(r[col].attrs["data-value"]) == m[k], (name, k)
            assert float(r[col + 1].attrs["data-value"]) == m[k] - base[k], (name, k)
    assert set(recon) == {"baseline", "lr_small", "broken", "slow", "wide", "late"}
    assert "baseline" in recon["baseline"][0].text and recon["late"][1].attrs["data-value"] == "synced"
    with_loss = {n: _metrics(lp, n) for n in recon if _metrics(lp, n)}
    best = min(with_loss, key=lambda n: with_loss[n]["val_loss"])  # type: ignore[index]
    assert [n for n, r in recon.items() if "best" in r[2].classes] == [best]

    det = dom.by_id("ablation-det")
    head, rows = table_rows(det)
    assert head == ["cell", "state", "val_loss", "train_loss", "epochs"]  # no baseline: no differences
    assert "no baseline cell for task det" in det.parent.text if det.parent else False
    for r in rows:
        m = _metrics(lp, r[0].attrs["data-value"])
        assert m is not None and float(r[2].attrs["data-value"]) == m["val_loss"]

    # ---- the CSV holds the same rows and numbers as the tables
    csv_rows = list(csv.reader(io.StringIO(csv_path.read_text())))
    assert csv_rows[0] == ["task", "cell", "cfg", "epochs", "state", "baseline", "val_loss",
                           "val_loss_vs_baseline", "train_loss", "train_loss_vs_baseline", "epochs",
                           "epochs_vs_baseline"]
    table_view = []
    for task in ("det", "recon"):
        _, rows = table_rows(dom.by_id(f"ablation-{task}"))
        for r in rows:
            vals = [td.attrs["data-value"] for td in r[2:]]
            if task == "det":  # no difference columns in the page: empty in the CSV
                vals = [x for v in vals for x in (v, "")]
            table_view.append([task, r[0].attrs["data-value"], r[1].attrs["data-value"], *vals])
    assert sorted([c[0], c[1], c[4], *c[6:]] for c in csv_rows[1:]) == sorted(table_view)
    assert [c[1] for c in csv_rows[1:]] == ["det_a", "det_b", "baseline", "lr_small", "broken", "slow",
                                           "wide", "late"]  # by task, then roster order
    assert {c[1]: c[5] for c in csv_rows[1:]}["baseline"] == "yes"

    # ---- sorting: the recon table came out by val_loss, descending, cells without metrics last
    _, rows = table_rows(dom.by_id("ablation-recon"))
    order = [r[0].attrs["data-value"] for r in rows]
    by_loss = sorted(with_loss, key=lambda n: -with_loss[n]["val_loss"])  # type: ignore[index]
    assert order[: len(by_loss)] == by_loss and set(order[len(by_loss):]) == {"broken", "slow"}
    ths = dom.by_id("ablation-recon").find_all("th")
    assert [th.attrs["aria-sort"] for th in ths[:4]] == ["none", "none", "descending", "none"]
    # as written, nothing is sorted: the browser ran the page's script
    assert {th.attrs["aria-sort"] for th in parse(html).find_all("th")} == {"none"}

    # ---- a screenshot of the page, and the PNG timeline beside it
    shot = tmp_path / "report.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,2000", html_path.as_uri())
    img = image(shot)
    assert img.shape[:2] == (2000, 1400) and distinct_colours(img) > 20
    png = image(png_path)
    assert png.shape[0] > 150 and png.shape[1] > 600 and distinct_colours(png) > 20


# --------------------------------------------------------------------------- the table over seeds


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


@pytest.fixture(autouse=True)
def _need_chromium(request: pytest.FixtureRequest) -> None:
    if "chromium" in request.node.name and shutil.which(CHROMIUM) is None:
        pytest.skip(f"{CHROMIUM} is absent (scripts/test.sh installs it: apt-get install chromium)")


def test_report_before_anything_ran_and_an_out_that_is_a_file(
        local_project: LocalProject, cli: Cli, tmp_path: Path) -> None:
    lp = local_project
    lp.queue("q1", ["# ablate: host=h1", lp.cfg("cfgs/recon/baseline.yaml") + " recon"])
    code, out, err = cli(lp, "report", "--out", str(tmp_path / "r"))
    assert code == 0, err
    assert out.splitlines()[0] == f"report: {tmp_path / 'r' / 'report.html'}"
    html = (tmp_path / "r" / "report.html").read_text()
    assert "No cell has started yet" in html and 'data-value="never_ran"' in html
    assert (tmp_path / "r" / "ablation.csv").read_text().splitlines() == [
        "task,cell,cfg,epochs,state,baseline", "recon,baseline,cfgs/recon/baseline.yaml,3,never_ran,yes"]
    assert image(tmp_path / "r" / "timeline.png").shape[0] > 100

    (tmp_path / "afile").write_text("x")
    before = lp.snapshot()
    code, out, err = cli(lp, "report", "--out", str(tmp_path / "afile"), "--json")
    assert code == 2 and err.startswith("ablate: error: ") and "is a file" in err
    assert len(err.splitlines()) == 1
    assert json.loads(out) == {"error": err.strip().removeprefix("ablate: error: ")}
    assert (tmp_path / "afile").read_text() == "x" and lp.snapshot() == before


# --------------------------------------------------------------------------- timeline from events


def _ev(t: float, ev: str, host: str, queue: str, **kw: Any) -> dict[str, Any]:
    return {"t": t, "ev": ev, "host": host, "queue": queue, **kw}


def test_timeline_marks_reruns_steals_interruptions_and_the_running_cell() -> None:
    evs = {
        "a.q1": [_ev(100, "queue_start", "a", "q1", slot=None),
                 _ev(100, "start", "a", "q1", idx=0, cell="x", resume=0),
                 _ev(110, "end", "a", "q1", idx=0, cell="x", rc=0, dur=10.0),
                 _ev(110, "start", "a", "q1", idx=1, cell="y", resume=0),
                 _ev(113, "stopped", "a", "q1", pgid=1, signal="TERM", by="me"),
                 _ev(120, "queue_start", "a", "q1", slot=None),
                 _ev(120, "start", "a", "q1", idx=1, cell="y", resume=1),
                 _ev(126, "end", "a", "q1", idx=1, cell="y", rc=137, dur=6.0)],
        "b.q2": [_ev(101, "queue_start", "b", "q2", slot=1),
                 _ev(101, "start", "b", "q2", idx=0, cell="z", resume=0),
                 _ev(121, "end", "b", "q2", idx=0, cell="z", rc=0, dur=20.0),
                 _ev(121, "steal", "b", "q2", idx=2, cell="w", from_queue="q1", from_host="a", est=3),
                 _ev(121, "start", "b", "q2", idx=2, cell="w", resume=0, from_queue="q1")],
    }
    hbs = {"b.q2": {"mtime": 129.0, "data": {"state": "running", "cell": "w"}}}
    tasks = {"x": "t1", "y": "t1", "z": "t2", "w": "t2"}
    snap = Snapshot.parse({"now": 130.0, "events": evs, "heartbeats": hbs})  # as the probe answers
    tl = build_timeline(snap.events, snap.heartbeats, {"a": 2.0, "b": 1.0}, tasks, now=130.0)
    runs = [(r.cell, r.lane, r.outcome, r.attempt, r.attempts, r.stolen_from, r.start, r.end)
            for r in tl.runs]
    assert runs == [("x", "a.q1", "ok", 1, 1, None, 100, 110), ("z", "b.q2", "ok", 1, 1, None, 101, 121),
                    ("y", "a.q1", "interrupted", 1, 2, None, 110, 113),
                    ("y", "a.q1", "failed", 2, 2, None, 120, 126),
                    ("w", "b.q2", "running", 1, 1, "q1", 121, 130)]
    assert [ln.label for ln in tl.lanes] == ["a/q1", "b/q2 gpu1"]
    assert tl.t0 == 100 and tl.makespan == 30
    # x: 10 s at speed 2 = 20 units, z: 20 s at speed 1 = 20 units; machines of speed 2 and 1
    assert tl.lower_bound == pytest.approx(max(40 / 3, 20 / 2))


def test_an_open_cell_without_a_live_heartbeat_is_interrupted_at_its_last_beat() -> None:
    evs = {"a.q": [_ev(10, "start", "a", "q", idx=0, cell="x", resume=0)]}
    hbs = {"a.q": {"mtime": 17.5, "data": {"state": "stopped", "cell": "x"}}}
    snap = Snapshot.parse({"now": 99.0, "events": evs, "heartbeats": hbs})
    tl = build_timeline(snap.events, snap.heartbeats, {}, {}, now=99.0)
    assert [(r.outcome, r.end) for r in tl.runs] == [("interrupted", 17.5)]
    assert tl.lower_bound is None and tl.lanes[0].speed == 1.0


# --------------------------------------------------------------------------- the table


def _rc(name: str, cfg: str, task: str) -> RosterCell:
    return RosterCell(name, Cell(cfg, task, 3), "q")


def test_baseline_by_cfg_glob_differences_and_best_by_goal() -> None:
    roster = {rc.name: rc for rc in (_rc("a", "cfgs/ref/a.yaml", "t"), _rc("b", "cfgs/x/b.yaml", "t"),
                                       _rc("c", "cfgs/x/c.yaml", "t"), _rc("d", "cfgs/x/d.yaml", "u"))}
    metrics = {"a": CellResult({"acc": 0.5, "loss": 2.0, "n": 3}, "local"),
               "b": CellResult({"acc": 0.75, "loss": 1.0, "n": 3, "extra.f1": 0.1}, "fs"),
               "c": CellResult(None, None), "d": CellResult({"acc": 0.25}, "fs")}
    settings = ReportSettings(("cfgs/ref/*",), "acc", "max")
    tables = build_tables(roster, {"a": "verified", "b": "synced"}, metrics, settings, ("loss",))
    t, u = tables
    assert t.task == "t" and t.baseline == "a" and t.metrics == ["acc", "loss", "n", "extra.f1"]
    b = t.rows[1]
    assert b.deltas == {"acc": 0.25, "loss": -1.0, "n": 0} and isinstance(b.deltas["n"], int)
    assert t.best == {"acc": {"b"}, "loss": {"b"}, "extra.f1": {"b"}}  # `n`: no direction, not marked
    assert t.rows[2].values == {} and t.rows[2].state == "missing"
    assert u.baseline is None and u.note and "no baseline cell for task u" in u.note
    assert u.rows[0].deltas == {}


def test_the_report_probe_reads_every_metrics_file_in_one_op(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    for name, body in (("a", '{"val": {"loss": 0.5, "acc": 0.9}, "epochs": 3, "tag": "x", "ok": true}'),
                       ("b", "not json"), ("c", "[1, 2]")):
        d = root / "final_ckpts" / name
        d.mkdir(parents=True)
        (d / "m.json").write_text(body)
        (d / "MANIFEST.json").write_text(json.dumps({"name": name, "task": "t", "artifacts": {}}))
    (root / "final_ckpts" / "nomanifest").mkdir()
    (root / "gate").mkdir()
    (root / "gate" / "reconcile.json").write_text('{"cells": {"a": {"manifest_sha256": "x"}}}')
    got = LocalFS(str(root)).probe("report", {"root": str(root), "metrics": "m.json"})
    assert got["metrics"]["a"] == {"values": {"val.loss": 0.5, "val.acc": 0.9, "epochs": 3}, "error": None}
    assert got["metrics"]["b"]["values"] is None and "unreadable" in got["metrics"]["b"]["error"]
    assert got["metrics"]["c"]["error"] == "not a JSON object (list)"
    assert set(got["metrics"]) == {"a", "b", "c"} and got["reconcile"]["cells"]["a"]["manifest_sha256"] == "x"
    assert set(got["manifests"]) == {"a", "b", "c"} and "events" in got  # a superset of `snapshot`
    assert probe.metric_numbers({"x": float("nan"), "y": {"z": {"w": {"v": 1}}}, "k": 2}) == {"k": 2}


# --------------------------------------------------------------------------- over SSH


def test_report_over_ssh_reads_the_shared_fs_in_one_round_trip(
        testbed: Testbed, tmp_path: Path, cli: Cli,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Three cells on a test-bed instance, nothing pulled: every metric comes from the FS, and the
    whole FS read is one probe command (the tmux query per host aside)."""
    sweep = "rep"
    proj = make_project(testbed, tmp_path, sweep, cells=3, epochs=2, step_time=0.0)
    cfg = yaml.safe_load((proj / "ablate.yaml").read_text())
    cfg["report"] = {"baseline": f"configs/{sweep}/c1.yaml"}  # a cfg-path glob
    (proj / "ablate.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    final = testbed.shared_dir / "ablate" / sweep / "final_ckpts"
    (proj / "queues").mkdir()
    (proj / "queues" / "q1.txt").write_text(
        "# ablate: host=tb-h2\n" + "".join(f"configs/{sweep}/c{i}.yaml recon\n" for i in range(3)))
    try:
        cli.json(proj, "launch", "q1", "--host", "tb-h2")
        wait_for(lambda: all((final / f"c{i}" / "MANIFEST.json").exists() for i in range(3)), timeout=90)
        cli.json(proj, "status")  # ships the probe's files once, as any earlier command would

        commands: list[list[str]] = []
        run = SSHFS._exec  # every FS command goes through it, a probe's `py` form beside it

        def counted(self: SSHFS, command: str, **kw: Any) -> Any:
            commands.append(shlex.split(command))
            return run(self, command, **kw)

        monkeypatch.setattr(SSHFS, "_exec", counted)
        res = cli.json(proj, "report")
        # bash --norc -c PROBE bash lib env python flags op args
        assert [c[9] if len(c) > 9 else c for c in commands] == ["report"], commands
    finally:
        close_all()
        shutil.rmtree(testbed.shared_dir / "work" / sweep, ignore_errors=True)

    assert res["runs"] == 3 and res["lanes"] == 1 and res["tasks"]["recon"]["baseline"] == "c1"
    rows = list(csv.DictReader(io.StringIO(Path(res["csv"]).read_text())))
    base = json.loads((final / "c1" / "metrics.json").read_text())
    assert [r["cell"] for r in rows] == ["c0", "c1", "c2"]
    for r in rows:
        m = json.loads((final / r["cell"] / "metrics.json").read_text())
        assert r["state"] == "synced" and float(r["val_loss"]) == m["val_loss"]
        assert float(r["val_loss_vs_baseline"]) == m["val_loss"] - base["val_loss"]
    assert not (proj / "results").exists()  # nothing was pulled: the numbers came over the probe
