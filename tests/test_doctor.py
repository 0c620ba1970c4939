"""`ablate doctor` on the local transport and on the test bed (real sshd, real tmux, one shared dir),
and `launch` refusing a short budget with the numbers."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ablate.config.project import load_project
from ablate.doctor.command import DoctorReport, doctor
from ablate.errors import CheckFailed
from ablate.run.launch import launch
from ablate.transport import close_all, host_transport
from ablate.transport.ssh import SSHHost
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject
from tests.testbed import Testbed

pytestmark = pytest.mark.tmux  # tests/helpers/tiers.py

CHECKS = ["reachable", "bash", "tmux", "env", "shared_fs", "deployed", "disk", "shared_disk", "inodes", "gpu",
          "workdir", "commit"]


def cli_doctor(cli: Cli, directory: Path) -> tuple[int, dict[str, Any], str]:
    r = cli(directory, "doctor", "--json")
    return r.code, r.json(), r.err


def failures(report: dict[str, Any]) -> dict[tuple[str, str], str]:
    return {(host, c["check"]): c["reason"] for host, h in report["hosts"].items()
            for c in h["checks"] if not c["ok"]}


def no_nonce_left(shared: Path) -> bool:
    return not list(shared.rglob(".doctor-nonce.*"))


# --------------------------------------------------------------------------- local transport


def test_fresh_local_project_is_all_ok(local_project: LocalProject) -> None:
    report = doctor(load_project(local_project.root))
    assert report.ok and report.problems == 0, report.lines()
    assert list(report.hosts) == ["h1", "h2"]
    for h in report.hosts.values():
        assert [c.check for c in h.checks] == CHECKS
    assert "not deployed yet" in (report.check("h1", "deployed") or pytest.fail()).reason
    assert no_nonce_left(local_project.root / ".ablate")
    line = next(ln for ln in report.lines() if ln.startswith("h1") and " disk " in ln)
    assert "  ok  " in line and "need 1.0 MB (0 cell(s)" in line
    assert list(doctor(load_project(local_project.root), ["h2"]).hosts) == ["h2"]


def test_absurd_disk_budget_fails_with_the_numbers_and_launch_refuses(
        local_project: LocalProject, cli: Cli, tmux_socket: str) -> None:
    local_project.write_config(budget={"ckpt_size": "900TB", "scratch": "1MB"})
    local_project.queue("q1", ["# ablate: host=h1", local_project.cfg("configs/r/a.yaml") + " recon",
                               local_project.cfg("configs/r/b.yaml") + " recon"])
    code, report, _ = cli_doctor(cli, local_project.root)
    assert code == 1 and report["ok"] is False
    fails = failures(report)
    # h2 runs no cells (scratch only, which fits); the shared FS both see holds neither the two
    # results nor the resume copies of the one queue running at once
    assert list(fails) == [("h1", "disk"), ("h1", "shared_disk"), ("h2", "shared_disk")]
    assert "need 1.8 PB (2 cell(s) x 900.0 TB + 1.0 MB scratch), free " in fails[("h1", "disk")]
    assert fails[("h2", "shared_disk")].startswith(
        "below budget: need 4.5 PB (2 result(s) to come + 3 resume copies (3 per running cell, 1 queue(s)) "
        "x 900.0 TB), free "), fails

    before = local_project.snapshot()
    with pytest.raises(CheckFailed) as e:
        launch(load_project(local_project.root), "q1", "h1")
    assert e.value.exit_code == 1
    assert e.value.message.startswith("h1: disk below budget: need 1.8 PB") and "free " in e.value.message
    assert local_project.snapshot() == before  # nothing deployed, no ledger, no queue copy
    assert subprocess.run(["tmux", "-L", tmux_socket, "has-session"], capture_output=True).returncode != 0

    # launch --all refuses that host's queue the same way, and starts nothing for it
    from ablate.run.launch import launch_all

    results = launch_all(load_project(local_project.root))
    assert [(r.queue, r.status) for r in results] == [("q1", "failed")]
    assert (results[0].error or "").startswith("h1: disk below budget: need 1.8 PB")
    assert not (local_project.shared / "queues" / "q1.ledger").exists()
    assert subprocess.run(["tmux", "-L", tmux_socket, "has-session"], capture_output=True).returncode != 0


def test_asked_gpu_fails_where_there_is_none(local_project: LocalProject,
                                             cli: Cli) -> None:
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    plain = doctor(load_project(local_project.root)).check("h1", "gpu")
    assert plain is not None and plain.ok and plain.reason == "no GPU (nvidia-smi not found)"
    local_project.write_config(resources={"gpu": {"name": "A100", "count": 1, "memory": "24GB+"}})
    code, report, err = cli_doctor(cli, local_project.root)
    assert code == 1 and "2 problem(s)" in err
    fails = failures(report)
    assert set(fails) == {("h1", "gpu"), ("h2", "gpu")}
    assert fails[("h1", "gpu")] == ("resources.gpu asks for 1x A100 24GB+; no GPU here "
                                    "(nvidia-smi not found)")


def test_code_drift_is_found_and_refuses_launch(local_project: LocalProject, tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    work = tmp_path / "work"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for repo, msg in ((local_project.root, "controller"), (work, "host")):
        repo.mkdir(exist_ok=True)
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        subprocess.run([*git, "-C", str(repo), "commit", "-q", "--allow-empty", "-m", msg], check=True)
    local_project.write_config(workdir=str(work))
    local_project.queue("q1", [local_project.cfg("configs/r/a.yaml") + " recon"])
    report = doctor(load_project(local_project.root))
    drift = report.check("h1", "commit")
    assert drift is not None and not drift.ok and drift.reason.startswith("code drift: ")
    with pytest.raises(CheckFailed, match=r"h1: code drift: .* on h1 is at [0-9a-f]{12}, the controller at"):
        launch(load_project(local_project.root), "q1", "h1")


# --------------------------------------------------------------------------- test bed


@pytest.fixture
def tb_project(testbed: Testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    # A bind mount: the lag is 0, so a host that does not see the nonce within 2 s never will
    # (the default cap, 60 s, is for real network filesystems).
    monkeypatch.setenv("ABLATE_FS_LAG_CAP", "2")
    root = tmp_path / "proj"
    (root / "profiles").mkdir(parents=True)
    profile = {"transport": "ssh", "shared_fs": testbed.shared_path,
               "ckpt_root": f"{testbed.local_path}/ckpt"}
    (root / "profiles" / "tb.yaml").write_text(yaml.safe_dump(profile))
    # The same paths, except the "shared" FS is the instance's own local disk.
    local = {**profile, "shared_fs": testbed.local_path}
    (root / "profiles" / "tblocal.yaml").write_text(yaml.safe_dump(local))
    write_tb_config(root, testbed.ssh_config, testbed)
    try:
        yield root
    finally:
        close_all()
        for p in testbed.shared_dir.glob("ablate/doctor-*"):
            shutil.rmtree(p)


def write_tb_config(root: Path, ssh_config: Path, tb: Testbed, **hosts: dict[str, Any]) -> None:
    sweep = f"doctor-{hashlib.sha256(str(root).encode()).hexdigest()[:8]}"
    (root / "ablate.yaml").write_text(yaml.safe_dump({
        "profile": "tb", "sweep": sweep, "workdir": "/root",
        "train": "python t.py {cfg}", "artifacts": {"checkpoint": "best.pth"},
        "tasks": {"t": {"epochs": 1}}, "budget": {"ckpt_size": "1MB", "scratch": "1MB"},
        "ssh_config": str(ssh_config), "hosts": {**{h: {} for h in tb.hosts}, **hosts}}))


def only_failure(cli: Cli, root: Path) -> tuple[str, str, str]:
    code, report, _ = cli_doctor(cli, root)
    assert code == 1 and report["ok"] is False, report
    [((host, check), reason)] = failures(report).items()
    return host, check, reason


def test_testbed_all_ok(testbed: Testbed, tb_project: Path, cli: Cli) -> None:
    code, report, _ = cli_doctor(cli, tb_project)
    assert code == 0 and report["ok"] is True, failures(report)
    assert list(report["hosts"]) == testbed.hosts
    for h in report["hosts"].values():
        assert [c["check"] for c in h["checks"]] == CHECKS
        shared = next(c for c in h["checks"] if c["check"] == "shared_fs")
        assert "through tb-h1" in shared["reason"]
    assert no_nonce_left(testbed.shared_dir)


def test_testbed_local_dir_posing_as_shared_fails_that_host(
        testbed: Testbed, tb_project: Path, cli: Cli) -> None:
    write_tb_config(tb_project, testbed.ssh_config, testbed, **{"tb-h3": {"profile": "tblocal"}})
    host, check, reason = only_failure(cli, tb_project)
    assert (host, check) == ("tb-h3", "shared_fs")
    assert reason.startswith("not the same shared FS as tb-h1 (AutoDL file storage is per region?)")
    assert testbed.local_path in reason and "is missing on tb-h3" in reason
    assert no_nonce_left(testbed.shared_dir)


def test_testbed_host_without_tmux(testbed: Testbed, tb_project: Path,
                                   cli: Cli) -> None:
    tmux = shutil.which("tmux")
    assert tmux is not None
    ns = ["nsenter", f"--mount=/proc/{testbed.sshd_pid('tb-h2')}/ns/mnt"]
    subprocess.run([*ns, "mount", "--bind", "/dev/null", tmux], check=True)
    try:
        host, check, reason = only_failure(cli, tb_project)
    finally:
        subprocess.run([*ns, "umount", tmux], check=True)
    assert (host, check) == ("tb-h2", "tmux")
    assert "apt-get install -y tmux" in reason


def test_testbed_disk_below_budget_fails_and_launch_refuses(
        testbed: Testbed, tb_project: Path, cli: Cli) -> None:
    (tb_project / "queues").mkdir()
    (tb_project / "queues" / "q1.txt").write_text(
        "# ablate: host=tb-h1\nc/a.yaml t\nc/b.yaml t\nc/c.yaml t\n")
    testbed.fill_disk("tb-h1")
    host, check, reason = only_failure(cli, tb_project)
    assert (host, check) == ("tb-h1", "disk")
    assert reason.startswith("below budget: need 4.0 MB (3 cell(s) x 1.0 MB + 1.0 MB scratch), free ")
    assert f"ckpt_root {testbed.local_path}/ckpt" in reason

    project = load_project(tb_project)
    with pytest.raises(CheckFailed, match=r"^tb-h1: disk below budget: need 4\.0 MB .* free "):
        launch(project, "q1", "tb-h1")
    ht = host_transport(project, project.hosts["tb-h1"])
    assert ht.tmux_sessions() == set()
    assert not (testbed.shared_dir / "ablate" / project.sweep / "DEPLOYED.json").exists()


def test_testbed_unknown_host_key_fails_that_host(testbed: Testbed, tb_project: Path, tmp_path: Path,
                                                 cli: Cli) -> None:
    known = testbed.trust_current_keys(tmp_path / "known_hosts", hosts=["tb-h1", "tb-h3"])
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", known_hosts=known)
    write_tb_config(tb_project, cfg, testbed)
    host, check, reason = only_failure(cli, tb_project)
    assert (host, check) == ("tb-h2", "reachable")
    assert "unknown host key" in reason and testbed.address("tb-h2") in reason
    assert f"`ssh -F {cfg} -o StrictHostKeyChecking=ask tb-h2`" in reason
    assert "--accept-new-host-keys" in reason
    assert known.read_text().count("\n") == 2  # nothing was trusted behind the user's back


def test_testbed_host_key_removed_or_changed_fails_doctor_while_a_master_lives(
        testbed: Testbed, tb_project: Path, tmp_path: Path, cli: Cli) -> None:
    """Doctor predicts the next cold command: its host-key and authentication checks are a new
    connection's, not the kept master's (authenticated before the key went), which it leaves alive
    for the other commands."""
    known = testbed.trust_current_keys(tmp_path / "known_hosts")
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", known_hosts=known)
    write_tb_config(tb_project, cfg, testbed)
    code, report, _ = cli_doctor(cli, tb_project)
    assert code == 0, failures(report)
    project = load_project(tb_project)
    hosts = {h: host_transport(project, project.hosts[h]) for h in ("tb-h2", "tb-h3")}
    masters = {h: t.master_pid() for h, t in hosts.items() if isinstance(t, SSHHost)}
    assert set(masters) == {"tb-h2", "tb-h3"} and all(masters.values()), masters  # kept for the next command

    # tb-h2's line removed (the instance re-created and cleaned up); tb-h3 re-keyed, its old key kept.
    lines = known.read_text().splitlines(keepends=True)
    known.write_text("".join(ln for ln in lines if not ln.startswith(testbed.address("tb-h2") + " ")))
    testbed.change_host_key("tb-h3")
    for h in ("tb-h2", "tb-h3"):  # what OpenSSH itself says to a cold command
        r = subprocess.run(["ssh", "-F", str(cfg), "-o", "ControlPath=none", h, "true"],
                           capture_output=True, timeout=60)
        assert r.returncode == 255 and b"Host key verification failed" in r.stderr, r.stderr
    code, report, _ = cli_doctor(cli, tb_project)
    assert code == 1 and report["ok"] is False
    got = failures(report)
    assert set(got) == {("tb-h2", "reachable"), ("tb-h3", "reachable")}, got
    assert "unknown host key" in got["tb-h2", "reachable"]
    assert f"`ssh -F {cfg} -o StrictHostKeyChecking=ask tb-h2`" in got["tb-h2", "reachable"]
    assert "CHANGED" in got["tb-h3", "reachable"] and "ssh-keygen" in got["tb-h3", "reachable"]
    assert report["hosts"]["tb-h1"]["ok"] is True
    assert known.read_text().count("\n") == 2  # nothing was trusted behind the user's back
    # The kept connections are left to the commands that reuse them, as before.
    close_all()
    project = load_project(tb_project)
    for h, pid in masters.items():
        t = host_transport(project, project.hosts[h])
        assert isinstance(t, SSHHost) and t.master_pid() == pid
        assert t.run(["true"]).rc == 0


def test_report_lines_name_host_check_and_reason(testbed: Testbed, tb_project: Path) -> None:
    write_tb_config(tb_project, testbed.ssh_config, testbed, **{"tb-h2": {"profile": "tblocal"}})
    report: DoctorReport = doctor(load_project(tb_project))
    assert report.problems == 1, [ln for ln in report.lines() if "FAIL" in ln]
    [line] = [ln for ln in report.lines() if "FAIL" in ln]
    assert line.split()[:3] == ["tb-h2", "shared_fs", "FAIL"] and "not the same shared FS as tb-h1" in line


def test_testbed_dead_host_and_runpod_proxy_never_hide_the_others(
        testbed: Testbed, tb_project: Path, tmp_path: Path, cli: Cli) -> None:
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", extra=(
        "\nHost pod-a\n  HostName ssh.runpod.io\n  User abc123-64410f\n"))
    write_tb_config(tb_project, cfg, testbed, **{"pod-a": {}})
    testbed.kill("tb-h1")  # also the host the shared FS is reached through: tb-h2 serves instead
    code, report, _ = cli_doctor(cli, tb_project)
    assert code == 1
    fails = failures(report)
    assert set(fails) == {("tb-h1", "reachable"), ("pod-a", "reachable")}
    assert "tb-h1" in fails[("tb-h1", "reachable")] and "cannot connect" in fails[("tb-h1", "reachable")]
    assert "RunPod proxy ssh.runpod.io" in fails[("pod-a", "reachable")]
    assert "use full SSH (root@IP -p PORT)" in fails[("pod-a", "reachable")]
    for host in ("tb-h2", "tb-h3"):
        assert report["hosts"][host]["ok"] and len(report["hosts"][host]["checks"]) == len(CHECKS)
    shared = next(c for c in report["hosts"]["tb-h3"]["checks"] if c["check"] == "shared_fs")
    assert "through tb-h2" in shared["reason"]
    assert no_nonce_left(testbed.shared_dir)
