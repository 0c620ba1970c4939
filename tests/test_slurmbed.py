"""The Slurm bed is a real cluster (`slurm_cluster`, tests/slurmbed.py): three slurmd nodes, each its
own network, hostname, /tmp and local disk, one shared directory, and Slurm's own answers to a
requeue and to a node that dies. What Slurm 22.05 does here (SlurmdTimeout=10, JobRequeue=1):

- `scontrol requeue` of a running batch job kills it (its output gets "CANCELLED ... DUE TO JOB
  REQUEUE"), the job goes PENDING with Restarts=1 and Reason=BeginTime for cred_expire + 1 s (11 s
  here; 121 s with Slurm's default), then runs again with SLURM_RESTART_COUNT=1;
- a killed node keeps its state (`alloc`) while slurmctld pings it, turns `alloc*` (not
  responding) and then `down*` about 30 s after the kill (SlurmdTimeout, plus the ping's own
  MessageTimeout); at that moment its running batch job is requeued, not failed: PENDING,
  Restarts=1, and after its BeginTime it runs on another node;
- the node's slurmd booted again registers and the node is `idle` at once (ReturnToService=2), with
  an empty /tmp and its local disk as it was;
- with accounting (`SlurmBed(accounting=True)`: slurmdbd and a MariaDB of its own), slurmctld
  registers its cluster with slurmdbd by itself; an ended job's record is in the database within
  ~0.1 s, but plain `sacct` (jobs eligible in today's window) lists it 3-5 s later, once slurmctld
  has sent the job's eligible time as well: tests poll.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.proc import alive
from tests.helpers.wait import wait_for
from tests.slurmbed import SlurmBed, missing_requirement

# Time for slurmctld to notice a dead node: SlurmdTimeout (10 s), pings that wait MessageTimeout
# (10 s) on a refused connection, and slack for a loaded machine.
NODE_DOWN_S = 90.0


@pytest.fixture(autouse=True)
def _heal(slurm_cluster: SlurmBed) -> Iterator[None]:
    yield
    slurm_cluster.heal()  # no job left, every node idle, for the next test


def fields(text: str) -> list[dict[str, str]]:
    """One dict per output line of `key=value` words (a job's runs, when it appends)."""
    return [dict(w.split("=", 1) for w in line.split() if "=" in w)
            for line in text.splitlines() if line.startswith("run ")]


def sacct(sb: SlurmBed) -> dict[str, list[str]]:
    """Job id -> [JobName, State, NodeList, ExitCode] as `sacct` (slurmdbd's records) has them."""
    out = sb.run("sacct", "-X", "-n", "-P", "-o", "JobID,JobName,State,NodeList,ExitCode").stdout
    return {line.split("|")[0]: line.split("|")[1:] for line in out.splitlines() if line}


def test_three_nodes_idle_in_the_default_partition(slurm_cluster: SlurmBed) -> None:
    sb = slurm_cluster
    assert sb.sinfo() == {"sn1": "idle", "sn2": "idle", "sn3": "idle"}
    assert sb.run("sinfo", "-h", "-o", "%P %D %t").stdout.split() == ["main*", "3", "idle",
                                                                      "urgent", "3", "idle"]
    addrs = {n: sb.node(n)["NodeAddr"] for n in sb.nodes}
    assert addrs == {n: sb.address(n) for n in sb.nodes} and len(set(addrs.values())) == 3
    # Each slurmd has a network, UTS and mount namespace of its own (none is this machine's).
    for kind in ("net", "uts", "mnt"):
        own = {os.readlink(f"/proc/{sb.slurmd_pid(n)}/ns/{kind}") for n in sb.nodes}
        assert len(own) == 3 and os.readlink(f"/proc/self/ns/{kind}") not in own, kind


def test_a_job_runs_on_the_node_it_is_pinned_to(slurm_cluster: SlurmBed) -> None:
    """Each node runs its job under its own hostname, writes to its own local disk and to the one
    shared dir, and has a /tmp of its own: all three jobs hold their /tmp file at the same time
    (a barrier on the shared dir), and none sees another's or this machine's."""
    sb = slurm_cluster
    shared = sb.shared_dir / uuid.uuid4().hex[:8]
    shared.mkdir()
    marker = Path("/tmp") / f"slurmbed-host-{uuid.uuid4().hex[:8]}"  # this machine's /tmp
    marker.touch()
    try:
        script = (
            "set -e; me=$(hostname); "
            f"echo $me > {sb.local_path}/who; echo $me > {shared}/hello-$me; : > /tmp/mine-$me; "
            f"touch {shared}/ready-$me; i=0; "
            f"while [ $(ls {shared} | grep -c '^ready-') -lt 3 ]; do "
            "i=$((i+1)); [ $i -lt 600 ] || exit 3; sleep 0.05; done; "
            'echo "run host=$me node=$SLURMD_NODENAME tmp=$(ls -A /tmp | tr \'\\n\' ,)"')
        jobs = {node: sb.sbatch(script, "-w", node) for node in sb.nodes}
        for node, job in jobs.items():
            info = sb.wait_job(job, "COMPLETED", "FAILED")
            assert (info["JobState"], info["NodeList"]) == ("COMPLETED", node), sb.output(job)
            [run] = fields(sb.output(job))
            assert (run["host"], run["node"]) == (node, node)
            # Its own file, no other node's, not this machine's. Other files may be there: the node's
            # /tmp lives as long as the bed, and earlier jobs leave theirs (torch's inductor cache).
            tmp = set(run["tmp"].split(",")) - {""}
            assert f"mine-{node}" in tmp and marker.name not in tmp, run
            assert not {f"mine-{n}" for n in sb.nodes if n != node} & tmp, run
            assert (sb.local_dir(node) / "who").read_text() == f"{node}\n"
        assert sorted(p.name for p in shared.glob("hello-*")) == [f"hello-{n}" for n in sb.nodes]
        assert not list(Path(sb.local_path).iterdir())  # nothing went to the unmounted mountpoint
    finally:
        marker.unlink()


def test_requeue_runs_a_running_job_again(slurm_cluster: SlurmBed) -> None:
    sb = slurm_cluster
    job = sb.sbatch('echo "run restart=${SLURM_RESTART_COUNT:-0} host=$(hostname)"; sleep 300',
                    "-w", "sn1", "--open-mode=append")
    sb.wait_job(job, "RUNNING")
    wait_for(lambda: fields(sb.output(job)) == [{"restart": "0", "host": "sn1"}], 30)

    sb.run("scontrol", "requeue", job)
    info = sb.wait_job(job, "PENDING", timeout=30)
    assert info["Restarts"] == "1"
    assert "DUE TO JOB REQUEUE" in sb.output(job)  # the first run was killed, not left running
    info = sb.wait_job(job, "RUNNING", timeout=60)  # once its BeginTime (cred_expire + 1 s) passed
    assert (info["Restarts"], info["NodeList"]) == ("1", "sn1")
    wait_for(lambda: len(fields(sb.output(job))) == 2, 30)
    assert fields(sb.output(job)) == [{"restart": "0", "host": "sn1"}, {"restart": "1", "host": "sn1"}]


def test_a_killed_node_goes_down_its_job_is_requeued_elsewhere_and_the_node_returns(
        slurm_cluster: SlurmBed) -> None:
    sb = slurm_cluster
    # sn1 and sn3 busy: the unpinned job can only start on sn2.
    blockers = [sb.sbatch("sleep 300", "-w", node) for node in ("sn1", "sn3")]
    for b in blockers:
        sb.wait_job(b, "RUNNING")
    job = sb.sbatch(f'echo "run restart=${{SLURM_RESTART_COUNT:-0}} host=$(hostname) pid=$$"; '
                    f': > /tmp/was-here; echo kept > {sb.local_path}/kept; sleep 300',
                    "--open-mode=append")
    assert sb.wait_job(job, "RUNNING")["NodeList"] == "sn2"
    wait_for(lambda: fields(sb.output(job)), 30)
    (first,) = fields(sb.output(job))
    assert (first["restart"], first["host"]) == ("0", "sn2")

    sb.node_kill("sn2")
    assert not alive(first["pid"])  # the job's shell died with its node
    wait_for(lambda: sb.sinfo()["sn2"] == "down*", NODE_DOWN_S)
    info = sb.wait_job(job, "PENDING", timeout=10)  # requeued with the node's failure, not failed
    assert info["Restarts"] == "1"
    assert {n: s for n, s in sb.sinfo().items() if n != "sn2"} == {"sn1": "alloc", "sn3": "alloc"}

    sb.run("scancel", *blockers)
    info = sb.wait_job(job, "RUNNING", timeout=60)
    assert info["NodeList"] in ("sn1", "sn3")
    wait_for(lambda: len(fields(sb.output(job))) == 2, 30)
    second = fields(sb.output(job))[1]
    assert (second["restart"], second["host"]) == ("1", info["NodeList"])

    sb.node_restart("sn2")
    assert sb.sinfo()["sn2"] == "idle"
    back = sb.sbatch(f'echo "run host=$(hostname) tmp=$(ls -A /tmp | tr \'\\n\' ,) '
                     f'local=$(cat {sb.local_path}/kept)"', "-w", "sn2")
    assert sb.wait_job(back, "COMPLETED", "FAILED")["JobState"] == "COMPLETED"
    # A boot: its /tmp is new and empty, its local disk kept what the killed job wrote.
    assert fields(sb.output(back)) == [{"host": "sn2", "tmp": "", "local": "kept"}]


def test_close_leaves_nothing_behind(slurm_cluster: SlurmBed) -> None:
    """A second bed beside the session's (its own subnet) starts, runs a job, and its teardown
    removes every process, namespace, link and file it made."""
    with SlurmBed(2) as sb:
        assert sb.subnet != slurm_cluster.subnet
        job = sb.sbatch("hostname", "-w", "sn2")
        assert sb.wait_job(job, "COMPLETED", "FAILED")["JobState"] == "COMPLETED"
        pids = list(sb.pids().values())
        names = [*sb.namespaces(), sb.bridge, *(sb.veth(n) for n in sb.nodes), sb.ctl_veth]
    assert not [p for p in pids if Path(f"/proc/{p}").exists()]
    assert not [n for n in names if Path(f"/run/netns/{n}").exists() or Path(f"/sys/class/net/{n}").exists()]
    assert not sb.dir.exists()
    assert str(sb.dir) not in Path("/proc/mounts").read_text()


def test_an_accounting_bed_has_sacct_and_close_leaves_nothing_behind(slurm_cluster: SlurmBed) -> None:
    """`accounting=True`: slurmdbd and its MariaDB run beside slurmctld, `sacct` from here lists a
    completed and a cancelled job (once slurmctld has sent their records), and teardown removes
    those daemons and their files as well."""
    reason = missing_requirement(accounting=True)
    if reason:
        pytest.skip(reason)
    with SlurmBed(3, accounting=True) as sb:
        assert sb.subnet != slurm_cluster.subnet
        # slurmctld registered its cluster itself (no `sacctmgr add cluster`).
        clusters = sb.run("sacctmgr", "-n", "-P", "list", "cluster", "format=Cluster").stdout.split()
        assert clusters == [sb.cluster]
        done = sb.sbatch("hostname", "-w", "sn2")
        assert sb.wait_job(done, "COMPLETED", "FAILED")["JobState"] == "COMPLETED"
        cancelled = sb.sbatch("sleep 300", "-w", "sn1")
        sb.wait_job(cancelled, "RUNNING")
        sb.run("scancel", cancelled)
        sb.wait_job(cancelled, "CANCELLED")

        def recorded() -> dict[str, list[str]] | None:
            jobs = sacct(sb)
            states = [jobs.get(done, ["", ""])[1], jobs.get(cancelled, ["", ""])[1]]
            return jobs if states[0] == "COMPLETED" and states[1].startswith("CANCELLED") else None

        jobs = wait_for(recorded, 30)
        assert isinstance(jobs, dict)
        assert jobs[done] == ["wrap", "COMPLETED", "sn2", "0:0"]
        name, state, nodes, _ = jobs[cancelled]
        assert (name, state, nodes) == ("wrap", "CANCELLED by 0", "sn1")  # uid 0: this test, root
        daemons = sb.pids()
        assert {"mariadbd", "slurmdbd"} <= set(daemons)
        names = [*sb.namespaces(), sb.bridge, *(sb.veth(n) for n in sb.nodes), sb.ctl_veth]
    assert not [p for p in daemons.values() if Path(f"/proc/{p}").exists()]
    assert not [n for n in names if Path(f"/run/netns/{n}").exists() or Path(f"/sys/class/net/{n}").exists()]
    assert not sb.dir.exists()  # MariaDB's datadir and socket, slurmdbd.conf and its log were in it
    assert str(sb.dir) not in Path("/proc/mounts").read_text()
