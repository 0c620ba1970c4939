"""The controller lock (`ablate.sweep.lock`): two controllers on one sweep are serialised, the loser is
told who holds it, a dead holder (even SIGKILLed) never leaves it stuck, and it is re-entrant.
Real processes contending on the real lock file; over SSH on the namespace test bed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ablate.config.project import Project, load_project
from ablate.errors import Busy
from ablate.monitor.status import status
from ablate.run.deploy import deploy
from ablate.run.launch import launch
from ablate.run.stop import stop
from ablate.sweep.lock import (
    controller_lock,
    held_here,
    holder_path,
    lock_path,
    lock_timeout,
    set_lock_timeout,
)
from ablate.transport import close_all
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject
from tests.helpers.testbed_projects import ssh_project
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

# A second controller: takes the lock, says so in a file, holds it until its stdin closes.
HOLDER = """
import sys
from pathlib import Path
from ablate.config.project import load_project
from ablate.sweep.lock import controller_lock
project = load_project(sys.argv[1])
with controller_lock(project, sys.argv[2], timeout=float(sys.argv[3])):
    Path(sys.argv[4]).write_text("held")
    sys.stdin.read()
"""


class Holder:
    """Another controller process holding the sweep's lock."""

    def __init__(self, proj: Path, flag: Path, op: str = "launch --all", timeout: float = 30.0) -> None:
        self.flag = flag
        self.proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(proj), op, str(timeout), str(flag)],
                                     stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                                     cwd=Path(__file__).resolve().parent.parent)

    def wait_held(self) -> Holder:
        wait_for(lambda: self.flag.exists() or self.proc.poll() is not None, timeout=30)
        assert self.flag.exists(), self.proc.stderr.read().decode() if self.proc.stderr else ""
        return self

    def finish(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=30) == 0

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for h in made:
        h.close()
    set_lock_timeout(None)


def free(project: Project) -> bool:
    """Can this process take the lock at once?"""
    try:
        with controller_lock(project, "probe", timeout=0):
            return True
    except Busy:
        return False


# --------------------------------------------------------------------------- local


def test_a_second_controller_times_out_naming_the_holder_then_gets_it_once_freed(
        local_project: LocalProject, holders: list[Holder], tmp_path: Path) -> None:
    project = load_project(local_project.root)
    holder = Holder(local_project.root, tmp_path / "held")
    holders.append(holder)
    holder.wait_held()
    root = local_project.shared
    record = json.loads((root / "locks" / "controller.holder").read_text())
    assert record["pid"] == holder.proc.pid and record["op"] == "launch --all"
    assert record["by"].endswith("@" + os.uname().nodename) and abs(record["t"] - time.time()) < 30

    t0 = time.monotonic()
    with pytest.raises(Busy) as e, controller_lock(project, "deploy", timeout=0.5):
        pytest.fail("two controllers held the lock at once")
    assert 0.4 < time.monotonic() - t0 < 10
    msg = e.value.message
    assert e.value.exit_code == 1
    assert msg.startswith("sweep t1 is busy: `ablate launch --all` held by ")
    assert f"(pid {holder.proc.pid}) since " in msg and "retry with a longer --lock-timeout" in msg
    assert held_here(project) is None

    holder.finish()
    assert not (root / "locks" / "controller.holder").exists()  # removed as it let go
    with controller_lock(project, "deploy", timeout=0):
        assert held_here(project) == "deploy"
        assert json.loads((root / "locks" / "controller.holder").read_text())["pid"] == os.getpid()


def test_a_killed_holder_leaves_no_stale_lock(local_project: LocalProject, holders: list[Holder],
                                               tmp_path: Path) -> None:
    project = load_project(local_project.root)
    holder = Holder(local_project.root, tmp_path / "held")
    holders.append(holder)
    holder.wait_held()
    assert not free(project)
    holder.kill()  # SIGKILL: no cleanup ran, its holder record is left behind
    assert (local_project.shared / "locks" / "controller.holder").exists()
    assert free(project)


def test_a_waiting_controller_gets_the_lock_when_the_holder_finishes(
        local_project: LocalProject, holders: list[Holder], tmp_path: Path) -> None:
    project = load_project(local_project.root)
    holder = Holder(local_project.root, tmp_path / "held")
    holders.append(holder)
    holder.wait_held()
    notes: list[str] = []
    killed: list[float] = []

    def kill_once_waited_for() -> None:  # the holder killed once this controller says it waits
        wait_for(lambda: notes, timeout=30)
        killed.append(time.monotonic())
        holder.kill()

    releaser = threading.Thread(target=kill_once_waited_for)
    t0 = time.monotonic()
    releaser.start()
    with controller_lock(project, "stop", timeout=30, log=notes.append):
        waited = time.monotonic() - t0
        assert killed  # held only once the holder was being killed
    releaser.join()
    assert waited < 20
    assert notes and "waiting up to 30s for `ablate launch --all`" in notes[0]


def test_util_linux_flock_and_filelock_exclude_each_other(local_project: LocalProject,
                                                          holders: list[Holder], tmp_path: Path) -> None:
    """The ssh transport holds the lock with flock(1) on a host; the local one with filelock."""
    project = load_project(local_project.root)
    path = lock_path(str(local_project.shared))
    with controller_lock(project, "deploy"):
        assert subprocess.run(["flock", "-n", path, "true"]).returncode == 1
    assert subprocess.run(["flock", "-n", path, "true"]).returncode == 0
    flag = tmp_path / "flocked"
    other = subprocess.Popen(["flock", "-o", path, "sh", "-c", f"touch {flag}; sleep 30"])
    try:
        wait_for(flag.exists, timeout=10)
        assert not free(project)
    finally:
        other.kill()
        other.wait()
    assert free(project)


@pytest.mark.tmux
def test_the_lock_is_reentrant_within_a_process(local_project: LocalProject, holders: list[Holder],
                                                tmp_path: Path) -> None:
    require_tmux()
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/x.yaml") + " recon 1"])
    project = load_project(lp.root)
    with controller_lock(project, "remediate --launch"):
        with controller_lock(project, "launch"):  # an inner command: no deadlock, no new acquire
            assert held_here(project) == "remediate --launch"
        launch(project, "q1", "h1")  # launch -> deploy: each takes the lock again
        assert held_here(project) == "remediate --launch"
        record = json.loads((lp.shared / "locks" / "controller.holder").read_text())
        assert record["op"] == "remediate --launch"
        other = Holder(lp.root, tmp_path / "held", timeout=0.3)
        holders.append(other)
        assert other.proc.wait(timeout=30) != 0  # still held by the outer block
        assert not other.flag.exists()
    assert held_here(project) is None
    assert free(project)
    stop(project, "q1", "h1")


@pytest.mark.tmux
def test_commands_that_change_the_sweep_wait_for_the_lock_and_readers_do_not(
        local_project: LocalProject, holders: list[Holder], tmp_path: Path,
        cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    require_tmux()
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/x.yaml") + " recon 1"])
    project = load_project(lp.root)
    deploy(project)
    holder = Holder(lp.root, tmp_path / "held", op="remediate --launch")
    holders.append(holder)
    holder.wait_held()
    assert status(project).to_json()  # read-only: never waits
    before = lp.snapshot()

    set_lock_timeout(0.2)
    for call in (lambda: deploy(project), lambda: launch(project, "q1", "h1"),
                 lambda: stop(project, "q1", "h1"), lambda: stop(project, "q1", "h1", after_current=True)):
        with pytest.raises(Busy, match=r"`ablate remediate --launch` held by"):
            call()
    set_lock_timeout(None)
    assert lp.snapshot() == before

    lp.cfg("cfgs/a/y.yaml")
    before["cfgs/a/y.yaml"] = (lp.root / "cfgs/a/y.yaml").read_bytes()
    code, out, err = cli(lp.root, "--lock-timeout", "0.2", "append", "q1", "cfgs/a/y.yaml", "det")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "ablate: error: sweep t1 is busy: `ablate remediate --launch`" in err
    monkeypatch.setenv("ABLATE_LOCK_TIMEOUT", "0.2")
    assert lock_timeout() == 0.2
    code, out, _ = cli(lp.root, "launch", "q1", "--host", "h1", "--json")
    assert code == 1 and "is busy" in json.loads(out)["error"]
    lp.write_config(cells=[{"glob": "cfgs/b/*.yaml", "task": "recon"}])
    lp.cfg("cfgs/b/z.yaml")
    before = {**before, "ablate.yaml": (lp.root / "ablate.yaml").read_bytes(),
              "cfgs/b/z.yaml": (lp.root / "cfgs/b/z.yaml").read_bytes()}
    code, _, err = cli(lp.root, "plan")
    assert code == 1 and "is busy" in err, err
    assert lp.snapshot() == before
    code, _, err = cli(lp.root, "status")
    assert code == 0, err
    holder.finish()
    code, _, err = cli(lp.root, "launch", "q1", "--host", "h1")
    assert code == 0, err


def test_a_bad_lock_timeout_is_refused(local_project: LocalProject, cli: Cli,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = cli(local_project.root, "--lock-timeout", "-1", "deploy")
    assert code == 2 and "--lock-timeout" in err
    monkeypatch.setenv("ABLATE_LOCK_TIMEOUT", "soon")
    code, _, err = cli(local_project.root, "deploy")
    assert code == 2 and "ABLATE_LOCK_TIMEOUT" in err


# --------------------------------------------------------------------------- over SSH


def test_the_lock_over_ssh_serialises_controllers_and_dies_with_a_killed_one(
        testbed: Testbed, tmp_path: Path, holders: list[Holder]) -> None:
    sweep = f"lock{os.getpid()}"
    proj = ssh_project(testbed, tmp_path, sweep)
    project = load_project(proj)
    root = testbed.shared_dir / "ablate" / sweep
    try:
        holder = Holder(proj, tmp_path / "held", op="launch --all")
        holders.append(holder)
        holder.wait_held()
        # Held on the instance by flock(1): the same flock(2) lock a local process sees on the file.
        assert subprocess.run(["flock", "-n", lock_path(str(root)), "true"]).returncode == 1
        record = json.loads(Path(holder_path(str(root))).read_text())
        assert record["pid"] == holder.proc.pid and record["op"] == "launch --all"
        held_by = rf"`ablate launch --all` held by .*\(pid {holder.proc.pid}\)"
        with pytest.raises(Busy, match=held_by), controller_lock(project, "deploy", timeout=0.5):
            pytest.fail("two controllers held the lock at once")

        holder.kill()  # the controller dies: its SSH connection closes, flock on the host exits
        wait_for(lambda: subprocess.run(["flock", "-n", lock_path(str(root)), "true"]).returncode == 0,
                 timeout=15)
        assert not Path(holder_path(str(root))).exists()  # removed on the host before it let go
        with controller_lock(project, "deploy", timeout=5):
            assert subprocess.run(["flock", "-n", lock_path(str(root)), "true"]).returncode == 1
            with controller_lock(project, "launch"):  # re-entrant over SSH too
                pass
            assert subprocess.run(["flock", "-n", lock_path(str(root)), "true"]).returncode == 1
            second = Holder(proj, tmp_path / "held2", timeout=0.5)
            holders.append(second)
            assert second.proc.wait(timeout=60) != 0 and not second.flag.exists()
        assert subprocess.run(["flock", "-n", lock_path(str(root)), "true"]).returncode == 0
        assert not Path(holder_path(str(root))).exists()

        # A waiter over SSH gets it as soon as the holder (here: a local flock) lets go.
        flag = tmp_path / "flocked"
        other = subprocess.Popen(["flock", lock_path(str(root)), "sh", "-c", f"touch {flag}; sleep 1.5"])
        wait_for(flag.exists, timeout=10)
        t0 = time.monotonic()
        with controller_lock(project, "stop", timeout=30):
            assert time.monotonic() - t0 > 0.5
        other.wait(timeout=10)
    finally:
        close_all()
