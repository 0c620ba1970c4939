"""ablate.results.release.release: the teardown gate refuses until rule 8 holds, then releases and records."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ablate.config.project import load_project
from ablate.errors import CheckFailed, ConfigError, RemoteError
from ablate.remote.layout import session_name
from ablate.results.pull import pull
from ablate.results.reconcile import reconcile
from ablate.results.release import ReleaseResult, release
from ablate.transport.local import LocalHost
from tests.helpers.project import LocalProject
from tests.helpers.results import publish_cells
from tests.helpers.tmux import require_tmux

CELLS = [("configs/recon/a.yaml", "recon", 3), ("configs/det/b.yaml", "det", 2)]


def no_prompt(question: str) -> bool:
    raise AssertionError(f"asked {question!r} although yes=True")


@pytest.fixture
def proj(local_project: LocalProject) -> LocalProject:
    published: LocalProject = publish_cells(local_project, CELLS)
    return published


@pytest.fixture
def ready(proj: LocalProject) -> LocalProject:
    """Pulled and reconciled: every condition of the gate holds."""
    project = load_project(proj.root)
    pull(project)
    assert reconcile(project).complete
    return proj


def allow(p: LocalProject, host: str = "h1") -> ReleaseResult:
    return release(load_project(p.root), host, yes=True, confirm=no_prompt)


def refusal(p: LocalProject, host: str = "h1") -> str:
    with pytest.raises(CheckFailed) as exc:
        release(load_project(p.root), host, yes=True, confirm=no_prompt)
    assert exc.value.exit_code == 1
    assert "\n" not in exc.value.message
    assert not (p.shared / "gate" / f"release.{host}.json").exists()
    return exc.value.message


def test_refused_before_any_reconcile(proj: LocalProject) -> None:
    msg = refusal(proj)
    assert msg == "release h1 refused: no reconcile recorded: run `ablate pull` then `ablate reconcile`"


def test_allowed_after_complete_reconcile_and_recorded(ready: LocalProject) -> None:
    result = allow(ready)
    assert result.message == "safe to release h1" and result.ran is None
    assert result.lines() == ["safe to release h1"]
    assert result.to_json()["ran"] is None
    rec = json.loads((ready.shared / "gate" / "release.h1.json").read_text())
    assert set(rec) == {"t", "host", "roster_digest", "by", "ran"}
    assert rec["host"] == "h1" and rec["ran"] is None and "@" in rec["by"]
    reconciled = json.loads((ready.shared / "gate" / "reconcile.json").read_text())
    assert rec["roster_digest"] == reconciled["roster_digest"] == result.roster_digest


def test_refused_after_a_cell_is_appended(ready: LocalProject) -> None:
    ready.cfg("configs/det/c.yaml")
    with (ready.root / "queues" / "q1.txt").open("a") as f:
        f.write("configs/det/c.yaml det\n")
    msg = refusal(ready)
    assert "the roster changed since the last reconcile (3 cells now, 2 then); reconcile again" in msg


@pytest.mark.tmux
def test_refused_while_a_queue_of_that_host_runs_in_tmux(ready: LocalProject) -> None:
    require_tmux()
    h1 = LocalHost("h1")
    h1.tmux_start(session_name("t1", "h1", "q1"), ["sleep", "60"], {})
    h1.tmux_start(session_name("other-sweep", "h1", "q1"), ["sleep", "60"], {})
    msg = refusal(ready, "h1")
    assert f"queue q1 is live on h1 (tmux session {session_name('t1', 'h1', 'q1')})" in msg
    assert "other-sweep" not in msg
    # Same tmux server, another host's name: h2 is free to go.
    assert allow(ready, "h2").message == "safe to release h2"
    h1.tmux_kill(session_name("t1", "h1", "q1"))
    assert allow(ready).ran is None


def test_fresh_running_heartbeat_refuses_a_stale_one_does_not(ready: LocalProject) -> None:
    hb = ready.shared / "heartbeats" / "h1.q2"
    hb.parent.mkdir(parents=True)
    hb.write_text(json.dumps({"t": time.time(), "host": "h1", "queue": "q2", "state": "running",
                              "idx": 0, "cell": "a"}))
    assert "queue q2 on h1 reported running" in refusal(ready)
    old = time.time() - 3600
    os.utime(hb, (old, old))  # the instance died an hour ago
    assert allow(ready).message == "safe to release h1"


def test_every_unmet_condition_is_listed(proj: LocalProject) -> None:
    project = load_project(proj.root)
    (proj.shared / "final_ckpts" / "b" / "metrics.json").write_text("{}")
    reconcile(project, fs=True, load=False)
    msg = refusal(proj)
    assert "the last reconcile was not complete (1/2 cells verified)" in msg
    assert "checked the shared FS (--fs), not pulled copies" in msg
    assert msg.count("; ") >= 2


def test_no_load_reconcile_is_not_enough(ready: LocalProject) -> None:
    reconcile(load_project(ready.root), load=False)
    assert "did not load the artifacts (--no-load)" in refusal(ready)


def test_changed_local_copy_refuses_a_touched_but_identical_one_does_not(ready: LocalProject) -> None:
    metrics = ready.root / "results" / "t1" / "a" / "metrics.json"
    later = time.time() + 100
    os.utime(metrics, (later, later))  # re-hashed, identical: trusted
    assert allow(ready).message == "safe to release h1"
    (ready.shared / "gate" / "release.h1.json").unlink()
    metrics.write_text(json.dumps({"val_loss": 99.0}))
    msg = refusal(ready)
    assert "pulled copies changed since the last reconcile: a (metrics.json: changed)" in msg
    (ready.root / "results" / "t1" / "b" / "b.log").unlink()
    assert "b (b.log: gone)" in refusal(ready)


def test_unknown_host_is_bad_input(ready: LocalProject) -> None:
    with pytest.raises(ConfigError) as exc:
        release(load_project(ready.root), "h9", yes=True, confirm=no_prompt)
    assert exc.value.exit_code == 2


def test_confirmation(ready: LocalProject) -> None:
    asked: list[str] = []

    def say_no(question: str) -> bool:
        asked.append(question)
        return False

    with pytest.raises(CheckFailed, match="release h1 not confirmed"):
        release(load_project(ready.root), "h1", yes=False, confirm=say_no)
    assert asked == ["All 2 cells are verified locally. Release h1 (record the approval)?"]
    assert not (ready.shared / "gate" / "release.h1.json").exists()
    assert release(load_project(ready.root), "h1", yes=False, confirm=lambda q: True).message \
        == "safe to release h1"


def with_release(p: LocalProject, template: str, **hosts: dict[str, object]) -> None:
    (p.root / "profiles").mkdir(exist_ok=True)
    (p.root / "profiles" / "local.yaml").write_text(
        "transport: local\nshared_fs: .ablate/shared\nckpt_root: .ablate/local/{host}/ckpt\n"
        f"release: {json.dumps(template)}\n")
    p.write_config(hosts=hosts or {"h1": {"instance_id": "i-123"}, "h2": {}})


def test_release_template_runs_without_a_shell(ready: LocalProject, tmp_path: Path) -> None:
    marker = tmp_path / "marks"
    marker.mkdir()
    with_release(ready, f"touch {marker}/released-{{host}}-{{instance_id}} {marker}/';x'")
    result = allow(ready)
    assert sorted(p.name for p in marker.iterdir()) == [";x", "released-h1-i-123"]
    assert result.ran == f"touch {marker}/released-h1-i-123 '{marker}/;x'"
    assert result.message == f"released h1: ran `{result.ran}`"
    assert json.loads((ready.shared / "gate" / "release.h1.json").read_text())["ran"] == result.ran


def test_release_template_needing_instance_id_on_a_host_without_one(ready: LocalProject) -> None:
    with_release(ready, "vastai destroy instance {instance_id}")
    with pytest.raises(ConfigError, match="host h2 has no instance_id") as exc:
        allow(ready, "h2")
    assert exc.value.exit_code == 2


def test_failing_release_command_is_not_recorded(ready: LocalProject) -> None:
    with_release(ready, "false {host}")
    with pytest.raises(RemoteError, match=r"release command for h1 `false h1` exited 1"):
        allow(ready)
    assert not (ready.shared / "gate" / "release.h1.json").exists()
