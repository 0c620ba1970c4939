"""The report's timeline and ablation table, built from hand-written events and metrics: reruns,
steals, interruptions and the running cell on the timeline, its makespan and lower bound; an
open cell without a live heartbeat interrupted at its last beat; the baseline by a cfg glob,
the differences to it and the best cell by each metric's goal."""

from __future__ import annotations

from typing import Any

import pytest

from ablate.config.settings import ReportSettings
from ablate.report.data import CellResult, RosterCell
from ablate.report.table import build_tables
from ablate.report.timeline import build_timeline
from ablate.sweep.cells import Cell
from ablate.sweep.snapshot import Snapshot


def _ev(t: float, ev: str, host: str, queue: str, **kw: Any) -> dict[str, Any]:
    return {"t": t, "ev": ev, "host": host, "queue": queue, **kw}


def test_timeline_marks_reruns_steals_interruptions_and_the_running_cell() -> None:
    evs = {
        "a.q1": [_ev(100, "queue_start", "a", "q1", slot=None),
                 _ev(100, "start", "a", "q1", idx=0, cell="x", resume=0),
                 _ev(110, "end", "a", "q1", idx=0, cell="x", rc=0, dur=10.0),
                 _ev(110, "start", "a", "q1", idx=1, cell="y", resume=0),
                 _ev(113, "stopped", "a", "q1", pgid=1, signal="TERM", by="me"),
                 _ev(120, "queue_start", "a", "q1", slot=None),
                 _ev(120, "start", "a", "q1", idx=1, cell="y", resume=1),
                 _ev(126, "end", "a", "q1", idx=1, cell="y", rc=137, dur=6.0)],
        "b.q2": [_ev(101, "queue_start", "b", "q2", slot=1),
                 _ev(101, "start", "b", "q2", idx=0, cell="z", resume=0),
                 _ev(121, "end", "b", "q2", idx=0, cell="z", rc=0, dur=20.0),
                 _ev(121, "steal", "b", "q2", idx=2, cell="w", from_queue="q1", from_host="a", est=3),
                 _ev(121, "start", "b", "q2", idx=2, cell="w", resume=0, from_queue="q1")],
    }
    hbs = {"b.q2": {"mtime": 129.0, "data": {"state": "running", "cell": "w"}}}
    tasks = {"x": "t1", "y": "t1", "z": "t2", "w": "t2"}
    snap = Snapshot.parse({"now": 130.0, "events": evs, "heartbeats": hbs})  # as the probe answers
    tl = build_timeline(snap.events, snap.heartbeats, {"a": 2.0, "b": 1.0}, tasks, now=130.0)
    runs = [(r.cell, r.lane, r.outcome, r.attempt, r.attempts, r.stolen_from, r.start, r.end)
            for r in tl.runs]
    assert runs == [("x", "a.q1", "ok", 1, 1, None, 100, 110), ("z", "b.q2", "ok", 1, 1, None, 101, 121),
                    ("y", "a.q1", "interrupted", 1, 2, None, 110, 113),
                    ("y", "a.q1", "failed", 2, 2, None, 120, 126),
                    ("w", "b.q2", "running", 1, 1, "q1", 121, 130)]
    assert [ln.label for ln in tl.lanes] == ["a/q1", "b/q2 gpu1"]
    assert tl.t0 == 100 and tl.makespan == 30
    # x: 10 s at speed 2 = 20 units, z: 20 s at speed 1 = 20 units; machines of speed 2 and 1
    assert tl.lower_bound == pytest.approx(max(40 / 3, 20 / 2))


def test_an_open_cell_without_a_live_heartbeat_is_interrupted_at_its_last_beat() -> None:
    evs = {"a.q": [_ev(10, "start", "a", "q", idx=0, cell="x", resume=0)]}
    hbs = {"a.q": {"mtime": 17.5, "data": {"state": "stopped", "cell": "x"}}}
    snap = Snapshot.parse({"now": 99.0, "events": evs, "heartbeats": hbs})
    tl = build_timeline(snap.events, snap.heartbeats, {}, {}, now=99.0)
    assert [(r.outcome, r.end) for r in tl.runs] == [("interrupted", 17.5)]
    assert tl.lower_bound is None and tl.lanes[0].speed == 1.0


def _rc(name: str, cfg: str, task: str) -> RosterCell:
    return RosterCell(name, Cell(cfg, task, 3), "q")


def test_baseline_by_cfg_glob_differences_and_best_by_goal() -> None:
    roster = {rc.name: rc for rc in (_rc("a", "cfgs/ref/a.yaml", "t"), _rc("b", "cfgs/x/b.yaml", "t"),
                                       _rc("c", "cfgs/x/c.yaml", "t"), _rc("d", "cfgs/x/d.yaml", "u"))}
    metrics = {"a": CellResult({"acc": 0.5, "loss": 2.0, "n": 3}, "local"),
               "b": CellResult({"acc": 0.75, "loss": 1.0, "n": 3, "extra.f1": 0.1}, "fs"),
               "c": CellResult(None, None), "d": CellResult({"acc": 0.25}, "fs")}
    settings = ReportSettings(("cfgs/ref/*",), "acc", "max")
    tables = build_tables(roster, {"a": "verified", "b": "synced"}, metrics, settings, ("loss",))
    t, u = tables
    assert t.task == "t" and t.baseline == "a" and t.metrics == ["acc", "loss", "n", "extra.f1"]
    b = t.rows[1]
    assert b.deltas == {"acc": 0.25, "loss": -1.0, "n": 0} and isinstance(b.deltas["n"], int)
    assert t.best == {"acc": {"b"}, "loss": {"b"}, "extra.f1": {"b"}}  # `n`: no direction, not marked
    assert t.rows[2].values == {} and t.rows[2].state == "missing"
    assert u.baseline is None and u.note and "no baseline cell for task u" in u.note
    assert u.rows[0].deltas == {}
