"""Queues as Slurm job arrays (`array: true`) on a real cluster (tests/slurmbed.py): a task's time
limit requeues that task alone; a launch is throttled and split by MaxArraySize, each task's
queue live under its own name and stopped alone; a throttle below the arrays needed is refused
by doctor and launch, nothing submitted."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cli import Cli
from tests.helpers.slurm_jobs import slurm_env_fixture
from tests.helpers.slurm_sweep import Sweep
from tests.helpers.wait import wait_for
from tests.slurmbed import SlurmBed

pytestmark = pytest.mark.usefixtures("_slurm_env")
_slurm_env = slurm_env_fixture()


def test_an_array_tasks_time_limit_requeues_that_task_alone(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """Three queues as one array: the task whose own job id is the array's id (a bare id names every
    task) has its time limit cut to a minute. At Slurm's USR2 its queue cuts its cell and requeues
    itself by `A_i`: it alone restarts and resumes its cell; the other tasks keep Restarts=0."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=3, queues=3, epochs=3, step_time=0.5,
               slurm={"array": True, "grace": 30})
    for c in sw.cells:  # each cell held after its first epoch: every task mid-cell, however loaded
        (sw.work / "faults").mkdir(exist_ok=True)
        (sw.work / "faults" / f"{c}.hang").write_text("1\n")
    sw.ok("plan")
    sw.ok("launch", "--all")

    def running() -> bool:
        jobs = sw.jobs()
        return (len(jobs) == 3 and all(j["state"] == "RUNNING" for j in jobs)
                and all(any(e["ev"] == "epoch" for e in sw.trace(c)) for c in sw.cells))

    wait_for(running, timeout=120, interval=0.5)
    tasks = {j["id"]: slurm_cluster.job(j["id"]) for j in sw.jobs()}
    assert all(re.fullmatch(r"\d+_\d+", t) for t in tasks), tasks
    [first] = [t for t, d in tasks.items() if d["JobId"] == d["ArrayJobId"]]
    slurm_cluster.run("scontrol", "update", f"JobId={first}", "TimeLimit=1")
    wait_for(lambda: slurm_cluster.job(first)["Restarts"] == "1", timeout=150, interval=1)
    for t in tasks:
        if t != first:
            assert slurm_cluster.job(t)["Restarts"] == "0", (t, slurm_cluster.job(t))
    stops = [e for e in sw.events() if e["ev"] == "queue_stop"]
    assert len(stops) == 1 and stops[0]["reason"] == "time_limit" and stops[0]["requeue"] == 1, stops
    for c in sw.cells:
        (sw.work / "faults" / f"{c}.hang").unlink()
    sw.wait_done()
    sw.assert_all_verified_once()
    cut = stops[0]["cell"]
    assert [e["resume"] for e in sw.trace(cut) if e["ev"] == "start"] == [0, 1], sw.trace(cut)
    for c in sw.cells:
        if c != cut:
            assert [e["resume"] for e in sw.trace(c) if e["ev"] == "start"] == [0], (c, sw.trace(c))


def _peak(events: list[dict[str, Any]]) -> int:
    """The most queues running at once, by their queue_start and queue_end events."""
    marks = sorted((e["t"], 1 if e["ev"] == "queue_start" else -1)
                   for e in events if e["ev"] in ("queue_start", "queue_end"))
    now = peak = 0
    for _, d in marks:
        now += d
        peak = max(peak, now)
    return peak


def test_an_array_launch_is_throttled_and_split_by_max_array_size(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """`array: true, throttle: 2`, 4 queues, a cluster of MaxArraySize 3: one launch submits two
    arrays (3 tasks and 1, %1 each: never more than 2 queues at once), each task's queue is live
    under its session name (status shows its task, a second launch starts nothing), stop cancels
    one task alone, and every cell is verified once."""
    slurm_cluster.reconfigure(MaxArraySize="3")
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=8, queues=4, epochs=2, step_time=0.4,
               slurm={"array": True, "throttle": 2})
    # Each cell held after its first epoch until the queues have been looked at: a queue that ran
    # its two cells meanwhile (CI: while four commands ran under load) is no longer live.
    (sw.work / "faults").mkdir(exist_ok=True)
    holds = [sw.work / "faults" / f"{c}.hang" for c in sw.cells]
    for h in holds:
        h.write_text("1\n")
    sw.ok("plan")
    sw.ok("deploy")
    checks = {c["check"]: c for c in sw.ok("doctor")["hosts"]["cluster"]["checks"]}
    assert checks["array"]["ok"] and checks["array"]["reason"] == \
        "4 planned queue(s) go as 2 array(s) of at most 3 tasks, at most 2 running", checks["array"]
    got = sw.ok("launch", "--all")
    assert len(got["launched"]) == 4 and {r["status"] for r in got["launched"]} == {"launched"}, got
    names = {j["name"] for j in sw.jobs()}
    assert len(names) == 2 and all(".a" in n for n in names), sw.jobs()
    tasks = {p.name: p.read_text().split() for p in (sw.root / "slurm").glob("*.tasks")}
    assert sorted(len(t) for t in tasks.values()) == [1, 3], tasks
    again = sw.ok("launch", "--all")
    assert {r["status"] for r in again["launched"]} == {"running"}, again
    rows = sw.ok("status")["queues"]
    assert len(rows) == 4 and all(r["live"] and re.fullmatch(r"\d+_\d", r["job"]["id"]) for r in rows), rows
    # The queue of the single-task array: cancelled alone, then launched again as a job of its own.
    last = next(iter(t for t in tasks.values() if len(t) == 1))[0]
    queue = next(r["queue"] for r in rows if last.endswith(f"-{r['queue']}"))
    stopped = sw.ok("stop", queue, "--host", "cluster")
    assert stopped["was_live"] is True, stopped
    assert len({r["queue"] for r in sw.ok("status")["queues"] if r["live"]}) == 3
    assert sw.ok("launch", queue, "--host", "cluster")["status"] == "launched"
    for h in holds:
        h.unlink()
    sw.wait_done()
    sw.assert_all_verified_once()
    # The three-task array's share of the throttle is 1: its queues ran one after the other.
    three = tasks[next(n for n, t in tasks.items() if len(t) == 3)]
    mine = [e for e in sw.events() if f"ablate-{sw.sweep}-cluster-{e.get('queue')}" in three]
    assert len([e for e in mine if e["ev"] == "queue_start"]) == 3 and _peak(mine) == 1, mine
    for session in three:  # Slurm's output of each task is its queue's log
        log = (sw.root / "slurm" / f"{session}.out").read_text()
        assert "] started at line 0" in log and "drained at line" in log, (session, log)


def test_an_array_throttle_below_the_arrays_needed_is_refused_and_nothing_submitted(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """MaxArraySize 1: 3 queues need 3 arrays, more than throttle 2 can share out (never a
    --dependency chain): doctor says so, and launch submits nothing and says how to fix it."""
    slurm_cluster.reconfigure(MaxArraySize="1")
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=3, queues=3, epochs=1, step_time=0.0,
               slurm={"array": True, "throttle": 2})
    sw.ok("plan")
    sw.ok("deploy")
    code, out, err = cli(sw.proj, "doctor", "--json")
    checks = {c["check"]: c for c in json.loads(out)["hosts"]["cluster"]["checks"]}
    assert code == 1 and not checks["array"]["ok"], checks
    assert "3 planned queues need 3 arrays of at most 1 tasks" in checks["array"]["reason"], checks["array"]
    code, out, err = cli(sw.proj, "launch", "--all", "--json")
    got = json.loads(out)
    assert code != 0 and {r["status"] for r in got["launched"]} == {"failed"}, (code, out, err)
    assert all("raise throttle to at least 3" in r["error"] for r in got["launched"]), got
    assert not sw.jobs() and not list((sw.root / "slurm").glob("*.tasks"))
