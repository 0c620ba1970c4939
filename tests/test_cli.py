"""The command contract: exit codes, one-line errors on stderr, `--json` on stdout, nothing changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject
from tests.helpers.wait import wait_for


def assert_one_line_error(err: str, *needles: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("ablate: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, err)


BAD_ARGS = [
    (["frobnicate"], "No such command"),
    (["launch", "h1"], "--host"),
    (["launch", "--all", "--host", "h1"], "--all"),
    (["launch", "h1", "--host", "h1", "--start-index", "-1"], "start-index"),
    (["launch", "h1", "--host", "h1", "--start-index", "x"], "start-index"),
    (["launch", "h1", "--host", "nope"], "nope"),
    (["launch", "../etc", "--host", "h1"], "queue name"),
    (["plan", "--hosts", "h1,,h2"], "--hosts"),
    (["plan", "--hosts", "h1,zz"], "zz"),
    (["append", "h1", "configs/a;rm -rf x.yaml", "recon"], "shell"),
    (["append", "h1", "configs/a.yaml", "recon", "0"], "EPOCHS"),
    (["append", "h1", "configs/a.yaml", "nosuchtask"], "nosuchtask"),
    (["reconcile", "--host", "h1"], "--fs"),
    (["release", "nope", "--yes"], "nope"),
    (["status", "--watch", "--json"], "--json"),
    (["status", "--interval", "0"], "interval"),
]


@pytest.mark.parametrize(("args", "needle"), BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_cli_input_is_one_line_exit_2_and_changes_nothing(
    local_project: LocalProject, cli: Cli, args: list[str], needle: str
) -> None:
    local_project.cfg("configs/recon/a.yaml")
    local_project.queue("h1", ["# ablate: host=h1", "configs/recon/a.yaml recon"])
    before = local_project.snapshot()
    code, out, err = cli(local_project, *args)
    assert code == 2, (code, out, err)
    assert_one_line_error(err, needle)
    assert local_project.snapshot() == before


def test_json_error_goes_to_stdout_as_one_object(local_project: LocalProject,
                                                 cli: Cli) -> None:
    code, out, err = cli(local_project, "launch", "h1", "--host", "zz", "--json")
    assert code == 2
    assert "zz" in json.loads(out)["error"]
    assert_one_line_error(err, "zz")


def test_missing_config_names_the_fix(tmp_path: Path, cli: Cli) -> None:
    code, _, err = cli(tmp_path, "status")
    assert code == 2
    assert_one_line_error(err, "ablate.yaml", "ablate init")


def test_invalid_config_names_file_and_key(local_project: LocalProject,
                                           cli: Cli) -> None:
    local_project.write_config(hostz={"h1": {}})
    code, _, err = cli(local_project, "plan")
    assert code == 2
    assert_one_line_error(err, "ablate.yaml", "hostz", "did you mean 'hosts'")


def test_version_and_help(cli: Cli) -> None:
    code, out, _ = cli(None, "--version")
    assert code == 0 and "ablate" in out
    code, out, _ = cli(None, "launch", "--help")
    assert code == 0 and "Example:" in out


@pytest.mark.tmux
def test_whole_flow_through_the_cli_with_its_exit_codes(
    local_project: LocalProject, cli: Cli
) -> None:
    p = local_project
    for i in range(4):
        p.cfg(f"configs/recon/r{i}.yaml", seed=i)
    p.cfg("configs/det/d0.yaml")
    p.write_config(cells=[{"glob": "configs/recon/*.yaml", "task": "recon"},
                          {"glob": "configs/det/*.yaml", "task": "det"}])

    code, out, _ = cli(p, "plan", "--json")
    planned = json.loads(out)
    assert code == 0 and set(planned) == {"queues", "makespan", "lower_bound", "eta_seconds", "model"}
    assert sorted(n for q in planned["queues"] for n in q["cells"]) == ["d0", "r0", "r1", "r2", "r3"]
    assert planned["makespan"] >= planned["lower_bound"] > 0

    code, _, err = cli(p, "release", "h1", "--yes")
    assert code == 1 and "reconcile" in err  # the gate is shut before any reconcile

    code, out, _ = cli(p, "launch", "--all", "--json")
    assert code == 0 and len(json.loads(out)["launched"]) == 2

    def drained() -> bool:
        code, out, _ = cli(p, "status", "--json")
        rows = json.loads(out)["queues"]
        return code == 0 and all(r["state"] == "drained" for r in rows)

    wait_for(drained, timeout=60, interval=0.3)
    code, out, _ = cli(p, "reconcile", "--json")
    assert code == 1 and sorted(json.loads(out)["missing"]) == ["d0", "r0", "r1", "r2", "r3"]  # not pulled
    code, _, _ = cli(p, "pull")
    assert code == 0
    code, out, _ = cli(p, "reconcile", "--json")
    report = json.loads(out)
    assert code == 0 and report["complete"] and report["verified"] == report["roster"] == 5

    p.cfg("configs/recon/r9.yaml")
    code, _, _ = cli(p, "append", "h1", "configs/recon/r9.yaml", "recon")
    assert code == 0
    code, _, err = cli(p, "release", "h1", "--yes")
    assert code == 1 and "roster changed" in err  # a cell appended since the reconcile

    wait_for(lambda: (p.shared / "final_ckpts/r9/MANIFEST.json").exists(), timeout=60)
    wait_for(drained, timeout=60, interval=0.3)
    assert cli(p, "pull")[0] == 0
    assert cli(p, "reconcile")[0] == 0
    code, out, _ = cli(p, "release", "h1", "--yes", "--json")
    assert code == 0 and json.loads(out)["approved"] is True
