"""What `calibrate:` measured, for `status`: each queue's benchmark figure (measured by this sweep or
kept from an earlier one), and whether the benchmark costs too much against this sweep's cells.

A measurement pays only when the benchmark is short against the cells: by the simulation
(`scripts/bench_gate.py`, docs/BENCHMARKS.md) a benchmark costing 5 % of a small cell meets issue
13's target, one costing a small cell does worse than measuring nothing. A kept measurement costs
nothing, so only the queues that ran the benchmark in this sweep count."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ablate.remote.queue.learn import median
from ablate.sweep.records import Event

COSTLY = 0.10  # the benchmark's wall time over the median cell's above which `status` says so
MIN_CELLS = 3  # ended cells before the median cell is worth comparing against


def measurement(events: Iterable[Event]) -> dict[str, Any] | None:
    """A queue's last `calibrate` event as `{host, secs, kept, dur, rc}` (secs None: it failed)."""
    last = None
    for e in events:
        if e.ev == "calibrate":
            last = e
    if last is None:
        return None
    return {"host": last.host, "secs": last.secs, "kept": last.kept, "dur": last.dur, "rc": last.rc}


@dataclass(frozen=True)
class Calibration:
    queues: Mapping[str, dict[str, Any]]  # queue -> measurement()
    host: str | None  # where the benchmark took longest in this sweep
    cost: float | None  # its wall seconds (None: no queue ran it in this sweep)
    median_cell: float | None  # seconds of this sweep's median ended cell (None: < MIN_CELLS ended)

    @property
    def costly(self) -> bool:
        return (self.cost is not None and self.median_cell is not None
                and self.cost > COSTLY * self.median_cell)

    def to_json(self) -> dict[str, Any]:
        return {"queues": dict(self.queues), "cost": self.cost, "cost_host": self.host,
                "median_cell": self.median_cell, "costly": self.costly}

    def lines(self) -> list[str]:
        if not self.queues:
            return []
        out = ["measured (calibrate): " + ", ".join(
            f"{q} ({m['host']}) {m['secs']:g} s{' (kept)' if m['kept'] else ''}" if m["secs"] is not None
            else f"{q} ({m['host']}) failed (rc {m['rc']})" for q, m in self.queues.items())]
        if self.costly and self.cost is not None and self.median_cell is not None:
            out.append(f"calibrate: the benchmark took {self.cost:.1f} s on {self.host}, "
                       f"{self.cost / self.median_cell:.0%} of this sweep's median cell "
                       f"({self.median_cell:.1f} s); measuring pays only when the benchmark is a few % "
                       "of a small cell (a kept figure is free in the next sweeps): shorten it, or drop "
                       "`calibrate:` for cells this short")
        return out


def calibration(events: Mapping[str, tuple[Event, ...]]) -> Calibration:
    """From the sweep's events (`host.queue` -> that queue's events, every queue that ran)."""
    got: dict[str, dict[str, Any]] = {}
    cost: tuple[float, str] | None = None
    for key, evs in sorted(events.items()):
        fig = measurement(evs)
        if fig is None:
            continue
        got[next((e.queue for e in evs if e.queue), key)] = fig
        if not fig["kept"] and fig["dur"] is not None and (cost is None or fig["dur"] > cost[0]):
            cost = (fig["dur"], fig["host"] or key)
    durs = [e.dur for evs in events.values() for e in evs
            if e.ev == "end" and e.rc == 0 and e.dur is not None]
    return Calibration(got, cost[1] if cost else None, cost[0] if cost else None,
                       median(durs) if len(durs) >= MIN_CELLS else None)
