"""`ablate stop`: the whole process group goes (the trainer's own children too, even one that
ignores TERM), the cut cell is not counted done; `--after-current` lets the running cell finish and
starts nothing more; a launch clears the request. Real tmux, real wrappers, real processes."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from ablate.config.project import load_project
from ablate.run.launch import launch, launch_all
from ablate.run.stop import stop
from ablate.transport import close_all
from tests.helpers.cli import Cli
from tests.helpers.project import TRAIN, LocalProject, events, live
from tests.helpers.testbed_projects import ssh_project
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

pytestmark = pytest.mark.tmux  # tests/helpers/tiers.py


@pytest.fixture(autouse=True)
def _tmux() -> None:
    require_tmux()


def procs(marker: str) -> dict[int, str]:
    """Live (non-zombie) processes whose command line holds `marker`: pid -> command line."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z" and "tmux" not in cmd.split(" ", 1)[0]:  # not tmux itself
            out[int(d.name)] = cmd
    return out


def exact(cmdline: str) -> list[int]:
    """Live processes whose whole command line is `cmdline`."""
    return [pid for pid, cmd in procs(cmdline).items() if cmd.strip() == cmdline]


def heartbeat(lp: LocalProject) -> dict[str, Any]:
    path = lp.shared / "heartbeats/h1.q1"
    return json.loads(path.read_text()) if path.exists() else {}


def manifest(lp: LocalProject, name: str) -> Path:
    return lp.shared / "final_ckpts" / name / "MANIFEST.json"


def test_stop_kills_the_whole_group_including_the_trainers_children(
        local_project: LocalProject, monkeypatch: pytest.MonkeyPatch) -> None:
    lp = local_project
    n = 800000 + os.getpid() % 100000  # marks this test's children in /proc
    # The trainer starts a helper that ignores TERM (only KILL ends it) and a plain one.
    lp.write_config(train=f"sh -c 'trap \"\" TERM; exec sleep {n}' & sleep {n + 1} & {TRAIN}",
                    stop_grace=1)  # the KILL one second after the TERM
    lp.queue("q1", [lp.cfg("cfgs/a/cut.yaml", step_time=0.2) + " recon 200",
                    lp.cfg("cfgs/a/after.yaml") + " recon 1"])
    project = load_project(lp.root)
    launch(project, "q1", "h1")
    trainer = f"--out {lp.root}/.ablate/local/h1/ckpt/cut "
    # Wait for the helpers themselves (`sleep N` after exec, so the TERM trap is set), not for a
    # shell whose command line merely holds the text: signalled before its trap, it would die on TERM.
    wait_for(lambda: exact(f"sleep {n}") and exact(f"sleep {n + 1}") and procs(trainer), timeout=30)
    hb = heartbeat(lp)
    ours = procs(f"sleep {n}") | procs(f"sleep {n + 1}") | procs(trainer) | procs(str(lp.root))
    assert {os.getpgid(pid) for pid in ours} == {hb["pgid"]}  # wrappers, trainer, helpers: one group

    t0 = time.monotonic()
    res = stop(project, "q1", "h1")
    assert res.was_live and res.pgid == hb["pgid"] and res.signal == "KILL"  # TERM was not enough
    assert time.monotonic() - t0 < 8  # stop_grace, not the 10 s it once was
    assert not procs(f"sleep {n}") and not procs(f"sleep {n + 1}") and not procs(str(lp.root))
    with pytest.raises(ProcessLookupError):
        os.killpg(hb["pgid"], 0)
    assert not live("h1", "q1")
    # The cut cell is not done: no durable result, its end never recorded as a success.
    assert not manifest(lp, "cut").exists() and not manifest(lp, "after").exists()
    evs = events(lp, "h1", "q1")
    assert not any(e["ev"] == "end" and e.get("rc") == 0 for e in evs)
    assert evs[-1]["ev"] == "stopped" and evs[-1]["signal"] == "KILL"
    assert heartbeat(lp)["state"] == "stopped"


def test_a_queue_killed_before_its_own_last_beat_is_recorded_stopped(local_project: LocalProject) -> None:
    """run_queue writes its `stopped` beat in its TERM trap, once its cell has ended or its own
    stop_grace has passed; a cell that takes the whole grace (a trainer saving, its last resume
    copy) lets `ablate stop`'s KILL come first. Here the queue was launched with a 30 s grace and
    the stop uses 1 s (ablate.yaml edited between), and the trainer ignores TERM: only `ablate stop`
    can say the queue stopped, and its heartbeat never goes on saying `running` for it."""
    lp = local_project
    lp.write_config(train=f"trap '' TERM; {TRAIN}", stop_grace=30)
    lp.queue("q1", [lp.cfg("cfgs/a/cut.yaml", step_time=0.2) + " recon 200"])
    launch(load_project(lp.root), "q1", "h1")
    wait_for(lambda: heartbeat(lp).get("cell_started") is not None, timeout=30)
    lp.write_config(train=f"trap '' TERM; {TRAIN}", stop_grace=1)
    t0 = time.monotonic()
    res = stop(load_project(lp.root), "q1", "h1")
    assert res.signal == "KILL" and not live("h1", "q1") and time.monotonic() - t0 < 8
    after = heartbeat(lp)
    assert (after["state"], after["cell"], after["cell_started"]) == ("stopped", "cut", None)
    assert events(lp, "h1", "q1")[-1]["ev"] == "stopped"


# A trainer that saves on TERM: it records what ABLATE_STOP_FILE says, takes SAVE seconds to save,
# records that it saved and exits 0 (as some frameworks do after a graceful stop).
SAVER = r"""
import json, os, signal, sys, time
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
def on_term(*_):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # saving: a second TERM changes nothing
    with open(os.environ["ABLATE_STOP_FILE"]) as f:
        told = json.load(f)
    with open(os.path.join(out, "told.json"), "w") as f:
        json.dump(told, f)
    time.sleep(float(sys.argv[2]))
    open(os.path.join(out, "saved"), "w").close()
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(out, "started"), "w").close()
while True:
    time.sleep(0.1)
"""


def test_stop_gives_the_cell_stop_grace_to_save_and_says_why(local_project: LocalProject,
                                                              tmp_path: Path) -> None:
    """`stop_grace: 30`: the trainer, told why in ABLATE_STOP_FILE before its TERM, saves for 2 s
    and exits 0 by itself (no KILL); the cut cell is still not a result."""
    lp = local_project
    saver = tmp_path / "saver.py"
    saver.write_text(SAVER)
    lp.write_config(train=f"{sys.executable} {saver} {{ckpt_dir}} 2 {{cfg}}", stop_grace=30)
    lp.queue("q1", [lp.cfg("cfgs/a/cut.yaml") + " recon 1"])
    project = load_project(lp.root)
    launch(project, "q1", "h1")
    ckpt = lp.root / ".ablate" / "local" / "h1" / "ckpt" / "cut"
    wait_for(lambda: (ckpt / "started").exists() and heartbeat(lp).get("state") == "running", timeout=30)
    res = stop(project, "q1", "h1")
    assert res.was_live and res.signal == "TERM"  # it ended within its grace: no KILL
    assert (ckpt / "saved").exists()
    told = json.loads((ckpt / "told.json").read_text())
    assert told["reason"] == "stop" and told["kill_after"] == 30, told
    assert not manifest(lp, "cut").exists()
    evs = events(lp, "h1", "q1")
    assert not any(e["ev"] == "end" and e.get("rc") == 0 for e in evs)


def test_stop_after_current_lets_the_cell_finish_and_starts_nothing_more(
        local_project: LocalProject, cli: Cli) -> None:
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/first.yaml", step_time=0.4) + " recon 3",
                    lp.cfg("cfgs/a/second.yaml") + " recon 1",
                    lp.cfg("cfgs/a/third.yaml") + " recon 1"])
    project = load_project(lp.root)
    launch(project, "q1", "h1")
    wait_for(lambda: heartbeat(lp).get("cell_started"), timeout=30)

    res = cli.json(lp, "stop", "q1", "--host", "h1", "--after-current")
    request = lp.shared / "control" / "h1.q1.stop"
    assert res["after_current"] and res["was_live"] and res["cell"] == "first"
    assert res["request"] == str(request) and res["signal"] is None
    body = json.loads(request.read_text())
    assert set(body) == {"t", "by"} and "@" in body["by"]
    assert live("h1", "q1")  # nothing was killed

    wait_for(lambda: not live("h1", "q1"), timeout=60)
    evs = events(lp, "h1", "q1")
    assert [(e["ev"], e.get("idx")) for e in evs if e["ev"] in ("start", "end", "queue_stop")] == [
        ("start", 0), ("end", 0), ("queue_stop", 1)]
    assert next(e for e in evs if e["ev"] == "end")["rc"] == 0
    assert next(e for e in evs if e["ev"] == "queue_stop")["reason"] == "after_current"
    assert manifest(lp, "first").exists() and not manifest(lp, "second").exists()
    assert heartbeat(lp)["state"] == "stopped"
    assert stop(project, "q1", "h1", after_current=True).lines() == [
        "q1 is not running on h1 (no tmux ablate-t1-h1-q1); nothing to stop"]

    # A launch clears the request (recorded in the ledger) and the rest of the queue runs.
    again = launch(project, "q1", "h1")
    assert again.start_index == 1 and not request.exists()
    ledger = [json.loads(x) for x in (lp.shared / "queues/q1.ledger").read_text().splitlines()]
    assert ledger[-1]["cleared_stop"] is True and "cleared_stop" not in ledger[0]
    wait_for(lambda: not live("h1", "q1") and manifest(lp, "third").exists(), timeout=60)
    assert manifest(lp, "second").exists()
    assert sum(e["ev"] == "end" and e["cell"] == "first" for e in events(lp, "h1", "q1")) == 1


def test_stop_after_current_says_which_cell_and_launch_all_clears_it(local_project: LocalProject) -> None:
    lp = local_project
    lp.queue("q1", ["# ablate: host=h1", lp.cfg("cfgs/a/solo.yaml", step_time=0.3) + " recon 3",
                    lp.cfg("cfgs/a/next.yaml") + " recon 1"])
    project = load_project(lp.root)
    request = lp.shared / "control" / "h1.q1.stop"
    res = stop(project, "q1", "h1", after_current=True)  # never launched: nothing to ask
    assert not res.was_live and not request.exists()
    launch_all(project)
    wait_for(lambda: heartbeat(lp).get("cell_started"), timeout=30)
    res = stop(project, "q1", "h1", after_current=True)
    assert res.lines() == ["q1 on h1 will stop after its current cell solo; it starts nothing more "
                           "(`ablate launch q1 --host h1` clears the request)"]
    wait_for(lambda: not live("h1", "q1"), timeout=60)
    assert manifest(lp, "solo").exists() and not manifest(lp, "next").exists() and request.exists()
    [again] = launch_all(project)
    assert again.status == "launched" and again.start_index == 2 and not request.exists()
    ledger = [json.loads(x) for x in (lp.shared / "queues/q1.ledger").read_text().splitlines()]
    assert [e.get("cleared_stop") for e in ledger] == [None, True]
    wait_for(lambda: manifest(lp, "next").exists(), timeout=60)


def test_stop_over_ssh_signals_the_group_and_kills_it_after_stop_grace(testbed: Testbed,
                                                                       tmp_path: Path) -> None:
    """Over SSH (the host agent runs commands with dash, whose kill takes no `--`): the TERM and the
    group check reach the host, a TERM-ignoring trainer is KILLed stop_grace later (its queue with
    it: the `stopped` event says so), and the reason is in ABLATE_STOP_FILE."""
    sweep = f"st{os.getpid()}"
    # ignores TERM (only KILL ends it), and says so once it does
    deaf = "sh -c 'trap \"\" TERM; touch {ckpt_dir}.deaf; while :; do sleep 0.1; done'"
    proj = ssh_project(testbed, tmp_path, sweep, train=f"{deaf} && true {{cfg}} {{epochs}}")
    (testbed.shared_dir / "work" / sweep).mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((proj / "ablate.yaml").read_text())
    (proj / "ablate.yaml").write_text(yaml.safe_dump({**config, "stop_grace": 2}, sort_keys=False))
    (proj / "cfgs").mkdir()
    (proj / "cfgs" / "long.yaml").write_text("seed: 1\n")
    (proj / "queues").mkdir()
    (proj / "queues" / "q1.txt").write_text("cfgs/long.yaml recon\n")
    root = testbed.shared_dir / "ablate" / sweep
    host = testbed.hosts[1]
    try:
        project = load_project(proj)
        launch(project, "q1", host)
        wait_for(lambda: (testbed.local_dir(host) / "ckpt" / "long.deaf").exists(), timeout=30)
        t0 = time.monotonic()
        res = stop(project, "q1", host)
        took = time.monotonic() - t0
        assert res.was_live and res.signal == "KILL", res  # TERM was not enough: KILL, stop_grace later
        assert 2 <= took < 20, took
        last = (root / "events" / f"{host}.q1.jsonl").read_text().splitlines()[-1]
        assert json.loads(last)["ev"] == "stopped" and json.loads(last)["signal"] == "KILL"
        told = testbed.local_dir(host) / "ckpt" / ".ablate-stop" / f"{host}.q1"
        assert json.loads(told.read_text())["reason"] == "stop"
    finally:
        close_all()
        shutil.rmtree(testbed.shared_dir / "work" / sweep, ignore_errors=True)
