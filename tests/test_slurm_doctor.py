"""`ablate doctor` on a Slurm host: small probe jobs, ckpt_root on two nodes, the GPUs apart, and
the planned cells' seconds against `time - grace` and `max_restarts`.

On the real Slurm bed (tests/slurmbed.py): the probe (`--time=2`) starts before a reservation
that keeps every node from a job of the queue's full `time`; a ckpt_root on the nodes' private
local disk is reported node-local (and the nonce left there is removed by a job pinned to that
node), one on the shared dir passes; on a bed whose nodes have one GPU each (GRES), a GPU probe
that cannot start is "not checked" while the node checks pass. Without Slurm: which of the queue's
options a probe keeps, and the time checks on learned durations (event files on a local shared FS).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ablate.config.project import load_project
from ablate.config.slurm import SlurmSettings
from ablate.doctor.slurm import gpu_verdict, time_checks
from ablate.doctor.slurm_probe import ProbeJob, ProbeResult, ckpt_check, gpu_options, probe_options
from ablate.run.host_measure import Section
from tests import slurmbed
from tests.helpers.cli import Cli
from tests.helpers.slurm_sweep import Sweep
from tests.helpers.wait import wait_for
from tests.slurmbed import SlurmBed

# --------------------------------------------------------------------------- the real Slurm bed


@pytest.fixture
def bed(slurm_cluster: SlurmBed, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmBed]:
    """The session's bed, its client commands here; every test leaves no job, no reservation and
    every node up."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf_path))
    yield slurm_cluster
    for name in slurm_cluster.run("scontrol", "-o", "show", "reservation", check=False).stdout.split("\n"):
        if name.startswith("ReservationName="):
            slurm_cluster.run("scontrol", "delete", f"ReservationName={name.split()[0].split('=', 1)[1]}")
    slurm_cluster.heal()


def checks_of(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["check"]: c for c in report["hosts"]["cluster"]["checks"]}


def doctor_jobs(sb: SlurmBed) -> list[dict[str, str]]:
    return [j for j in sb.squeue() if j["name"].startswith("ablate-doctor-")]


def set_profile(sw: Sweep, **keys: Any) -> None:
    path = sw.proj / "profiles" / "cluster.yaml"
    data = yaml.safe_load(path.read_text())
    slurm = keys.pop("slurm", None)
    data.update(keys)
    data["slurm"].update(slurm or {})
    path.write_text(yaml.safe_dump(data))


def test_the_probe_asks_two_minutes_and_starts_before_a_reservation_the_full_time_would_not(
        bed: SlurmBed, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node is reserved from 4 minutes on: a job of the queue's 10-minute `time` cannot start
    before it (it pends), and Slurm still accepts it (`sbatch --test-only`: it would start after);
    doctor's probes ask 2 minutes and one task, so the scheduler starts them now, and every check
    passes, ckpt_root (on the shared dir) seen as one directory on two nodes."""
    monkeypatch.setenv("ABLATE_SLURM_PROBE_WAIT", "40")
    bed.run("scontrol", "create", "reservation", "ReservationName=maint", "StartTime=now+240",
            "Duration=60", "Nodes=ALL", "Users=root", "Flags=MAINT,IGNORE_JOBS")
    sw = Sweep(bed, tmp_path, cli, cells=2, queues=1, epochs=1, step_time=0.0,
               slurm={"extra": ["--mem=500", "--cpus-per-task=1", "--comment=probe me"]})
    full = bed.sbatch("true", "--time=10:00")
    sw.ok("deploy")
    started = time.monotonic()
    rep = sw.ok("doctor")
    took = time.monotonic() - started
    checks = checks_of(rep)
    assert all(c["ok"] for c in checks.values()), checks
    assert bed.job(full)["JobState"] == "PENDING", bed.job(full)  # the full time waits for the window
    assert "--time=10:00" in checks["request"]["reason"] and "--mem=500" in checks["request"]["reason"]
    job = checks["job"]["reason"]
    assert "--time=2" in job and "--ntasks=1" in job and "'--comment=probe me'" in job, job
    assert "--mem" not in job and "--cpus-per-task" not in job and "10:00" not in job, job
    a, b = checks["ckpt_root"]["reason"].split(" is one directory on ", 1)[1].split(":", 1)[0].split(" and ")
    assert a != b and {a, b} <= set(bed.nodes), checks["ckpt_root"]
    assert str(sw.scratch) in checks["ckpt_root"]["reason"]
    assert took < 40, took  # nothing waited for the window
    assert not list(sw.scratch.glob(".ablate-doctor.*")), "the second node removed the nonce"
    assert not doctor_jobs(bed)


def test_a_node_local_ckpt_root_without_resume_copies_is_a_problem_naming_the_fix(
        bed: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """ckpt_root on each node's private local disk (one path, a different directory on every
    node) and no durable resume copies (`resume: false`): the nonce the first probe wrote there is
    not on the second node; doctor exits 1 naming ckpt_root and shared scratch, and the nonce left
    on the first node is removed by a job there. (With the copies, the default, a node-local
    ckpt_root is fine: tests/test_slurm_requeue.py resumes a dead node's cell from them.)"""
    sw = Sweep(bed, tmp_path, cli, cells=1, queues=1, epochs=1, step_time=0.0)
    local = f"{bed.local_path}/ckpt-{sw.sweep}"
    set_profile(sw, ckpt_root=local)
    config = yaml.safe_load((sw.proj / "ablate.yaml").read_text())
    (sw.proj / "ablate.yaml").write_text(yaml.safe_dump({**config, "resume": False}, sort_keys=False))
    sw.ok("deploy")
    code, out, err = cli(sw.proj, "doctor", "--json")
    checks = checks_of(json.loads(out))
    assert code == 1, (out, err)
    bad = [n for n, c in checks.items() if not c["ok"]]
    assert bad == ["ckpt_root"], checks
    reason = checks["ckpt_root"]["reason"]
    assert reason.startswith("ckpt_root is node-local: ") and local in reason, reason
    assert "resume after a requeue fails" in reason and "shared scratch" in reason, reason
    first = checks["job"]["reason"].rsplit(" ", 1)[-1]
    nonce = bed.local_dir(first) / f"ckpt-{sw.sweep}"
    assert list(nonce.glob(".ablate-doctor.*")) or not doctor_jobs(bed), "written on the first node"
    wait_for(lambda: not list(nonce.glob(".ablate-doctor.*")) and not doctor_jobs(bed), timeout=60,
             interval=0.5)
    others = [n for n in bed.nodes if n != first]
    assert all(not list((bed.local_dir(n) / f"ckpt-{sw.sweep}").glob(".ablate-doctor.*")) for n in others)
    code, out, _ = cli(sw.proj, "doctor")
    assert code == 1 and re.search(r"^cluster +ckpt_root +FAIL +ckpt_root is node-local: ", out, re.M), out


def test_a_second_node_that_cannot_be_had_leaves_a_plain_warning(
        bed: SlurmBed, tmp_path: Path, cli: Cli) -> None:
    """The queue's jobs may run on one node only (`--nodelist=sn2`): no probe can run elsewhere,
    so whether ckpt_root is shared is not known: doctor passes and says so, and that the cells'
    durable resume copies make it no matter (without them, `resume: false`, it warns:
    test_ckpt_root_same_node_local_unwritable_or_unknown)."""
    sw = Sweep(bed, tmp_path, cli, cells=1, queues=1, epochs=1, step_time=0.0,
               slurm={"extra": ["--nodelist=sn2"]})
    sw.ok("deploy")
    checks = checks_of(sw.ok("doctor"))
    assert all(c["ok"] for c in checks.values()), checks
    reason = checks["ckpt_root"]["reason"]
    assert reason.startswith("whether ") and "is not checked" in reason, reason
    assert "either way, a requeued job's cut cell resumes from its durable copy" in reason, reason
    assert checks["job"]["reason"].endswith(" ran on sn2"), checks["job"]
    wait_for(lambda: not list(sw.scratch.glob(".ablate-doctor.*")) and not doctor_jobs(bed), timeout=60,
             interval=0.5)


class GpuBed(SlurmBed):
    """The bed with one GPU per node as Slurm counts them (GRES `gpu:1`; nothing here has a real
    one) and two CPUs, so a job holding a node's GPU leaves room for a probe without."""

    def _write_conf(self) -> None:
        super()._write_conf()
        text = self.conf_path.read_text().replace("CPUs=1 RealMemory=1000",
                                                  "CPUs=2 RealMemory=1000 Gres=gpu:1")
        self.conf_path.write_text("GresTypes=gpu\nSlurmdParameters=config_overrides\n" + text)
        # gres/gpu counts device files (Count alone registers 0): /dev/null stands for the GPU.
        self.conf_path.with_name("gres.conf").write_text("AutoDetect=off\nName=gpu File=/dev/null\n")


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[GpuBed]:
    reason = slurmbed.missing_requirement()
    if reason:
        pytest.skip(reason)
    with GpuBed(3) as bed:
        yield bed


@pytest.fixture
def gpu_bed(gpu_cluster: GpuBed, monkeypatch: pytest.MonkeyPatch) -> Iterator[GpuBed]:
    monkeypatch.setenv("SLURM_CONF", str(gpu_cluster.conf_path))
    yield gpu_cluster
    gpu_cluster.heal()


@pytest.mark.bed
def test_the_gpus_are_a_probe_of_their_own_and_one_that_cannot_start_is_not_checked(
        gpu_bed: GpuBed, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpus: 1`: the node checks run in a probe without GPUs, the GPU check in one with
    `--gres=gpu:1 --time=2`. Every node's GPU held by another job: the GPU probe pends (Resources)
    and is cancelled after the wait, the GPU check says "not checked" and doctor passes, the node
    checks done by the probe that started."""
    sw = Sweep(gpu_bed, tmp_path, cli, cells=1, queues=1, epochs=1, step_time=0.0, slurm={"gpus": 1})
    sw.ok("deploy")
    checks = checks_of(sw.ok("doctor"))
    assert all(c["ok"] for c in checks.values()), checks
    assert "--gres=gpu:1" in checks["request"]["reason"] and "--gres" not in checks["job"]["reason"], checks
    gpu = checks["gpu"]["reason"]
    assert re.fullmatch(r"no GPU \(nvidia-smi not found\) \(a probe job with --gres=gpu:1 on sn\d\)",
                        gpu), gpu
    holders = [gpu_bed.sbatch("sleep 300", "--gres=gpu:1", "--time=10", "-w", n) for n in gpu_bed.nodes]
    for job in holders:
        gpu_bed.wait_job(job, "RUNNING")
    monkeypatch.setenv("ABLATE_SLURM_PROBE_WAIT", "8")
    checks = checks_of(sw.ok("doctor"))
    assert all(c["ok"] for c in checks.values()), checks
    gpu = checks["gpu"]["reason"]
    assert gpu.startswith("not checked: a probe job with --gres=gpu:1 and --time=2: it did not run within "
                          "8 s (PENDING Resources); cancelled"), gpu
    assert "whether its GPUs are visible on a node is not known" in gpu, gpu
    assert checks["job"]["reason"].split(" ran on ")[1] in gpu_bed.nodes, checks["job"]
    assert "is one directory on" in checks["ckpt_root"]["reason"], checks["ckpt_root"]
    assert not doctor_jobs(gpu_bed), gpu_bed.squeue()


# --------------------------------------------------------------------------- without Slurm


def test_a_probe_keeps_where_the_queues_jobs_run_and_drops_what_they_ask() -> None:
    s = SlurmSettings(partition="gpu,gpu-long", account="lab", qos="normal", time="1-00:00:00", gpus=2,
                      extra=("--constraint=a100|h100", "--mem=64G", "--cpus-per-task=8", "-c8",
                             "--exclusive", "--gpus-per-node=2", "--mem-per-gpu=10G", "--nodelist=n[1-4]",
                             "--exclude=n9", "--hold", "--comment=x y", "--mem-per-c=4G", "-Cib", "-G2",
                             "--reservation=lab", "--begin=now+1hour", "--tmp=100G"))
    where = ["--partition=gpu,gpu-long", "--account=lab", "--qos=normal", "--time=2", "--ntasks=1",
             "--no-requeue", "--constraint=a100|h100"]
    assert probe_options(s) == [*where, "--nodelist=n[1-4]", "--exclude=n9", "--comment=x y", "-Cib",
                                "--reservation=lab"]
    assert probe_options(s, "n3") == [*where, "--nodelist=n[1-4]", "--comment=x y", "-Cib",
                                      "--reservation=lab", "--exclude=n3,n9"]
    assert gpu_options(s) == [*probe_options(s), "--gres=gpu:2", "--gpus-per-node=2", "-G2"]
    assert gpu_options(SlurmSettings(extra=("--mem=1G",))) is None
    assert probe_options(SlurmSettings()) == ["--time=2", "--ntasks=1", "--no-requeue"]
    assert probe_options(SlurmSettings(extra=("-xn1",)), "n2") == ["--time=2", "--ntasks=1", "--no-requeue",
                                                                  "--exclude=n2,n1"]


class Learned:
    """A Slurm project of 4 cells in 2 planned queues (shared FS a directory here: no `login`) and
    the event files of cells that ran, as the runners write them: what the time checks learn from."""

    def __init__(self, tmp: Path, cli: Cli) -> None:
        self.root, self.cli, self.shared = tmp / "proj", cli, tmp / "shared"
        for i in range(4):
            (self.root / "configs" / f"c{i}.yaml").parent.mkdir(parents=True, exist_ok=True)
            (self.root / "configs" / f"c{i}.yaml").write_text(yaml.safe_dump({"seed": i}))
        (self.root / "profiles").mkdir()
        self.profile()
        (self.root / "ablate.yaml").write_text(yaml.safe_dump({
            "profile": "cluster", "sweep": "s1", "workdir": str(self.root),
            "train": "python train.py --config {cfg} --out {ckpt_dir} --resume {resume}",
            "artifacts": {"checkpoint": "model.pt"},
            "tasks": {"t": {"epochs": 2, "cost_per_epoch": 1.0}},
            "cells": [{"glob": "configs/*.yaml", "task": "t"}],
            "hosts": {"cluster": {"queues": 2}}}))
        plan = cli.json(self.root, "plan")
        self.queues = {q["queue"]: q["cells"] for q in plan["queues"]}
        assert len(self.queues) == 2 and all(len(c) == 2 for c in self.queues.values()), plan

    def profile(self, **slurm: Any) -> None:
        (self.root / "profiles" / "cluster.yaml").write_text(yaml.safe_dump({
            "transport": "slurm", "shared_fs": str(self.shared), "ckpt_root": str(self.shared / "ckpt"),
            "python": sys.executable, "slurm": {"time": "10:00", "grace": 60, **slurm}}))

    def ran(self, seconds: float) -> None:
        """Every planned cell ran once, from its start, in `seconds`."""
        t = 1_700_000_000.0
        for q, cells in self.queues.items():
            evs: list[dict[str, Any]] = [{"t": t, "ev": "queue_start", "host": "cluster", "queue": q}]
            for c in cells:
                base = {"host": "cluster", "queue": q, "idx": 0, "cell": c}
                evs += [{"t": t, "ev": "start", "resume": 0, **base},
                        {"t": t + seconds, "ev": "end", "rc": 0, "dur": seconds, **base}]
                t += seconds
            path = self.shared / "ablate" / "s1" / "events" / f"cluster.{q}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(e) + "\n" for e in evs))

    def checks(self, **slurm: Any) -> dict[str, tuple[bool, str]]:
        self.profile(**slurm)
        project = load_project(self.root)
        return {name: (ok, reason) for name, ok, reason in time_checks(project, project.host("cluster"))}


def test_before_any_cell_has_run_the_times_are_not_compared(tmp_path: Path, cli: Cli) -> None:
    got = Learned(tmp_path, cli).checks()
    assert got == {"time_limit": (True, "10:00 per job; not compared with the cells and queues yet (costs "
                                        "are relative until cells have run)")}


def test_cells_and_queues_within_time_minus_grace_pass(tmp_path: Path, cli: Cli) -> None:
    lp = Learned(tmp_path, cli)
    lp.ran(100.0)
    got = lp.checks()
    assert got["longest_cell"][0] and "needs about 1m40s, within time - grace = 10:00 - 60 s = 9m00s" \
        in got["longest_cell"][1], got
    assert got["time_limit"] == (True, "10:00 per job; the longest planned queue needs about 3m20s"), got


def test_a_cell_longer_than_time_minus_grace_needs_a_trainer_that_resumes(tmp_path: Path, cli: Cli) -> None:
    """Each cell 11m40s against 9m00s of each job: with resubmit a warning (only a trainer that
    resumes finishes it), each queue 2 restarts; without resubmit a problem, cell and queue."""
    lp = Learned(tmp_path, cli)
    lp.ran(700.0)
    ok, why = lp.checks()["longest_cell"]
    assert ok and why.startswith("warning: c") and "needs about 11m40s, more than time - grace = 10:00 " \
        "- 60 s = 9m00s: it finishes only if the trainer saves when told (TERM) and resumes" in why, why
    assert "raise slurm.time above 12m40s" in why, why
    ok, why = lp.checks()["time_limit"]
    assert ok and "needs about 23m20s, over time - grace = 10:00 - 60 s = 9m00s: its job will be requeued " \
        "about 2 time(s) (slurm.max_restarts 10)" in why, why
    for off in ({"resubmit": False}, {"requeue": False}):
        got = lp.checks(**off)
        assert not got["longest_cell"][0] and "and resubmit is off: the time limit cuts it every time and " \
            "it never finishes: raise slurm.time above 12m40s" in got["longest_cell"][1], got
        assert not got["time_limit"][0] and "resubmit is off" in got["time_limit"][1], got


def test_a_queue_needing_more_restarts_than_max_restarts_is_a_problem_with_both_numbers(
        tmp_path: Path, cli: Cli) -> None:
    lp = Learned(tmp_path, cli)
    lp.ran(700.0)
    ok, why = lp.checks(max_restarts=1)["time_limit"]
    assert not ok and "needs about 23m20s: 2 restarts of its job at time - grace = 10:00 - 60 s = 9m00s " \
        "each, more than slurm.max_restarts 1, so it would end unfinished: raise slurm.max_restarts to 2, " \
        "raise slurm.time, or plan more queues (hosts.cluster.queues, then ablate plan)" in why, why
    assert lp.checks(max_restarts=2)["time_limit"][0]


def _probe(rc: int, got: dict[str, Section], pending: str | None = None, error: str = "",
           opts: tuple[str, ...] = ("--time=2", "--gres=gpu:1")) -> ProbeResult:
    return ProbeResult(ProbeJob("ablate-doctor-x", opts, ()), rc, got, pending, error, 30.0)


def test_a_gpu_probe_that_cannot_start_fails_only_for_a_reason_that_never_clears() -> None:
    def judge(sec: Section | None) -> tuple[str, bool, str]:
        return ("gpu", sec is not None, "judged")

    busy = gpu_verdict(_probe(124, {}, "PENDING Resources"), judge)
    assert busy[:2] == ("gpu", True) and busy[2].startswith("not checked: a probe job with --gres=gpu:1 "
                                                            "and --time=2: it did not run within 30 s"), busy
    held = gpu_verdict(_probe(124, {}, "PENDING QOSMaxGRESPerJob"), judge)
    assert not held[1] and "will not start by itself (QOSMaxGRESPerJob): it asks for more GPUs than the " \
        "QOS allows per job: lower slurm.gpus" in held[2], held
    refused = gpu_verdict(_probe(1, {}, None, "sbatch: error: Invalid generic resource"), judge)
    assert not refused[1] and refused[2].endswith("failed: sbatch exited 1: sbatch: error: Invalid generic "
                                                  "resource"), refused
    ran = gpu_verdict(_probe(0, {"node": Section(0, "g7"), "gpu": Section(0, "A100, 81920 MiB")}), judge)
    assert ran == ("gpu", True, "judged (a probe job with --gres=gpu:1 on g7)"), ran


def test_ckpt_root_same_node_local_unwritable_or_unknown() -> None:
    wrote = _probe(0, {"node": Section(0, "n1"), "ckpt": Section(0, "nfs")})

    def read(rc: int, out: str) -> ProbeResult:
        return _probe(0, {"node": Section(0, "n2"), "ckpt": Section(rc, out)})

    same = ckpt_check("/scratch/c", "abc", wrote, read(0, "nfs\nabc"))
    assert same == ("ckpt_root", True, "/scratch/c is one directory on n1 and n2: a nonce written there "
                                       "on n1 was read on n2, so a requeued job resumes its cut cell on any "
                                       "node"), same
    for rc, out, what in ((1, "ext2/ext3", "a nonce written to /scratch/c on n1 is missing on n2"),
                          (0, "ext2/ext3\nxyz", "a nonce written to /scratch/c on n1 is other bytes on n2"),
                          (2, "-", "/scratch/c does not exist on n2")):
        _, ok, why = ckpt_check("/scratch/c", "abc", wrote, read(rc, out))
        assert not ok and why.startswith(f"ckpt_root is node-local: {what}"), why
        assert "resume after a requeue fails: set ckpt_root in the profile to shared scratch" in why, why
        # with durable resume copies (`resume:` not false) a node-local ckpt_root is no problem
        _, ok, why = ckpt_check("/scratch/c", "abc", wrote, read(rc, out), copies=True)
        assert ok and why.startswith(f"ckpt_root is node-local: {what}") and "durable copy" in why, why
    _, ok, why = ckpt_check("/scratch/c", "abc", wrote, None, "down", copies=True)
    assert ok and not why.startswith("warning") and "durable copy" in why, why
    unwritable = ckpt_check("/scratch/c", "abc", _probe(0, {"node": Section(0, "n1"),
                                                            "ckpt": Section(1, "Permission denied")}), None)
    assert unwritable == ("ckpt_root", False, "could not write under /scratch/c on the compute node n1 "
                                              "(Permission denied): every running cell writes its "
                                              "checkpoints there"), unwritable
    _, ok, why = ckpt_check("/scratch/c", "abc", wrote, _probe(124, {}, "PENDING Priority"))
    assert ok and why.startswith("warning: whether /scratch/c is the same directory on another node than "
                                 "n1 is not checked (the probe kept off n1: it did not run within 30 s "
                                 "(PENDING Priority)"), why
    assert why.endswith("if ckpt_root is node-local, resume after a requeue to another node will not work "
                        "(`resume: false`: no durable copies; the cut cell's checkpoint stays on the old "
                        "node): make it shared scratch"), why
