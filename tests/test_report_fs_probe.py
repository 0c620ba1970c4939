"""What the report reads of the sweep's FS, in one op: the report probe reads every metrics file,
manifest and the reconcile record at once (a superset of the snapshot), and over SSH, with
nothing pulled, the whole FS read is one probe command on the test bed."""

from __future__ import annotations

import csv
import io
import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from ablate.remote.host import probe
from ablate.transport import close_all
from ablate.transport.local import LocalFS
from ablate.transport.sshfs import SSHFS
from tests.helpers.cli import Cli
from tests.helpers.testbed_projects import make_project
from tests.helpers.wait import wait_for
from tests.testbed import Testbed


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
