"""A sweep's runs from its events: one lane per (host, queue), one run per `start` event, each
cell's runs numbered as its attempts, and the work each cut or failed run lost (issue 45).

A run ends at its `end` event (outcome `ok` for rc 0, else `failed`). A `start` with no `end`
before the lane's next event was cut (`ablate stop`, a killed session, a reboot): `interrupted`,
ending at that next event, or at the heartbeat's last beat when nothing followed. An open `start`
that is the heartbeat's current cell is `running` (it ends "now", the FS's clock), unless the cell
ran again since (its queue died: it is `interrupted` at its last beat). A cell started
more than once is a re-run: its runs are numbered by start time across every lane. A run whose
`start` carries `from_queue` was stolen by a drained runner from that queue.

Work lost: what a run that did not finish did that the cell's next run did again. The next run's
`restore` event says what it started from: a checkpoint (a durable copy, or the one this box
kept), written at `written` (its newest file's mtime, the writing host's clock) — the run lost
what it did after that, `end - max(start, written)`; nothing (`from: none`, or no resume at all)
— it lost all of it. Unknown (None) while no next run has started, or when the next run said
nothing of its start (a wrapper older than the `restore` event that resumed). Times are the hosts'
clocks as the wrappers wrote them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ablate.sweep.records import Event, Heartbeat
from ablate.util.fmt import duration

OUTCOMES = ("ok", "failed", "interrupted", "running")


@dataclass(frozen=True)
class Lane:
    key: str  # "<host>.<queue>", the events file's stem
    host: str
    queue: str
    slot: int | None
    speed: float

    @property
    def label(self) -> str:
        slot = f" gpu{self.slot}" if self.slot is not None else ""
        return f"{self.host}/{self.queue}{slot}"


@dataclass(frozen=True)
class Run:
    lane: str
    cell: str
    task: str | None
    idx: int | None
    start: float
    end: float
    rc: int | None
    outcome: str  # one of OUTCOMES
    attempt: int  # 1-based, by start time across lanes
    attempts: int  # how many times this cell was started in all
    resume: bool
    stolen_from: str | None  # the queue a drained runner took this cell's line from
    measured: float | None = None  # the `end` event's `dur` (the wrapper's own measure)
    restored: str | None = None  # its `restore` event's `from`: local | copy | none (None: no event)
    written: float | None = None  # when the checkpoint it resumed from was written (its newest mtime)
    lost: float | None = None  # a run that did not finish: its seconds the next run did again

    @property
    def dur(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def work_secs(self) -> float:
        return self.measured if self.measured is not None else self.dur


def _lane_runs(lane: Lane, events: Sequence[Event], hb: Heartbeat | None, now: float) -> list[dict[str, Any]]:
    """The lane's runs as dicts (attempt numbers are set later, across lanes)."""
    runs: list[dict[str, Any]] = []
    open_run: dict[str, Any] | None = None
    for e in sorted((e for e in events if e.t is not None), key=lambda e: e.t or 0.0):
        ev, t = e.ev, float(e.t or 0.0)
        if open_run is not None:
            if ev == "end" and e.cell == open_run["cell"]:
                open_run.update(end=t, rc=e.rc, outcome="ok" if e.rc == 0 else "failed", measured=e.dur)
                runs.append(open_run)
                open_run = None
                continue
            if ev == "restore" and e.cell == open_run["cell"]:
                open_run.update(restored=e.restored, written=e.written)
                continue
            if ev in ("start", "queue_start", "stopped", "queue_end", "queue_stop"):
                open_run.update(end=t, outcome="interrupted")
                runs.append(open_run)
                open_run = None
        if ev == "start" and e.cell is not None:
            open_run = {"lane": lane.key, "cell": e.cell, "idx": e.idx, "start": t, "end": t,
                        "rc": None, "outcome": "interrupted", "resume": e.resume,
                        "stolen_from": e.from_queue or None}
    if open_run is not None:
        beat = hb.mtime if hb is not None else None
        if hb is not None and hb.state == "running" and hb.cell == open_run["cell"]:
            open_run.update(end=max(now, open_run["start"]), outcome="running",
                            beat=max(beat or open_run["start"], open_run["start"]))
        else:
            open_run["end"] = max(beat or open_run["start"], open_run["start"])
        runs.append(open_run)
    return runs


def lanes_of(events: Mapping[str, Sequence[Event]], speeds: Mapping[str, float]) -> list[Lane]:
    lanes = []
    for key, evs in events.items():
        first = next((e for e in evs if e.host and e.queue), None)
        host, _, queue = key.partition(".")  # fallback only: names may hold dots
        if first is not None:
            host, queue = str(first.host), str(first.queue)
        slot = next((e.slot for e in reversed(evs) if e.ev == "queue_start"), None)
        lanes.append(Lane(key, host, queue, slot, speeds.get(host, 1.0)))
    return sorted(lanes, key=lambda ln: (ln.host, ln.queue))


def runs_of(events: Mapping[str, Sequence[Event]], heartbeats: Mapping[str, Heartbeat],
            speeds: Mapping[str, float], tasks: Mapping[str, str | None],
            now: float) -> tuple[list[Lane], list[Run]]:
    """(the lanes, every run in start order, numbered and with the work each cut one lost)."""
    lanes = lanes_of(events, speeds)
    raw = [r for ln in lanes for r in _lane_runs(ln, events[ln.key], heartbeats.get(ln.key), now)]
    raw.sort(key=lambda r: (r["start"], r["lane"]))
    count: dict[str, int] = {}
    for r in raw:
        count[r["cell"]] = count.get(r["cell"], 0) + 1
        r["attempt"] = count[r["cell"]]
    last: dict[str, dict[str, Any]] = {}
    for r in raw:  # each run's predecessor learns from it what it lost
        before = last.get(r["cell"])
        if before is not None and before["outcome"] == "running":  # its queue died: its last beat
            before.update(outcome="interrupted", end=before["beat"])
        if before is not None and before["outcome"] != "ok":
            before["lost"] = lost(before["start"], before["end"], r.get("restored"), r.get("written"),
                                  r["resume"])
        last[r["cell"]] = r
    for r in raw:
        r.pop("beat", None)
    return lanes, [Run(task=tasks.get(r["cell"]), attempts=count[r["cell"]], **r) for r in raw]


def lost(start: float, end: float, restored: str | None, written: float | None, resume: bool) -> float | None:
    """The seconds of a run [start, end] that the next run, started from `restored` (its checkpoint
    written at `written`; `resume`: its {resume}), did again; None when that is not known."""
    if restored in ("copy", "local") and written is not None:
        return round(end - min(end, max(start, written)), 3)
    if restored == "none" or (restored is None and not resume):
        return round(max(0.0, end - start), 3)
    return None


def lost_total(runs: Sequence[Run]) -> tuple[int, float]:
    """(the runs that lost work, their seconds lost)."""
    cut = [r.lost for r in runs if r.lost]
    return len(cut), round(sum(cut), 3)


def attempts_by_cell(runs: Sequence[Run]) -> dict[str, dict[str, Any]]:
    """Per cell run more than once: {"runs", "cut" (runs that lost work), "lost_secs" (their sum;
    None when no cut run's loss is known yet)}, as `status` and `report` say them."""
    out: dict[str, dict[str, Any]] = {}
    for r in runs:
        if r.attempts < 2:
            continue
        rec = out.setdefault(r.cell, {"runs": r.attempts, "cut": 0, "lost_secs": None})
        if r.lost:
            rec["cut"] += 1
            rec["lost_secs"] = round((rec["lost_secs"] or 0.0) + r.lost, 3)
    return out


def attempts_lines(by_cell: Mapping[str, Mapping[str, Any]], prefix: str = "  ") -> list[str]:
    """`  c4: 3 runs, 2 cut, 12m40s of work done again` per cell, then the sweep's total."""
    out = []
    for cell, rec in by_cell.items():
        lost_secs = rec.get("lost_secs")
        cut = f", {rec['cut']} cut, {duration(lost_secs)} of work done again" if lost_secs else ""
        out.append(f"{prefix}{cell}: {rec['runs']} runs{cut}")
    total = sum(rec.get("lost_secs") or 0.0 for rec in by_cell.values())
    if total:
        out.append(f"work lost to cuts: {duration(total)} over "
                   f"{sum(rec['cut'] for rec in by_cell.values())} cut run(s)")
    return out
