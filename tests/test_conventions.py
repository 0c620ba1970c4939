"""CLI conventions: --version, shell completion through click, NO_COLOR, -v/-q, an example in every
command's help, errors on stderr and data on stdout; progress of long operations (bars on a
terminal, one plain line per step otherwise, never on stdout)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator

import click
import pytest

import ablate
from ablate.cli import cli as root_group
from tests.helpers.cli import REPO, Cli, ablate_cmd
from tests.helpers.project import LocalProject
from tests.helpers.tmux import Pane
from tests.helpers.wait import wait_for

SGR = re.compile(r"\x1b\[[0-9;]*m")


def shell(env: dict[str, str], script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env}, timeout=60)


@pytest.fixture
def done_sweep(local_project: LocalProject, cli: Cli) -> LocalProject:
    """Three cells trained to the end on h1 (not pulled yet)."""
    p = local_project
    for i in range(3):
        p.cfg(f"configs/c{i}.yaml", seed=i)
    p.queue("q1", ["# ablate: host=h1", *(f"configs/c{i}.yaml recon" for i in range(3))])
    assert cli(p, "-q", "launch", "--all").code == 0
    wait_for(lambda: all((p.shared / "final_ckpts" / f"c{i}" / "MANIFEST.json").exists() for i in range(3)),
             timeout=60)
    return p


@pytest.fixture
def pane() -> Iterator[Pane]:
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "COLUMNS", "NO_COLOR")}
    p = Pane(env, width=200, height=40)
    try:
        yield p
    finally:
        p.close()


def test_version(cli: Cli) -> None:
    code, out, err = cli(None, "--version")
    assert code == 0 and out == f"ablate, version {ablate.__version__}\n" and err == ""


def test_every_command_has_an_example_in_its_help(cli: Cli) -> None:
    assert isinstance(root_group, click.Group)
    names = sorted(root_group.commands)
    assert {"status", "logs", "pull", "reconcile", "deploy", "launch"} <= set(names)
    for name in names:
        code, out, _ = cli(None, name, "--help")
        assert code == 0 and re.search(r"Example:\s+ablate\s+\S", out), (name, out)
    code, out, _ = cli(None, "--help")
    assert "_ABLATE_COMPLETE=bash_source ablate" in out and "NO_COLOR" in out


def test_shell_completion_script_loads_in_bash_and_completes_commands_and_cells(
        local_project: LocalProject) -> None:
    local_project.cfg("configs/alpha.yaml")
    local_project.cfg("configs/beta.yaml")
    local_project.queue("q1", ["configs/alpha.yaml recon", "configs/beta.yaml recon"])
    cmd = ablate_cmd()
    source = shell({"_ABLATE_COMPLETE": "bash_source"}, cmd)
    assert source.returncode == 0 and "_ablate_completion()" in source.stdout, source
    # The script really loads into bash and registers the completion for `ablate`.
    loaded = shell({}, f'eval "$(_ABLATE_COMPLETE=bash_source {cmd})"; complete -p ablate')
    assert loaded.returncode == 0 and "-F _ablate_completion ablate" in loaded.stdout, loaded

    def complete(words: str) -> list[str]:
        r = shell({"_ABLATE_COMPLETE": "bash_complete", "COMP_WORDS": words,
                   "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}, cmd)
        assert r.returncode == 0, r
        return [line.split(",", 1)[1] for line in r.stdout.splitlines()]

    assert "logs" in complete("ablate lo") and "status" in complete("ablate st")
    assert complete(f"ablate -C {local_project.root} logs ") == ["alpha", "beta"]
    assert complete(f"ablate -C {local_project.root} logs b") == ["beta"]


def test_errors_on_stderr_data_on_stdout(local_project: LocalProject,
                                         cli: Cli) -> None:
    local_project.cfg("configs/a.yaml")
    local_project.queue("q1", ["# ablate: host=h1", "configs/a.yaml recon"])
    code, out, err = cli(local_project, "logs", "nope")
    assert code == 2 and out == "" and err.startswith("ablate: error: ")
    code, out, err = cli(local_project, "status", "--json")
    assert code == 0 and json.loads(out)["roster"] == 1 and err == ""


@pytest.mark.tmux
def test_plain_progress_is_one_line_per_step_on_stderr_never_on_stdout_and_q_silences_it(
        done_sweep: LocalProject, cli: Cli) -> None:
    code, out, err = cli(done_sweep, "pull", "--json")
    assert code == 0 and json.loads(out)["cells"] == 3  # stdout: exactly one JSON object
    assert [ln.split(":")[0] for ln in err.splitlines()] == [f"pull [{i}/3] c{i - 1}" for i in (1, 2, 3)]

    code, out, err = cli(done_sweep, "reconcile", "--json")
    assert code == 0 and json.loads(out)["complete"] is True
    steps = [ln for ln in err.splitlines() if ln.startswith("reconcile [")]
    assert steps == [f"reconcile [{i}/3 cells] c{i - 1}" for i in (1, 2, 3)], err

    code, out, err = cli(done_sweep, "deploy", "--json")
    assert code == 0 and json.loads(out)["created"] == []
    files = [ln for ln in err.splitlines() if ln.startswith("deploy [")]
    assert len(files) == 3 + 2 and all(ln.endswith(": already in place") for ln in files), err

    for args in (("pull",), ("reconcile",), ("deploy",)):
        code, out, err = cli(done_sweep, "-q", *args)
        assert code == 0 and err == "" and out, args  # -q: no progress; the result still printed


@pytest.mark.tmux
def test_launch_all_reports_each_queue_started(local_project: LocalProject,
                                               cli: Cli) -> None:
    for q, host in (("q1", "h1"), ("q2", "h2")):
        local_project.cfg(f"configs/{q}.yaml")
        local_project.queue(q, [f"# ablate: host={host}", f"configs/{q}.yaml recon"])
    code, out, err = cli(local_project, "launch", "--all", "--json")
    assert code == 0 and len(json.loads(out)["launched"]) == 2
    started = sorted(ln for ln in err.splitlines() if ln.startswith("launch ["))
    assert len(started) == 2 and {ln.split("] ")[0] for ln in started} == {"launch [1/2 queues",
                                                                           "launch [2/2 queues"}
    assert any(" h1: tmux " in ln and " runs q1 " in ln for ln in started), err


@pytest.mark.tmux
def test_progress_bars_on_a_terminal_with_rates_and_no_colour_under_no_color(
        done_sweep: LocalProject, pane: Pane) -> None:
    root = done_sweep.root
    pane.run(f"clear; {ablate_cmd()} -C {root} pull >/dev/null; {ablate_cmd()} -C {root} reconcile "
             ">/dev/null; echo BARS-DONE=$?")
    wait_for(lambda: "BARS-DONE=0" in pane.text(), timeout=60, interval=0.2)
    screen = pane.text(escapes=True)
    plain = SGR.sub("", screen)
    pull = next(ln for ln in plain.splitlines() if ln.lstrip().startswith("pull"))
    # bytes, files (checkpoint, metrics, log, manifest per cell), rate, time left, last cell
    assert "12/12 files" in pull and re.search(r"\d+(\.\d+)? [kMG]?B/s", pull) and "3/3 c2" in pull, pull
    rec = next(ln for ln in plain.splitlines() if "reconcile" in ln and "cells" in ln)
    assert "3/3 cells" in rec, rec
    assert SGR.search(screen), "colour terminal: the bars are coloured"

    pane.run(f"clear; NO_COLOR=1 {ablate_cmd()} -C {root} reconcile >/dev/null; echo BARS-DONE=x$?")
    wait_for(lambda: "BARS-DONE=x0" in pane.text(), timeout=60, interval=0.2)
    screen = pane.text(escapes=True)
    assert "3/3 cells" in screen and not SGR.search(screen), repr(screen[:500])

