"""The stop path's decisions (`ablate/remote/slurm/stop_plan.py`, the runner's `attempt` and `stop-plan`) in
milliseconds, over what Slurm really prints and sets: squeue's `%L` and the `SLURM_*` environment
of a job, a requeued job and an array task, captured from the Slurm bed (tests/slurmbed.py). Then
the numbers every run spec carries for run_queue, each defined once in Python, and the store's
verbs that answer alike without a store."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from ablate.config.project import load_project
from ablate.config.settings import DEFAULT_MONITOR
from ablate.config.slurm import DEFAULT_GRACE, DEFAULT_MAX_RESTARTS
from ablate.remote.queue import defaults, serve
from ablate.remote.slurm import signal_window, stop_plan
from ablate.remote.slurm.stop_plan import Job, Plan
from ablate.run.placement import render_spec
from tests.helpers.project import LocalProject

REPO = Path(__file__).resolve().parent.parent

# `squeue -h -j SELF -o %L` on the bed: a job of --time=1-02:03:04 (Slurm keeps whole minutes), one
# of --time=5 seconds in, an array task of --time=3:00:00 (a pending one says its whole limit), a
# job without a limit; and a job squeue no longer knows (rc 1: "Invalid job id specified").
LEFT = {"1-02:03:54\n": 93834, "1-02:04:00": 93840, "4:54\n": 294, "5:00": 300, "2:59:58\n": 10798,
        "3:00:00": 10800, "0:00": 0}
UNKNOWN = ["UNLIMITED\n", "INVALID", "NOT_SET", "", "\n", None, "4:54\n4:54\n", "garbage"]

# The SLURM_* environment of real jobs on the bed.
FIRST_RUN = {"SLURM_JOB_ID": "1", "SLURM_JOB_PARTITION": "main"}  # no SLURM_RESTART_COUNT yet
REQUEUED = {**FIRST_RUN, "SLURM_RESTART_COUNT": "1"}
ARRAY_TASK = {"SLURM_ARRAY_JOB_ID": "3", "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_ID": "0",
              "SLURM_ARRAY_TASK_MAX": "2", "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_STEP": "1",
              "SLURM_JOB_ID": "4", "SLURM_JOB_PARTITION": "main"}
# The task whose own id is the array's: a bare 3 would name every task of the array.
ARRAY_FIRST = {**ARRAY_TASK, "SLURM_ARRAY_TASK_ID": "2", "SLURM_JOB_ID": "3", "SLURM_RESTART_COUNT": "2"}

CONFIG = "Configuration data as of 2026-11-28T16:28:17\nKillWait                = 30 sec\n"
PARTITION = "PartitionName=main AllowGroups=ALL Default=YES GraceTime=20 Hidden=NO MaxTime=UNLIMITED\n"


def never() -> int:
    raise AssertionError("the window is asked only for a preemption or a TERM")


# --------------------------------------------------------------------------- the job

@pytest.mark.parametrize(("env", "job"), [
    (FIRST_RUN, Job("1.0", "1", 0)),
    (REQUEUED, Job("1.1", "1", 1)),
    (ARRAY_TASK, Job("4.0", "3_0", 0)),
    (ARRAY_FIRST, Job("3.2", "3_2", 2)),
    ({**FIRST_RUN, "SLURM_RESTART_COUNT": ""}, Job("1.0", "1", 0)),
    ({**FIRST_RUN, "SLURM_RESTART_COUNT": "x1"}, Job("1.0", "1", 0)),  # garbled: the first run's
    ({**ARRAY_TASK, "SLURM_ARRAY_TASK_ID": "a"}, Job("4.0", "4", 0)),  # no whole task: its own id
    ({}, None),
    ({"SLURM_JOB_ID": ""}, None),
    ({"SLURM_JOB_ID": "1;id"}, None),
    ({"SLURM_JOB_ID": "1\n"}, None),
])
def test_the_job_is_its_attempt_its_name_for_slurm_and_its_restarts(env: dict[str, str],
                                                                     job: Job | None) -> None:
    assert stop_plan.job_of(env) == job


def test_the_restart_cap_stops_an_attempt_past_it_and_refuses_the_requeue_that_would_pass_it() -> None:
    assert [stop_plan.restarted_too_often(r, 10) for r in (9, 10, 11)] == [False, False, True]
    assert [stop_plan.requeue_refused(r, 10) for r in (9, 10, 11)] == [False, True, True]
    assert stop_plan.requeue_refused(0, 0) and not stop_plan.restarted_too_often(0, 0)


# --------------------------------------------------------------------------- the time left

@pytest.mark.parametrize(("text", "seconds"), list(LEFT.items()))
def test_squeue_time_left_is_read_by_the_one_parser_of_slurm_times(text: str, seconds: int) -> None:
    assert stop_plan.time_left(text) == seconds == signal_window.time_seconds(text.strip())


@pytest.mark.parametrize("text", UNKNOWN)
def test_a_time_left_squeue_cannot_say_is_unknown(text: str | None) -> None:
    assert stop_plan.time_left(text) is None


def test_a_cut_cell_has_all_but_the_margin_and_at_least_a_second() -> None:
    assert [stop_plan.cell_wait(s) for s in (50, 12, 11, 10, 0)] == [40, 2, 1, 1, 1]
    assert stop_plan.FALLBACK_WAIT == signal_window.KILL_WAIT - stop_plan.STOP_MARGIN == 20


# --------------------------------------------------------------------------- USR2 and TERM

def test_more_time_left_than_grace_plus_90_is_a_preemption_left_to_slurm() -> None:
    job = stop_plan.job_of(FIRST_RUN)
    at = 120 + 90
    assert stop_plan.on_usr2(job, at + 1, 120, 10, True, True, lambda: 50) == \
        Plan("preempted", False, 40, False, False)
    assert stop_plan.on_usr2(job, at, 120, 10, True, True, never) == \
        Plan("time_limit", True, at - 10, True, False)
    # the bed's preemption: USR2 at once, a day left, the partition's GraceTime 20 + KillWait 30
    plan = stop_plan.on_usr2(job, LEFT["1-02:03:54\n"], 120, 10, True, True,
                            lambda: signal_window.window(FIRST_RUN, fake({"scontrol show": CONFIG,
                                                                     "scontrol -o": PARTITION})))
    assert plan.line() == "why=preempted requeue=0 wait=40 cut=0 capped=0"


def test_at_the_time_limit_the_cell_has_until_the_margin_and_the_job_is_requeued_up_to_the_cap() -> None:
    first, requeued = stop_plan.job_of(FIRST_RUN), stop_plan.job_of(REQUEUED)
    assert stop_plan.on_usr2(first, 50, 50, 10, True, True, never).line() == \
        "why=time_limit requeue=1 wait=40 cut=1 capped=0"
    assert stop_plan.on_usr2(first, None, 50, 10, True, True, never).wait == 40  # squeue silent: the grace
    assert stop_plan.on_usr2(first, 50, 50, 10, True, False, never).cut is False  # no cell ran
    no_resubmit = Plan("time_limit", False, 40, True, False)
    assert stop_plan.on_usr2(first, 50, 50, 10, False, True, never) == no_resubmit
    capped = Plan("time_limit", False, 40, True, True)
    assert stop_plan.on_usr2(requeued, 50, 50, 1, True, True, never) == capped
    assert stop_plan.on_usr2(requeued, 50, 50, 2, True, True, never).requeue is True
    assert stop_plan.on_usr2(requeued, 50, 50, 1, False, True, never).capped is False  # nothing refused


def test_outside_a_slurm_job_a_usr2_cuts_by_the_grace_and_asks_nothing_of_slurm() -> None:
    assert stop_plan.on_usr2(None, None, 120, 10, True, True, never) == \
        Plan("time_limit", False, 110, False, False)


def test_slurms_term_gives_the_cell_the_sites_window_less_the_margin() -> None:
    assert stop_plan.on_term(lambda: 50) == Plan("slurm_signal", False, 40, False, False)
    assert stop_plan.on_term(lambda: 5).wait == 1


def fake(answers: dict[str, str | None]) -> signal_window.Run:
    """Slurm's commands answering what the bed's answer (by their first two words), else failing."""
    def run(argv: Sequence[str]) -> str | None:
        return answers.get(" ".join(argv[:2]))
    return run


def plan_of(env: dict[str, str], squeue: str | None, *args: str) -> tuple[int, list[str], list[list[str]]]:
    """The verb as run_queue asks it, over a job's environment and Slurm's answers."""
    asked: list[list[str]] = []

    def run(argv: Sequence[str]) -> str | None:
        asked.append(list(argv))
        answers = {"squeue -h": squeue, "scontrol show": CONFIG, "scontrol -o": PARTITION}
        return answers.get(" ".join(argv[:2]))

    out: list[str] = []
    rc = stop_plan.verb(["stop-plan", *args], env, out.append, run)
    return rc, out, asked


def test_the_verb_asks_squeue_for_this_job_by_its_own_name() -> None:
    args = ("--grace", "120", "--max-restarts", "10", "--resubmit", "1", "--running", "1")
    rc, out, asked = plan_of(ARRAY_TASK, "1:30\n", *args)
    assert (rc, out) == (0, ["why=time_limit requeue=1 wait=80 cut=1 capped=0"])
    assert asked == [["squeue", "-h", "-j", "3_0", "-o", "%L"]]
    rc, out, asked = plan_of(ARRAY_TASK, "2:59:58\n", *args)  # the site's preemption
    assert out == ["why=preempted requeue=0 wait=40 cut=0 capped=0"]
    assert [a[:2] for a in asked] == [["squeue", "-h"], ["scontrol", "-o"], ["scontrol", "show"]]
    rc, out, asked = plan_of(ARRAY_TASK, None, *args)  # squeue failed
    assert out == ["why=time_limit requeue=1 wait=110 cut=1 capped=0"]
    rc, out, asked = plan_of(ARRAY_TASK, "1:30", "--signal", "term", *args)
    assert out == ["why=slurm_signal requeue=0 wait=40 cut=0 capped=0"] and asked[0][0] == "scontrol"
    rc, out, asked = plan_of({}, "1:30", *args)  # no job: no squeue
    assert out == ["why=time_limit requeue=0 wait=110 cut=0 capped=0"] and asked == []


def test_the_attempt_verb_answers_in_a_job_and_says_nothing_outside_one() -> None:
    out: list[str] = []
    assert stop_plan.verb(["attempt", "--max-restarts", "1"], ARRAY_FIRST, out.append) == 0
    assert out == ["attempt=3.2 self=3_2 restarts=2 stop=1"]
    out.clear()
    assert stop_plan.verb(["attempt", "--max-restarts", "2"], REQUEUED, out.append) == 0
    assert out == ["attempt=1.1 self=1 restarts=1 stop=0"]
    out.clear()
    assert stop_plan.verb(["attempt", "--max-restarts", "10"], {}, out.append) == 1 and out == []


# --------------------------------------------------------------------------- through the runner

def test_the_runner_answers_the_stop_verbs_and_the_stores_alike_without_a_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """serve's command line, as run_queue's co-process answers them: the job from its environment;
    without a store `pull` and `push` do nothing and `claim` says to claim on the shared FS."""
    for k in [*REQUEUED, "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "ABLATE_STORE"]:
        monkeypatch.delenv(k, raising=False)
    for k, v in REQUEUED.items():
        monkeypatch.setenv(k, v)
    base = [str(tmp_path), "h1", "q1", "-"]
    capsys.readouterr()
    assert serve.main(["attempt", *base, "--max-restarts", "0"]) == 0
    assert capsys.readouterr().out == "attempt=1.1 self=1 restarts=1 stop=1\n"
    assert serve.attempt() == "1.1"  # what a store's claim and commit record
    assert serve.main(["claim", *base, "c1", "0"]) == 0 and capsys.readouterr().out == "fs\n"
    for verb in ("pull", "push"):
        assert serve.main([verb, *base]) == 0 and capsys.readouterr().out == ""
    assert serve.main(["commit", *base, "c1", "x", "1"]) == 2  # run_one's: only with a store


# --------------------------------------------------------------------------- the spec's numbers

SPEC_NUMBERS = ("ABLATE_HEARTBEAT_SECS", "ABLATE_STEAL", "ABLATE_PIN_GPU", "ABLATE_STOP_GRACE",
                "ABLATE_CLAIM_WAIT", "ABLATE_CALIBRATE_TIMEOUT", "ABLATE_SLURM_GRACE",
                "ABLATE_SLURM_MAX_RESTARTS", "ABLATE_SLURM_RESUBMIT", "ABLATE_SLURM_FALLBACK_WAIT")


def spec_values(spec: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in spec.decode().splitlines() if not line.startswith("#"))


def slurm_project(tmp_path: Path, slurm: dict[str, object]) -> Path:
    root = tmp_path / "proj"
    (root / "profiles").mkdir(parents=True)
    (root / "configs").mkdir()
    (root / "configs" / "c0.yaml").write_text("lr: 0.1\n")
    (root / "profiles" / "cluster.yaml").write_text(yaml.safe_dump(
        {"transport": "slurm", "shared_fs": str(tmp_path / "shared"), "ckpt_root": str(tmp_path / "scratch"),
         "python": sys.executable, "slurm": {"time": "4:00:00", **slurm}}))
    (root / "ablate.yaml").write_text(yaml.safe_dump(
        {"profile": "cluster", "sweep": "s1", "workdir": str(root), "train": "python t.py {cfg} {ckpt_dir}",
         "artifacts": {"checkpoint": "model.pt"}, "tasks": {"t": {"epochs": 2, "cost_per_epoch": 1.0}},
         "cells": [{"glob": "configs/*.yaml", "task": "t"}], "hosts": {"cluster": {"queues": 2}}}))
    return root


def test_every_spec_carries_each_number_run_queue_computes_with_from_its_one_definition(
        local_project: LocalProject, tmp_path: Path) -> None:
    project = load_project(local_project.root)
    got = spec_values(render_spec(project, project.hosts["h1"], "/x/run_one.sh"))
    assert {k: got[k] for k in SPEC_NUMBERS} == {
        "ABLATE_HEARTBEAT_SECS": str(project.heartbeat_secs), "ABLATE_STEAL": "1", "ABLATE_PIN_GPU": "1",
        "ABLATE_STOP_GRACE": str(int(DEFAULT_MONITOR.stop_grace)),
        "ABLATE_CLAIM_WAIT": str(defaults.CLAIM_WAIT),
        "ABLATE_CALIBRATE_TIMEOUT": "600", "ABLATE_SLURM_GRACE": str(DEFAULT_GRACE),
        "ABLATE_SLURM_MAX_RESTARTS": str(DEFAULT_MAX_RESTARTS), "ABLATE_SLURM_RESUBMIT": "0",
        "ABLATE_SLURM_FALLBACK_WAIT": str(stop_plan.FALLBACK_WAIT)}
    cluster = load_project(slurm_project(tmp_path, {"grace": 50, "max_restarts": 3}))
    got = spec_values(render_spec(cluster, cluster.hosts["cluster"], "/x/run_one.sh"))
    assert (got["ABLATE_PIN_GPU"], got["ABLATE_SLURM_GRACE"], got["ABLATE_SLURM_MAX_RESTARTS"],
            got["ABLATE_SLURM_RESUBMIT"]) == ("0", "50", "3", "1")


def test_run_queue_keeps_no_copy_of_a_number_and_refuses_a_spec_without_one(
        local_project: LocalProject, tmp_path: Path) -> None:
    source = (REPO / "wrappers" / "run_queue.sh").read_text()
    assert not re.findall(r"\$\{ABLATE_[A-Z_]+:-[0-9]", source)  # no `${ABLATE_X:-120}` fallback
    project = load_project(local_project.root)
    spec = render_spec(project, project.hosts["h1"], "/x/run_one.sh").decode()
    for name, bad in (("ABLATE_CLAIM_WAIT", None), ("ABLATE_SLURM_GRACE", "2m")):
        path = tmp_path / f"{name}.env"
        kept = [ln for ln in spec.splitlines() if not ln.startswith(f"{name}=")]
        path.write_text("\n".join(kept + ([f"{name}={bad}"] if bad else [])) + "\n")
        r = subprocess.run(["bash", str(REPO / "wrappers" / "run_queue.sh"), str(path), "q1", "0"],
                           capture_output=True, text=True, timeout=30,
                           env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
        assert r.returncode == 2 and name in r.stderr and r.stdout == "", r
        assert not [*local_project.shared.glob("events/*"), *local_project.shared.glob("heartbeats/*")]
