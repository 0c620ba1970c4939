"""How each verified cell's checkpoint was checked (issue 32), where a user reads it after
`reconcile`: the gate record, `status` (a verified cell's reason and `verified_by`, the sweep line)
and the report's roster; and a gate record written before issue 32, which does not say it.

Real result dirs on the shared FS, verified by the real verify (`reconcile --fs`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.checked import OPAQUE, add_checkpoint_file
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject
from tests.helpers.results import make_result
from tests.helpers.tmux import require_tmux

CELLS = [("cfgs/a/a.yaml", "recon", 3), ("cfgs/a/b.yaml", "recon", 3), ("cfgs/b/c.yaml", "det", 2)]


@pytest.fixture
def sweep(local_project: LocalProject) -> LocalProject:
    """Three published cells whose checkpoint is the directory `ckpt/`: a and b hold a safetensors
    file (loaded), c also a file of a format nobody reads (size and sha256 only)."""
    require_tmux()  # status and report ask each host's tmux
    p = local_project
    p.write_config(artifacts={"checkpoint": "ckpt", "metrics": "metrics.json", "metrics_keys": ["val_loss"]})
    final = p.shared / "final_ckpts"
    for i, (cfg, task, epochs) in enumerate(CELLS):
        p.cfg(cfg, seed=i)
        make_result(final, cfg, task, epochs, project_dir=p.root, seed=i, checkpoint="ckpt/model.safetensors")
    add_checkpoint_file(final / "c", "ckpt/w.h5", OPAQUE)
    p.queue("q1", [f"{cfg} {task}" for cfg, task, _ in CELLS])
    return p


def record(p: LocalProject) -> Path:
    return p.shared / "gate" / "reconcile.json"


def roster_checked(html: str) -> dict[str, tuple[str, str]]:
    """cell -> (the roster's `checked` value, its title) from report.html's roster table."""
    table = html[html.index('<table id="roster"'):]
    table = table[:table.index("</table>")]
    head = re.findall(r"<th [^>]*>([^<]*)</th>", table)
    assert head[-1] == "checked", head
    out = {}
    for name, row in re.findall(r'<tr data-cell="([^"]+)">(.*?)</tr>', table, re.S):
        last = re.findall(r"<td[^>]*>", row)[-1]
        value = re.search(r'data-value="([^"]*)"', last)
        title = re.search(r'title="([^"]*)"', last)
        out[name] = (value.group(1) if value else "", title.group(1) if title else "")
    return out


def test_status_and_the_report_say_how_each_verified_cell_was_checked(sweep: LocalProject, cli: Cli) -> None:
    p = sweep
    before = cli.json(p, "status")
    assert before["verified"] is None and all("verified_by" not in c for c in before["cells"].values())

    rec = cli.json(p, "reconcile", "--fs")
    assert rec["complete"] and rec["checkpoint_checks"] == {"loaded": 3, "hash": 1}
    assert rec["checked"]["c"] == {"ckpt/model.safetensors": "loaded", "ckpt/w.h5": "hash",
                                   "metrics.json": "loaded", "c.log": "hash"}
    gate = json.loads(record(p).read_text())
    by = {n: c["verified_by"] for n, c in gate["cells"].items()}
    assert by == {"a": "loaded", "b": "loaded", "c": "hash"}

    st = cli.json(p, "status")
    assert st["verified"] == 3 and st["verified_by"] == {"loaded": 2, "hash": 1}
    cells = st["cells"]
    assert {n: (c["state"], c.get("verified_by")) for n, c in cells.items()} == {
        "a": ("verified", "loaded"), "b": ("verified", "loaded"), "c": ("verified", "hash")}
    assert cells["a"]["reason"] == "verified by the last reconcile: every checkpoint file loaded"
    assert cells["c"]["reason"] == ("verified by the last reconcile: a checkpoint file checked by size and "
                                    "sha256 only, not loaded")
    text = cli(p, "status")
    assert text.code == 0
    assert "sweep t1: 3/3 cells synced to the shared FS, 3 verified (checkpoint: loaded 2 cells, hash 1)" \
        in text.out.splitlines()

    out = cli.json(p, "report")
    got = roster_checked(Path(out["html"]).read_text())
    assert got == {"a": ("loaded", "its files: loaded 2 files, hash 1"),
                   "b": ("loaded", "its files: loaded 2 files, hash 1"),
                   "c": ("hash", "its files: loaded 2 files, hash 2")}


def test_a_record_from_before_issue_32_reads_as_before(sweep: LocalProject, cli: Cli) -> None:
    """A gate record without `checked` / `verified_by` (an older ablate wrote it): its cells stay
    verified, said as then ("loaded by the last reconcile"), with no method made up."""
    p = sweep
    cli.json(p, "reconcile", "--fs")
    gate = json.loads(record(p).read_text())
    for c in gate["cells"].values():
        del c["checked"], c["verified_by"]
    record(p).write_text(json.dumps(gate) + "\n")

    cells = cli.json(p, "status")["cells"]
    assert {n: c["state"] for n, c in cells.items()} == dict.fromkeys("abc", "verified")
    assert all(c["reason"] == "loaded by the last reconcile" and "verified_by" not in c
               for c in cells.values())
    assert "3/3 cells synced to the shared FS, 3 verified by load" in cli(p, "status").out
    assert cli.json(p, "status")["verified_by"] == {}
    got = roster_checked(Path(cli.json(p, "report")["html"]).read_text())
    assert got == dict.fromkeys("abc", ("", ""))


def test_a_cell_changed_since_its_reconcile_loses_its_method(sweep: LocalProject, cli: Cli) -> None:
    """The method belongs to the manifest that was verified: a result re-made since is synced, and
    says nothing of how the earlier one was checked."""
    p = sweep
    cli.json(p, "reconcile", "--fs")
    final = p.shared / "final_ckpts"
    make_result(final, "cfgs/b/c.yaml", "det", 2, project_dir=p.root, seed=7,
                checkpoint="ckpt/model.safetensors")
    cells = cli.json(p, "status")["cells"]
    assert cells["c"]["state"] == "synced" and "verified_by" not in cells["c"]
    assert cells["a"]["verified_by"] == "loaded"
    # the sweep line counts the last reconcile's cells, as its number always has
    assert "3 verified (checkpoint: loaded 2 cells, hash 1)" in cli(p, "status").out
