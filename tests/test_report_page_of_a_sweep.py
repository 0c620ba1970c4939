"""`ablate report` on a small real sweep (real tmux, the real tiny trainer, real checkpoints and
metrics, a real steal, a failed cell re-run, an interrupted cell), opened in headless Chromium:
one timeline bar per run, marked by what happened, the makespan and its lower bound, the roster,
the ablation tables against the baseline, the CSV with the same numbers, sorting by the page's
script, a screenshot and the PNG timeline; and the report before anything ran, and an `--out`
that is a file."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from ablate.config.project import load_project
from ablate.plan.balance import lower_bound
from ablate.results.pull import pull
from ablate.results.reconcile import reconcile
from ablate.results.remediate import remediate
from ablate.run.launch import launch
from ablate.run.stop import stop
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject, drained, events
from tests.helpers.report_page import (
    chromium,
    distinct_colours,
    image,
    need_chromium_fixture,
    parse,
    table_rows,
)
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for

_need_chromium = need_chromium_fixture()


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
