"""`ablate demo` end to end, and the installed package (wrappers and profiles shipped inside it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import Cli

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.tmux
def test_demo_catches_the_broken_cell_then_verifies_everything(tmp_path: Path, cli: Cli) -> None:
    code, out, err = cli(None, "demo", "--dir", str(tmp_path / "d"), "--cells", "9")
    assert code == 0, out + err
    lines = out.strip().splitlines()
    assert lines[-1].startswith("9/9 cells verified (checkpoint files: loaded 9)"), lines[-3:]
    # the failure was met the way a user meets it: reconcile listed it, the gate refused, with why
    assert "refused (exit 1)" in out and "recon_lr_fast" in out
    # the durable copy of the fixed cell was made from the fixed config
    manifest = json.loads((tmp_path / "d/.ablate/shared/ablate/demo/final_ckpts/recon_lr_fast/MANIFEST.json")
                          .read_text())
    assert manifest["name"] == "recon_lr_fast"
    # each release left its approval on the shared FS
    gate = tmp_path / "d/.ablate/shared/ablate/demo/gate"
    assert sorted(p.name for p in gate.glob("release.*.json")) == [
        "release.fast.json", "release.mid.json", "release.slow.json"]


def test_demo_refuses_an_existing_project(tmp_path: Path, cli: Cli) -> None:
    (tmp_path / "ablate.yaml").write_text("sweep: x\n")
    code, _, err = cli(None, "demo", "--dir", str(tmp_path))
    assert code == 2
    assert "already holds an ablate.yaml" in err
    assert (tmp_path / "ablate.yaml").read_text() == "sweep: x\n"


@pytest.mark.tmux
def test_installed_package_runs_the_demo_from_another_directory(tmp_path: Path) -> None:
    """`pip install .` into a fresh venv: the wrappers and profiles must ship inside the package."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(REPO)], check=True, cwd=tmp_path,
                   timeout=600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": ""}
    where = subprocess.run([str(py), "-c", "import ablate, sys; print(ablate.__file__)"],
                           capture_output=True, text=True, cwd=elsewhere, env=env, check=True)
    assert str(venv) in where.stdout, "the test must exercise the installed copy, not the repo"
    proc = subprocess.run([str(venv / "bin" / "ablate"), "demo", "--dir", str(tmp_path / "demo"),
                           "--cells", "6"], capture_output=True, text=True, cwd=elsewhere, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("6/6 cells verified (checkpoint files: loaded 6)")
