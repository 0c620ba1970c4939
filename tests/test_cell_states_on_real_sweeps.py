"""Cell classification (ablate/sweep/classify.py) on real sweeps: real tmux, the real tiny trainer, real
checkpoints, real events, heartbeats, claims and log tails on the FS. Each state is reached for
real, then read back through `status --json` / `reconcile --json` as a user would."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ablate.config.project import load_project
from ablate.remote.layout import session_name
from ablate.sweep.alarms import host_alarms
from ablate.sweep.classify import Verification, cfg_hashes, classify
from ablate.sweep.snapshot import SweepState, state_of
from ablate.transport.local import LocalFS, LocalHost
from tests.helpers.cli import Cli
from tests.helpers.project import LocalProject
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for


@pytest.fixture(autouse=True)
def _tmux() -> None:
    require_tmux()


def states(cli: Cli, p: LocalProject) -> dict[str, dict[str, Any]]:
    cells: dict[str, dict[str, Any]] = cli.json(p, "status")["cells"]
    return cells


def drained(p: LocalProject, host: str, queue: str) -> None:
    def done() -> bool:
        path = p.shared / "events" / f"{host}.{queue}.jsonl"
        live = session_name("t1", host, queue) in LocalHost(host).tmux_sessions()
        return not live and path.exists() and '"queue_end"' in path.read_text()

    wait_for(done, timeout=60, interval=0.1)


@pytest.mark.tmux
def test_each_failure_state_from_a_real_sweep(local_project: LocalProject,
                                              cli: Cli) -> None:
    p = local_project
    p.write_config(steal=False, monitor={"idle_after": "1s"})
    ok = p.cfg("cfgs/a/ok.yaml")
    bad = p.cfg("cfgs/a/crash.yaml", exit_code=1)
    oom = p.cfg("cfgs/a/oom.yaml", exit_code=137)
    ok2 = p.cfg("cfgs/b/ok2.yaml", seed=2)
    later = p.cfg("cfgs/b/later.yaml", seed=3)
    p.queue("h1", ["# ablate: host=h1", f"{ok} recon", f"{bad} recon 2", f"{oom} recon", f"{ok2} recon"])
    p.queue("h2", ["# ablate: host=h2", f"{later} recon"])  # planned, never launched

    before = states(cli, p)
    assert {n: c["state"] for n, c in before.items()} == dict.fromkeys(
        ["ok", "crash", "oom", "ok2", "later"], "never_ran")
    assert before["later"]["pending"] == "h2" and "not launched yet" in before["later"]["reason"]

    cli.json(p, "launch", "h1", "--host", "h1")
    drained(p, "h1", "h1")
    st = cli.json(p, "status")
    cells = st["cells"]
    assert {n: c["state"] for n, c in cells.items()} == {
        "ok": "synced", "crash": "crashed", "oom": "oom", "ok2": "synced", "later": "never_ran"}
    assert cells["crash"]["rc"] == 1 and cells["crash"]["host"] == "h1" and cells["crash"]["queue"] == "h1"
    assert "simulated failure exit 1" in cells["crash"]["tail"][-2]  # the tail the runner kept
    assert "simulated failure exit 1" in cells["crash"]["reason"]
    assert cells["oom"]["rc"] == 137 and "SIGKILL" in cells["oom"]["reason"]
    assert st["states"] == {"synced": 2, "oom": 1, "crashed": 1, "never_ran": 1}
    # The queue drained, its last event is more than idle_after old: the host costs money for nothing.
    wait_for(lambda: cli.json(p, "status")["idle_hosts"], timeout=10, interval=0.3)
    [idle] = cli.json(p, "status")["idle_hosts"]
    assert idle["host"] == "h1" and idle["state"] == "idle_costing_money"
    assert idle["next"] == "ablate reconcile, then ablate release h1"
    r = cli(p, "status")
    assert r.code == 0
    assert "cells: 2 synced, 1 oom, 1 crashed, 1 never_ran" in r.output
    assert "host h1 idle_costing_money" in r.output and "`ablate release h1`" in r.output
    assert any(ln.split()[:2] == ["crashed", "crash"] for ln in r.output.splitlines())

    # reconcile --fs verifies the durable copies in place; its text and JSON classify the rest.
    rec = cli.json(p, "reconcile", "--fs", code=1)
    assert rec["verified"] == 2 and rec["missing"] == ["crash", "oom", "later"]
    assert set(rec["cells"]) == {"crash", "oom", "later"} and rec["cells"]["oom"]["state"] == "oom"
    assert rec["states"] == {"verified": 2, "oom": 1, "crashed": 1, "never_ran": 1}
    r = cli(p, "reconcile", "--fs")
    assert r.code == 1 and "cells: 2 verified, 1 oom, 1 crashed, 1 never_ran" in r.output
    assert states(cli, p)["ok"]["state"] == "verified"

    # A durable checkpoint truncated after its sync: corrupt at the next reconcile, and in status.
    ckpt = p.shared / "final_ckpts" / "ok2" / "model.safetensors"
    with open(ckpt, "r+b") as f:
        f.truncate(ckpt.stat().st_size // 2)
    rec = cli.json(p, "reconcile", "--fs", code=1)
    assert [c["name"] for c in rec["corrupt"]] == ["ok2"] and rec["cells"]["ok2"]["state"] == "corrupt"
    record = json.loads((p.shared / "gate" / "reconcile.json").read_text())
    assert record["corrupt"]["ok2"]["manifest_sha256"]  # keyed to the manifest it was checked against
    assert states(cli, p)["ok2"]["state"] == "corrupt"

    # The config of a verified cell changed since its result was made: stale, not verified.
    (p.root / ok).write_text((p.root / ok).read_text() + "lr2: 0.5\n")
    got = states(cli, p)["ok"]
    assert got["state"] == "stale" and "changed since the result was made" in got["reason"]


@pytest.mark.tmux
def test_hung_then_stopped_is_interrupted_and_its_queue_rest_never_ran(
        local_project: LocalProject, cli: Cli) -> None:
    p = local_project
    p.write_config(steal=False, monitor={"hung_after": "2s"})
    hang = p.cfg("cfgs/a/hang.yaml", step_time=120)  # prints epoch 1, then silent for 2 minutes
    after = p.cfg("cfgs/a/after.yaml")
    p.queue("q1", [f"{hang} recon", f"{after} recon"])
    cli.json(p, "launch", "q1", "--host", "h1")

    seen = wait_for(lambda: (s := states(cli, p))["hang"]["state"] == "running" and s, timeout=20)
    assert isinstance(seen, dict) and seen["after"]["state"] == "queued" and seen["after"]["queue"] == "q1"
    wait_for(lambda: states(cli, p)["hang"]["state"] == "hung", timeout=30, interval=0.3)
    got = states(cli, p)["hang"]
    assert "silent" in got["reason"] and "`ablate stop q1 --host h1`" in got["reason"]
    # remediate leaves a hung cell alone, saying to stop it first; nothing is queued anew.
    out = cli.json(p, "remediate")
    assert out["nothing_new"] and out["targets"] == {} and "hang" in out["hung"]
    assert any("ablate stop q1 --host h1" in a for a in out["advice"])
    assert not list((p.root / "queues").glob("remediate-*"))

    cli.json(p, "stop", "q1", "--host", "h1")
    got2 = states(cli, p)
    assert got2["hang"]["state"] == "interrupted" and "ablate stop" in got2["hang"]["reason"]
    assert got2["after"]["state"] == "never_ran" and "stopped before reaching it" in got2["after"]["reason"]


@pytest.mark.tmux
def test_a_claim_with_no_owner_is_queued_while_a_live_queue_reaches_it_else_interrupted(
        local_project: LocalProject, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner that ended between its claim's mkdir and its owner leaves an ownerless claim. While a
    live queue still reaches the cell, it is `queued` (that queue takes the claim over once the wait
    for the FS's lag is over, and runs it) and remediate leaves it; with no live queue to reach it,
    it is `interrupted`, for remediate to re-run."""
    monkeypatch.setenv("ABLATE_CLAIM_WAIT", "4")  # the tmux server, started here, passes it on
    p = local_project
    p.write_config(steal=False)
    slow, orphan, lone = p.cfg("cfgs/a/slow.yaml", step_time=0.5), p.cfg("cfgs/a/orphan.yaml"), \
        p.cfg("cfgs/a/lone.yaml")
    p.queue("q1", [f"{slow} recon 4", f"{orphan} recon"])
    p.queue("q2", [f"{lone} recon"])  # never launched
    for name in ("orphan", "lone"):
        (p.shared / "claims" / name).mkdir(parents=True)
    cli.json(p, "launch", "q1", "--host", "h1")
    seen = wait_for(lambda: (s := states(cli, p))["slow"]["state"] == "running" and s, timeout=20)
    assert isinstance(seen, dict)
    assert seen["orphan"]["state"] == "queued" and seen["orphan"]["queue"] == "q1", seen["orphan"]
    assert "has no owner" in seen["orphan"]["reason"] and "takes it over" in seen["orphan"]["reason"]
    assert seen["lone"]["state"] == "interrupted" and "has no owner" in seen["lone"]["reason"], seen["lone"]
    out = cli.json(p, "remediate")
    assert set(out["targets"]) == {"lone"}, out["targets"]
    drained(p, "h1", "q1")
    assert states(cli, p)["orphan"]["state"] == "synced"  # published (reconcile verifies)
    evs = [json.loads(x) for x in (p.shared / "events" / "h1.q1.jsonl").read_text().splitlines()]
    assert [e["cell"] for e in evs if e["ev"] == "start"] == ["slow", "orphan"]


@pytest.mark.tmux
def test_lost_needs_both_signals(local_project: LocalProject, cli: Cli) -> None:
    """A real snapshot of a running cell, classified as the controller would see it with its host
    unreachable: fresh heartbeat = a dropped link (running); stale heartbeat too = lost."""
    p = local_project
    p.write_config(steal=False)
    slow = p.cfg("cfgs/a/slow.yaml", step_time=0.5)
    p.queue("q1", [f"{slow} recon 40"])
    cli.json(p, "launch", "q1", "--host", "h1")
    wait_for(lambda: states(cli, p)["slow"]["state"] == "running", timeout=20)
    project = load_project(p.root)
    snap = LocalFS(str(p.shared)).probe("snapshot", {"root": str(p.shared)})

    def sweep_state(snapshot: dict[str, Any], sessions: dict[str, set[str] | None]) -> SweepState:
        return state_of(project, snapshot, sessions)

    def state(snapshot: dict[str, Any], sessions: dict[str, set[str] | None]) -> str:
        st = sweep_state(snapshot, sessions)
        return classify(st, cfg_sha=cfg_hashes(project, st.queues), verification=None,
                        hung_after=1800)["slow"].state

    live = {"h1": {session_name("t1", "h1", "q1")}, "h2": set()}
    assert state(snap, live) == "running"
    assert state(snap, {"h1": None, "h2": set()}) == "running"  # unreachable, heartbeat fresh
    later = {**snap, "now": snap["now"] + 600}
    assert state(later, {"h1": None, "h2": set()}) == "lost"  # unreachable and heartbeat stale
    assert state(later, live) == "running"  # tmux answers: alive, whatever the heartbeat's age
    assert state(snap, {"h1": set(), "h2": set()}) == "interrupted"  # host up, its queue gone
    # No idle alarm for a host whose queue runs.
    assert host_alarms(sweep_state(later, live), ["h1"], idle_after=1) == []
    cli.json(p, "stop", "q1", "--host", "h1")


@pytest.mark.tmux
def test_sync_failure_is_classified(local_project: LocalProject, cli: Cli,
                                    tmp_path: Path) -> None:
    """final_ckpts/ read-only (a bind mount: permissions do not stop root) -> rc 3 + sync_failed."""
    if os.geteuid() != 0:
        pytest.skip("needs root for a read-only bind mount")
    p = local_project
    p.write_config(steal=False)
    one = p.cfg("cfgs/a/one.yaml")
    p.queue("q1", [f"{one} recon"])
    final = p.shared / "final_ckpts"
    final.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(final), str(final)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(final)], check=True)
        cli.json(p, "launch", "q1", "--host", "h1")
        drained(p, "h1", "q1")
    finally:
        subprocess.run(["umount", str(final)], check=True)
    got = states(cli, p)["one"]
    assert got["state"] == "sync_failed" and got["rc"] == 3
    assert "copy to the shared FS failed" in got["reason"] and "kept" in got["reason"]
    assert (p.root / ".ablate" / "local" / "h1" / "ckpt" / "one" / "model.safetensors").exists()


def test_verification_from_an_old_record_without_corrupt_names() -> None:
    v = Verification.from_record({"cells": {"a": {"manifest_sha256": "x"}}, "source": "fs"})
    assert v is not None and v.verified == {"a": "x"} and v.corrupt == {} and v.source == "fs"
    assert Verification.from_record(None) is None
