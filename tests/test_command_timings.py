"""`ABLATE_TIMINGS=FILE`: a command says where its wall time went (ablate/util/timings.py), which
`scripts/bench_fanout.py` reads per command. A real `ablate` process on a local project: its marks
in order, within the process's life; none of it without the variable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.project import LocalProject


def _ablate(root: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ablate", "-C", str(root), *args], capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.tmux
def test_a_command_writes_its_marks_in_order(local_project: LocalProject, tmp_path: Path) -> None:
    local_project.queue("q1", ["# ablate: host=h1", f"{local_project.cfg('configs/c0.yaml', seed=0)} recon"])
    out = tmp_path / "t.jsonl"
    env = {**os.environ, "ABLATE_TIMINGS": str(out)}
    start = time.time()
    r = _ablate(local_project.root, "status", "--json", env=env)
    end = time.time()
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["sweep"] == "t1"
    [line] = out.read_text().splitlines()
    got = json.loads(line)
    assert got["argv"] == ["-C", str(local_project.root), "status", "--json"]
    m = got["marks"]
    assert start < m["main"] < m["project"] < m["output"] <= m["exit"] < end, m
    assert got["trips"] == [] and got["spans"] == []  # a local host runs nothing over SSH
    # a second command appends; without the variable, nothing is written
    assert _ablate(local_project.root, "--version", env=env).returncode == 0
    assert [sorted(json.loads(x)["marks"]) for x in out.read_text().splitlines()][1] == ["exit", "main"]
    quiet = {k: v for k, v in env.items() if k != "ABLATE_TIMINGS"}
    assert _ablate(local_project.root, "status", "--json", env=quiet).returncode == 0
    assert len(out.read_text().splitlines()) == 2
