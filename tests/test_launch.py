"""deploy / launch / launch --all / stop / append against real tmux (the conftest's private socket),
the real tiny trainer and real files."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

import ablate.run.placement as placement
from ablate.config.project import load_project
from ablate.errors import AblateError
from ablate.remote.layout import session_name
from ablate.run.append import append
from ablate.run.deploy import deploy
from ablate.run.launch import launch, launch_all
from ablate.run.stop import stop
from tests.helpers.project import LocalProject, drained, events, live
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for


@pytest.fixture(autouse=True)
def _tmux() -> None:
    require_tmux()


def log_of(lp: LocalProject, name: str, host: str = "h1") -> str:
    path = lp.root / ".ablate" / "local" / host / "ckpt" / f"{name}.log"
    return path.read_text() if path.exists() else ""


def trainer_pids(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (zombies excluded)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and "train.py" in cmd and state != "Z":
            pids.append(int(d.name))
    return pids


def slow_queue(lp: LocalProject, name: str = "slow", queue: str = "q1") -> None:
    lp.queue(queue, [lp.cfg(f"cfgs/a/{name}.yaml", step_time=0.2) + " recon 200"])


# --------------------------------------------------------------------------- deploy


def test_deploy_is_idempotent_and_a_changed_wrapper_is_a_new_file(
        local_project: LocalProject, monkeypatch: pytest.MonkeyPatch) -> None:
    project = load_project(local_project.root)
    first = deploy(project)
    wrappers = local_project.shared / "wrappers"
    old = wrappers / first.run_queue
    old_bytes = old.read_bytes()
    # 2 wrappers, the learning helper, 2 specs
    assert len(first.created) == 5 and old_bytes.startswith(b"#!/usr/bin/env bash")
    deployed = local_project.shared / "DEPLOYED.json"
    mtime = deployed.stat().st_mtime_ns
    again = deploy(project)
    assert again.created == () and again.version == first.version
    assert deployed.stat().st_mtime_ns == mtime
    assert again.lines()[0] == f"deployed version {first.version} (already in place)"

    packaged = placement.packaged_wrappers()
    changed = {**packaged, "run_queue": packaged["run_queue"] + b"# a fix\n"}
    monkeypatch.setattr(placement, "packaged_wrappers", lambda: changed)
    new = deploy(project)
    assert new.version != first.version and new.run_queue != first.run_queue
    assert new.run_one == first.run_one  # unchanged content, same file
    assert (wrappers / new.run_queue).read_bytes() == changed["run_queue"]
    assert old.read_bytes() == old_bytes and stat.S_IMODE(old.stat().st_mode) == 0o444
    assert stat.S_IMODE((wrappers / new.run_queue).stat().st_mode) == 0o444
    assert json.loads(deployed.read_text())["run_queue"] == new.run_queue
    assert new.to_json()["specs"] == first.to_json()["specs"]  # specs name run_one, which is unchanged


# --------------------------------------------------------------------------- launch / stop


@pytest.mark.tmux
def test_second_live_launch_is_refused_and_stop_kills_the_process_group(local_project: LocalProject) -> None:
    lp = local_project
    slow_queue(lp)
    project = load_project(lp.root)
    launch(project, "q1", "h1")
    wait_for(lambda: "epoch 1/200" in log_of(lp, "slow"))
    pids = trainer_pids(str(lp.root))
    assert len(pids) == 1
    before = lp.snapshot()
    with pytest.raises(AblateError, match=r"already running on h1; `ablate stop q1 --host h1` first") as e:
        launch(project, "q1", "h1")
    assert e.value.exit_code == 2
    assert len((lp.shared / "queues/q1.ledger").read_text().splitlines()) == 1

    hb = json.loads((lp.shared / "heartbeats/h1.q1").read_text())
    assert hb["state"] == "running" and hb["cell"] == "slow" and os.getpgid(pids[0]) == hb["pgid"]
    wait_for(lambda: json.loads((lp.shared / "heartbeats/h1.q1").read_text())["t"] > hb["t"], timeout=5)
    res = stop(project, "q1", "h1")
    assert res.was_live and res.pgid == hb["pgid"] and res.signal == "TERM"
    assert not trainer_pids(str(lp.root)) and not live("h1", "q1")
    with pytest.raises(ProcessLookupError):
        os.killpg(hb["pgid"], 0)
    last = events(lp, "h1", "q1")[-1]
    assert last["ev"] == "stopped" and last["pgid"] == hb["pgid"]
    assert json.loads((lp.shared / "heartbeats/h1.q1").read_text())["state"] == "stopped"
    assert "epoch 1/200" in before[".ablate/local/h1/ckpt/slow.log"].decode()
    assert not stop(project, "q1", "h1").was_live  # stopping a stopped queue is a no-op


@pytest.mark.tmux
def test_relaunch_after_tmux_killed_mid_cell_resumes_the_cell(local_project: LocalProject) -> None:
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/done.yaml") + " recon 1",
                    lp.cfg("cfgs/a/long.yaml", step_time=0.2) + " recon 60"])
    project = load_project(lp.root)
    launch(project, "q1", "h1")
    wait_for(lambda: "epoch 2/60" in log_of(lp, "long"))
    subprocess.run(["tmux", "-L", os.environ["ABLATE_TMUX_SOCKET"], "kill-session", "-t",
                    session_name("t1", "h1", "q1")], check=True)
    wait_for(lambda: not trainer_pids(str(lp.root)))
    n = len(events(lp, "h1", "q1"))
    lp.cfg("cfgs/a/long.yaml", step_time=0)  # finish fast after the resume
    res = launch(project, "q1", "h1")
    assert res.resumed and res.start_index == 1  # `done` is durable; `long` is the first unfinished
    evs = drained(lp, "h1", "q1", since=n)[n:]
    assert [(e["cell"], e["resume"]) for e in evs if e["ev"] == "start"] == [("long", 1)]
    assert [e["rc"] for e in evs if e["ev"] == "end"] == [0]
    assert "resumed from epoch" in log_of(lp, "long")
    assert json.loads((lp.shared / "final_ckpts/long/MANIFEST.json").read_text())["resume"] == 1


@pytest.mark.tmux
def test_edited_launched_line_refuses_relaunch_naming_it(local_project: LocalProject) -> None:
    lp = local_project
    a, b = lp.cfg("cfgs/a/e1.yaml"), lp.cfg("cfgs/a/e2.yaml")
    lp.queue("q1", ["# queue", f"{a} recon 1", f"{b} recon 1"])
    project = load_project(lp.root)
    launch(project, "q1", "h1")
    drained(lp, "h1", "q1")
    lp.queue("q1", ["# queue", f"{a} recon 2", f"{b} recon 1"])
    before = lp.snapshot()
    with pytest.raises(AblateError) as e:
        launch(project, "q1", "h1")
    assert "queues/q1.txt:2 changed since it was launched" in e.value.message
    assert f"was '{a} recon 1', now '{a} recon 2'" in e.value.message
    with pytest.raises(AblateError, match=r"q1.txt:2 changed"):
        append(project, "q1", lp.cfg("cfgs/a/e3.yaml"), "recon")
    lp.root.joinpath("cfgs/a/e3.yaml").unlink()
    assert lp.snapshot() == before and not live("h1", "q1")
    lp.queue("q1", ["# queue", f"{a} recon 1"])  # a launched line deleted
    with pytest.raises(AblateError, match=r"q1.txt:3 was launched as .*e2.yaml recon 1.* is gone"):
        launch(project, "q1", "h1")


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"host": "nohost"}, r"unknown host 'nohost'"),
    ({"start_index": 2}, r"--start-index 2 is out of range: queues/q1.txt has 2 lines"),
    ({"slot": 1}, r"slot 1 is not a GPU slot of host h1"),
    ({"host": "h2"}, r"planned for host h1"),
])
def test_bad_launch_arguments_are_refused_and_change_nothing(
        local_project: LocalProject, kwargs: dict[str, Any], pattern: str) -> None:
    lp = local_project
    lp.queue("q1", ["# ablate: host=h1", lp.cfg("cfgs/a/x.yaml") + " recon 1"])
    before = lp.snapshot()
    args = {"host": "h1", **kwargs}
    with pytest.raises(AblateError, match=pattern) as e:
        launch(load_project(lp.root), "q1", args.pop("host"), **args)
    assert e.value.exit_code == 2
    assert lp.snapshot() == before and not lp.shared.exists()


def test_name_collision_anywhere_refuses_launch(local_project: LocalProject) -> None:
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/same.yaml") + " recon 1"])
    lp.queue("q2", [lp.cfg("cfgs/b/same.yaml") + " recon 1"])
    before = lp.snapshot()
    with pytest.raises(AblateError, match=r"name collision.*'same'"):
        launch(load_project(lp.root), "q1", "h1")
    with pytest.raises(AblateError, match=r"name collision"):
        launch_all(load_project(lp.root))
    assert lp.snapshot() == before and not lp.shared.exists()


@pytest.mark.tmux
def test_launch_all_starts_planned_queues_and_reports_live_ones(local_project: LocalProject) -> None:
    lp = local_project
    lp.queue("q1", ["# ablate: host=h1", lp.cfg("cfgs/a/slow.yaml", step_time=0.2) + " recon 200"])
    lp.queue("q2", ["# ablate: host=h2", lp.cfg("cfgs/a/quick.yaml") + " recon 1"])
    lp.queue("loose", [lp.cfg("cfgs/a/loose.yaml") + " recon 1"])  # no header: not launched
    project = load_project(lp.root)
    first = launch_all(project)
    assert [(r.queue, r.host, r.status) for r in first] == [("q1", "h1", "launched"),
                                                            ("q2", "h2", "launched")]
    drained(lp, "h2", "q2")
    assert live("h1", "q1")
    second = launch_all(project)
    assert [(r.queue, r.status) for r in second] == [("q1", "running"), ("q2", "launched")]
    assert second[0].lines() == ["q1: already running on h1 (tmux ablate-t1-h1-q1); not relaunched"]
    assert second[1].start_index == 2 and second[1].cells == 0  # everything done: it just drains
    assert not (lp.shared / "events/h1.loose.jsonl").exists()
    stop(project, "q1", "h1")


# --------------------------------------------------------------------------- append


@pytest.mark.tmux
def test_append_to_a_drained_queue_restarts_it_at_the_new_line(local_project: LocalProject) -> None:
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/a1.yaml") + " recon 1", lp.cfg("cfgs/a/a2.yaml") + " recon 1"])
    project = load_project(lp.root)
    launch(project, "q1", "h1")
    n = len(drained(lp, "h1", "q1"))
    res = append(project, "q1", lp.cfg("cfgs/a/a3.yaml"), "det")
    assert (res.index, res.cell, res.live) == (2, "a3", False)
    assert res.restarted is not None and res.restarted.start_index == 2
    evs = drained(lp, "h1", "q1", since=n)[n:]
    assert [e["cell"] for e in evs if e["ev"] == "start"] == ["a3"]
    assert not [e for e in evs if e["ev"] == "skip"]  # started at the new line, not from the top
    assert (lp.root / "queues/q1.txt").read_text().splitlines()[-1] == "cfgs/a/a3.yaml det"
    assert (lp.shared / "queues/q1.txt").read_text().splitlines()[-1] == "cfgs/a/a3.yaml det"
    assert json.loads((lp.shared / "final_ckpts/a3/MANIFEST.json").read_text())["epochs"] == 2


@pytest.mark.tmux
def test_append_to_a_live_queue_only_appends_and_the_queue_picks_it_up(local_project: LocalProject) -> None:
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/l1.yaml", step_time=0.1) + " recon 10"])
    project = load_project(lp.root)
    launch(project, "q1", "h1")
    wait_for(lambda: "epoch 1/10" in log_of(lp, "l1"))
    res = append(project, "q1", lp.cfg("cfgs/a/l2.yaml"), "recon", 1)
    assert res.live and res.restarted is None and res.host == "h1"
    evs = drained(lp, "h1", "q1")
    assert [e["cell"] for e in evs if e["ev"] == "start"] == ["l1", "l2"]
    assert len([e for e in evs if e["ev"] == "queue_start"]) == 1
    ledger = [json.loads(x) for x in (lp.shared / "queues/q1.ledger").read_text().splitlines()]
    assert [(e["op"], e["lines"]) for e in ledger] == [("launch", 1), ("append", 2)]


def test_append_refuses_a_name_collision_before_writing(local_project: LocalProject) -> None:
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/c.yaml") + " recon 1"])
    lp.queue("q2", [lp.cfg("cfgs/a/d.yaml") + " recon 1"])
    other = lp.cfg("cfgs/b/c.yaml")
    before = lp.snapshot()
    with pytest.raises(AblateError, match=r"name collision.*'c'"):
        append(load_project(lp.root), "q2", other, "recon")
    with pytest.raises(AblateError, match=r"task 'nope' is not in ablate.yaml tasks"):
        append(load_project(lp.root), "q2", "cfgs/a/e.yaml", "nope")
    assert lp.snapshot() == before
    res = append(load_project(lp.root), "q2", "cfgs/a/c.yaml", "recon", 1)  # the same cell: allowed
    assert res.host is None and "never launched" in res.lines()[1]
