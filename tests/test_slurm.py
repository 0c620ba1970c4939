"""The same sweep on a real Slurm cluster (tests/slurmbed.py: slurmctld + three slurmd nodes, each its
own network, hostname and /tmp, one shared directory): `transport: slurm`, a host of `queues: 3`,
each queue one batch job running the same run_queue. Every scenario ends with every cell verified
and its training completed exactly once, counted by the trainer itself (its trace on the shared
scratch, which survives the node it ran on)."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import slurmbed
from tests.helpers.cli import Cli
from tests.helpers.slurm_sweep import Sweep
from tests.helpers.wait import wait_for
from tests.slurmbed import SlurmBed

pytestmark = pytest.mark.usefixtures("_slurm_env")


@pytest.fixture
def _slurm_env(slurm_cluster: SlurmBed, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Slurm's client commands (here and in the jobs, which inherit this environment) talk to the
    bed's controller; every test leaves no job and every node up."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf_path))
    yield
    slurm_cluster.heal()


def test_a_whole_sweep_runs_as_batch_jobs_and_verifies(slurm_cluster: SlurmBed, tmp_path: Path,
                                                       cli: Cli) -> None:
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=6, queues=3, epochs=3, step_time=0.2)
    plan = sw.ok("plan")
    assert [q["host"] for q in plan["queues"]] == ["cluster"] * 3
    got = sw.ok("launch", "--all")
    assert {r["status"] for r in got["launched"]} == {"launched"}, got
    jobs = sw.jobs()
    assert len(jobs) == 3, jobs
    sw.wait_done()
    sw.assert_all_verified_once()
    # Each queue's job ran on a node of the cluster, as its events say, never on this machine.
    starts = [e for e in sw.events() if e["ev"] == "queue_start"]
    assert len(starts) == 3 and all(e.get("node") in slurm_cluster.nodes for e in starts), starts
    assert all(e.get("attempt", "").endswith(".0") for e in starts), starts
    rows = sw.ok("status")["queues"]
    assert len(rows) == 3 and {r["state"] for r in rows} == {"drained"}, rows
    # The bed keeps no accounting (accounting_storage/none, as many clusters): sacct fails, no hint.
    assert all(r["job"] is None and r["last_job"] is None for r in rows), rows
    # The gate on a cluster: nothing is cleaned until the roster is pulled and verified locally.
    code, out, err = cli(sw.proj, "release", "cluster", "--yes")
    assert code == 1 and "refused" in err, (out, err)
    assert all((sw.scratch / c).is_dir() for c in sw.cells)
    assert sw.ok("pull")["failed"] == []
    assert sw.ok("reconcile")["complete"] is True
    released = sw.ok("release", "cluster", "--yes")
    assert "scratch" in released["ran"], released
    assert not [p for p in sw.scratch.iterdir() if p.name.startswith("c")], list(sw.scratch.iterdir())



def _mid_cell(sw: Sweep, min_epoch: int = 1, timeout: float = 120.0) -> tuple[str, dict[str, str]]:
    """(a cell that is training past `min_epoch`, the running job of its queue)."""
    found: list[tuple[str, dict[str, str]]] = []

    def training() -> bool:
        for hb in (sw.root / "heartbeats").glob("cluster.*"):
            data = json.loads(hb.read_text() or "{}")
            cell = data.get("cell")
            if data.get("state") != "running" or not cell or not data.get("cell_started"):
                continue
            epochs = [e["epoch"] for e in sw.trace(cell) if e["ev"] == "epoch"]
            if not epochs or max(epochs) < min_epoch or max(epochs) >= sw.epochs:
                continue
            job = [j for j in sw.jobs()
                   if j["name"].endswith(f"-{data['queue']}") and j["state"] == "RUNNING"]
            if job:
                found.append((cell, job[0]))
                return True
        return False

    wait_for(training, timeout=timeout, interval=0.2)
    return found[-1]


def _launch_and_hold_mid_cell(sw: Sweep, min_epoch: int) -> tuple[str, dict[str, str]]:
    """Plan and launch; once a cell is past `min_epoch`, its job is requeued and held: Slurm keeps
    it pending until released, however slow this machine is. (the cell, its job)"""
    sw.ok("plan")
    sw.ok("launch", "--all")
    cell, job = _mid_cell(sw, min_epoch=min_epoch)
    sw.sb.run("scontrol", "requeuehold", job["id"])
    wait_for(lambda: sw.sb.job(job["id"]).get("JobState") == "PENDING", timeout=30)
    return cell, job


def _resumed(sw: Sweep, cell: str) -> list[dict[str, Any]]:
    return [e for e in sw.trace(cell) if e["ev"] == "start" and e["resume"] == 1 and e["start_epoch"] >= 1]


def test_a_requeued_job_re_enters_its_cell_and_skips_what_is_published(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """`scontrol requeue` of a job mid-cell: Slurm restarts the whole batch script; its queue skips
    the cells it published, re-enters the cut one with {resume}=1 under the new attempt, and every
    cell trains to the end once. Meanwhile the two other queues finish."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=6, queues=3, epochs=6, step_time=0.5)
    cell, job = _launch_and_hold_mid_cell(sw, min_epoch=2)
    # The cut cell is its queue's to re-enter: status says so, with the job's state, and remediate
    # leaves it alone (one owner of retries).
    st = sw.ok("status")
    row = next(r for r in st["queues"] if r["job"] and r["job"]["id"] == job["id"])
    assert row["job"]["state"] == "PENDING" and row["live"] is True, row
    got = st["cells"][cell]
    assert got["state"] == "queued" and "re-enters" in got["reason"], got
    fix = sw.ok("remediate")
    assert cell not in fix["targets"] and not fix["queues"], fix
    slurm_cluster.run("scontrol", "release", job["id"])
    sw.wait_done(timeout=240)
    sw.assert_all_verified_once()
    assert _resumed(sw, cell), sw.trace(cell)
    starts = [e for e in sw.events() if e["ev"] == "queue_start"]
    assert sorted(e["attempt"] for e in starts if e["attempt"].startswith(job["id"] + ".")) == \
        [f"{job['id']}.0", f"{job['id']}.1"], starts
    owner = (sw.root / "claims" / cell / "owner").read_text().split()
    assert owner[4] == f"{job['id']}.1", owner  # the claim is the new attempt's
    manifest = json.loads((sw.root / "final_ckpts" / cell / "MANIFEST.json").read_text())
    assert manifest["resume"] == 1, manifest


def test_two_queues_finish_at_once_while_a_third_is_requeued(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """Three queues of two equal cells start together; one job is requeued (and held) mid-cell.
    The other two drain at about the same moment while it is pending: they take nothing of its
    (its cut cell is claimed, its queue is Slurm's to restart), status and remediate leave it to
    Slurm; released, it resumes its cut cell and runs its other, and every cell trains once."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=6, queues=3, epochs=4, step_time=0.5)
    cell, job = _launch_and_hold_mid_cell(sw, min_epoch=1)
    held = [e["queue"] for e in sw.events() if e["ev"] == "queue_start" and e["attempt"] == f"{job['id']}.0"]
    assert len(held) == 1, sw.events()

    def others_drained() -> bool:
        return len({e["queue"] for e in sw.events() if e["ev"] == "queue_end"}) == 2

    wait_for(others_drained, timeout=120, interval=0.3)
    ends = [e for e in sw.events() if e["ev"] == "queue_end"]
    assert held[0] not in {e["queue"] for e in ends}, ends
    assert slurm_cluster.job(job["id"]).get("JobState") == "PENDING"  # still held while they drained
    st = sw.ok("status")
    assert st["cells"][cell]["state"] == "queued", st["cells"][cell]
    fix = sw.ok("remediate")
    assert not fix["queues"] and cell not in fix["targets"], fix
    slurm_cluster.run("scontrol", "release", job["id"])
    sw.wait_done(timeout=240)
    sw.assert_all_verified_once()
    assert _resumed(sw, cell), sw.trace(cell)
    assert not [e for e in sw.events() if e["ev"] == "steal"], "a held queue's cells are not stolen"


def test_a_preempted_job_is_requeued_by_slurm_and_its_cell_resumed(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """Preemption as a site sets it up (the bed: partition_prio, PreemptMode=REQUEUE,
    send_user_signal, GraceTime): a job of partition `urgent` takes the node of a queue's job
    mid-cell. The batch shell gets USR2 at once, cuts its cell resumable and records `preempted`,
    asking for no requeue of its own, and waits for the grace time to end: a job that ends by
    itself then is COMPLETED, never requeued (Slurm 22.05), so Slurm's PreemptMode must decide.
    The job comes back once a node is free, resumes the cell, and every cell trains once."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=3, queues=3, epochs=6, step_time=0.5)
    sw.ok("plan")
    sw.ok("launch", "--all")
    cell, job = _mid_cell(sw, min_epoch=1)
    urgent = slurm_cluster.sbatch("sleep 3", "-p", "urgent", "-w", job["nodes"])
    wait_for(lambda: any(e["ev"] == "queue_stop" for e in sw.events()), timeout=60, interval=0.2)
    slurm_cluster.wait_job(urgent, "COMPLETED", timeout=90)
    sw.wait_done(timeout=240)
    sw.assert_all_verified_once()
    assert _resumed(sw, cell), sw.trace(cell)
    stops = [e for e in sw.events() if e["ev"] == "queue_stop"]
    assert [(e["reason"], e["requeue"], e["cell"]) for e in stops] == [("preempted", 0, cell)], stops
    assert not [e for e in sw.events() if e["ev"] == "requeue_failed"]
    starts = [e["attempt"] for e in sw.events()
              if e["ev"] == "queue_start" and e["attempt"].startswith(job["id"] + ".")]
    assert starts == [f"{job['id']}.0", f"{job['id']}.1"], starts


def test_with_accounting_status_shows_each_queues_last_job_by_sacct(
        tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster that keeps accounting (slurmdbd): once squeue no longer lists a queue's job,
    status shows its last job as sacct has it, a stopped one CANCELLED, a finished one COMPLETED,
    beside the FS's own word (the cell states), never instead of it."""
    reason = slurmbed.missing_requirement(accounting=True)
    if reason:
        pytest.skip(reason)
    with SlurmBed(3, accounting=True) as sb:
        monkeypatch.setenv("SLURM_CONF", str(sb.conf_path))
        sw = Sweep(sb, tmp_path, cli, cells=2, queues=2, epochs=6, step_time=0.5)
        sw.ok("plan")
        sw.ok("launch", "--all")
        cell, job = _mid_cell(sw, min_epoch=1)
        queue = next(r["queue"] for r in sw.ok("status")["queues"]
                     if r["job"] and r["job"]["id"] == job["id"])
        sw.ok("stop", queue, "--host", "cluster")
        last: list[dict[str, Any]] = []

        def shown(want: dict[str, str]) -> bool:
            last[:] = sw.ok("status")["queues"]
            got = {r["queue"]: (r["last_job"] or {}).get("state", "") for r in last}
            return all(got[q].startswith(s) for q, s in want.items())

        wait_for(lambda: shown({queue: "CANCELLED"}), timeout=60, interval=1)
        row = next(r for r in last if r["queue"] == queue)
        assert row["live"] is False and row["job"] is None and row["last_job"]["id"] == job["id"], row
        assert sw.ok("status")["cells"][cell]["state"] != "verified"
        _, out, _ = cli(sw.proj, "status")
        assert f"last job of {queue} (sacct): {job['id']} CANCELLED" in out, out
        other = next(r["queue"] for r in last if r["queue"] != queue)
        wait_for(lambda: shown({other: "COMPLETED"}), timeout=120, interval=1)
        assert sw.ok("launch", queue, "--host", "cluster")["status"] == "launched"
        sw.wait_done()
        sw.assert_all_verified_once()
        wait_for(lambda: shown({queue: "COMPLETED", other: "COMPLETED"}), timeout=60, interval=1)
        assert all(r["last_job"]["exit"] == "0:0" and r["last_job"]["nodes"] in sb.nodes for r in last), last


def test_a_node_that_dies_mid_cell_is_requeued_by_slurm_and_its_cell_resumed(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=4, queues=2, epochs=8, step_time=1.0)
    sw.ok("plan")
    sw.ok("launch", "--all")
    cell, job = _mid_cell(sw, min_epoch=1)
    node = job["nodes"]
    slurm_cluster.node_kill(node)
    # Slurm notices (SlurmdTimeout), requeues the job on another node; the queue re-enters.
    sw.wait_done(timeout=300)
    sw.assert_all_verified_once()
    assert _resumed(sw, cell), sw.trace(cell)
    starts = [e for e in sw.events() if e["ev"] == "queue_start" and e["attempt"].startswith(job["id"] + ".")]
    assert starts[0]["node"] == node and starts[-1]["node"] != node, starts


def test_stop_then_launch_again_resumes_the_cut_cell(slurm_cluster: SlurmBed, tmp_path: Path,
                                                     cli: Cli) -> None:
    """scancel's TERM reaches the trainer and the queue's shell at once; the shell outlives the
    trainer (the job ends with it) through Slurm's window, so a trainer that takes 12 s to save
    (more than the 10 s ablate once gave) saves, and is told why."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=2, queues=1, epochs=6, step_time=0.5)
    (sw.work / "faults").mkdir(exist_ok=True)
    for c in sw.cells:
        (sw.work / "faults" / f"{c}.save_on_term").write_text("12\n")
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


def test_doctor_checks_the_request_and_a_compute_nodes_view_in_a_probe_job(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=2, queues=2, epochs=1, step_time=0.0)
    sw.ok("deploy")
    rep = sw.ok("doctor")
    checks = {c["check"]: c for c in rep["hosts"]["cluster"]["checks"]}
    assert all(c["ok"] for c in checks.values()), checks
    assert {"slurm", "request", "job", "shared_fs", "deployed", "workdir", "env", "time_limit"} <= set(checks)
    node = checks["job"]["reason"].rsplit(" ", 1)[-1]
    assert node in slurm_cluster.nodes, checks["job"]
    assert "sha256 matches" in checks["deployed"]["reason"], checks["deployed"]
    assert not list((sw.root / "slurm").glob(".doctor.*")), "the probe job's output is removed"
    # A partition the cluster does not have: Slurm's own refusal, doctor exits 1, no job left.
    profile = sw.proj / "profiles" / "cluster.yaml"
    data = yaml.safe_load(profile.read_text())
    data["slurm"]["partition"] = "nosuch"
    profile.write_text(yaml.safe_dump(data))
    code, out, err = cli(sw.proj, "doctor")
    assert code == 1 and "request" in out and "nosuch" in out, (out, err)
    assert not sw.jobs()


def test_any_sbatch_value_and_a_partition_list_reach_slurm_as_given(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """`extra` values with shell syntax and `partition` as a list: doctor's `sbatch --test-only`
    and the queue's job take them as given (one argument each, quoted on every hop), and nothing in
    them runs."""
    marker = slurm_cluster.shared_dir / f"pwned-{uuid.uuid4().hex[:6]}"
    comment = f"my run; $(touch {marker}) `touch {marker}` '{marker}' \"x|y&z\""
    extra = [f"--comment={comment}", "--nodelist=sn[1-3]"]
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=1, queues=1, epochs=2, step_time=0.2,
               slurm={"partition": ["urgent", "main"], "extra": extra})
    (sw.work / "faults").mkdir(exist_ok=True)
    (sw.work / "faults" / "c0.hang").write_text("1\n")  # the job stays while we look at it
    sw.ok("deploy")
    checks = {c["check"]: c for c in sw.ok("doctor")["hosts"]["cluster"]["checks"]}
    assert checks["request"]["ok"] and checks["job"]["ok"], checks
    sw.ok("plan")
    sw.ok("launch", "--all")
    wait_for(lambda: [j["state"] for j in sw.jobs()] == ["RUNNING"], timeout=60, interval=0.5)
    got = slurm_cluster.run("squeue", "-h", "-j", sw.jobs()[0]["id"], "-o", "%P|%k").stdout.strip()
    partition, _, seen = got.partition("|")
    assert seen == comment and partition in ("urgent", "main"), got
    (sw.work / "faults" / "c0.hang").unlink()
    sw.wait_done()
    sw.assert_all_verified_once()
    assert not marker.exists()


def test_a_job_pending_for_a_reason_that_never_clears_is_flagged_with_its_fix(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """A held job (sbatch --hold, then held by the administrator) keeps its cells queued forever:
    status says so in Slurm's words and what to do; released, it runs and nothing is flagged."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=1, queues=1, epochs=1, step_time=0.0,
               slurm={"extra": ["--hold"]})
    sw.ok("plan")
    sw.ok("launch", "--all")
    [job] = sw.jobs()
    [row] = sw.ok("status")["queues"]
    assert row["job"]["reason"] == "JobHeldUser", row
    assert row["job"]["stuck"] == ("will not start by itself (JobHeldUser): the job is held (sbatch "
                                   f"--hold or scontrol hold): `scontrol release {job['id']}`"), row
    slurm_cluster.run("scontrol", "hold", job["id"])  # as root: the administrator's hold
    [row] = sw.ok("status")["queues"]
    assert row["job"]["reason"] == "JobHeldAdmin" and "an administrator holds the job" in row["job"]["stuck"]
    code, out, _ = cli(sw.proj, "status")
    assert code == 0 and "will not start by itself (JobHeldAdmin): an administrator holds" in out, out
    slurm_cluster.run("scontrol", "release", job["id"])
    sw.wait_done()
    sw.assert_all_verified_once()


def test_without_requeue_a_dead_nodes_cells_are_remediated_as_new_jobs(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """`requeue: false`: Slurm ends the job of a node that died instead of restarting it. The queue
    is no longer live and its cut cell is not done; `remediate --launch` puts the cells that are not
    done into a new queue, submitted as a new job, and the sweep completes, each cell once."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=4, queues=2, epochs=8, step_time=1.0,
               slurm={"requeue": False})
    sw.ok("plan")
    sw.ok("launch", "--all")
    cell, job = _mid_cell(sw, min_epoch=1)
    slurm_cluster.node_kill(job["nodes"])
    wait_for(lambda: job["id"] not in {j["id"] for j in sw.jobs()}, timeout=120, interval=0.5)
    # The surviving queue finishes its own cells (and may steal); then the cut cell is left.
    wait_for(lambda: not sw.jobs(), timeout=180, interval=0.5)
    assert cell not in sw.published()
    # Lost by Slurm's own word: the node of the cell's claim is out of service.
    got = sw.ok("status")["cells"][cell]
    assert got["state"] == "lost" and job["nodes"] in got["reason"] and "Slurm" in got["reason"], got
    code, out, err = cli(sw.proj, "logs", cell)
    assert code == 0 and "epoch 1/8" in out, (code, out, err)
    # Unmeasured, the FS's lag is taken as 60 s: remediate acts once the state has settled that long
    # (issue 11's rule for a network FS's client caches); until then it launches nothing.
    got: list[dict[str, Any]] = []

    def remediated() -> bool:
        got.append(sw.ok("remediate", "--launch"))
        return bool(got[-1]["launched"])

    wait_for(remediated, timeout=150, interval=5)
    fixed = got[-1]
    redo = {c for q in fixed["queues"] for c in q["cells"]}
    assert redo == {cell, *(set(sw.cells) - sw.published())}, fixed
    assert all(not g["launched"] for g in got[:-1]) and all(g["unconfirmed"] for g in got[:-1]), got
    sw.wait_done(timeout=180)
    sw.assert_all_verified_once()


def test_through_the_login_node_over_ssh(slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`slurm.login`: no Slurm client here (SLURM_CONF unset: this machine's sbatch would fail); every
    Slurm command and the shared FS go through the login node's sshd, as from a laptop."""
    monkeypatch.delenv("SLURM_CONF")
    assert subprocess.run(["squeue"], capture_output=True).returncode != 0
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=3, queues=2, epochs=3, step_time=0.3,
               login=slurm_cluster.login())
    sw.ok("plan")
    got = sw.ok("launch", "--all")
    assert {r["status"] for r in got["launched"]} == {"launched"}, got
    sw.wait_done()
    sw.assert_all_verified_once()
    rows = sw.ok("status")["queues"]
    assert {r["state"] for r in rows} == {"drained"} and all(r["live"] is False for r in rows), rows
    checks = {c["check"]: c for c in sw.ok("doctor")["hosts"]["cluster"]["checks"]}
    assert all(c["ok"] for c in checks.values()), checks
    assert checks["reachable"]["reason"] == "ssh slurm-login", checks


def _queue_order(sw: Sweep) -> list[str]:
    """The cells of the one planned queue, in its order."""
    [qf] = sorted((sw.proj / "queues").glob("*.txt"))
    return [Path(ln.split()[0]).stem for ln in qf.read_text().splitlines() if ln.strip()
            and not ln.startswith("#")]


def _ev(sw: Sweep, kind: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in sw.events() if e["ev"] == kind and all(e.get(k) == v for k, v in match.items())]


def test_a_restart_re_enters_the_cut_cell_never_the_one_that_failed(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """One queue: its first cell is OOM-killed (exit 137), its second held mid-cell. The job is
    requeued: the new attempt re-enters the cut cell with {resume}=1 and passes over the failed one,
    which stays `oom`, for `ablate remediate` alone (rule 8: retries are remediate's)."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=2, queues=1, epochs=3, step_time=0.5)
    sw.ok("plan")
    failed, cut = _queue_order(sw)
    (sw.work / "faults").mkdir(exist_ok=True)
    (sw.work / "faults" / f"{failed}.oom").write_text("")
    (sw.work / "faults" / f"{cut}.hang").write_text("1\n")
    sw.ok("launch", "--all")
    wait_for(lambda: _ev(sw, "end", cell=failed) and any(e["ev"] == "epoch" for e in sw.trace(cut)),
             timeout=120, interval=0.5)
    [job] = sw.jobs()
    slurm_cluster.run("scontrol", "requeue", job["id"])
    wait_for(lambda: len(_ev(sw, "start", cell=cut)) == 2, timeout=150, interval=0.5)
    (sw.work / "faults" / f"{cut}.hang").unlink()
    wait_for(lambda: sw.published() == {cut} and not sw.jobs(), timeout=150, interval=0.5)
    assert [e["resume"] for e in _ev(sw, "start", cell=cut)] == [0, 1]
    assert len(_ev(sw, "start", cell=failed)) == 1, sw.explain()  # never re-entered
    assert [e["rc"] for e in _ev(sw, "end", cell=failed)] == [137]
    out = (sw.root / "slurm").glob("*.out")
    assert any(f"{failed} ended with exit 137 in an earlier run" in p.read_text() for p in out)
    st = sw.ok("status")
    assert st["cells"][failed]["state"] == "oom", st["cells"][failed]
    fix = sw.ok("remediate")
    assert list(fix["targets"]) == [failed], fix


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
    wait_for(lambda: sw.published() == {after} and not sw.jobs(), timeout=480, interval=1)
    [end] = _ev(sw, "end", cell=stuck)
    assert end["rc"] == 124 and end["reason"] == "no_progress", end
    # Each attempt that ran it was cut at its time limit (2, or 3 when Slurm's first signal came
    # before epoch 1 was saved); the last resumed from epoch 1 and saved nothing more.
    cuts = _ev(sw, "queue_stop", reason="time_limit", cell=stuck)
    starts = [e for e in sw.trace(stuck) if e["ev"] == "start"]
    assert len(cuts) == len(starts) >= 2 and starts[-1]["start_epoch"] == 1, (starts, sw.explain())
    assert end["checkpoint"] != "none", end  # its epoch-1 checkpoint, found where the spec says
    attempts = sorted((e["attempt"] for e in _ev(sw, "queue_start")), key=lambda a: int(a.split(".")[1]))
    assert end["since"] == attempts[len(cuts) - 2], (end, attempts)
    assert not [e for e in _ev(sw, "start", cell=stuck) if e["t"] > end["t"]]
    cell = sw.ok("status")["cells"][stuck]
    assert cell["state"] == "too_long" and "raise slurm.time" in cell["reason"], cell
    fix = sw.ok("remediate")
    assert fix["targets"][stuck]["state"] == "too_long", fix


def test_a_queue_ends_after_max_restarts_and_leaves_its_cut_cell_to_remediate(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """`max_restarts: 1`: the first restart re-enters the cut cell; at the second the queue ends at
    once (`queue_stop`, reason max_restarts) and its cut cell is `interrupted`, saying why."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=1, queues=1, epochs=3, step_time=0.5,
               slurm={"max_restarts": 1})
    [cell] = sw.cells
    (sw.work / "faults").mkdir(exist_ok=True)
    (sw.work / "faults" / f"{cell}.stall").write_text("1\n")
    sw.ok("plan")
    sw.ok("launch", "--all")
    wait_for(lambda: any(e["ev"] == "epoch" for e in sw.trace(cell)), timeout=120, interval=0.5)
    [job] = sw.jobs()
    for n in (1, 2):
        wait_for(lambda n=n: len(_ev(sw, "start", cell=cell)) == n, timeout=150, interval=0.5)
        slurm_cluster.run("scontrol", "requeue", job["id"])
    wait_for(lambda: _ev(sw, "queue_stop", reason="max_restarts") and not sw.jobs(), timeout=150,
             interval=0.5)
    [stop] = _ev(sw, "queue_stop", reason="max_restarts")
    assert stop["restarts"] == 2, stop
    assert len(_ev(sw, "start", cell=cell)) == 2, sw.explain()  # the third attempt ran nothing
    got = sw.ok("status")["cells"][cell]
    assert got["state"] == "interrupted" and "max_restarts" in got["reason"], got
    fix = sw.ok("remediate")  # an absence (no `end`): a target once the FS's lag has passed
    assert [*fix["targets"], *fix["unconfirmed"]] == [cell], fix


def test_a_drained_queue_takes_the_cells_of_a_queue_whose_job_is_still_pending(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """Two queues whose jobs can only run one at a time (one node, --exclusive): the second job
    pends. When the first queue drains it steals the pending queue's lines (its ledger older than a
    fresh heartbeat, no heartbeat); when the pending job starts at last, every line is claimed or
    published and it runs nothing: each cell trains once."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=4, queues=2, epochs=4, step_time=4.0,
               slurm={"extra": ["--nodelist=sn1", "--exclusive"]})
    sw.ok("plan")
    sw.ok("launch", "--all")
    sw.wait_done(timeout=420)
    sw.assert_all_verified_once()
    steals = _ev(sw, "steal")
    assert len(steals) == 2 and len({e["from_queue"] for e in steals}) == 1, sw.explain()
    victim = sw.root / "events" / f"cluster.{steals[0]['from_queue']}.jsonl"
    mine = [json.loads(line) for line in victim.read_text().splitlines() if line.strip()]
    # it started once the thief's job ended, found its lines taken and ran nothing
    assert [e["ev"] for e in mine if e["ev"] in ("queue_start", "queue_end")] == ["queue_start", "queue_end"]
    assert not [e for e in mine if e["ev"] == "start"], mine
    assert {e["reason"] for e in mine if e["ev"] == "skip"} <= {"claimed", "done"}, mine
