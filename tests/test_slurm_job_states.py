"""What ablate reads of a queue's Slurm job on a real cluster (tests/slurmbed.py): a job pending
for a reason that never clears is flagged in Slurm's words with its fix; with accounting, a
queue's last job as sacct has it, beside the FS's cell states; and a queue whose job is still
pending has its cells taken by a drained one, so each cell trains once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import slurmbed
from tests.helpers.cli import Cli
from tests.helpers.slurm_jobs import ev as _ev
from tests.helpers.slurm_jobs import mid_cell as _mid_cell
from tests.helpers.slurm_jobs import slurm_env_fixture
from tests.helpers.slurm_sweep import Sweep
from tests.helpers.wait import wait_for
from tests.slurmbed import SlurmBed

pytestmark = pytest.mark.usefixtures("_slurm_env")
_slurm_env = slurm_env_fixture()


def test_a_job_pending_for_a_reason_that_never_clears_is_flagged_with_its_fix(
        slurm_cluster: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """A held job (sbatch --hold, then held by the administrator) keeps its cells queued forever:
    status says so in Slurm's words and what to do; released, it runs and nothing is flagged."""
    sw = Sweep(slurm_cluster, tmp_path, cli, cells=1, queues=1, epochs=1, step_time=0.0,
               slurm={"extra": ["--hold"]})
    sw.ok("plan")
    sw.ok("launch", "--all")
    [job] = sw.jobs()
    got = sw.ok("status")
    [row] = got["queues"]
    assert row["job"]["reason"] == "JobHeldUser", row
    # no autostop on a cluster: the job ends with its queue, and status says what it holds meanwhile
    held = got["autostop"]["cluster"]
    assert held["kind"] == "job_ends" and "1 still hold" in held["why"], held
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
    wait_for(lambda: not sw.jobs(), timeout=60)
    ended = sw.ok("status")["autostop"]["cluster"]
    assert ended["why"] == "Slurm: its queues' jobs have ended with them: no allocation is held", ended


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
        # every cell held after epoch 2 until the stop: on a loaded machine 6 epochs of 0.5 s ended
        # before it, and the job COMPLETED instead of being CANCELLED
        (sw.work / "faults").mkdir(exist_ok=True)
        for c in sw.cells:
            (sw.work / "faults" / f"{c}.hang").write_text("2\n")
        sw.ok("plan")
        sw.ok("launch", "--all")
        cell, job = _mid_cell(sw, min_epoch=1)
        queue = next(r["queue"] for r in sw.ok("status")["queues"]
                     if r["job"] and r["job"]["id"] == job["id"])
        sw.ok("stop", queue, "--host", "cluster")
        for c in sw.cells:
            (sw.work / "faults" / f"{c}.hang").unlink()
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
