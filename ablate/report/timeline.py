"""The sweep's timeline from the events: one lane per (host, queue), one run per `start` event.

A run ends at its `end` event (outcome `ok` for rc 0, else `failed`). A `start` with no `end`
before the lane's next event was cut (`ablate stop`, a killed session, a reboot): `interrupted`,
ending at that next event, or at the heartbeat's last beat when nothing followed. An open `start`
that is the heartbeat's current cell is `running` (it ends "now", the FS's clock). A cell started
more than once is a re-run: its runs are numbered by start time across every lane. A run whose
`start` carries `from_queue` was stolen by a drained runner from that queue.

Makespan: first start to last end. Its lower bound uses the measured work: each cell's successful
run, `dur x speed` of the host that ran it (its cost on a speed-1.0 machine), spread over the
machines that ran queues, one per (host, slot) (`ablate.plan.balance.lower_bound`). Times are the
hosts' clocks as the wrappers wrote them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ablate.plan.balance import lower_bound
from ablate.sweep.snapshot import Event, Heartbeat

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

    @property
    def dur(self) -> float:
        return max(0.0, self.end - self.start)

    @property
    def work_secs(self) -> float:
        return self.measured if self.measured is not None else self.dur


@dataclass(frozen=True)
class Timeline:
    lanes: list[Lane]
    runs: list[Run]
    t0: float  # the first start
    makespan: float
    lower_bound: float | None  # None until some cell finished with rc 0

    @property
    def ratio(self) -> float | None:
        if not self.lower_bound:
            return None
        return self.makespan / self.lower_bound


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
            open_run.update(end=max(now, open_run["start"]), outcome="running")
        else:
            open_run["end"] = max(beat or open_run["start"], open_run["start"])
        runs.append(open_run)
    return runs


def _lanes(events: Mapping[str, Sequence[Event]], speeds: Mapping[str, float]) -> list[Lane]:
    lanes = []
    for key, evs in events.items():
        first = next((e for e in evs if e.host and e.queue), None)
        host, _, queue = key.partition(".")  # fallback only: names may hold dots
        if first is not None:
            host, queue = str(first.host), str(first.queue)
        slot = next((e.slot for e in reversed(evs) if e.ev == "queue_start"), None)
        lanes.append(Lane(key, host, queue, slot, speeds.get(host, 1.0)))
    return sorted(lanes, key=lambda ln: (ln.host, ln.queue))


def build_timeline(events: Mapping[str, Sequence[Event]], heartbeats: Mapping[str, Heartbeat],
                   speeds: Mapping[str, float], tasks: Mapping[str, str | None], now: float) -> Timeline:
    """`events`/`heartbeats` of a `Snapshot`; `tasks` maps cell -> task."""
    lanes = _lanes(events, speeds)
    raw = [r for ln in lanes for r in _lane_runs(ln, events[ln.key], heartbeats.get(ln.key), now)]
    raw.sort(key=lambda r: (r["start"], r["lane"]))
    count: dict[str, int] = {}
    for r in raw:
        count[r["cell"]] = count.get(r["cell"], 0) + 1
        r["attempt"] = count[r["cell"]]
    runs = [Run(task=tasks.get(r["cell"]), attempts=count[r["cell"]], **r) for r in raw]
    if not runs:
        return Timeline(lanes, [], now, 0.0, None)
    t0 = min(r.start for r in runs)
    makespan = max(r.end for r in runs) - t0
    speed_of = {ln.key: ln.speed for ln in lanes}
    work: dict[str, float] = {}
    for run in runs:
        if run.outcome == "ok":
            work[run.cell] = run.work_secs * speed_of[run.lane]  # the last successful run of a cell counts
    # Machines are (host, slot) pairs: two queues of one slot-less host share its GPU, as plan has it.
    machines = {(ln.host, ln.slot): ln.speed for ln in lanes}
    bound = lower_bound(list(work.values()), list(machines.values())) if work else None
    return Timeline(lanes, runs, t0, makespan, bound)


def steal_count(timeline: Timeline) -> int:
    return sum(1 for r in timeline.runs if r.stolen_from)


def rerun_cells(timeline: Timeline) -> list[str]:
    return sorted({r.cell for r in timeline.runs if r.attempts > 1})


# Colour-blind-safe categorical palette (Okabe-Ito, then Tableau) shared by the SVG and the PNG.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
           "#4E79A7", "#F28E2B", "#59A14F", "#B07AA1", "#9C755F")
UNKNOWN_TASK = "#999999"


def task_colors(tasks: list[str]) -> dict[str, str]:
    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(sorted(tasks))}
