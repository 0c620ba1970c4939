"""The shared head in run_queue (issue 13), on with `calibrate:`: each queue's host times a benchmark
before its first cell; then the cells of at least half the largest estimate are dealt out before any
other line, by the measured speeds, each to the runner expected to end it first; a runner leaves its
own head line dealt to another (deferred) and takes it back when nobody else will.
Real run_queue processes (one under tmux via `launch`, the others started directly, each leading its
own process group), the real trainer, real checkpoints."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from typing import Any

import pytest

from ablate.config.project import load_project
from ablate.errors import ConfigError
from ablate.monitor.status import status
from ablate.remote.layout import session_name
from ablate.run.deploy import deploy
from ablate.run.launch import launch
from ablate.run.stop import stop
from ablate.sweep.classify import cfg_hashes, classify
from ablate.sweep.records import Heartbeat
from ablate.sweep.snapshot import state_of
from ablate.transport.local import LocalFS
from tests.helpers.project import LocalProject, events
from tests.helpers.runners import Runners, ends, estimates, finish, own_queue, victim_drained
from tests.helpers.tmux import require_tmux
from tests.helpers.wait import wait_for

DECLARED = ["host\th1\t-\t1000", "host\th2\t-\t200"]  # h2 declared 5x slower


def measured(lp: LocalProject, q1: str, q2: str) -> None:
    """`calibrate:` on; the benchmark of q1 and of q2 prints these seconds."""
    lp.write_config(calibrate="cat speed_$ABLATE_QUEUE.txt")
    (lp.root / "speed_q1.txt").write_text(q1)
    (lp.root / "speed_q2.txt").write_text(q2)
COSTS = {"x": 1500, "big": 3000, "s1": 500}


@pytest.fixture(autouse=True)
def _tmux() -> None:
    require_tmux()


def start_q1(lp: LocalProject) -> None:
    """q1 on h1 (under tmux): x, ~1.5 s; returns once it runs."""
    lp.queue("q1", [lp.cfg("cfgs/v/x.yaml", step_time=0.5) + " recon 3"])
    launch(load_project(lp.root), "q1", "h1")
    wait_for(lambda: any(e["ev"] == "start" and e["cell"] == "x" for e in events(lp, "h1", "q1")))


def q2_lines(lp: LocalProject) -> list[str]:
    """h2's own queue: big (a head cell, ~0.9 s), then s1 (~3 s: h1 drains while it runs)."""
    return [lp.cfg("cfgs/v/big.yaml", step_time=0.3) + " recon 3",
            lp.cfg("cfgs/v/s1.yaml", step_time=1.0) + " recon 3"]


def each_ran_its_own_config(lp: LocalProject, cells: set[str]) -> None:
    """Every cell published, from the config of its own name (what the trainer was given)."""
    for cell in cells:
        manifest = json.loads((lp.shared / "final_ckpts" / cell / "MANIFEST.json").read_text())
        assert manifest["cfg"] == f"cfgs/v/{cell}.yaml", (cell, manifest["cfg"])


def kinds(evs: list[dict[str, Any]], cell: str) -> list[str]:
    return [e["ev"] for e in evs if e.get("cell") == cell]


@pytest.mark.tmux
def test_a_head_line_is_dealt_to_the_runner_that_ends_it_first(
        local_project: LocalProject, runners: Runners) -> None:
    """h2 (measured 5x slower) reaches its own `big` while h1 runs x: h1 would end it first, so h2
    defers it (its heartbeat lists the line) and runs s1; h1, draining, takes big from q2 by the
    deal. Every cell runs once."""
    lp = local_project
    measured(lp, "0.2\n", "1.0\n")
    start_q1(lp)
    estimates(lp, DECLARED, COSTS)
    own_queue(lp, "q2", q2_lines(lp))
    p = runners.start("h2", "q2")

    def deferred() -> tuple[int, ...]:
        path = lp.shared / "heartbeats/h2.q2"
        hb = Heartbeat.from_bytes("h2.q2", path.read_bytes() if path.exists() else None)
        return hb.deferred if hb is not None else ()

    assert wait_for(lambda: deferred() == (0,))
    finish(p)
    victim_drained(lp)
    mine, theirs = events(lp, "h2", "q2"), events(lp, "h1", "q1")
    assert kinds(mine, "big") == ["defer", "skip"], mine  # left to the deal; claimed by h1 by then
    deal = next(e for e in theirs if e["ev"] == "steal")
    assert (deal["cell"], deal["from_queue"], deal["from_host"], deal["idx"], deal["by"]) == \
        ("big", "q2", "h2", 0, "deal")
    assert ends(lp) == Counter({"x": 1, "big": 1, "s1": 1})  # every cell ran exactly once
    each_ran_its_own_config(lp, {"x", "big", "s1"})
    assert json.loads((lp.shared / "final_ckpts/big/MANIFEST.json").read_text())["host"] == "h1"


@pytest.mark.tmux
def test_a_deferred_line_is_taken_back_when_its_taker_stops(
        local_project: LocalProject, runners: Runners) -> None:
    """As above, but q1 is asked to stop after x: nobody else is left to deal big to, so h2 takes its
    own deferred line back once s1 ends. A line is never left behind."""
    lp = local_project
    measured(lp, "0.2\n", "1.0\n")
    start_q1(lp)
    (lp.shared / "control").mkdir(exist_ok=True)
    (lp.shared / "control/h1.q1.stop").write_text('{"t": 0, "by": "test"}\n')
    estimates(lp, DECLARED, COSTS)
    own_queue(lp, "q2", q2_lines(lp))
    finish(runners.start("h2", "q2"))
    victim_drained_or_stopped = events(lp, "h1", "q1")
    assert [e["ev"] for e in victim_drained_or_stopped][-1] == "queue_stop"
    mine = events(lp, "h2", "q2")
    assert kinds(mine, "big") == ["defer", "start", "synced", "end"], mine
    assert [e["cell"] for e in mine if e["ev"] == "start"] == ["s1", "big"]
    assert next(e for e in mine if e["ev"] == "start" and e["cell"] == "big")["idx"] == 0
    assert ends(lp) == Counter({"x": 1, "big": 1, "s1": 1})
    each_ran_its_own_config(lp, {"x", "big", "s1"})


@pytest.mark.tmux
def test_measured_speeds_decide_the_deal(local_project: LocalProject, runners: Runners) -> None:
    """`calibrate:` measures h2 10x faster than h1 (the benchmark prints its own seconds), against
    the declared 5x slower: h2 keeps big and runs it first. Each queue's measurement is an event and
    a file under calib/, made once per host."""
    lp = local_project
    measured(lp, "1.0\n", "warming up\n0.1\n")
    start_q1(lp)
    estimates(lp, DECLARED, COSTS)
    own_queue(lp, "q2", q2_lines(lp))
    finish(runners.start("h2", "q2"))
    victim_drained(lp)
    mine = events(lp, "h2", "q2")
    assert [e["ev"] for e in mine][:2] == ["queue_start", "calibrate"]
    assert (mine[1]["rc"], mine[1]["secs"]) == (0, 0.1)
    assert next(e["secs"] for e in events(lp, "h1", "q1") if e["ev"] == "calibrate") == 1.0
    assert (lp.shared / "calib/h2.-").read_text() == "100\n"
    report = status(load_project(lp.root))  # what a user sees of it
    assert report.calibrate is not None
    assert {q: (m["secs"], m["kept"]) for q, m in report.calibrate.queues.items()} == \
        {"q1": (1.0, False), "q2": (0.1, False)}
    assert "measured (calibrate): q1 (h1) 1 s, q2 (h2) 0.1 s" in report.lines()
    assert (lp.shared / "calib/h1.-").read_text() == "1000\n"
    assert "defer" not in [e["ev"] for e in mine]
    assert next(e["cell"] for e in mine if e["ev"] == "start") == "big"
    assert ends(lp) == Counter({"x": 1, "big": 1, "s1": 1})
    each_ran_its_own_config(lp, {"x", "big", "s1"})


def test_a_queue_waits_for_the_others_calibration_before_its_first_cell(
        local_project: LocalProject, runners: Runners) -> None:
    """q2's benchmark takes 1 s, q3's none: q3 starts its first cell only once q2 has measured (the
    deal needs every running queue's speed); a failed benchmark is marked, not waited for."""
    lp = local_project
    lp.write_config(calibrate="sh -c 'sleep $(cat wait_$ABLATE_QUEUE.txt); echo 0.5'")
    (lp.root / "wait_q2.txt").write_text("1\n")
    (lp.root / "wait_q3.txt").write_text("0\n")
    deploy(load_project(lp.root))
    estimates(lp, DECLARED, COSTS)
    own_queue(lp, "q2", [lp.cfg("cfgs/v/s1.yaml") + " recon 1"])
    own_queue(lp, "q3", [lp.cfg("cfgs/v/x.yaml") + " recon 1"])
    p2 = runners.start("h2", "q2")
    assert wait_for(lambda: (lp.shared / "heartbeats/h2.q2").exists())
    p3 = runners.start("h1", "q3")
    finish(p2)
    finish(p3)
    calibrated = next(e["t"] for e in events(lp, "h2", "q2") if e["ev"] == "calibrate")
    first = next(e["t"] for e in events(lp, "h1", "q3") if e["ev"] == "start")
    assert first >= calibrated
    assert ends(lp) == Counter({"x": 1, "s1": 1})
    each_ran_its_own_config(lp, {"x", "s1"})


@pytest.mark.parametrize(("value", "why"), [
    ("python bench.py --cfg {cfg}", "{cfg}"),
    (["python", "bench.py"], "must be a command"),
    ({"command": "python bench.py", "timeout": 0}, "positive whole number"),
    ({"command": "python bench.py", "every": 1}, "every"),
    ({"command": "python bench.py", "keep": "yes"}, "true or false"),
])
def test_a_bad_calibrate_setting_is_refused_with_its_fix(
        local_project: LocalProject, value: object, why: str) -> None:
    local_project.write_config(calibrate=value)
    with pytest.raises(ConfigError, match="calibrate") as e:
        load_project(local_project.root)
    assert why in str(e.value)


def test_calibrate_reaches_the_run_spec(local_project: LocalProject) -> None:
    from ablate.run.deploy import render_spec

    local_project.write_config(calibrate={"command": "python bench.py --gpu {gpu}", "timeout": 30})
    project = load_project(local_project.root)
    spec = render_spec(project, project.host("h1"), "run_one.sh").decode()
    assert "ABLATE_CALIBRATE='python bench.py --gpu {gpu}'\n" in spec
    assert "ABLATE_CALIBRATE_TIMEOUT=30\n" in spec
    assert "ABLATE_CALIBRATE_KEEP=1\n" in spec
    local_project.write_config(calibrate={"command": "python bench.py", "keep": False})
    project = load_project(local_project.root)
    assert "ABLATE_CALIBRATE_KEEP=0\n" in render_spec(project, project.host("h1"), "run_one.sh").decode()


@pytest.mark.tmux
def test_a_deferred_line_is_classified_queued_not_never_ran(local_project: LocalProject) -> None:
    """Both queues launched: h2 (measured 5x slower) defers its own `big` to h1, which still runs x
    for seconds. Meanwhile big is in no claim and behind q2's `idx`: classification counts it
    queued on q2 (the heartbeat's `deferred`), not `never_ran`, which remediate would re-run."""
    lp = local_project
    measured(lp, "0.2\n", "1.0\n")
    project = load_project(lp.root)
    lp.queue("q1", [lp.cfg("cfgs/v/x.yaml", step_time=2.0) + " recon 3"])  # ~6 s
    lp.queue("q2", [lp.cfg("cfgs/v/big.yaml", step_time=0.2) + " recon 4",
                    lp.cfg("cfgs/v/s1.yaml", step_time=6.0) + " recon 1"])
    launch(project, "q1", "h1")
    wait_for(lambda: any(e["ev"] == "start" for e in events(lp, "h1", "q1")))
    launch(project, "q2", "h2")

    def deferred_snapshot() -> dict[str, Any] | None:
        snap = LocalFS(str(lp.shared)).probe("snapshot", {"root": str(lp.shared)})
        data = (snap["heartbeats"].get("h2.q2") or {}).get("data") or {}
        return snap if data.get("deferred") == [0] and "big" not in snap["claims"] else None

    snap = wait_for(deferred_snapshot, timeout=20)
    assert isinstance(snap, dict)
    live = {"h1": {session_name("t1", "h1", "q1")}, "h2": {session_name("t1", "h2", "q2")}}
    st = state_of(project, snap, live)
    cells = classify(st, cfg_sha=cfg_hashes(project, st.queues), verification=None, hung_after=1800)
    assert (cells["big"].state, cells["big"].queue) == ("queued", "q2"), cells["big"]
    stop(project, "q1", "h1")
    stop(project, "q2", "h2")


def test_a_runner_on_another_queues_line_shows_its_own_next_line(
        local_project: LocalProject, runners: Runners) -> None:
    """h1 (measured 5x faster) is dealt q2's big2 before its own s1: while it runs it, its heartbeat's
    `idx` is big2's line in q2's file and `next` its own next line (0), which the other runners' deals
    and steals and the classification read its queue from. (`next` once came from run_cell's own
    `idx`, the stolen line's number: h1's own head line big1 was hidden from the others.)"""
    lp = local_project
    # h1's benchmark takes 1 s from when h2 runs (`go_q1`, touched below): a queue waits only for the
    # queues it sees running, and under load h2 once started more than 1 s after h1.
    lp.write_config(calibrate="sh -c 'until [ -e go_$ABLATE_QUEUE ]; do sleep 0.05; done; "
                              "sleep $(cat wait_$ABLATE_QUEUE.txt); cat speed_$ABLATE_QUEUE.txt'")
    for q, wait, secs in (("q1", "1", "0.2"), ("q2", "0", "1.0")):
        (lp.root / f"wait_{q}.txt").write_text(wait + "\n")
        (lp.root / f"speed_{q}.txt").write_text(secs + "\n")
    (lp.root / "go_q2").touch()
    deploy(load_project(lp.root))
    estimates(lp, DECLARED, {"s1": 500, "big1": 2500, "big2": 3000})
    own_queue(lp, "q1", [lp.cfg("cfgs/v/s1.yaml") + " recon 1",
                         lp.cfg("cfgs/v/big1.yaml", step_time=0.2) + " recon 2"])
    # the deal reads the declared estimates, not these times; big2's 1.8 s are the window to see it run
    own_queue(lp, "q2", ["# big2 is line 1", lp.cfg("cfgs/v/big2.yaml", step_time=0.6) + " recon 3"])
    p1 = runners.start("h1", "q1")
    assert wait_for(lambda: (lp.shared / "heartbeats/h1.q1").exists())
    p2 = runners.start("h2", "q2")
    assert wait_for(lambda: (lp.shared / "heartbeats/h2.q2").exists())
    (lp.root / "go_q1").touch()
    beat = lp.shared / "heartbeats/h1.q1"

    def on_big2() -> dict[str, Any] | None:
        hb = json.loads(beat.read_text()) if beat.exists() else {}
        return hb if hb.get("cell") == "big2" and hb.get("cell_started") else None

    hb = wait_for(on_big2, timeout=20)
    assert isinstance(hb, dict)
    assert (hb["idx"], hb["from_queue"], hb["next"]) == (1, "q2", 0), hb
    finish(p1)
    finish(p2)
    deal = next(e for e in events(lp, "h1", "q1") if e["ev"] == "steal")
    assert (deal["cell"], deal["by"]) == ("big2", "deal")
    assert ends(lp) == Counter({"s1": 1, "big1": 1, "big2": 1})
    each_ran_its_own_config(lp, {"s1", "big1", "big2"})


BENCH = "sh -c 'uname -n >> benchmarks.txt; echo 0.3'"  # one line per run: which machine ran it


def one_sweep(lp: LocalProject, runners: Runners, sweep: str, calibrate: object,
              prefix: tuple[str, ...] = ()) -> list[tuple[float, bool]]:
    """Sweep `sweep` of the project, its one cell on h1, run to the end (under `prefix`): its
    `calibrate` events' (secs, kept)."""
    lp.write_config(sweep=sweep, calibrate=calibrate)
    deploy(load_project(lp.root))
    root = lp.shared.parent / sweep
    (root / "queues").mkdir(parents=True, exist_ok=True)
    (root / "queues/q1.txt").write_text(lp.cfg("cfgs/v/s1.yaml", step_time=0.05) + " recon 1\n")
    finish(runners.start("h1", "q1", root=root, prefix=prefix))
    evs = [json.loads(x) for x in (root / "events/h1.q1.jsonl").read_text().splitlines()]
    assert [e["cell"] for e in evs if e["ev"] == "end" and e["rc"] == 0] == ["s1"]
    return [(e["secs"], e.get("kept", False)) for e in evs if e["ev"] == "calibrate"]


def benchmarks(lp: LocalProject) -> list[str]:
    path = lp.root / "benchmarks.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_a_measurement_is_kept_for_the_next_sweep_on_the_same_machine(
        local_project: LocalProject, runners: Runners) -> None:
    """Sweep t1 times the benchmark on h1; t2, the same benchmark on the same machine, takes the kept
    figure without running it (event `calibrate` with `kept`, the same calib/ file); with `keep:
    false` (t3) or another benchmark command (t4) it is measured again."""
    lp = local_project
    assert one_sweep(lp, runners, "t1", BENCH) == [(0.3, False)]
    assert one_sweep(lp, runners, "t2", BENCH) == [(0.3, True)]
    assert (lp.shared.parent / "t2/calib/h1.-").read_text() == "300\n"
    assert len(benchmarks(lp)) == 1
    assert one_sweep(lp, runners, "t3", {"command": BENCH, "keep": False}) == [(0.3, False)]
    assert len(benchmarks(lp)) == 2
    assert one_sweep(lp, runners, "t4", BENCH.replace("0.3", "0.4")) == [(0.4, False)]
    assert len(benchmarks(lp)) == 3


def test_a_failed_benchmark_is_marked_and_never_kept(local_project: LocalProject, runners: Runners) -> None:
    """A benchmark exiting 3: calib/ says `failed 3` (nobody waits for it), the event has its rc and
    no seconds, the cell still runs, and nothing is kept: the next sweep runs the benchmark again."""
    lp = local_project
    failing = "sh -c 'uname -n >> benchmarks.txt; exit 3'"
    for sweep in ("t1", "t2"):
        lp.write_config(sweep=sweep, calibrate=failing)
        deploy(load_project(lp.root))
        root = lp.shared.parent / sweep
        (root / "queues").mkdir(parents=True, exist_ok=True)
        (root / "queues/q1.txt").write_text(lp.cfg("cfgs/v/s1.yaml", step_time=0.05) + " recon 1\n")
        finish(runners.start("h1", "q1", root=root))
        evs = [json.loads(x) for x in (root / "events/h1.q1.jsonl").read_text().splitlines()]
        calib = [e for e in evs if e["ev"] == "calibrate"]
        assert [(e["rc"], "secs" in e, e.get("kept")) for e in calib] == [(3, False, None)], calib
        assert (root / "calib/h1.-").read_text() == "failed 3\n"
        assert [e["cell"] for e in evs if e["ev"] == "end" and e["rc"] == 0] == ["s1"]
        assert "measured (calibrate): q1 (h1) failed (rc 3)" in status(load_project(lp.root)).lines()
    assert len(benchmarks(lp)) == 2
    assert not list((lp.shared.parent / ".calib").glob("*"))


def test_status_calls_out_a_benchmark_that_costs_too_much_against_the_cells(
        local_project: LocalProject, runners: Runners) -> None:
    """A benchmark of half a second before cells of well under a second costs more than it can win:
    `status` says so, with the host and the figures. Once the figure is kept (the next sweep), it costs
    nothing and `status` only shows it."""
    lp = local_project
    slow = "sh -c 'sleep 0.5; echo 0.05'"
    cells = [lp.cfg(f"cfgs/v/s{i}.yaml", step_time=0.05) + " recon 1" for i in range(3)]
    for sweep, kept in (("t1", False), ("t2", True)):
        lp.write_config(sweep=sweep, calibrate=slow)
        deploy(load_project(lp.root))
        root = lp.shared.parent / sweep
        (root / "queues").mkdir(parents=True, exist_ok=True)
        (root / "queues/q1.txt").write_text("\n".join(cells) + "\n")
        finish(runners.start("h1", "q1", root=root))
        report = status(load_project(lp.root))
        assert report.calibrate is not None
        got = report.calibrate.to_json()
        assert (got["queues"]["q1"]["secs"], got["queues"]["q1"]["kept"]) == (0.05, kept)
        assert got["median_cell"] is not None, got  # 3 cells ended (each well under the 5 s that would
        # make 0.5 s of benchmark 10 % of a cell, even on a loaded machine)
        costly = [ln for ln in report.lines() if ln.startswith("calibrate: the benchmark took")]
        if kept:
            assert (got["cost"], got["costly"], costly) == (None, False, []), got
        else:
            assert got["cost"] >= 0.5 and got["cost_host"] == "h1" and got["costly"], got
            assert len(costly) == 1 and "on h1" in costly[0] and "shorten it" in costly[0], costly


def test_a_new_machine_under_the_same_host_name_is_measured_again(
        local_project: LocalProject, runners: Runners) -> None:
    """A rented name can be a new instance tomorrow: the kept figure is the machine's, not the name's.
    h1's queue run in a UTS namespace named otherwise (another machine) measures again, and a second
    sweep there takes that machine's own kept figure."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a UTS namespace (another machine's name)")
    lp = local_project
    elsewhere = ("unshare", "--uts", "sh", "-c", 'hostname ablate-other-machine && exec "$@"', "sh")
    assert one_sweep(lp, runners, "t1", BENCH) == [(0.3, False)]
    assert one_sweep(lp, runners, "t2", BENCH, elsewhere) == [(0.3, False)]
    assert one_sweep(lp, runners, "t3", BENCH, elsewhere) == [(0.3, True)]
    assert benchmarks(lp)[1:] == ["ablate-other-machine"]
    assert benchmarks(lp)[0] != "ablate-other-machine"
