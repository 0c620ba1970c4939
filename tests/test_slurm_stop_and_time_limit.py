"""A Slurm job's cell cut on purpose on a real cluster (tests/slurmbed.py): `stop` (scancel's TERM,
with Slurm's window for the trainer to save) and launched again resumes the cut cell;
`stop --after-current` lets the cell finish and the job end by itself; the time limit cuts the
cell resumable and the job requeues itself, until a cell cut twice with its checkpoint unchanged
is stopped as `too_long`; Slurm's USR2 that comes as the job starts (before the queue knows its
attempt) is acted on once it can be, not fatal."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers import proc
from tests.helpers.cli import Cli
from tests.helpers.slurm_jobs import ev as _ev
from tests.helpers.slurm_jobs import mid_cell as _mid_cell
from tests.helpers.slurm_jobs import queue_order as _queue_order
from tests.helpers.slurm_jobs import resumed as _resumed
from tests.helpers.slurm_jobs import slurm_env_fixture
from tests.helpers.slurm_sweep import Sweep
from tests.helpers.wait import wait_for
from tests.slurmbed import SlurmBed

pytestmark = pytest.mark.usefixtures("_slurm_env")
_slurm_env = slurm_env_fixture()


def test_stop_then_launch_again_resumes_the_cut_cell(slurm_cluster: SlurmBed, tmp_path: Path,
                                                     cli: Cli) -> None:
    """scancel's TERM reaches the trainer and the queue's shell at once; the shell outlives the
    trainer (the job ends with it) through Slurm's window, so a trainer that takes 12 s to save
    (more than the 10 s ablate once gave) saves, and is told why."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=2, queues=1, epochs=6, step_time=0.5)
    (sw.work / "faults").mkdir(exist_ok=True)
    for c in sw.cells:
        (sw.work / "faults" / f"{c}.save_on_term").write_text("12\n")
        # held after epoch 2 until the stop: on a loaded machine 6 epochs of 0.5 s ended before it
        (sw.work / "faults" / f"{c}.hang").write_text("2\n")
    sw.ok("plan")
    sw.ok("launch", "--all")
    cell, _ = _mid_cell(sw, min_epoch=1)
    [queue] = [q["queue"] for q in sw.ok("status")["queues"]]
    stopped = sw.ok("stop", queue, "--host", "cluster")
    assert stopped["was_live"] is True, stopped
    assert not sw.jobs(), sw.jobs()  # scancel'd, and gone from squeue before stop returned
    assert cell not in sw.published()
    [saved] = [e for e in sw.trace(cell) if e["ev"] == "saved"]
    assert saved["told"]["reason"] == "slurm_signal" and saved["told"]["kill_after"] >= 12, saved
    for c in sw.cells:
        (sw.work / "faults" / f"{c}.save_on_term").unlink()
        (sw.work / "faults" / f"{c}.hang").unlink()
    again = sw.ok("launch", queue, "--host", "cluster")
    assert again["status"] == "launched", again
    sw.wait_done()
    sw.assert_all_verified_once()
    assert _resumed(sw, cell), sw.trace(cell)


def test_stop_after_current_lets_the_cell_finish_then_the_job_ends(slurm_cluster: SlurmBed,
                                                                   tmp_path: Path, cli: Cli) -> None:
    """`stop --after-current` on Slurm, as anywhere: nothing is cancelled; the running cell is
    published, the queue starts nothing more and its job ends by itself; launched again, the
    queue runs the rest."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=3, queues=1, epochs=4, step_time=0.5)
    sw.ok("plan")
    sw.ok("launch", "--all")
    cell, _ = _mid_cell(sw, min_epoch=1)
    [queue] = [q["queue"] for q in sw.ok("status")["queues"]]
    got = sw.ok("stop", queue, "--host", "cluster", "--after-current")
    assert got["after_current"] is True and got["cell"] == cell, got
    wait_for(lambda: not sw.jobs(), timeout=90, interval=0.3)
    done = sw.published()
    assert cell in done and len(done) < 3 and sw.completed(cell) == 1, (done, sw.explain())
    assert all(not sw.trace(c) for c in set(sw.cells) - done), "nothing started after the stop"
    assert sw.ok("launch", queue, "--host", "cluster")["status"] == "launched"
    sw.wait_done()
    sw.assert_all_verified_once()


def test_the_time_limit_cuts_the_cell_resumable_and_the_job_requeues_itself(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """A queue longer than its job's time limit (1 min): Slurm's USR2 (`--signal=B:USR2@50`) makes
    run_queue cut its cell (the trainer's last checkpoint stays) and requeue its own job; the next
    attempt goes on from there, until the queue is done."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=3, queues=1, epochs=10, step_time=3.0,
               slurm={"time": "1:00", "grace": 50})
    (sw.work / "faults").mkdir(exist_ok=True)
    marker = sw.work / "faults" / f"{sw.cells[0]}.save_on_term"
    marker.write_text("12\n")  # the first cut trainer takes 12 s to save: more than ablate once gave
    sw.ok("plan")
    sw.ok("launch", "--all")
    wait_for(lambda: any(t["ev"] == "saved" for t in sw.trace(sw.cells[0])), timeout=240, interval=0.5)
    marker.unlink()  # the later cuts end at once, as before
    sw.wait_done(timeout=480)
    sw.assert_all_verified_once()
    stops = [e for e in sw.events() if e["ev"] == "queue_stop" and e.get("reason") == "time_limit"]
    assert stops and all(e["requeue"] == 1 for e in stops), stops
    # told why before its TERM, given until 10 s before the limit, and it saved
    [saved] = [t for t in sw.trace(sw.cells[0]) if t["ev"] == "saved"]
    assert saved["told"]["reason"] == "time_limit" and saved["told"]["kill_after"] >= 12, saved
    attempts = {e["attempt"] for e in sw.events() if e["ev"] == "queue_start"}
    assert len(attempts) == len(stops) + 1, (attempts, stops)


def test_a_cell_cut_twice_at_the_time_limit_with_its_checkpoint_unchanged_is_stopped(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """A cell that never reaches its next save within a job (1 min, grace 50 s): cut at the time
    limit, resumed, cut again with the same checkpoint. Its second cut ends it (`no_progress`,
    exit 124): no third attempt runs it, the queue goes on with its next cell, and status says
    what to do (`too_long`: raise time or make the trainer resume)."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=2, queues=1, epochs=2, step_time=0.5,
               slurm={"time": "1:00", "grace": 50})
    sw.ok("plan")
    stuck, after = _queue_order(sw)
    (sw.work / "faults").mkdir(exist_ok=True)
    (sw.work / "faults" / f"{stuck}.stall").write_text("1\n")  # epoch 1 saved, epoch 2 never
    sw.ok("launch", "--all")
    sw.wait_until(lambda: sw.published() == {after} and not sw.jobs(), timeout=480, interval=1)
    [end] = _ev(sw, "end", cell=stuck)
    assert end["rc"] == 124 and end["reason"] == "no_progress", end
    # Each attempt that ran it was cut at its time limit (2, or 3 when Slurm's first signal came
    # before epoch 1 was saved); the last resumed from epoch 1 and saved nothing more.
    cuts = _ev(sw, "queue_stop", reason="time_limit", cell=stuck)
    starts = [e for e in sw.trace(stuck) if e["ev"] == "start"]
    assert len(cuts) == len(starts) >= 2 and starts[-1]["start_epoch"] == 1, (starts, sw.explain())
    assert end["checkpoint"] != "none", end  # its epoch-1 checkpoint, found where the spec says
    # `since`: the attempt whose cut left the checkpoint as the last cut found it, the one before the
    # last. Each cut's attempt is the queue's start before it: an attempt may also end without
    # running the cell (Slurm's first signal at its start), so attempts and cuts do not pair by count.
    current, cut_by = None, []
    for e in sw.events():
        if e["ev"] == "queue_start":
            current = e["attempt"]
        elif e["ev"] == "queue_stop" and e.get("reason") == "time_limit" and e.get("cell") == stuck:
            cut_by.append(current)
    assert end["since"] == cut_by[-2], (end, cut_by, sw.explain())
    assert not [e for e in _ev(sw, "start", cell=stuck) if e["t"] > end["t"]]
    cell = sw.ok("status")["cells"][stuck]
    assert cell["state"] == "too_long" and "raise slurm.time" in cell["reason"], cell
    fix = sw.ok("remediate")
    assert fix["targets"][stuck]["state"] == "too_long", fix


def test_slurms_usr2_at_the_jobs_start_requeues_it_rather_than_ending_it(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """slurmctld signals a job whose time left is within grace + 30 s at its next check, which may
    come as the job starts: here the queue's first Python start is held 3 s (the profile's python),
    and the USR2 (`scancel --signal=USR2 --batch`, as slurmctld sends it) lands in it, before
    run_queue knows its attempt. Bash's default for USR2 would end the job, unrequeued, its cells
    never run; the queue notes it, then stops as at the time limit and asks for a requeue, and the
    next attempt runs the cells."""
    work = slurm_cluster.shared_dir / "work"
    work.mkdir(exist_ok=True)
    held, slow = work / f"held-{tmp_path.name}", work / f"slowpy-{tmp_path.name}"
    slow.write_text(f"#!/bin/sh\n[ -n \"$SLURM_JOB_ID\" ] && mkdir {held} 2>/dev/null && sleep 3\n"
                    f"exec {sys.executable} \"$@\"\n")
    slow.chmod(0o755)
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=2, queues=1, epochs=2, step_time=0.1,
               slurm={"time": "1:00", "grace": 50}, python=str(slow))
    sw.ok("plan")
    sw.ok("launch", "--all")
    sw.wait_until(lambda: held.exists() and [j["state"] for j in sw.jobs()] == ["RUNNING"], timeout=60,
                  interval=0.05)
    [job] = sw.jobs()
    slurm_cluster.run("scancel", "--signal=USR2", "--batch", job["id"])
    sw.wait_done(timeout=240)
    sw.assert_all_verified_once()
    [first, *_] = [e for e in sw.events() if e["ev"] == "queue_stop"]
    assert first["reason"] == "time_limit" and first["requeue"] == 1 and first["cell"] is None, first


def test_the_time_limit_while_the_cell_waits_on_the_runner_is_planned_and_requeued(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """Slurm's USR2 may land while the cell's run_one waits on the queue's runner process (its
    publish, over the pipe they share): the handler's plan is asked of a Python start of its own,
    never of that pipe, where the two readers took each other's answers (CI: the plan lost, the
    publish never answered and killed, the job ended unrequeued with a cell never run). Here the
    runner's process is held (SIGSTOP) from before the trainer ends until the queue has planned."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=2, queues=1, epochs=2, step_time=0.1,
               slurm={"time": "3:00", "grace": 95})  # any USR2 is the time limit's (3 min < 95 s + 90 s)
    faults = sw.work / "faults"
    faults.mkdir(exist_ok=True)
    (faults / "c0.hang").write_text("1\n")
    sw.ok("plan")
    sw.ok("launch", "--all")
    sw.wait_until(lambda: any(e["ev"] == "epoch" for e in sw.trace("c0")), timeout=120, interval=0.2)
    [runner] = proc.with_args("serve", str(sw.root))  # the queue's runner process: `runner serve ROOT ...`
    stop_file = sw.scratch / ".ablate-stop" / "cluster.cluster"
    os.kill(runner, signal.SIGSTOP)
    try:
        (faults / "c0.hang").unlink()
        sw.wait_until(lambda: (sw.scratch / "c0" / "metrics.json").exists(), timeout=60, interval=0.1)
        [job] = sw.jobs()
        slurm_cluster.run("scancel", "--signal=USR2", "--batch", job["id"])
        sw.wait_until(stop_file.exists, timeout=60, interval=0.1)
    finally:
        os.kill(runner, signal.SIGCONT)
    sw.wait_done(timeout=240)
    sw.assert_all_verified_once()
    [first, *_] = [e for e in sw.events() if e["ev"] == "queue_stop"]
    assert first["reason"] == "time_limit" and first["requeue"] == 1 and first["cell"] == "c0", first
