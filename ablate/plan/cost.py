"""What a cell costs: declared in `ablate.yaml`, learned from the durations on the shared FS; the
ETAs of `plan` and `status`; the estimates file the runners steal by.

**Declared.** The first `costs:` override whose glob matches the cell's cfg path (relative to the
repo root; `*` stays inside a directory, `**` as a whole component crosses any number of them)
gives `cost`, or `cost_per_epoch x epochs`; else `tasks[task].cost_per_epoch x epochs`. A declared
cost has no time unit: it plans (only ratios matter) but gives no ETA.

**Learned.** Every cell whose latest successful run is recorded on the FS (an `end` event with
rc 0 and a positive `dur`, from a run that was not a resume: its `start` had `resume` 0; the host
is the one whose events file holds it, the thief for a stolen cell) is one observation of
`seconds = cost x spu[task] / speed[host]`. The fit is least squares in log space (alternating
means, exact on exact data), refitted once without outliers (a residual beyond 3 robust sigma and a
factor 2), and its free scale is pinned to the declared speeds: the median over the hosts with
history of (learned / declared) is 1, so when most hosts run as declared they keep their declared
speed and the odd one out is learned (and a host without history keeps its declared speed on the
same scale). A task without history takes the pooled seconds per cost unit. When two parts of the
history share no task or host, their relative speed is not identifiable: the declared ratio is kept.

**estimates.tsv** (`<root>/estimates.tsv`, atomic replace by launch / launch --all / append /
remediate --launch): `# ablate estimates <t> <declared|learned>`, then one tab-separated line per
machine `host <host> <slot|-> <speed_milli>` and per roster cell `cell <name> <ms>`: the expected
milliseconds on a speed-1.0 machine (declared: cost x 1000, only ratios matter then). All integers.
"""

from __future__ import annotations

import math
import posixpath
import re
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ablate.config.project import Project
from ablate.errors import AblateError
from ablate.remote.layout import SweepLayout
from ablate.sweep.cells import Cell, parse_queue_text, read_all_queues
from ablate.sweep.snapshot import Snapshot
from ablate.transport import SharedFS
from ablate.transport.base import WriteAtomic
from ablate.util.fmt import Log, duration

ESTIMATES_FILE = "estimates.tsv"
MAX_SWEEPS = 2000  # alternating-means iterations; converges in a few dozen on real histories
_TOL = 1e-12
_MIN_OUTLIER = math.log(2.0)  # never call a run an outlier for being within 2x of the model


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


@dataclass(frozen=True)
class Observation:
    name: str
    task: str
    host: str
    cost: float  # declared
    seconds: float


def known_cells(project: Project, snapshot: Snapshot | None = None,
                extra: Iterable[Cell] = ()) -> dict[str, Cell]:
    """name -> cell over the local queue files, the FS copies in `snapshot` (queues another
    controller launched or appended to) and `extra`; an unreadable copy is skipped."""
    out: dict[str, Cell] = {c.name: c for c in extra}
    for qf in read_all_queues(project):
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


def observations(project: Project, snapshot: Snapshot, cells: Mapping[str, Cell]) -> list[Observation]:
    """One observation per cell: its latest successful, non-resumed run in the events."""
    latest: dict[str, tuple[float, Observation]] = {}
    for key, events in sorted(snapshot.events.items()):
        resumed: dict[str, bool] = {}
        for e in events:
            cell = e.cell
            if cell is None:
                continue
            if e.ev == "start":
                resumed[cell] = e.resume
                continue
            dur = e.dur
            if e.ev != "end" or e.rc != 0 or resumed.get(cell, False) or dur is None or not dur > 0 \
                    or cell not in cells:
                continue
            host = e.host if e.host is not None else key.split(".", 1)[0]
            c = cells[cell]
            t = e.t if e.t is not None else 0.0
            obs = Observation(cell, c.task, host, declared_cost(project, c), dur)
            if cell not in latest or t >= latest[cell][0]:
                latest[cell] = (t, obs)
    return [latest[n][1] for n in sorted(latest)]


@dataclass(frozen=True)
class Fit:
    log_spu: Mapping[str, float]  # per task with history
    log_speed: Mapping[str, float]  # per host with history
    used: int  # observations kept
    outliers: int
    task_cells: Mapping[str, int]
    host_cells: Mapping[str, int]


def fit(obs: Sequence[Observation], declared_speed: Mapping[str, float]) -> Fit:
    """The multiplicative model, robustly (see the module docstring). Pure arithmetic."""
    first = _ls(obs, declared_speed)
    resid = [math.log(o.seconds / o.cost) - (first.log_spu[o.task] - first.log_speed[o.host]) for o in obs]
    kept = list(obs)
    if len(obs) >= 3:
        med = statistics.median(resid)
        mad = statistics.median(abs(r - med) for r in resid) * 1.4826
        limit = max(3 * mad, _MIN_OUTLIER)
        kept = [o for o, r in zip(obs, resid, strict=True) if abs(r - med) <= limit]
    if len(kept) == len(obs) or not kept:
        return first
    again = _ls(kept, declared_speed)
    return Fit(again.log_spu, again.log_speed, len(kept), len(obs) - len(kept),
               again.task_cells, again.host_cells)


def _ls(obs: Sequence[Observation], declared_speed: Mapping[str, float]) -> Fit:
    y = [math.log(o.seconds / o.cost) for o in obs]
    tasks = sorted({o.task for o in obs})
    hosts = sorted({o.host for o in obs})
    by_task: dict[str, list[int]] = {t: [] for t in tasks}
    by_host: dict[str, list[int]] = {h: [] for h in hosts}
    for i, o in enumerate(obs):
        by_task[o.task].append(i)
        by_host[o.host].append(i)
    # Start from the declared speeds, so a part of the history that no task links to the rest
    # keeps the declared ratio.
    b = {h: math.log(declared_speed.get(h, 1.0)) for h in hosts}
    a = {t: 0.0 for t in tasks}
    for _ in range(MAX_SWEEPS):
        a = {t: sum(y[i] + b[obs[i].host] for i in ix) / len(ix) for t, ix in by_task.items()}
        nb = {h: sum(a[obs[i].task] - y[i] for i in ix) / len(ix) for h, ix in by_host.items()}
        moved = max(abs(nb[h] - b[h]) for h in hosts)
        b = nb
        if moved < _TOL:
            break
    a = {t: sum(y[i] + b[obs[i].host] for i in ix) / len(ix) for t, ix in by_task.items()}
    pinned = [h for h in hosts if h in declared_speed]
    if pinned:  # the typical host with history keeps its declared speed (module docstring)
        shift = statistics.median(math.log(declared_speed[h]) - b[h] for h in pinned)
        b = {h: v + shift for h, v in b.items()}
        a = {t: v + shift for t, v in a.items()}
    return Fit(a, b, len(obs), 0, {t: len(ix) for t, ix in by_task.items()},
               {h: len(ix) for h, ix in by_host.items()})


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class CostModel:
    """Declared costs and, when history exists, seconds. `weight(cell)` is what the planner
    balances: expected seconds on a speed-1.0 machine when learned, else the declared cost."""

    project: Project
    spu: Mapping[str, float] = field(default_factory=dict)  # seconds per cost unit, tasks with history
    global_spu: float | None = None  # pooled; None: nothing learned
    speeds: Mapping[str, float] = field(default_factory=dict)  # learned host speeds
    cells: int = 0  # observations the model was learned from
    outliers: int = 0
    task_cells: Mapping[str, int] = field(default_factory=dict)
    host_cells: Mapping[str, int] = field(default_factory=dict)
    note: str | None = None  # why no history was read, when it could not be

    @property
    def learned(self) -> bool:
        return self.global_spu is not None

    @property
    def source(self) -> str:
        return "learned" if self.learned else "declared"

    def cost(self, cell: Cell) -> float:
        return declared_cost(self.project, cell)

    def speed(self, host: str) -> float:
        if host in self.speeds:
            return self.speeds[host]
        return self.project.hosts[host].speed if host in self.project.hosts else 1.0

    def weight(self, cell: Cell) -> float:
        if self.global_spu is None:
            return self.cost(cell)
        return self.cost(cell) * self.spu.get(cell.task, self.global_spu)

    def seconds(self, cell: Cell, host: str) -> float | None:
        """Expected wall-clock seconds of `cell` on `host`; None before any history."""
        if self.global_spu is None:
            return None
        return self.weight(cell) / self.speed(host)

    def describe(self) -> str:
        if not self.learned:
            why = f"; {self.note}" if self.note else ""
            return f"declared costs; no history yet{why}"
        extra = f", {self.outliers} outlier(s) left out" if self.outliers else ""
        return f"learned from {self.cells} cell(s){extra}"

    def to_json(self) -> dict[str, Any]:
        hosts = {}
        for h in self.project.hosts:
            hosts[h] = {"speed": _r(self.speed(h)), "source": "learned" if h in self.speeds else "declared",
                        "cells": self.host_cells.get(h, 0)}
        tasks = {}
        for t in self.project.tasks:
            spu = self.spu.get(t, self.global_spu)
            tasks[t] = {"seconds_per_cost": None if spu is None else _r(spu),
                        "source": "learned" if t in self.spu else ("pooled" if self.learned else "declared"),
                        "cells": self.task_cells.get(t, 0)}
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
    if not obs:
        return declared_model(project)
    declared = {h.name: h.speed for h in project.hosts.values()}
    f = fit(obs, declared)
    spu = {t: math.exp(v) for t, v in f.log_spu.items()}
    n = sum(f.task_cells.values())
    pooled = math.exp(sum(f.log_spu[t] * k for t, k in f.task_cells.items()) / n)
    return CostModel(project, spu, pooled, {h: math.exp(v) for h, v in f.log_speed.items()},
                     f.used, f.outliers, dict(f.task_cells), dict(f.host_cells))


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
              elapsed: float | None) -> float | None:
    """Seconds until a running queue drains: its remaining cells' expected time plus what the
    current cell is expected to have left (never below zero). None before any history."""
    if not model.learned:
        return None
    total = 0.0
    for c in remaining:
        total += model.seconds(c, host) or 0.0
    if current is not None:
        total += max(0.0, (model.seconds(current, host) or 0.0) - (elapsed or 0.0))
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
        milli = max(1, round(model.speed(h.name) * 1000))
        for slot in h.slots:
            rows.append(f"host\t{h.name}\t{'-' if slot is None else slot}\t{milli}")
    for c in sorted(cells, key=lambda c: c.name):
        rows.append(f"cell\t{c.name}\t{max(1, round(model.weight(c) * 1000))}")
        # What a draining runner learns from (ablate/remote/learn.py): the cell's task and declared
        # cost in the user's units. run_queue itself reads only host and cell lines.
        rows.append(f"cost\t{c.name}\t{c.task}\t{model.cost(c):.6g}")
    return "".join(r + "\n" for r in rows)


@dataclass(frozen=True)
class Estimates:
    path: str
    model: CostModel
    cells: int


def estimates_op(project: Project, root: str, snapshot: Snapshot) -> tuple[WriteAtomic, Estimates]:
    """The atomic write of `<root>/estimates.tsv` for the roster (the local queue files and the FS
    copies in `snapshot`), for a caller that batches it with its own writes (launch)."""
    known = known_cells(project, snapshot)
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
