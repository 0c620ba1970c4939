"""A queue's Slurm job cut mid-cell on a real cluster (tests/slurmbed.py) and restarted: requeued
by hand, preempted, or its node dead, Slurm restarts the batch script and the queue re-enters its
cut cell with {resume}=1 (never a cell that failed), leaving what is published and what the other
queues hold; after `max_restarts` it ends and leaves the cell to remediate; with `requeue: false`
remediate re-runs a dead node's cells as a new job. Each cell trains to the end once, counted by
the trainer itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

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


def _launch_and_hold_mid_cell(sw: Sweep, min_epoch: int) -> tuple[str, dict[str, str]]:
    """Plan and launch; once a cell is past `min_epoch`, its job is requeued and held: Slurm keeps
    it pending until released, however slow this machine is. (the cell, its job)"""
    sw.ok("plan")
    sw.ok("launch", "--all")
    cell, job = _mid_cell(sw, min_epoch=min_epoch)
    sw.sb.run("scontrol", "requeuehold", job["id"])
    wait_for(lambda: sw.sb.job(job["id"]).get("JobState") == "PENDING", timeout=30)
    return cell, job


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


def test_a_node_that_dies_mid_cell_is_requeued_by_slurm_and_its_cell_resumed(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """ckpt_root on each node's own disk: the dead node's checkpoint is out of reach, and the job
    requeued onto another node restores the cut cell's durable copy from the shared FS."""
    # A checkpoint every 2 s: the keeper copies one once it has stayed the same for a second.
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=4, queues=2, epochs=5, step_time=2.0, node_local=True)
    sw.ok("plan")
    sw.ok("launch", "--all")
    cell, job = _mid_cell(sw, min_epoch=1)
    sw.wait_until(lambda: list((sw.root / "resume" / cell).glob("[0-9]*/RESUME.json")), timeout=60,
                  interval=0.2)
    node = job["nodes"]
    slurm_cluster.node_kill(node)
    # Slurm notices (SlurmdTimeout), requeues the job on another node; the queue re-enters.
    sw.wait_done(timeout=300)
    sw.assert_all_verified_once()
    assert _resumed(sw, cell), sw.trace(cell)
    starts = [e for e in sw.events() if e["ev"] == "queue_start" and e["attempt"].startswith(job["id"] + ".")]
    assert starts[0]["node"] == node and starts[-1]["node"] != node, starts
    restored = _ev(sw, "restore", cell=cell)
    assert [e["from"] for e in restored] == ["copy"] and restored[0]["made_on"] == "cluster", restored
    assert not (sw.root / "resume" / cell).exists()  # published: its copies gone


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
