"""A sweep on a real Slurm cluster (tests/slurmbed.py: slurmctld + three slurmd nodes, each its own
network, hostname and /tmp, one shared directory), `transport: slurm`, each queue one batch job
running the same run_queue: submitted from here or through the login node over ssh, verified and
gated as anywhere; doctor's checks of the request in a probe job; `sbatch` values and a partition
list reaching Slurm as given. Each ends with every cell verified and trained exactly once,
counted by the trainer itself (its trace on the shared scratch)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from tests.helpers.cli import Cli
from tests.helpers.slurm_jobs import slurm_env_fixture
from tests.helpers.slurm_sweep import Sweep
from tests.helpers.wait import wait_for
from tests.slurmbed import SlurmBed

pytestmark = pytest.mark.usefixtures("_slurm_env")
_slurm_env = slurm_env_fixture()


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
