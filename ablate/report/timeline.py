"""The sweep's timeline: its runs (`ablate.sweep.runs`: lanes, attempts, the work cuts lost), its
makespan and that makespan's lower bound.

Makespan: first start to last end. Its lower bound uses the measured work: each cell's successful
run, `dur x speed` of the host that ran it (its cost on a speed-1.0 machine), spread over the
machines that ran queues, one per (host, slot) (`ablate.plan.balance.lower_bound`). Times are the
hosts' clocks as the wrappers wrote them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ablate.plan.balance import lower_bound
from ablate.sweep.runs import OUTCOMES, Lane, Run, runs_of
from ablate.sweep.snapshot import Event, Heartbeat

__all__ = ["OUTCOMES", "Lane", "Run", "Timeline", "build_timeline", "rerun_cells", "steal_count",
           "task_colors"]


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


def build_timeline(events: Mapping[str, Sequence[Event]], heartbeats: Mapping[str, Heartbeat],
                   speeds: Mapping[str, float], tasks: Mapping[str, str | None], now: float) -> Timeline:
    """`events`/`heartbeats` of a `Snapshot`; `tasks` maps cell -> task."""
    lanes, runs = runs_of(events, heartbeats, speeds, tasks, now)
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
