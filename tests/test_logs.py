"""`ablate logs CELL [-f] [-n N]`: the log wherever it is, the user never naming a host.

Local sweeps for each place a log can be (running, durable, failed: instance log, then the FS tail),
and on the namespace test bed: `-f` follows a running cell's log live on its instance over SSH until
the cell ends, and the same command on the finished cell prints its durable copy and exits."""

from __future__ import annotations

import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ablate.config.project import load_project
from ablate.monitor.logs import source_of
from ablate.remote.layout import SweepLayout, session_name
from ablate.sweep.snapshot import state_of
from ablate.transport import close_all
from ablate.transport.local import LocalFS
from tests.helpers.cli import Cli, ablate_process
from tests.helpers.project import LocalProject
from tests.helpers.testbed_projects import events, make_project
from tests.helpers.wait import wait_for
from tests.testbed import Testbed


class Follower:
    """`ablate logs … -f` as a real process; its stdout lines are collected as they arrive."""

    def __init__(self, root: Path, *args: str) -> None:
        self.p = ablate_process(root, "logs", *args)
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.put(line)

    def next_line(self, timeout: float) -> str:
        line = self.lines.get(timeout=timeout)
        self.out.append(line)
        return line

    def finish(self, timeout: float) -> tuple[int, str, str]:
        rc = self.p.wait(timeout=timeout)
        self.reader.join(timeout=30)  # the pipe's last lines, up to its end
        assert not self.reader.is_alive(), "stdout still open after the process ended"
        while not self.lines.empty():
            self.out.append(self.lines.get())
        err = self.p.stderr.read() if self.p.stderr else ""
        return rc, "".join(self.out), err

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


@pytest.fixture
def proj(local_project: LocalProject) -> LocalProject:
    p = local_project
    p.write_config(tasks={"recon": {"epochs": 4, "cost_per_epoch": 1.0}})
    p.cfg("configs/slow.yaml", step_time=0.7)
    p.cfg("configs/bad.yaml", exit_code=3)
    p.cfg("configs/later.yaml")
    p.queue("q1", ["# ablate: host=h1", "configs/bad.yaml recon", "configs/slow.yaml recon"])
    p.queue("q2", ["# ablate: host=h2", "configs/later.yaml recon"])
    return p


def test_unknown_cell_is_bad_input_with_the_closest_names(proj: LocalProject,
                                                          cli: Cli) -> None:
    code, out, err = cli(proj, "logs", "slo")
    assert code == 2 and out == ""
    [line] = err.splitlines()
    assert line.startswith("ablate: error: ") and "'slo'" in line and "did you mean slow" in line


def test_a_cell_that_never_ran_says_which_queue_has_yet_to_reach_it(
        proj: LocalProject, cli: Cli) -> None:
    code, out, err = cli(proj, "logs", "later")
    assert code == 1 and out == ""
    assert "later has not run yet" in err and "q2 is not launched" in err


@pytest.mark.tmux
def test_logs_of_running_finished_and_failed_cells_without_naming_a_host(
        proj: LocalProject, cli: Cli) -> None:
    assert cli(proj, "launch", "q1", "--host", "h1").code == 0
    instance = proj.root / ".ablate" / "local" / "h1" / "ckpt"
    wait_for(lambda: "epoch 1/4" in (instance / "slow.log").read_text()
             if (instance / "slow.log").exists() else False, timeout=30)

    # running: tailed on its host, the last N lines
    code, out, err = cli(proj, "logs", "slow", "-n", "1")
    assert code == 0 and len(out.splitlines()) == 1 and out.startswith("epoch ")
    assert f"slow: running on h1 (queue q1); live log: {instance}/slow.log" in err

    # failed (rc 3, no durable copy): the instance-local log on the host that ran it
    code, out, err = cli(proj, "logs", "bad")
    assert code == 0 and "simulated failure exit 3" in out and "# ablate end" in out
    assert f"instance log on h1: {instance}/bad.log" in err

    final = proj.shared / "final_ckpts" / "slow"
    wait_for(lambda: (final / "MANIFEST.json").exists(), timeout=60)
    code, out, err = cli(proj, "logs", "slow", "-n", "3")
    assert code == 0 and out.splitlines() == (final / "slow.log").read_text().splitlines()[-3:]
    assert f"finished; durable copy on the shared FS: {final}/slow.log" in err
    started = time.monotonic()
    code, out2, _ = cli(proj, "logs", "slow", "-f", "-n", "3")  # done: print and exit
    assert code == 0 and out2 == out and time.monotonic() - started < 10

    # the instance log gone (disk wiped): the lines run_queue kept on the FS
    tails = proj.shared / "tails" / "bad.log"
    wait_for(tails.exists, timeout=10)
    (instance / "bad.log").unlink()
    code, out, err = cli(proj, "logs", "bad", "-n", "5")
    assert code == 0 and "simulated failure exit 3" in out
    assert f"last lines kept on the shared FS: {tails}" in err
    tails.unlink()
    code, out, err = cli(proj, "logs", "bad")
    assert code == 1 and out == "" and "the log is gone from h1" in err and "tails/bad.log" in err


@pytest.mark.tmux
def test_a_published_cell_whose_heartbeat_has_not_moved_on_is_durable(proj: LocalProject,
                                                                       cli: Cli) -> None:
    """run_one publishes the result before its queue's heartbeat leaves the cell: in that window
    the cell is finished (its durable log is the whole one), not running. Real snapshots of the
    sweep: the heartbeat while `slow` trains, the results once it published."""
    assert cli(proj, "-q", "launch", "q1", "--host", "h1").code == 0
    project = load_project(proj.root)
    fs = LocalFS(str(proj.shared))
    layout = SweepLayout(str(proj.shared))
    live = {"h1": {session_name("t1", "h1", "q1")}, "h2": set()}

    def snapshot() -> dict[str, Any]:
        return fs.probe("snapshot", {"root": str(proj.shared)})

    def on_slow(snap: dict[str, Any]) -> bool:
        return any(hb["data"].get("cell") == "slow" and hb["data"].get("state") == "running"
                   for hb in snap["heartbeats"].values())

    wait_for(lambda: on_slow(snapshot()), timeout=30)
    running = snapshot()
    assert source_of(project, state_of(project, running, live), layout, "slow").where == "running"
    wait_for(lambda: (proj.shared / "final_ckpts" / "slow" / "MANIFEST.json").exists(), timeout=60)
    window = {**snapshot(), "heartbeats": running["heartbeats"]}
    got = source_of(project, state_of(project, window, live), layout, "slow")
    assert (got.where, got.path) == ("durable", f"{layout.final_dir('slow')}/slow.log")


@pytest.mark.tmux
def test_follow_streams_a_running_cell_until_it_ends(proj: LocalProject, cli: Cli) -> None:
    assert cli(proj, "-q", "launch", "q1", "--host", "h1").code == 0
    wait_for(lambda: any(e.get("cell") == "slow" and e["ev"] == "start" for e in local_events(proj)),
             timeout=30)
    f = Follower(proj.root, "slow", "-f", "-n", "50")
    try:
        final = proj.shared / "final_ckpts" / "slow" / "MANIFEST.json"
        while not f.next_line(timeout=30).startswith("epoch 1/4"):
            pass
        assert not final.exists()  # seen while it trains, not after
        rc, out, err = f.finish(timeout=60)
    finally:
        f.kill()
    assert rc == 0
    assert out.index("epoch 1/4") < out.index("epoch 4/4") < out.index("# ablate end")
    assert "slow: running on h1 (queue q1)" in err and "slow: the cell ended (rc=0)" in err


def local_events(p: LocalProject) -> list[dict[str, object]]:
    import json

    out: list[dict[str, object]] = []
    for f in (p.shared / "events").glob("*.jsonl"):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def test_follow_on_a_testbed_instance_then_the_durable_copy_with_the_same_command(
        testbed: Testbed, tmp_path: Path, cli: Cli) -> None:
    sweep, host, q = "logs", "tb-h2", "q2"  # the FS is read through tb-h1; the log lives on tb-h2
    proj = make_project(testbed, tmp_path, sweep, cells=1, epochs=10, step_time=0.8)
    (proj / "queues").mkdir()
    (proj / "queues" / f"{q}.txt").write_text(f"# ablate: host={host}\nconfigs/{sweep}/c0.yaml recon\n")
    final = testbed.shared_dir / "ablate" / sweep / "final_ckpts" / "c0"
    instance_log = f"{testbed.local_path}/ckpt/{sweep}/c0.log"
    try:
        assert cli(proj, "-q", "launch", q, "--host", host).code == 0
        wait_for(lambda: any(e["ev"] == "start" for e in events(testbed, sweep, host, q)), timeout=30)
        f = Follower(proj, "c0", "-f")
        try:
            live = 0  # epoch lines that arrived while the cell still trained: followed, not replayed
            while not (line := f.next_line(timeout=30)).startswith("epoch 10/10"):
                live += line.startswith("epoch ") and not (final / "MANIFEST.json").exists()
            assert live >= 2, f.out
            rc, out, err = f.finish(timeout=60)
        finally:
            f.kill()
        assert rc == 0, err
        assert out.index("epoch 1/10") < out.index("epoch 10/10") < out.index("# ablate end")
        assert f"c0: running on {host} (queue {q}); live log: {instance_log}" in err
        assert "c0: the cell ended (rc=0)" in err
        assert not (testbed.local_dir("tb-h1") / "ckpt" / sweep / "c0.log").exists()  # it is only on tb-h2

        wait_for(lambda: (final / "MANIFEST.json").exists(), timeout=30)
        again = Follower(proj, "c0", "-f")
        try:
            rc, out2, err2 = again.finish(timeout=30)  # finished: printed, not followed
        finally:
            again.kill()
        assert rc == 0, err2
        durable = (final / "c0.log").read_text()
        assert out2 == "".join(durable.splitlines(keepends=True)[-50:])
        assert "epoch 10/10" in out2 and "finished; durable copy on the shared FS" in err2
    finally:
        close_all()
        shutil.rmtree(testbed.shared_dir / "work" / sweep, ignore_errors=True)
