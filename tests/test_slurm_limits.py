"""Submit limits on a real Slurm cluster that enforces them (tests/slurmbed.py with accounting and
`AccountingStorageEnforce=associations,limits,qos`; the user's association gets MaxSubmitJobs with
sacctmgr, as an administrator sets it): a launch submits no more than the limit, the rest wait on
the shared FS and start as earlier jobs end, without the user doing anything; a refusal is shown by
`status` in Slurm's words."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import slurmbed
from tests.helpers.cli import Cli
from tests.helpers.slurm_sweep import Sweep
from tests.helpers.wait import wait_for
from tests.slurmbed import SlurmBed

pytestmark = pytest.mark.bed  # tests/helpers/tiers.py

LIMIT = 5


@pytest.fixture
def limited(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmBed]:
    """An accounting bed whose user (root) may have at most LIMIT jobs pending or running."""
    reason = slurmbed.missing_requirement(accounting=True)
    if reason:
        pytest.skip(reason)
    bed = SlurmBed(3, accounting=True)
    bed.overrides = {"AccountingStorageEnforce": "associations,limits,qos"}
    with bed as sb:
        monkeypatch.setenv("SLURM_CONF", str(sb.conf_path))
        sb.run("sacctmgr", "-i", "modify", "user", "root", "set", f"MaxSubmitJobs={LIMIT}")
        # slurmctld has the new limit once sbatch is refused past it (its cache is updated async).
        held = [sb.sbatch("true", "--hold") for _ in range(LIMIT)]
        wait_for(lambda: sb.run("sbatch", "--hold", "--wrap", "true", check=False).returncode != 0,
                 timeout=30, interval=0.5)
        sb.run("scancel", *held)
        wait_for(lambda: not sb.squeue(), timeout=30, interval=0.2)
        yield sb


def counted(squeue_lines: str) -> list[str]:
    """The jobs of `squeue -o "%i %t"` that count against MaxSubmitJobs. A job leaves the count when
    it completes (slurmctld's job_completion_logger calls acct_policy_remove_job_submit) but squeue
    still lists it as CG (completing) until its nodes are cleaned up; a sample counting CG jobs
    could see LIMIT + 1 while Slurm held LIMIT."""
    rows = (line.split() for line in squeue_lines.splitlines())
    return [w[0] for w in rows if w and w[1:] != ["CG"]]


def test_a_completing_job_is_not_counted() -> None:
    assert counted("11 R\n12 PD\n13 CG\n14 CF\n\n") == ["11", "12", "14"]


class Peak(threading.Thread):
    """The most jobs counted against the limit at once, sampled every 0.2 s until stopped."""

    def __init__(self, sb: SlurmBed) -> None:
        super().__init__(daemon=True)
        self.sb, self.stop, self.peak, self.samples = sb, threading.Event(), 0, 0
        self.at_peak = ""

    def run(self) -> None:
        while not self.stop.wait(0.2):
            out = self.sb.run("squeue", "-h", "-r", "-o", "%i %t", check=False).stdout
            n = len(counted(out))
            if n > self.peak:
                self.peak, self.at_peak = n, out
            self.samples += 1


def _overlap(sb: SlurmBed, sweep: str) -> int:
    """The most of the sweep's jobs in Slurm at once by its own accounting (submit to end)."""
    out = sb.run("sacct", "-X", "-n", "-P", "-a", "-S", "now-1hours", "-o", "JobName,Submit,End").stdout
    marks: list[tuple[str, int]] = []
    for line in out.splitlines():
        name, submit, end = line.split("|")
        if sweep in name:
            marks += [(submit, 1), (end, -1)]
    now = peak = 0
    for _, d in sorted(marks, key=lambda m: (m[0], m[1])):  # an end before a submit of the same second
        now += d
        peak = max(peak, now)
    return peak


def test_launch_all_of_40_queues_under_max_submit_jobs_runs_every_queue(
        limited: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """40 queues of one tiny cell each, MaxSubmitJobs 5: launch --all reports every queue launched,
    Slurm never holds more than 5 of them, the rest wait on the shared FS and each is submitted by a
    finishing job's hook (nobody runs ablate meanwhile); every cell is published and verified once."""
    sb = limited
    sw = Sweep(sb, tmp_path, cli, cells=40, queues=40, epochs=1, step_time=0.0)
    plan = sw.ok("plan")
    assert len(plan["queues"]) == 40
    peak = Peak(sb)
    peak.start()
    try:
        got = sw.ok("launch", "--all")
        assert len(got["launched"]) == 40 and {r["status"] for r in got["launched"]} == {"launched"}, got
        waiting = sw.root / "slurm" / "waiting"
        parked = [p for p in waiting.iterdir() if not p.name.startswith(".")]
        assert parked, "none left waiting"
        sw.wait_done(timeout=600)
    finally:
        peak.stop.set()
        peak.join()
    assert peak.samples > 50 and 0 < peak.peak <= LIMIT, (peak.peak, peak.samples, peak.at_peak)
    assert _overlap(sb, sw.sweep) <= LIMIT
    assert not [p for p in waiting.iterdir() if not p.name.startswith(".")]
    logs = "".join(p.read_text() for p in (sw.root / "slurm").glob("*.out"))
    # What still waited when launch returned was submitted by finishing jobs' hooks (nobody ran
    # ablate meanwhile), and every queue's job was submitted once.
    assert logs.count("[ablate on exit] submitted waiting queue") >= len(parked), (len(parked), logs[-3000:])
    ids = {p.stem: p.read_text().split() for p in (sw.root / "slurm").glob("*.jobs")}
    assert len(ids) == 40 and all(len(v) == 1 for v in ids.values()), ids
    sw.assert_all_verified_once()
    rows = sw.ok("status")["queues"]
    assert len(rows) == 40 and {r["state"] for r in rows} == {"drained"}, rows


def test_a_refusal_leaves_the_queue_waiting_and_status_shows_slurms_words(
        limited: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """The user's own other jobs fill the limit: sbatch refuses the sweep's second job
    (AssocMaxSubmitJobLimit); the queue waits, `status` says why in Slurm's words; once the other
    jobs go, `status` submits it, and the sweep completes."""
    sb = limited
    other = [sb.sbatch("true", "--hold") for _ in range(LIMIT - 1)]
    sw = Sweep(sb, tmp_path, cli, cells=2, queues=2, epochs=1, step_time=0.0)
    sw.ok("plan")
    code, out, err = cli(sw.proj, "launch", "--all", "--json")
    got = json.loads(out)
    assert code == 0 and {r["status"] for r in got["launched"]} == {"launched"}, (got, err)
    assert "waits to be submitted (sbatch: error: " in err and "AssocMaxSubmitJobLimit" in err, err
    rows = {r["queue"]: r for r in sw.ok("status")["queues"]}
    waiting = [r for r in rows.values() if r["job"] and r["job"]["state"] == "WAITING"]
    assert len(waiting) == 1 and "AssocMaxSubmitJobLimit" in waiting[0]["job"]["reason"], rows
    code, out, _ = cli(sw.proj, "status")
    assert code == 0 and f"job of {waiting[0]['queue']}: WAITING to be submitted: sbatch: error: " \
                         "AssocMaxSubmitJobLimit" in out, out
    sb.run("scancel", *other)
    wait_for(lambda: all(j["state"] != "WAITING" for r in sw.ok("status")["queues"] if (j := r["job"])),
             timeout=60, interval=2)
    sw.wait_done(timeout=240)
    sw.assert_all_verified_once()
    assert json.loads(json.dumps(sw.ok("status")))["queues"]
