"""Work stealing in run_queue (issue 4): a drained runner takes not-yet-started cells from the queue
expected to finish last, by `estimates.tsv`, through the claims. The victim runs under real tmux
(`launch`); the stealers are the same deployed run_queue started directly, each leading its own
process group as under tmux, so the test controls when they start and the estimates they read
(`launch` may rewrite estimates.tsv). Real trainer, real checkpoints, real files."""

from __future__ import annotations

import fcntl
import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from ablate.config.project import load_project
from ablate.remote.layout import session_name
from ablate.run.launch import launch
from ablate.transport.local import LocalHost
from tests.helpers.project import LocalProject, events
from tests.helpers.runners import Runners, all_events, ends, estimates, finish, own_queue, victim_drained
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.tmux  # tests/helpers/tiers.py


@pytest.fixture(autouse=True)
def _tmux() -> None:
    require_tmux()


def start_victim(lp: LocalProject, tails: list[str], long_epochs: int = 10) -> None:
    """q1 on h1: a long cell (0.5 s an epoch), then short ones; returns once `long` is running."""
    lp.queue("q1", [lp.cfg("cfgs/v/long.yaml", step_time=0.5) + f" recon {long_epochs}", *tails])
    launch(load_project(lp.root), "q1", "h1")
    wait_for(lambda: any(e["ev"] == "start" and e["cell"] == "long" for e in events(lp, "h1", "q1")))


CELLS = {"long": 5000, "t1": 1000, "t2": 1000, "t3": 1000, "s1": 500}


def short(lp: LocalProject, name: str) -> str:
    return lp.cfg(f"cfgs/v/{name}.yaml") + " recon 1"


def test_drained_queue_steals_the_tail_of_the_slow_one(local_project: LocalProject, runners: Runners) -> None:
    lp = local_project
    start_victim(lp, [short(lp, "t1"), short(lp, "t2"), short(lp, "t3")])
    estimates(lp, ["host\th1\t-\t1000", "host\th2\t-\t1000"], CELLS)
    own_queue(lp, "q2", [short(lp, "s1")])
    finish(runners.start("h2", "q2"))
    stealer = events(lp, "h2", "q2")
    steals = [e for e in stealer if e["ev"] == "steal"]
    # the first steal is the victim's last line, taken while `long` (5 s) still runs there
    assert steals[0] == {**steals[0], "idx": 3, "cell": "t3", "from_queue": "q1", "from_host": "h1",
                         "est": 1.0}
    stolen = [e["cell"] for e in steals]
    assert len(set(stolen)) == len(stolen) and set(stolen) <= {"t1", "t2", "t3"}
    for cell in stolen:
        assert [(e["ev"], e["from_queue"]) for e in stealer if e.get("cell") == cell and e["ev"] in
                ("start", "end")] == [("start", "q1"), ("end", "q1")]
    assert [e["rc"] for e in stealer if e["ev"] == "end"] == [0] * (1 + len(stolen))
    assert "from_queue" not in next(e for e in stealer if e["ev"] == "start" and e["cell"] == "s1")
    assert (lp.shared / "claims/t3/owner").read_text().split()[:3] == ["h2", "q2", "3"]
    assert json.loads((lp.shared / "final_ckpts/t3/MANIFEST.json").read_text())["host"] == "h2"
    hb = json.loads((lp.shared / "heartbeats/h2.q2").read_text())
    assert (hb["state"], hb["cell"], hb["from_queue"]) == ("drained", stolen[-1], "q1")

    victim = victim_drained(lp)
    # each stolen line is skipped: `claimed` while it runs on h2, `done` once it has synced
    assert [e["cell"] for e in victim if e["ev"] == "skip"] == [c for c in ("t1", "t2", "t3") if c in stolen]
    assert {e["reason"] for e in victim if e["ev"] == "skip"} <= {"claimed", "done"}
    assert ends(lp) == Counter({c: 1 for c in CELLS})  # every cell ran exactly once
    assert {p.name for p in (lp.shared / "final_ckpts").iterdir()} == set(CELLS)


@pytest.mark.parametrize("order", [["big", "small"], ["small", "big"]])
def test_a_drained_runner_takes_the_cell_that_minimises_the_later_finish(
        local_project: LocalProject, runners: Runners, order: list[str]) -> None:
    """The min-max rule (scripts/bench_balance.py, rule_min_max): q1 runs `long` (5 s) and then has
    `big` (3 s) and `small` (1 s) waiting; a drained h2 of the same speed takes `big`, which leaves q1
    finishing at ~6 s and h2 at 3 s, whichever order q1 lists them in. The rule before it (the last
    line that fits) took `small` from [big, small]; the first line that fits, `small` from
    [small, big]: both leave q1 finishing at ~8 s."""
    lp = local_project
    lines = {"big": lp.cfg("cfgs/v/big.yaml", step_time=0.5) + " recon 4", "small": short(lp, "small")}
    start_victim(lp, [lines[c] for c in order])
    estimates(lp, ["host\th1\t-\t1000", "host\th2\t-\t1000"], {"long": 5000, "big": 3000, "small": 1000})
    own_queue(lp, "q2", ["# drains at once"])
    finish(runners.start("h2", "q2"))
    steals = [e for e in events(lp, "h2", "q2") if e["ev"] == "steal"]
    assert (steals[0]["cell"], steals[0]["from_queue"], steals[0]["est"]) == ("big", "q1", 3.0), steals
    victim_drained(lp)
    assert ends(lp) == Counter({"long": 1, "big": 1, "small": 1})  # every cell ran exactly once


@pytest.mark.parametrize("case", ["slow_slot", "steal_off"])
def test_no_steal_when_not_earlier_or_disabled(
        local_project: LocalProject, runners: Runners, case: str) -> None:
    """A stealer whose slot is very slow would finish t3 long after the victim: it does not take it
    (its host's other slots are fast: the slot's own line wins). With `steal: false` a fast stealer
    takes nothing either."""
    lp = local_project
    if case == "steal_off":
        lp.write_config(steal=False)
    start_victim(lp, [short(lp, "t3")])
    hosts = ["host\th1\t-\t1000", "host\th2\t-\t1000"]
    estimates(lp, hosts + (["host\th2\t1\t50"] if case == "slow_slot" else []), CELLS)
    spec = json.loads((lp.shared / "DEPLOYED.json").read_text())["specs"]["h2"]
    assert f"ABLATE_STEAL={0 if case == 'steal_off' else 1}\n" in (lp.shared / "specs" / spec).read_text()
    own_queue(lp, "q2", [short(lp, "s1")])
    finish(runners.start("h2", "q2", slot=1 if case == "slow_slot" else None))
    assert [e["ev"] for e in events(lp, "h2", "q2")] == ["queue_start", "start", "synced", "end", "queue_end"]
    hb = json.loads((lp.shared / "heartbeats/h1.q1").read_text())
    assert (hb["state"], hb["cell"]) == ("running", "long")  # t3 was there to take, and left alone
    assert not (lp.shared / "claims/t3").exists()
    victim = victim_drained(lp)
    assert [e["cell"] for e in victim if e["ev"] == "end"] == ["long", "t3"]


def history(lp: LocalProject, host: str, queue: str, slot: int | None, cells: dict[str, float]) -> None:
    """Earlier ended cells of this sweep on (host, slot), as their runner recorded them: cell ->
    seconds, each cell costing its seconds' first digit in declared units (1 or 2)."""
    rows = [{"t": 1.0, "ev": "queue_start", "host": host, "queue": queue, "slot": slot}]
    for cell, dur in cells.items():
        rows += [{"t": 2.0, "ev": "start", "host": host, "queue": queue, "cell": cell, "resume": 0},
                 {"t": 3.0, "ev": "end", "host": host, "queue": queue, "cell": cell, "rc": 0, "dur": dur}]
    (lp.shared / "events").mkdir(exist_ok=True)
    (lp.shared / "events" / f"{host}.{queue}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_drained_runner_steals_by_what_this_sweep_has_learned(
        local_project: LocalProject, runners: Runners) -> None:
    """The declared figures say the stealer's slot is 20x slower than the victim's host (the case
    above where it takes nothing); this sweep's ended cells say it is 10x faster. Draining, the
    runner fits its figures on the events (ablate/remote/queue/learn.py, shipped with the wrappers) and
    takes t3, which would wait behind `long` there: the steal event says it was by learned figures,
    and every cell still runs once."""
    lp = local_project
    start_victim(lp, [short(lp, "t3")])
    history(lp, "h1", "q0", None, {"x1": 10.0, "x2": 20.0})  # 10 s a unit
    history(lp, "h2", "q9", 1, {"y1": 1.0, "y2": 2.0})  # 1 s a unit
    costs = {"long": 5.0, "t3": 1.0, "s1": 0.5, "x1": 1.0, "x2": 2.0, "y1": 1.0, "y2": 2.0}
    estimates(lp, ["host\th1\t-\t1000", "host\th2\t-\t1000", "host\th2\t1\t50",
                   *(f"cost\t{c}\trecon\t{u}" for c, u in costs.items())], CELLS)
    own_queue(lp, "q2", [short(lp, "s1")])
    finish(runners.start("h2", "q2", slot=1))
    steals = [e for e in events(lp, "h2", "q2") if e["ev"] == "steal"]
    assert [(e["cell"], e["by"]) for e in steals] == [("t3", "learned")], events(lp, "h2", "q2")
    assert steals[0]["est"] < 5.0, steals  # about a unit's 1 s here (20 s by the declared figures)
    victim = victim_drained(lp)
    assert [e["cell"] for e in victim if e["ev"] == "end"] == ["long"]
    assert ends(lp) == Counter({c: 1 for c in ("long", "t3", "s1", "x1", "x2", "y1", "y2")})


def test_drained_stealers_racing_for_one_cell_run_it_once(
        local_project: LocalProject, runners: Runners, tmp_path: Path) -> None:
    lp = local_project
    lp.write_config(hosts={"h1": {}, "h2": {}, "h3": {}})
    # The comment lines after t1 widen the window between a stealer's look at claims/t1 (early in
    # its scan of q1) and its mkdir (after the scan), so the stealers really collide there.
    start_victim(lp, [short(lp, "t1"), *["# pad"] * 400], long_epochs=8)
    estimates(lp, [f"host\th{i}\t-\t1000" for i in (1, 2, 3)], CELLS)
    stealers = (("h2", "q2"), ("h3", "q3"), ("h3", "q4"), ("h2", "q5"))
    for _, q in stealers:
        own_queue(lp, q, [f"# {q}: nothing of its own, it drains at once"])
    # All four are released at the same instant (they wait on one flock), so they scan together and
    # reach `mkdir claims/t1` at once ("lost the claim of t1" in their output).
    gate = tmp_path / "gate"
    gate.touch()
    fd = os.open(gate, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        procs = [runners.start(h, q, gate=gate) for h, q in stealers]
        pids = {str(p.pid) for p in procs}
        blocked = f":{gate.stat().st_ino} 0 EOF"  # /proc/locks: "N: -> FLOCK ADVISORY READ pid dev:ino 0 EOF"
        wait_for(lambda: pids <= {ln.split()[5] for ln in Path("/proc/locks").read_text().splitlines()
                                  if " -> FLOCK " in ln and ln.endswith(blocked)})
    finally:
        os.close(fd)  # releases the gate
    for p in procs:
        finish(p)
    steals = [e for e in all_events(lp) if e["ev"] == "steal"]
    assert [e["cell"] for e in steals] == ["t1"]
    victim = victim_drained(lp)
    assert [(e["cell"], e["reason"]) for e in victim if e["ev"] == "skip"] in ([("t1", "claimed")],
                                                                              [("t1", "done")])
    assert ends(lp) == Counter({"long": 1, "t1": 1})


def test_a_stolen_cell_cut_by_a_stop_is_reentered_with_resume_on_relaunch(
        local_project: LocalProject, runners: Runners) -> None:
    lp = local_project
    start_victim(lp, [lp.cfg("cfgs/v/t3.yaml", step_time=0.4) + " recon 8"])
    estimates(lp, ["host\th1\t-\t1000", "host\th2\t-\t1000"], {**CELLS, "t3": 3000})
    own_queue(lp, "q2", [short(lp, "s1")])
    p = runners.start("h2", "q2")
    log = lp.root / ".ablate/local/h2/ckpt/t3.log"
    wait_for(lambda: log.exists() and "epoch 2/8" in log.read_text())
    os.killpg(p.pid, signal.SIGTERM)  # what `ablate stop` does to the group
    p.communicate(timeout=30)
    assert p.returncode == 143
    assert json.loads((lp.shared / "heartbeats/h2.q2").read_text())["state"] == "stopped"
    victim = victim_drained(lp)  # meanwhile the victim reaches t3: still claimed by h2/q2
    assert [(e["cell"], e["reason"]) for e in victim if e["ev"] == "skip"] == [("t3", "claimed")]

    finish(runners.start("h2", "q2", start=1))  # relaunch: its own line is done
    stealer = events(lp, "h2", "q2")
    starts = [(e["resume"], e["from_queue"]) for e in stealer if e["ev"] == "start" and e["cell"] == "t3"]
    assert starts == [(0, "q1"), (1, "q1")]
    assert [e["cell"] for e in stealer if e["ev"] == "steal"] == ["t3"]  # re-entered, not stolen again
    assert "resumed from epoch" in log.read_text()
    assert ends(lp) == Counter({"long": 1, "t3": 1, "s1": 1})
    assert (lp.shared / "final_ckpts/t3/MANIFEST.json").exists()


def test_stop_file_is_honoured_before_a_steal(local_project: LocalProject, runners: Runners) -> None:
    lp = local_project
    start_victim(lp, [short(lp, "t3")])
    estimates(lp, ["host\th1\t-\t1000", "host\th2\t-\t1000"], CELLS)
    own_queue(lp, "q2", [lp.cfg("cfgs/v/s1.yaml", step_time=1.0) + " recon 1"])
    p = runners.start("h2", "q2")
    wait_for(lambda: any(e["ev"] == "start" for e in events(lp, "h2", "q2")))
    (lp.shared / "control").mkdir(exist_ok=True)
    (lp.shared / "control/h2.q2.stop").write_text('{"t": 0, "by": "test"}\n')
    finish(p)
    assert [e["ev"] for e in events(lp, "h2", "q2")][-2:] == ["end", "queue_stop"]
    assert events(lp, "h2", "q2")[-1] == {**events(lp, "h2", "q2")[-1], "idx": 1, "reason": "after_current"}
    assert json.loads((lp.shared / "heartbeats/h2.q2").read_text())["state"] == "stopped"
    assert not (lp.shared / "claims/t3").exists()


def test_steals_from_the_queue_finishing_last_that_has_a_cell_to_give(
        local_project: LocalProject, runners: Runners) -> None:
    """q1 finishes last but only has its running cell: nothing to take there. qa is next by remaining
    time (its running `mid` plus u1), ahead of qb (a shorter running cell plus w1): u1 goes first."""
    lp = local_project
    lp.write_config(hosts={"h1": {}, "h2": {}, "h3": {}})
    project = load_project(lp.root)
    lp.queue("q1", [lp.cfg("cfgs/v/big.yaml", step_time=0.5) + " recon 12"])
    lp.queue("qa", [lp.cfg("cfgs/v/mid.yaml", step_time=0.5) + " recon 8", short(lp, "u1")])
    lp.queue("qb", [lp.cfg("cfgs/v/small.yaml", step_time=0.5) + " recon 4", short(lp, "w1")])
    for q, host in (("q1", "h1"), ("qa", "h3"), ("qb", "h3")):
        launch(project, q, host)
    def running(host: str, q: str, cell: str) -> bool:
        return any(e["ev"] == "start" and e["cell"] == cell for e in events(lp, host, q))

    wait_for(lambda: running("h1", "q1", "big") and running("h3", "qa", "mid")
             and running("h3", "qb", "small"))
    estimates(lp, [f"host\th{i}\t-\t1000" for i in (1, 2, 3)],
              {"big": 8000, "mid": 4000, "u1": 1000, "small": 2000, "w1": 1000})
    own_queue(lp, "q2", ["# drains at once"])
    finish(runners.start("h2", "q2"))
    steals = [e for e in events(lp, "h2", "q2") if e["ev"] == "steal"]
    assert (steals[0]["cell"], steals[0]["from_queue"], steals[0]["from_host"]) == ("u1", "qa", "h3")
    assert {e["cell"] for e in steals} <= {"u1", "w1"}

    def all_drained() -> bool:
        live = LocalHost("h1").tmux_sessions()
        return not {session_name("t1", h, q) for q, h in (("q1", "h1"), ("qa", "h3"), ("qb", "h3"))} & live

    wait_for(all_drained, timeout=60)
    assert ends(lp) == Counter({c: 1 for c in ("big", "mid", "u1", "small", "w1")})
