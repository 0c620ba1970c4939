"""run_queue's decisions come from one long-lived runner process per queue (`runner.py serve`, its
co-process): a queue keeps going when that process is killed, and leaves none behind when it ends or
is stopped. Real tmux, the real tiny trainer, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ablate.config.project import load_project
from ablate.remote.layout import session_name
from ablate.run.launch import launch
from ablate.transport.local import LocalHost
from tests.helpers.project import LocalProject
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.tmux  # tests/helpers/tiers.py


@pytest.fixture(autouse=True)
def _tmux() -> None:
    require_tmux()


def events(lp: LocalProject, host: str, queue: str) -> list[dict[str, Any]]:
    path = lp.shared / "events" / f"{host}.{queue}.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def servers(shared: Path) -> list[int]:
    """Pids of the runner processes serving this sweep's queues."""
    out = subprocess.run(["pgrep", "-f", f"runner\\..*\\.pyz serve {shared}"], capture_output=True,
                         text=True).stdout
    return [int(p) for p in out.split()]


def test_a_queue_starts_python_once_its_decisions_and_publishes_are_asked_of_one_process(
        local_project: LocalProject, tmp_path: Path) -> None:
    """The profile's python logs each start: one `serve` for a queue of three cells, no `publish` of
    its own (run_one asks the queue's runner process over its fds 3 and 4)."""
    lp = local_project
    starts = tmp_path / "starts.log"
    py = tmp_path / "py"
    py.write_text(f'#!/bin/sh\necho "$3" >>{starts}\nexec {sys.executable} "$@"\n')
    py.chmod(0o755)
    (lp.root / "profiles").mkdir()
    (lp.root / "profiles" / "logged.yaml").write_text(
        "transport: local\nshared_fs: .ablate/shared\n"
        f"ckpt_root: .ablate/local/{{host}}/ckpt\npython: {py}\n")
    lp.write_config(profile="logged")
    lp.queue("q1", [lp.cfg(f"cfgs/a/c{i}.yaml") + " recon 1" for i in range(3)])
    launch(load_project(lp.root), "q1", "h1")
    wait_for(lambda: any(e["ev"] == "queue_end" for e in events(lp, "h1", "q1")), timeout=60)
    assert [e["cell"] for e in events(lp, "h1", "q1") if e["ev"] == "synced"] == ["c0", "c1", "c2"]
    assert starts.read_text().split() == ["serve"]


def test_a_killed_runner_process_is_started_again_and_the_queue_goes_on(
        local_project: LocalProject) -> None:
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/first.yaml", step_time=0.5) + " recon 3",
                    lp.cfg("cfgs/a/second.yaml") + " recon 1"])
    launch(load_project(lp.root), "q1", "h1")
    wait_for(lambda: any(e["ev"] == "start" for e in events(lp, "h1", "q1")))
    before = wait_for(lambda: servers(lp.shared) or None)
    assert len(before) == 1
    os.kill(before[0], signal.SIGKILL)  # the OOM killer, say
    wait_for(lambda: any(e["ev"] == "queue_end" for e in events(lp, "h1", "q1")), timeout=60)
    evs = events(lp, "h1", "q1")
    assert [e["cell"] for e in evs if e["ev"] == "end" and e["rc"] == 0] == ["first", "second"]
    assert not [e for e in evs if e["ev"] == "queue_stop"]
    wait_for(lambda: session_name("t1", "h1", "q1") not in LocalHost("h1").tmux_sessions())
    wait_for(lambda: not servers(lp.shared))  # the new one ended with its queue


def test_a_stopped_queue_leaves_no_runner_process_behind(local_project: LocalProject) -> None:
    """`ablate stop` TERMs the queue's process group: the runner process ignores that TERM (it is
    the cell's) and ends with its queue's shell."""
    lp = local_project
    lp.queue("q1", [lp.cfg("cfgs/a/long.yaml", step_time=1.0) + " recon 30"])
    launch(load_project(lp.root), "q1", "h1")
    wait_for(lambda: any(e["ev"] == "start" for e in events(lp, "h1", "q1")))
    hb = json.loads((lp.shared / "heartbeats" / "h1.q1").read_text())
    assert wait_for(lambda: servers(lp.shared) or None)
    os.killpg(hb["pgid"], signal.SIGTERM)
    wait_for(lambda: json.loads((lp.shared / "heartbeats" / "h1.q1").read_text())["state"] == "stopped")
    wait_for(lambda: not servers(lp.shared), timeout=15)
    wait_for(lambda: session_name("t1", "h1", "q1") not in LocalHost("h1").tmux_sessions(), timeout=15)
