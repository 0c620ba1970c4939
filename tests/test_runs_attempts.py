"""A cell's runs across lanes, numbered as its attempts, and the work each cut run lost: what the
next run did again, from its `restore` event (ablate/sweep/runs.py)."""

from __future__ import annotations

from typing import Any

from ablate.sweep.records import Event
from ablate.sweep.runs import attempts_by_cell, attempts_lines, lost, runs_of


def _ev(**kw: Any) -> Event:
    got = Event.parse(kw)
    assert got is not None
    return got


def _sweep(restore: dict[str, Any] | None, resume: bool = True) -> dict[str, list[Event]]:
    """c1 started on h1 at 100, cut at 300 (its queue stopped); run again on h2 from 400 to 500."""
    h1 = [_ev(ev="queue_start", t=90, host="h1", queue="q1"),
          _ev(ev="start", t=100, host="h1", queue="q1", cell="c1", idx=0, resume=False),
          _ev(ev="restore", t=100.5, host="h1", queue="q1", cell="c1", **{"from": "local", "written": 50}),
          _ev(ev="stopped", t=300, host="h1", queue="q1")]
    h2 = [_ev(ev="queue_start", t=390, host="h2", queue="q1"),
          _ev(ev="start", t=400, host="h2", queue="q1", cell="c1", idx=0, resume=resume)]
    if restore is not None:
        h2.append(_ev(ev="restore", t=400.5, host="h2", queue="q1", cell="c1", **restore))
    h2.append(_ev(ev="end", t=500, host="h2", queue="q1", cell="c1", idx=0, rc=0, dur=100))
    return {"h1.q1": h1, "h2.q1": h2}


def test_a_cut_run_lost_what_it_did_after_the_checkpoint_the_next_run_restored() -> None:
    _lanes, runs = runs_of(_sweep({"from": "copy", "seq": 3, "written": 250.0}), {}, {}, {}, 600)
    assert [(r.lane, r.attempt, r.attempts, r.outcome) for r in runs] == [
        ("h1.q1", 1, 2, "interrupted"), ("h2.q1", 2, 2, "ok")]
    assert runs[0].lost == 50.0 and runs[1].lost is None  # 300 - 250: the rest was durable
    assert (runs[0].restored, runs[0].written) == ("local", 50.0) and runs[1].restored == "copy"
    by_cell = attempts_by_cell(runs)
    assert by_cell == {"c1": {"runs": 2, "cut": 1, "lost_secs": 50.0}}
    assert attempts_lines(by_cell) == ["  c1: 2 runs, 1 cut, 50s of work done again",
                                       "work lost to cuts: 50s over 1 cut run(s)"]


def test_from_scratch_the_whole_run_is_lost_and_unknown_when_nothing_is_said() -> None:
    _, runs = runs_of(_sweep({"from": "none", "skipped": []}), {}, {}, {}, 600)
    assert runs[0].lost == 200.0
    _, runs = runs_of(_sweep(None, resume=False), {}, {}, {}, 600)  # resume off: started over
    assert runs[0].lost == 200.0
    _, runs = runs_of(_sweep(None, resume=True), {}, {}, {}, 600)  # an older wrapper: not known
    assert runs[0].lost is None and attempts_by_cell(runs)["c1"] == {"runs": 2, "cut": 0, "lost_secs": None}
    assert attempts_lines(attempts_by_cell(runs)) == ["  c1: 2 runs"]


def test_a_checkpoint_older_than_the_cut_run_means_all_of_it_was_lost() -> None:
    assert lost(100, 300, "copy", 40.0, True) == 200.0  # written before the run: it saved nothing new
    assert lost(100, 300, "local", 999.0, True) == 0.0  # a clock ahead: never negative
    assert lost(100, 300, "copy", None, True) is None


def test_a_killed_queues_stale_heartbeat_is_no_running_run_once_the_cell_ran_again() -> None:
    from ablate.sweep.records import Heartbeat

    events = _sweep({"from": "copy", "written": 250.0})
    events["h1.q1"] = events["h1.q1"][:3]  # SIGKILLed: no `stopped`, its heartbeat still says running
    hb = Heartbeat.parse("h1.q1", 280.0, {"state": "running", "cell": "c1"})
    _, runs = runs_of(events, {"h1.q1": hb}, {}, {}, 600)
    assert (runs[0].outcome, runs[0].end, runs[0].lost) == ("interrupted", 280.0, 30.0)
