"""`ablate deploy --gc`: old wrapper versions and specs go only when no queue can still read them
(live tmux session, fresh running heartbeat, or a host that cannot be asked); the current version
is never touched. Real tmux, real wrappers, real files."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

import ablate.run.placement as placement
from ablate.config.project import load_project
from ablate.errors import AblateError, CheckFailed
from ablate.remote.layout import session_name
from ablate.run.deploy import deploy, gc
from ablate.run.launch import launch
from ablate.run.stop import stop
from ablate.transport import close_all
from ablate.transport.local import LocalHost
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject
from tests.helpers.testbed_projects import ssh_project
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

pytestmark = pytest.mark.tmux  # tests/helpers/tiers.py


@pytest.fixture(autouse=True)
def _tmux() -> None:
    require_tmux()


def files(root: Path) -> dict[str, bytes]:
    return {f"{d}/{p.name}": p.read_bytes()
            for d in ("wrappers", "specs") for p in sorted((root / d).iterdir())}


def new_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrapper "fix": both wrappers change, so do the specs (they name run_one)."""
    packaged = placement.packaged_wrappers()
    changed = {k: v + b"# a fix\n" for k, v in packaged.items()}
    monkeypatch.setattr(placement, "packaged_wrappers", lambda: changed)


def test_gc_is_refused_while_an_old_version_runs_and_removes_it_after(
        local_project: LocalProject, monkeypatch: pytest.MonkeyPatch,
        cli: Cli) -> None:
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/slow.yaml", step_time=0.2) + " recon 200"])
    project = load_project(lp.root)
    old = launch(project, "q1", "h1")
    wait_for(lambda: (lp.shared / "heartbeats/h1.q1").exists(), timeout=30)
    old_files = files(lp.shared)
    new_version(monkeypatch)
    cur = deploy(project)
    assert cur.run_queue != old.run_queue and cur.specs["h1"] != old.spec
    current = {f"wrappers/{cur.run_queue}", f"wrappers/{cur.run_one}", f"wrappers/{cur.runner}",
               *(f"specs/{s}" for s in cur.specs.values())}
    before = files(lp.shared)
    # the runner zipapp did not change: both versions' specs name the one file
    assert len(before) == 9 and current < set(before)
    deployed = (lp.shared / "DEPLOYED.json").read_bytes()

    with pytest.raises(CheckFailed) as e:
        gc(project)
    msg = e.value.message
    assert e.value.exit_code == 1
    assert msg.startswith("deploy --gc refused: queue q1 is live on h1 (tmux), reading ")
    assert f"wrappers/{old.run_queue}" in msg and f"specs/{old.spec}" in msg
    run_one_old = next(n for n in old_files if n.startswith("wrappers/run_one") and n not in current)
    assert run_one_old in msg  # the spec's run_one: every cell of the queue reads it
    assert files(lp.shared) == before
    code, out, err = cli(lp.root, "deploy", "--gc", "--json")
    assert code == 1 and "queue q1 is live on h1" in json.loads(out)["error"]
    assert files(lp.shared) == before

    stop(project, "q1", "h1")
    result = gc(project)
    removed = set(before) - current
    assert set(result.removed) == removed and len(removed) == 4  # 2 wrappers, 2 specs of the old version
    assert set(result.kept) == current
    after = files(lp.shared)
    assert after == {k: v for k, v in before.items() if k in current}  # current: byte for byte
    assert all(stat.S_IMODE((lp.shared / k).stat().st_mode) == 0o444 for k in after)
    assert (lp.shared / "DEPLOYED.json").read_bytes() == deployed
    assert result.lines()[0] == "removed 4 old file(s), kept 5:"

    code, out, err = cli(lp.root, "deploy", "--gc", "--json")
    assert code == 0, err
    assert json.loads(out) == {"removed": [], "kept": sorted(current)}
    # The new version runs: a relaunch reads it, so nothing it reads was removed.
    again = launch(project, "q1", "h1")
    assert again.run_queue == cur.run_queue
    wait_for(lambda: session_name("t1", "h1", "q1") in LocalHost("h1").tmux_sessions(), timeout=10)
    assert gc(project).removed == ()
    stop(project, "q1", "h1")


def test_a_running_heartbeat_or_an_unreachable_host_naming_an_old_version_blocks_gc(
        local_project: LocalProject, monkeypatch: pytest.MonkeyPatch) -> None:
    lp = local_project
    # h3 is reached over ssh at a name that never resolves: it cannot be asked about its tmux.
    lp.write_config(workdir=str(lp.root),
                    hosts={"h1": {"speed": 1.0}, "h3": {"transport": "ssh", "ssh": "h3.invalid"}})
    project = load_project(lp.root)
    with pytest.raises(AblateError, match="nothing is deployed"):
        gc(project)
    old = deploy(project)
    new_version(monkeypatch)
    deploy(project)
    before = files(lp.shared)

    def beat(host: str, queue: str, state: str, age: float) -> None:
        data: dict[str, Any] = {"t": time.time(), "host": host, "queue": queue, "state": state,
                                "run_queue": old.run_queue, "spec": old.specs[host]}
        path = lp.shared / "heartbeats" / f"{host}.{queue}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
        t = time.time() - age
        os.utime(path, (t, t))

    beat("h3", "q3", "drained", 3600)  # an old, drained beat, but h3 cannot say it is not running
    with pytest.raises(CheckFailed, match=r"queue q3 may still run: h3 cannot be reached"):
        gc(project)
    (lp.shared / "heartbeats" / "h3.q3").unlink()

    beat("h1", "q1", "running", 0)  # fresh and running, though its tmux session is gone
    with pytest.raises(CheckFailed, match=r"queue q1 reported running on h1 0s ago"):
        gc(project)
    beat("h1", "q1", "running", 3600)  # a stale beat of a queue whose tmux is gone: not a reader
    assert files(lp.shared) == before
    assert len(gc(project).removed) == 4


def test_gc_over_ssh_waits_for_the_old_queue_to_stop(testbed: Testbed, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = f"gc{os.getpid()}"
    proj = ssh_project(testbed, tmp_path, sweep, train="sleep 600 && true {cfg} {epochs} {ckpt_dir} {resume}")
    (testbed.shared_dir / "work" / sweep).mkdir(parents=True, exist_ok=True)
    (proj / "cfgs").mkdir()
    (proj / "cfgs" / "long.yaml").write_text("seed: 1\n")
    (proj / "queues").mkdir()
    (proj / "queues" / "q1.txt").write_text("cfgs/long.yaml recon\n")
    root = testbed.shared_dir / "ablate" / sweep
    host = testbed.hosts[1]  # not the host the FS is read through
    try:
        project = load_project(proj)
        old = launch(project, "q1", host)
        wait_for(lambda: (root / "heartbeats" / f"{host}.q1").exists(), timeout=30)
        new_version(monkeypatch)
        deploy(project)
        before = files(root)
        live_old = rf"queue q1 is live on {host} \(tmux\), reading .*{old.run_queue}"
        with pytest.raises(CheckFailed, match=live_old):
            gc(project)
        assert files(root) == before

        res = stop(project, "q1", host)
        assert res.was_live and res.signal == "TERM"
        result = gc(project)
        assert len(result.removed) == 2 + len(testbed.hosts)  # old wrappers and every host's old spec
        assert set(files(root)) == set(result.kept) and f"wrappers/{old.run_queue}" not in result.kept
    finally:
        close_all()
