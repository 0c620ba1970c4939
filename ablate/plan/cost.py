"""What a cell costs: declared in `ablate.yaml`, learned from the durations on the shared FS; the
ETAs of `plan` and `status`; the estimates file the runners steal by.

**Declared.** The first `costs:` override whose glob matches the cell's cfg path (relative to the
repo root; `*` stays inside a directory, `**` as a whole component crosses any number of them)
gives `cost`, or `cost_per_epoch x epochs`; else `tasks[task].cost_per_epoch x epochs`. A declared
cost has no time unit: it plans (only ratios matter) but gives no ETA.

**Learned.** The same code as the runners' (`ablate.remote.queue.learn`, shipped to the instances in the
runner's zipapp, `runner.<sha>.pyz`), on the same inputs: every cell that ENDED with rc 0 from a
start that was not a resume (the runner that ran it: host and slot, the thief for a stolen cell) is
one observation of `seconds = overhead[runner] + cost x scale[task] / speed[runner]`, fitted by
`learn_rates` (mean durations, outliers left out, the free scale pinned to the declared speeds: a
host without history keeps its declared speed on the same scale; a task without history takes the
pooled scale). So `plan` and `status` ETAs and a draining runner's steal are one model and cannot
disagree.

**estimates.tsv** (`<root>/estimates.tsv`, atomic replace by launch / launch --all / append /
remediate --launch): `# ablate estimates <t> <declared|learned>`, then one tab-separated line per
machine `host <host> <slot|-> <speed_milli>` (and, once learned, `over <host> <slot|-> <ms>`: its
fixed time per cell), per roster cell `cell <name> <ms>`: the expected milliseconds on a speed-1.0
machine beyond the overhead (declared: cost x 1000, only ratios matter then), and `cost <name>
<task> <units>`, what the runners learn from. All integers but the units.
"""

from __future__ import annotations

import posixpath
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ablate.config.project import Project
from ablate.errors import AblateError
from ablate.remote.layout import SweepLayout
from ablate.remote.queue.learn import (
    DECLARED,
    Observation,
    Rates,
    ended_cells,
    learn_rates,
    median,
    runner_key,
)
from ablate.sweep.cells import Cell, QueueFile, parse_queue_text, read_all_queues
from ablate.sweep.snapshot import Snapshot
from ablate.transport import SharedFS
from ablate.transport.base import WriteAtomic
from ablate.util.fmt import Log, duration

ESTIMATES_FILE = "estimates.tsv"


# --------------------------------------------------------------------------- declared


@lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    parts: list[str] = []
    comps = pattern.split("/")
    for i, comp in enumerate(comps):
        last = i == len(comps) - 1
        if comp == "**":
            parts.append(".*" if last else "(?:[^/]*/)*")
            continue
        rx = ""
        k = 0
        while k < len(comp):
            ch = comp[k]
            if ch == "*":
                rx += "[^/]*"
            elif ch == "?":
                rx += "[^/]"
            elif ch == "[":
                end = comp.find("]", k + 2 if comp[k + 1:k + 2] in ("!", "]") else k + 1)
                if end < 0:
                    rx += re.escape(ch)
                else:
                    body = comp[k + 1:end]
                    if body.startswith("!"):
                        body = "^" + body[1:]
                    rx += "[" + body.replace("\\", "\\\\") + "]"
                    k = end
            else:
                rx += re.escape(ch)
            k += 1
        parts.append(rx if last else rx + "/")
    return re.compile("".join(parts) + r"\Z")


def glob_match(pattern: str, path: str) -> bool:
    """Whether a relative path matches a glob with the semantics of `cells:` globs (`**` as a
    whole component matches any number of directories, `*` and `?` never cross a `/`)."""
    norm = posixpath.normpath(path)
    return _glob_regex(posixpath.normpath(pattern)).match(norm) is not None


def declared_cost(project: Project, cell: Cell) -> float:
    for o in project.costs:
        if glob_match(o.glob, cell.cfg):
            if o.cost is not None:
                return o.cost
            assert o.cost_per_epoch is not None
            return o.cost_per_epoch * cell.epochs
    return project.tasks[cell.task].cost_per_epoch * cell.epochs


# --------------------------------------------------------------------------- learning


def known_cells(project: Project, snapshot: Snapshot | None = None,
                extra: Iterable[Cell] = (), queues: Iterable[QueueFile] | None = None) -> dict[str, Cell]:
    """name -> cell over the local queue files (`queues`, already read; else read here), the FS
    copies in `snapshot` (queues another controller launched or appended to) and `extra`; an
    unreadable copy is skipped."""
    out: dict[str, Cell] = {c.name: c for c in extra}
    for qf in read_all_queues(project) if queues is None else queues:
        for ln in qf.cells:
            assert ln.cell is not None
            out.setdefault(ln.cell.name, ln.cell)
    for qname, text in sorted((snapshot.queue_copies if snapshot else {}).items()):
        try:
            qf = parse_queue_text(qname, text, project.tasks, project.queues_dir / f"{qname}.txt")
        except AblateError:
            continue
        for ln in qf.cells:
            assert ln.cell is not None
            out.setdefault(ln.cell.name, ln.cell)
    return out


def runner_speeds(project: Project) -> dict[str, float]:
    """runner (`host slot`, slot `-` without one) -> declared speed: the `host` lines of estimates.tsv."""
    return {runner_key(h.name, slot): h.speed for h in project.hosts.values() for slot in h.slots}


def observations(project: Project, snapshot: Snapshot, cells: Mapping[str, Cell]) -> list[Observation]:
    """What the runners' helper reads from the events files, read from the snapshot instead: one
    (runner, task, declared cost, seconds) per cell that ended (`ended_cells`)."""
    events: list[dict[str, object]] = []
    for key, evs in sorted(snapshot.events.items()):  # the files in name order, as the helper reads them
        for e in evs:
            events.append({"ev": e.ev, "host": e.host if e.host is not None else key.split(".", 1)[0],
                           "queue": e.queue, "slot": e.slot, "cell": e.cell, "rc": e.rc, "dur": e.dur,
                           "resume": 1 if e.resume else 0})
    costs = {name: (c.task, declared_cost(project, c)) for name, c in cells.items()}
    return ended_cells(events, costs)


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class CostModel:
    """Declared costs and, once a cell has ended, the learned rates (`ablate.remote.queue.learn`).
    `weight(cell)` is what the planner balances: expected seconds on a speed-1.0 machine beyond the
    fixed overhead when learned, else the declared cost."""

    project: Project
    rates: Rates = DECLARED
    note: str | None = None  # why no history was read, when it could not be

    @property
    def learned(self) -> bool:
        return self.rates.cells > 0

    @property
    def source(self) -> str:
        return "learned" if self.learned else "declared"

    @property
    def cells(self) -> int:
        return self.rates.cells

    @property
    def outliers(self) -> int:
        return self.rates.outliers

    @property
    def global_spu(self) -> float | None:
        """Pooled seconds per declared unit (a task without history); None: nothing learned."""
        return self.rates.pooled_scale if self.learned else None

    @property
    def spu(self) -> Mapping[str, float]:
        return self.rates.scale

    def cost(self, cell: Cell) -> float:
        return declared_cost(self.project, cell)

    def declared_speed(self, host: str) -> float:
        return self.project.hosts[host].speed if host in self.project.hosts else 1.0

    def speed(self, host: str, slot: object = None) -> float:
        """The runner's learned speed (see `_learned`); else its declared speed."""
        v = self._learned(self.rates.speed, host, slot)
        return self.declared_speed(host) if v is None else v

    def overhead(self, host: str, slot: object = None) -> float:
        """The runner's fixed seconds per cell; else the pooled one (0 before any history)."""
        v = self._learned(self.rates.overhead, host, slot)
        return self.rates.pooled_overhead if v is None else v

    def _learned(self, table: Mapping[str, float], host: str, slot: object) -> float | None:
        """A runner's figure in `table`; for a host's slots taken together (`slot` None on a host
        with slots), the median of its learned ones; None when none is learned."""
        key = runner_key(host, slot)
        if key in table:
            return table[key]
        mine = [v for k, v in table.items() if k.split(" ", 1)[0] == host] if slot is None else []
        return median(mine) if mine else None

    def weight(self, cell: Cell) -> float:
        if not self.learned:
            return self.cost(cell)
        return self.cost(cell) * self.rates.scale.get(cell.task, self.rates.pooled_scale)

    def seconds(self, cell: Cell, host: str, slot: object = None) -> float | None:
        """Expected wall-clock seconds of `cell` on a runner (`Rates.seconds`, the runners' own
        figure); None before any history."""
        if not self.learned:
            return None
        return self.overhead(host, slot) + self.weight(cell) / self.speed(host, slot)

    def describe(self) -> str:
        if not self.learned:
            why = f"; {self.note}" if self.note else ""
            return f"declared costs; no history yet{why}"
        extra = f", {self.outliers} outlier(s) left out" if self.outliers else ""
        return f"learned from {self.cells} cell(s){extra}"

    def to_json(self) -> dict[str, Any]:
        r = self.rates
        hosts = {}
        for h in self.project.hosts:
            mine = [k for k in r.speed if k.split(" ", 1)[0] == h]
            hosts[h] = {"speed": _r(self.speed(h)), "source": "learned" if mine else "declared",
                        "cells": sum(r.host_cells.get(k, 0) for k in mine),
                        "overhead_seconds": _r(self.overhead(h)) if self.learned else None}
        tasks = {}
        for t in self.project.tasks:
            spu = r.scale.get(t, self.global_spu)
            tasks[t] = {"seconds_per_cost": None if spu is None else _r(spu),
                        "source": "learned" if t in r.scale else ("pooled" if self.learned else "declared"),
                        "cells": r.task_cells.get(t, 0)}
        return {"source": self.source, "cells": self.cells, "outliers": self.outliers,
                "unit": "seconds" if self.learned else "cost", "hosts": hosts, "tasks": tasks,
                "note": self.note}


def _r(x: float) -> float:
    return round(x, 6)


def declared_model(project: Project, note: str | None = None) -> CostModel:
    return CostModel(project, note=note)


def learn(project: Project, snapshot: Snapshot | None,
          cells: Mapping[str, Cell] | None = None) -> CostModel:
    """The model from one FS snapshot (the `snapshot` probe); declared when it holds no history."""
    if snapshot is None:
        return declared_model(project)
    known = dict(cells) if cells is not None else known_cells(project, snapshot)
    obs = observations(project, snapshot, known)
    return CostModel(project, learn_rates(obs, runner_speeds(project))) if obs else declared_model(project)


def read_snapshot(fs: SharedFS) -> Snapshot:
    return Snapshot.parse(fs.probe("snapshot", {"root": fs.root, "touch": False}))


def load_model(project: Project, extra: Iterable[Cell] = ()) -> CostModel:
    """The model from the shared FS when it answers; the declared model (with the reason) when
    it does not: an ETA is a nicety, never a reason to refuse."""
    from ablate.transport import shared_fs

    try:
        snap = read_snapshot(shared_fs(project))
    except (AblateError, OSError) as e:
        return declared_model(project, f"shared FS not read: {getattr(e, 'message', e)}")
    return learn(project, snap, known_cells(project, snap, extra))


# --------------------------------------------------------------------------- ETA


def queue_eta(model: CostModel, host: str, remaining: Iterable[Cell], current: Cell | None,
              elapsed: float | None, slot: object = None) -> float | None:
    """Seconds until a running queue drains: its remaining cells' expected time plus what the
    current cell is expected to have left (never below zero). None before any history."""
    if not model.learned:
        return None
    total = 0.0
    for c in remaining:
        total += model.seconds(c, host, slot) or 0.0
    if current is not None:
        total += max(0.0, (model.seconds(current, host, slot) or 0.0) - (elapsed or 0.0))
    return total


def eta_line(model: CostModel, eta: float | None, what: str = "sweep") -> str:
    if not model.learned:
        return f"{what} ETA unknown: no cell has finished yet ({model.describe()})"
    if eta is None:
        return f"{what} ETA unknown: no queue is running ({model.describe()})"
    return f"{what} ETA {duration(eta)} ({model.describe()})"


# --------------------------------------------------------------------------- estimates.tsv


def estimates_text(project: Project, model: CostModel, cells: Iterable[Cell], now: float) -> str:
    rows = [f"# ablate estimates {int(now)} {model.source}"]
    for h in project.hosts.values():
        for slot in h.slots:
            where = f"{h.name}\t{'-' if slot is None else slot}"
            rows.append(f"host\t{where}\t{max(1, round(model.speed(h.name, slot) * 1000))}")
            if model.learned:
                rows.append(f"over\t{where}\t{round(model.overhead(h.name, slot) * 1000)}")
    for c in sorted(cells, key=lambda c: c.name):
        rows.append(f"cell\t{c.name}\t{max(1, round(model.weight(c) * 1000))}")
        # What a draining runner learns from (ablate/remote/queue/learn.py): the cell's task and declared
        # cost in the user's units. run_queue itself reads only host and cell lines.
        rows.append(f"cost\t{c.name}\t{c.task}\t{model.cost(c):.6g}")
    return "".join(r + "\n" for r in rows)


@dataclass(frozen=True)
class Estimates:
    path: str
    model: CostModel
    cells: int


def estimates_op(project: Project, root: str, snapshot: Snapshot,
                 queues: Iterable[QueueFile] | None = None) -> tuple[WriteAtomic, Estimates]:
    """The atomic write of `<root>/estimates.tsv` for the roster (the local queue files, `queues`
    when the caller read them, and the FS copies in `snapshot`), for a caller that batches it with
    its own writes (launch)."""
    known = known_cells(project, snapshot, queues=queues)
    model = learn(project, snapshot, known)
    path = SweepLayout(root).estimates
    return (WriteAtomic(path, estimates_text(project, model, known.values(), time.time()).encode()),
            Estimates(path, model, len(known)))


def write_estimates(project: Project, fs: SharedFS, snapshot: Snapshot | None = None) -> Estimates:
    """Write `<root>/estimates.tsv` (one atomic FS write). `snapshot`: the `snapshot` probe the
    caller already read (else read here)."""
    op, estimates = estimates_op(project, fs.root, snapshot if snapshot is not None else read_snapshot(fs))
    fs.write_atomic(op.path, op.data, op.mode)
    return estimates


def estimates_note(e: BaseException) -> str:
    """The line that reports estimates.tsv was not written (never fatal: the runners then steal by
    the previous file, or not at all)."""
    return f"note: {ESTIMATES_FILE} not updated: {getattr(e, 'message', e)}"


def refresh_estimates(project: Project, fs: SharedFS, snapshot: Snapshot | None = None,
                      log: Log | None = None) -> Estimates | None:
    """`write_estimates` for launch and append: a failure is reported, never fatal (the runners
    then steal by the previous file, or not at all)."""
    try:
        return write_estimates(project, fs, snapshot)
    except (AblateError, OSError) as e:
        if log is not None:
            log(estimates_note(e))
        return None
