"""The autostop watcher (ablate/remote/host/autostop_watch.py) on a sweep root in a temp dir: what it
records at each check, when it runs the stop command, what it says when that fails, and that one
detached watcher runs per sweep and host, started by the queue's runner process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ablate.remote.host import autostop, autostop_watch
from ablate.remote.host.autostop_watch import Watcher
from tests.helpers.results import make_result
from tests.helpers.wait import wait_for

T = 1_800_000_000.0


@pytest.fixture(autouse=True)
def _alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The instance runs this sweep alone: the watchers here (in-process and detached) read an empty
    /proc of their own, not this machine's, where other tests' queues run."""
    proc = tmp_path / "proc"
    proc.mkdir()
    monkeypatch.setenv("ABLATE_AUTOSTOP_PROC", str(proc))


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self, root: str, host: str) -> float:
        return self.t


def sweep(root: Path, *, idle: float = 600, command: str = "stop-me", keep: int = 1) -> Path:
    """One host h1 with one queue q1 of one cell, c1, published (not checked: no checkpoint entry)."""
    for d in ("queues", "claims/c1", "final_ckpts", "heartbeats", "events", "autostop"):
        (root / d).mkdir(parents=True, exist_ok=True)
    make_result(root / "final_ckpts", "cfgs/c1.yaml", "recon", 1, host="h1")
    (root / "queues" / "q1.txt").write_text("cfgs/c1.yaml recon\n")
    launched(root, "q1", "h1")
    (root / "claims" / "c1" / "owner").write_text("h1 q1 0 1.0 - -\n")
    (root / "heartbeats" / "h1.q1").write_text(json.dumps({"state": "drained", "pid": 0}) + "\n")
    (root / "events" / "h1.q1.jsonl").write_text("{}\n")
    settings = {"idle": idle, "command": command, "keep": keep, "steal": False,
                "artifacts": {"checkpoint": ["model.safetensors"], "pick": "all", "metrics": "metrics.json",
                              "metrics_keys": []},
                "heartbeat": 10, "tasks": "recon=1"}
    (root / "autostop" / "h1.settings.json").write_text(json.dumps(settings))
    for p in root.rglob("*"):
        if p.is_file():
            os.utime(p, (T - 900, T - 900))
    return root


def launched(root: Path, queue: str, host: str) -> None:
    entry = {"op": "launch", "host": host, "start_index": 0}
    (root / "queues" / f"{queue}.ledger").write_text(json.dumps(entry) + "\n")


def state(root: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((root / "autostop" / "h1.state.json").read_text())
    return data


def events(root: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in (root / "autostop" / "h1.jsonl").read_text().splitlines()]


def test_an_idle_instance_runs_its_stop_command_once_its_idle_time_has_passed(tmp_path: Path) -> None:
    root = sweep(tmp_path / "s", idle=1200)
    ran: list[str] = []
    w = Watcher(str(root), "h1", clock=Clock(T), run=lambda c: (ran.append(c), (0, "bye"))[1])
    w.settle = 0.0
    wait = w.step()
    st = state(root)
    assert st["kind"] == "idle" and st["why"] == "stops in 5 min" and st["stop_at"] == T + 300
    assert st["last_work"] == T - 900 and ran == [] and 0 < wait <= 10
    w.clock = Clock(T + 300)
    w.step()
    assert ran == ["stop-me"]
    kinds = [e.get("kind") or e["ev"] for e in events(root)]
    assert kinds == ["idle", "stopping", "stopped", "stop_failed"], kinds
    stopped = next(e for e in events(root) if e["ev"] == "stopped")
    assert stopped["billed_idle"] == 1200 and stopped["out"] == "bye"
    # still here after the settle time: the command did not take the box away; it says so
    st = state(root)
    assert st["kind"] == "stop_failed" and "still up" in str(st["why"])


def test_a_stop_command_that_fails_is_reported_and_tried_again_later(tmp_path: Path) -> None:
    root = sweep(tmp_path / "s", idle=60)
    ran: list[str] = []
    missing = (127, "sh: runpodctl: not found")
    w = Watcher(str(root), "h1", clock=Clock(T), run=lambda c: (ran.append(c), missing)[1])
    w.step()
    st = state(root)
    assert st["kind"] == "stop_failed" and st["stop_rc"] == 127 and "runpodctl: not found" in str(st["why"])
    assert ran == ["stop-me"]
    w.clock = Clock(T + 30)
    w.step()
    assert ran == ["stop-me"] and state(root)["kind"] == "stop_failed"  # not again at once
    w.clock = Clock(T + autostop_watch.retry_after(60) + 1)
    w.step()
    assert ran == ["stop-me", "stop-me"]


def test_work_coming_back_resets_the_idle_time(tmp_path: Path) -> None:
    root = sweep(tmp_path / "s", idle=600)
    ran: list[str] = []
    w = Watcher(str(root), "h1", clock=Clock(T - 400), run=lambda c: (ran.append(c), (0, ""))[1])
    w.step()
    assert state(root)["kind"] == "idle"
    with (root / "queues" / "q1.txt").open("a") as f:  # an append: its queue file is written
        f.write("cfgs/c2.yaml recon\n")
    os.utime(root / "queues" / "q1.txt", (T - 100, T - 100))
    hb = root / "heartbeats" / "h1.q1"  # and the drained queue restarted: it runs the new line
    hb.write_text(json.dumps({"state": "running", "pid": os.getpid()}) + "\n")
    w.clock = Clock(T)
    w.step()
    st = state(root)
    assert st["kind"] == "running" and ran == []
    hb.write_text(json.dumps({"state": "drained", "pid": os.getpid()}) + "\n")  # c2 not taken: it ended
    w.step()
    st = state(root)
    assert st["kind"] == "kept" and "c2" in str(st["why"]) and ran == []  # nobody will take it: kept
    (root / "claims" / "c2").mkdir()
    (root / "claims" / "c2" / "owner").write_text("h1 q1 1 2.0 - -\n")
    make_result(root / "final_ckpts", "cfgs/c2.yaml", "recon", 1, host="h1")
    w.step()
    st = state(root)
    assert st["kind"] == "idle" and st["stop_at"] == T - 100 + 600 and ran == []


def test_cancelled_or_turned_off(tmp_path: Path) -> None:
    root = sweep(tmp_path / "s", idle=0)
    ran: list[str] = []
    w = Watcher(str(root), "h1", clock=Clock(T), run=lambda c: (ran.append(c), (0, ""))[1])
    (root / "autostop" / "h1.control.json").write_text(json.dumps({"cancelled": True}))
    w.step()
    assert state(root)["kind"] == "off" and state(root)["why"] == "autostop cancelled" and ran == []
    (root / "autostop" / "h1.control.json").write_text(json.dumps({"cancelled": False, "idle": 3600}))
    w.step()
    assert state(root)["kind"] == "idle" and state(root)["idle"] == 3600
    (root / "autostop" / "h1.settings.json").unlink()  # a launch without autostop
    assert w.step() < 0 and state(root)["kind"] == "off" and ran == []


def test_an_unreadable_sweep_never_stops_the_instance(tmp_path: Path) -> None:
    root = sweep(tmp_path / "s", idle=0)
    ran: list[str] = []
    w = Watcher(str(root), "h1", clock=Clock(T), run=lambda c: (ran.append(c), (0, ""))[1])
    (root / "queues").rename(root / "queues.away")  # an FS whose listing fails
    w.step()
    assert state(root)["kind"] == "unsure" and ran == []


def test_a_crashed_cell_keeps_the_elected_instance_until_remediated(tmp_path: Path) -> None:
    root = sweep(tmp_path / "s", idle=0)
    (root / "queues" / "q2.txt").write_text("cfgs/c3.yaml recon\n")
    launched(root, "q2", "h2")
    (root / "claims" / "c3").mkdir()
    (root / "claims" / "c3" / "owner").write_text("h2 q2 0 1.0 - -\n")  # crashed: no result, q2 drained
    (root / "heartbeats" / "h2.q2").write_text(json.dumps({"state": "drained"}) + "\n")
    (root / "autostop" / "h2.settings.json").write_text((root / "autostop" / "h1.settings.json").read_text())
    (root / "estimates.tsv").write_text("host\th2\t-\t2000\nhost\th1\t-\t1000\n")  # h2 is the faster
    ran: dict[str, list[str]] = {"h1": [], "h2": []}
    w1 = Watcher(str(root), "h1", clock=Clock(T), run=lambda c: (ran["h1"].append(c), (0, ""))[1])
    w2 = Watcher(str(root), "h2", clock=Clock(T), run=lambda c: (ran["h2"].append(c), (0, ""))[1])
    w1.settle = w2.settle = 0.0
    w2.step()
    kept = json.loads((root / "autostop" / "h2.state.json").read_text())
    assert kept["kind"] == "kept" and "c3" in kept["why"] and ran["h2"] == []
    assert json.loads((root / "autostop" / "keepers.1.json").read_text())["hosts"] == ["h2"]
    w1.step()
    assert ran["h1"] == ["stop-me"]  # not a keeper: it goes
    # remediated: c3 published; now h2 goes too
    make_result(root / "final_ckpts", "cfgs/c3.yaml", "recon", 1, host="h2")
    w2.step()
    assert ran["h2"] == ["stop-me"]


def test_a_new_election_when_every_keeper_has_stopped(tmp_path: Path) -> None:
    root = sweep(tmp_path / "s", idle=0)
    on = (root / "autostop" / "h1.settings.json").read_text()
    for h in ("h2", "h3"):
        (root / "autostop" / f"{h}.settings.json").write_text(on)
    (root / "autostop" / "keepers.1.json").write_text(json.dumps({"hosts": ["h2"]}))
    (root / "autostop" / "h2.state.json").write_text(json.dumps({"kind": "stopped"}))
    got = autostop_watch.keepers(str(root), "h1", 1, T)
    assert got in (("h1",), ("h3",)) and (root / "autostop" / "keepers.2.json").exists()
    assert autostop_watch.keepers(str(root), "h3", 1, T) == got  # decided once


def test_one_detached_watcher_per_sweep_and_host(tmp_path: Path) -> None:
    root = sweep(tmp_path / "s", idle=3600)
    env_root = str(root)
    assert autostop_watch.ensure(env_root, "h1")
    path = root / "autostop" / "h1.state.json"
    try:
        wait_for(lambda: path.exists() and json.loads(path.read_text()).get("kind") == "idle", 30)
    except AssertionError:  # it ends by itself once its settings are gone: never left running
        (root / "autostop" / "h1.settings.json").unlink()
        raise
    pid = json.loads(path.read_text())["pid"]
    try:
        assert os.getsid(pid) == pid  # a session of its own: it outlives the queue that started it
        assert not autostop_watch.ensure(env_root, "h1")  # it runs: not a second one
        alone = subprocess.run([sys.executable, "-m", "ablate.remote.host.autostop_watch", "autostop",
                                env_root, "h1"], capture_output=True, timeout=30, check=False)
        assert alone.returncode == 0  # refused by the lock, at once
        assert json.loads(path.read_text())["pid"] == pid
    finally:
        os.kill(pid, 15)
    wait_for(lambda: autostop_watch._try_lock(autostop_watch.lock_path(env_root, "h1")) is not None, 30)


def test_another_sweeps_queue_on_the_instance_keeps_it_up(tmp_path: Path) -> None:
    """Two sweeps on one box: this one is done with it, the other's queue still runs there."""
    root = sweep(tmp_path / "s", idle=0)
    proc = Path(os.environ["ABLATE_AUTOSTOP_PROC"])  # this instance's processes (the fixture's)
    (proc / "self" / "ns").mkdir(parents=True)
    (proc / "self" / "ns" / "net").symlink_to("net:[4026531840]")
    other = tmp_path / "shared" / "ablate" / "other"
    for pid, net in (("4242", "net:[4026531840]"), ("4343", "net:[4026532999]")):  # the 2nd: not here
        (proc / pid / "ns").mkdir(parents=True)
        (proc / pid / "ns" / "net").symlink_to(net)
        argv = ["bash", f"{other}{pid}/wrappers/run_queue.0123456789ab.sh", "spec.env", "q9", "0"]
        (proc / pid / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    ran: list[str] = []
    w = Watcher(str(root), "h1", clock=Clock(T), run=lambda c: (ran.append(c), (0, ""))[1])
    w.settle = 0.0
    w.step()
    st = state(root)
    assert st["kind"] == "running" and f"{other}4242" in str(st["why"]) and ran == []
    assert f"{other}4343" not in str(st["why"])
    (proc / "4242" / "cmdline").unlink()  # its queue ended
    w.step()
    assert ran == ["stop-me"]


def test_other_sweeps_reads_the_run_queue_processes_of_this_machine(tmp_path: Path) -> None:
    """On the real /proc: another root's run_queue is seen, this root's own is not."""
    root = sweep(tmp_path / "s", idle=0)
    other = tmp_path / "shared" / "ablate" / "other"
    procs = []
    for where in (other, root):
        script = where / "wrappers" / "run_queue.0123456789ab.sh"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text("sleep 60\n")
        procs.append(subprocess.Popen(["bash", str(script), "spec.env", "q1", "0"]))
    try:
        wait_for(lambda: str(other) in autostop.other_sweeps(str(root)), 10)
        assert str(root) not in autostop.other_sweeps(str(root))
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_failing_check_is_said_and_the_watcher_goes_on(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug (or an unreadable file) in one check never ends the watcher silently: its record says
    so, and the next check runs."""
    root = sweep(tmp_path / "s", idle=3600)
    w = Watcher(str(root), "h1", clock=Clock(T))
    calls: list[int] = []
    real = w.step

    def step() -> float:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("a damaged record")
        real()
        return -1.0  # end the loop after the second check

    monkeypatch.setattr(w, "step", step)
    monkeypatch.setattr(autostop_watch.time, "sleep", lambda s: None)
    assert w.loop() == 0 and len(calls) == 2
    evs = events(root)
    assert [e.get("kind") or e["ev"] for e in evs][:3] == ["watch_start", "unsure", "idle"], evs
    assert evs[1]["why"] == "not deciding: it failed (ValueError): a damaged record", evs[1]
