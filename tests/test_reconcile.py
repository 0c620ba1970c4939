"""ablate.results.reconcile: the roster against real result dirs; the report shape and the gate record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ablate.config.project import load_project
from ablate.errors import AblateError, ConfigError
from ablate.results.reconcile import STALE, _staging_name, reconcile
from tests.helpers.checked import OPAQUE, add_checkpoint_file
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject
from tests.helpers.results import make_result, rewrite_manifest, truncate

CELLS = [("configs/recon/a.yaml", "recon", 3), ("configs/recon/b.yaml", "recon", 3),
         ("configs/det/c.yaml", "det", 2)]
KEYS = ["roster", "verified", "complete", "missing", "zero_byte", "corrupt", "duplicates", "unexpected"]


@pytest.fixture
def proj(local_project: LocalProject) -> LocalProject:
    for i, (cfg, _, _) in enumerate(CELLS):
        local_project.cfg(cfg, seed=i)
    local_project.queue("q1", ["configs/recon/a.yaml recon", "# a comment", "configs/recon/b.yaml recon 3"])
    local_project.queue("q2", ["configs/det/c.yaml det"])
    return local_project


def results(p: LocalProject) -> Path:
    return p.root / "results" / "t1"


def publish(p: LocalProject, parent: Path, cells: list[tuple[str, str, int]] = CELLS) -> None:
    for i, (cfg, task, epochs) in enumerate(cells):
        make_result(parent, cfg, task, epochs, project_dir=p.root, seed=i)


def test_complete_reconcile_reports_the_contract_shape_and_records_the_gate(proj: LocalProject) -> None:
    publish(proj, results(proj))
    logged: list[str] = []
    report = reconcile(load_project(proj.root), log=logged.append)
    checked = {n: {"model.safetensors": "loaded", "metrics.json": "loaded", f"{n}.log": "hash"}
               for n in "abc"}
    assert report.to_json() == {"roster": 3, "verified": 3, "complete": True, "missing": [], "zero_byte": [],
                                "corrupt": [], "duplicates": [], "unexpected": [],
                                "states": {"verified": 3}, "cells": {},  # + the cell states (issue 6)
                                "checked": checked, "checkpoint_checks": {"loaded": 3}}  # + issue 32
    assert list(report.to_json())[:len(KEYS)] == KEYS
    assert report.lines() == [f"3/3 cells verified (loaded; local copies in {results(proj)})",
                              "verified by: loaded 3 checkpoint files"]
    assert logged
    rec = json.loads((proj.shared / "gate" / "reconcile.json").read_text())
    assert rec["complete"] is True and rec["source"] == "local" and rec["load"] is True
    assert rec["results_dir"] == str(results(proj)) and rec["roster"] == 3
    assert len(rec["roster_digest"]) == 64
    a = rec["cells"]["a"]
    st = (results(proj) / "a" / "model.safetensors").stat()
    assert a["files"]["model.safetensors"] == [st.st_size, st.st_mtime_ns]
    assert set(a["files"]) == {"model.safetensors", "metrics.json", "a.log", "MANIFEST.json"}
    assert len(a["manifest_sha256"]) == 64
    assert a["checked"] == checked["a"] and a["verified_by"] == "loaded"


def test_each_file_says_how_it_was_checked_and_the_weakest_is_recorded(proj: LocalProject, cli: Cli) -> None:
    """A checkpoint of a format with a reader (loaded) and one without (size and sha256 only): the
    JSON says it per file, counts the checkpoint files of the verified cells, the text says it in
    one line, and the gate record keeps each cell's weakest check for status and the report."""
    proj.write_config(artifacts={"checkpoint": ["model.safetensors", "weights.h5"], "metrics": "metrics.json",
                                 "metrics_keys": ["val_loss"]})
    publish(proj, results(proj))
    for n in "abc":
        add_checkpoint_file(results(proj) / n, "weights.h5", OPAQUE)
    truncate(results(proj) / "c" / "weights.h5")  # c fails: its files are no evidence of anything
    r = cli(proj, "reconcile", "--json")
    assert r.code == 1  # incomplete: the exit code of the contract, unchanged
    out = r.json()
    assert list(out)[:len(KEYS)] == KEYS and out["verified"] == 2
    assert out["checked"] == {n: {"model.safetensors": "loaded", "weights.h5": "hash",
                                  "metrics.json": "loaded", f"{n}.log": "hash"} for n in "ab"}
    assert out["checkpoint_checks"] == {"loaded": 2, "hash": 2}  # a and b's checkpoint files; not c's
    text = cli(proj, "reconcile")
    assert text.code == 1
    lines = text.out.splitlines()
    assert "verified by: loaded 2 checkpoint files, hash 2" in lines
    assert lines[-1].startswith("2/3 cells verified (checked as `verified by:` says; local copies")
    rec = json.loads((proj.shared / "gate" / "reconcile.json").read_text())
    assert set(rec["cells"]) == {"a", "b"}
    assert rec["cells"]["a"]["verified_by"] == "hash" and rec["cells"]["a"]["checked"] == out["checked"]["a"]

    # --no-load: every file by size and sha256, and the text says so
    (results(proj) / "c").rename(results(proj) / "c.gone")
    make_result(results(proj), "configs/det/c.yaml", "det", 2, project_dir=proj.root)
    add_checkpoint_file(results(proj) / "c", "weights.h5", OPAQUE)
    out = cli.json(proj, "reconcile", "--no-load")
    assert out["complete"] and out["checkpoint_checks"] == {"hash": 6}
    assert set(out["checked"]["c"].values()) == {"hash"}
    lines = cli(proj, "reconcile", "--no-load").out.splitlines()
    assert lines[:2] == [f"3/3 cells verified (size+hash only, not loaded; local copies in {results(proj)})",
                         "verified by: hash 6 checkpoint files"]
    rec = json.loads((proj.shared / "gate" / "reconcile.json").read_text())
    assert {n: c["verified_by"] for n, c in rec["cells"].items()} == dict.fromkeys("abc", "hash")


def test_a_project_with_verify_reconciles_locally_and_through_the_fs_probe(proj: LocalProject) -> None:
    """`artifacts.verify` rides in the verify probe's argument (a JSON document to the host that
    reads the FS) as {entry: check}; a format nobody reads passes by hash, as the config says."""
    proj.write_config(artifacts={"checkpoint": ["model.safetensors", "w/*.h5"], "verify": {"w/*.h5": "hash"}})
    for parent in (results(proj), proj.shared / "final_ckpts"):
        publish(proj, parent)
        for n in "abc":
            add_checkpoint_file(parent / n, "w/weights.h5", OPAQUE)
    project = load_project(proj.root)
    for fs in (False, True):
        report = reconcile(project, fs=fs)
        assert report.complete and report.checked["a"]["w/weights.h5"] == "hash"
        assert report.checkpoint_checks["hash"] == 3


def test_missing_zero_byte_truncated_and_bad_metrics(proj: LocalProject) -> None:
    publish(proj, results(proj), CELLS[:2])
    proj.cfg("configs/det/d.yaml")
    proj.queue("q3", ["configs/det/d.yaml det"])
    make_result(results(proj), "configs/det/d.yaml", "det", 2, project_dir=proj.root,
                metrics_data={"train_loss": 1.0})
    (results(proj) / "a" / "model.safetensors").write_bytes(b"")
    truncate(results(proj) / "b" / "model.safetensors")
    report = reconcile(load_project(proj.root))
    out = report.to_json()
    assert out["roster"] == 4 and out["verified"] == 0 and out["complete"] is False
    assert out["missing"] == ["c"] and out["zero_byte"] == ["a"]
    assert [(c["name"], c["file"]) for c in out["corrupt"]] == [("b", "model.safetensors"),
                                                                ("d", "metrics.json")]
    assert "val_loss" in out["corrupt"][1]["error"]
    lines = report.lines()
    assert "missing: c" in lines and "zero-byte: a" in lines
    assert lines[-1].endswith("INCOMPLETE")
    rec = json.loads((proj.shared / "gate" / "reconcile.json").read_text())
    assert rec["complete"] is False and rec["cells"] == {}


def test_garbage_checkpoint_passes_no_load_but_not_load(proj: LocalProject) -> None:
    publish(proj, results(proj))
    (results(proj) / "a" / "model.safetensors").write_bytes(b"\x00garbage" * 50)
    rewrite_manifest(results(proj) / "a")
    project = load_project(proj.root)
    assert reconcile(project, load=False).complete is True
    rec = json.loads((proj.shared / "gate" / "reconcile.json").read_text())
    assert rec["load"] is False
    report = reconcile(project)
    assert report.complete is False
    assert report.corrupt[0]["name"] == "a" and report.corrupt[0]["error"].startswith("load failed")


def test_changed_config_makes_the_result_stale(proj: LocalProject) -> None:
    publish(proj, results(proj))
    proj.cfg("configs/recon/b.yaml", lr=0.5)  # edited after b's result was made
    report = reconcile(load_project(proj.root))
    assert report.verified == 2 and not report.complete
    assert report.corrupt == [{"name": "b", "file": "configs/recon/b.yaml", "error": STALE}]


def test_result_of_another_config_is_corrupt(proj: LocalProject) -> None:
    publish(proj, results(proj))
    make_result(results(proj), "configs/recon/a.yaml", "recon", 7, project_dir=proj.root)
    report = reconcile(load_project(proj.root))
    assert [c["name"] for c in report.corrupt] == ["a"]
    assert "epochs=7" in report.corrupt[0]["error"] and "epochs=3" in report.corrupt[0]["error"]


def test_unexpected_results_are_listed_but_do_not_block(proj: LocalProject) -> None:
    publish(proj, results(proj))
    make_result(results(proj), "configs/old/zz.yaml", "recon", 3)
    report = reconcile(load_project(proj.root))
    assert report.complete and report.unexpected == ["zz"]


def test_case_variant_is_a_duplicate_and_unexpected(proj: LocalProject) -> None:
    publish(proj, results(proj))
    make_result(results(proj), "configs/recon/A.yaml", "recon", 3)
    report = reconcile(load_project(proj.root))
    assert report.duplicates == ["a"] and report.unexpected == ["A"]
    assert report.verified == 2 and not report.complete
    assert "duplicate: a (a, A)" in report.lines()


def test_fs_reconcile_reads_final_ckpts_and_flags_leftover_staging(proj: LocalProject) -> None:
    final = proj.shared / "final_ckpts"
    publish(proj, final)
    project = load_project(proj.root)
    report = reconcile(project, fs=True)
    assert report.complete and report.results_dir == str(final)
    assert json.loads((proj.shared / "gate" / "reconcile.json").read_text())["source"] == "fs"
    # A second sync of c that could not be renamed over the published result.
    shutil.copytree(final / "c", final / ".staging.c.h2.4242")
    # An in-flight sync of a cell with no result yet is not a duplicate.
    (final / ".staging.x.h1.7").mkdir()
    report = reconcile(project, fs=True, host="h1")
    assert report.duplicates == ["c"] and report.duplicate_dirs["c"] == ["c", ".staging.c.h2.4242"]
    assert report.verified == 2 and report.unexpected == []


def test_nothing_pulled_yet(proj: LocalProject) -> None:
    report = reconcile(load_project(proj.root))
    assert report.missing == ["a", "b", "c"] and not report.complete
    assert report.lines()[0] == f"no results in {results(proj)}: run `ablate pull` first"


def test_custom_results_dir_and_empty_roster(proj: LocalProject, tmp_path: Path) -> None:
    publish(proj, tmp_path / "elsewhere")
    assert reconcile(load_project(proj.root), results_dir=tmp_path / "elsewhere").complete
    for q in (proj.root / "queues").glob("*.txt"):
        q.unlink()
    report = reconcile(load_project(proj.root), results_dir=tmp_path / "elsewhere")
    assert report.roster == 0 and not report.complete and report.unexpected == ["a", "b", "c"]
    assert any("roster is empty" in line for line in report.lines())


def test_bad_arguments(proj: LocalProject) -> None:
    project = load_project(proj.root)
    with pytest.raises(AblateError, match="--host goes with --fs"):
        reconcile(project, host="h1")
    with pytest.raises(ConfigError, match="unknown host 'h9'") as exc:
        reconcile(project, fs=True, host="h9")
    assert exc.value.exit_code == 2


def test_staging_dir_names_with_dots() -> None:
    hosts = ["h1", "gpu.box"]
    assert _staging_name(".staging.a.b.gpu.box.12", hosts) == "a.b"
    assert _staging_name(".staging.a.h1.7", hosts) == "a"
    assert _staging_name(".staging.a.gone-host.7", hosts) == "a"
    assert _staging_name(".staging.a.h1.notapid", hosts) is None
    assert _staging_name("a", hosts) is None
