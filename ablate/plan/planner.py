"""`ablate plan`: balance the cells by cost into one queue file per machine (host, or GPU slot).

Cells come from the `cells:` globs of ablate.yaml (relative to the repo root, `**` crosses
directories, matches sorted; as in a shell, dot files and dot directories match only a pattern
that names the dot). With no `cells:`, the roster of the existing queue files is
re-balanced. A cell costs what `ablate.plan.cost` declares (`costs:` overrides, else
`tasks[task].cost_per_epoch * epochs`); a machine of speed s finishes cost C at C / s. Once the
shared FS holds history, the split is made on the learned model instead (expected seconds on a
speed-1.0 machine, learned host speeds), and `finish`, `makespan`, `lower_bound` are seconds
(`model.unit`); `eta_seconds` is set only then. The split is `ablate.plan.balance` (LPT + a bounded
local search); inside a queue the cells run longest first, so its tail holds the small cells a
drained runner can steal.

Each machine gets `queues/<host>.txt` (or `queues/<host>-g<slot>.txt` on a host with several
slots) whose first line is the header `# ablate: host=H [slot=N]`; that header is what marks a
file as written by plan. A machine with no cells still gets its (header-only) file.

Overwrite rule (checked for every file before anything is written; a refusal writes nothing):
- A file whose bytes equal what plan would write is left alone (an identical re-plan is a no-op).
- No file that plan would change, remove or set aside may have been launched: its ledger
  (`<sweep root>/queues/<queue>.ledger`) must not exist on the shared FS. A launched queue is
  append-only; add to it with `ablate append`, or have `ablate remediate` write a new queue.
  The same holds for a new queue file whose name a launched queue already used. When the shared
  FS cannot be reached, a first plan (no queue file exists locally to change) still proceeds, with
  a note; changing an existing queue file is refused until the check can be made.
- Plan replaces or removes only files it wrote (header on the first line), and only when no cell
  of such a file would be lost: every cell name in it must be in the new plan. So a cell added
  by hand to a plan-written file, or whose config no glob matches any more, is never dropped
  silently; the refusal names the line.
- With `cells:` globs, queue files plan did not write are the user's: kept as they are and part
  of the roster (name collisions with them are refused); one named like a planned queue is
  refused. Plan-written files of machines no longer planned on (`--hosts`) are removed.
- Re-balancing (no `cells:`) consumes every queue file: plan-written ones are replaced or removed;
  hand-written ones are set aside as `queues/<queue>.txt.replaced` (no longer `*.txt`, so out of
  the roster; refused if that name exists).
New files are written (atomically) before anything is removed, so an interruption can leave a
cell in two queue files (the same line in two places is one cell, run once) but never in none.

`write=False` computes the plan and the file changes it would make without writing anything
and without the overwrite checks (it reads only the run history on the shared FS, best effort).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ablate.config.project import CONFIG_NAME, Project
from ablate.errors import AblateError, Busy, ConfigError
from ablate.plan.balance import balance, lower_bound
from ablate.plan.cost import CostModel, declared_cost, eta_line, load_model
from ablate.sweep import cells as cellmod
from ablate.sweep.cells import Cell, QueueFile
from ablate.sweep.lock import controller_lock
from ablate.transport import shared_fs
from ablate.util.fmt import Log, duration
from ablate.util.fs import atomic_write

ASIDE_SUFFIX = ".replaced"


@dataclass(frozen=True)
class Machine:
    queue: str
    host: str
    slot: int | None  # a GPU index, or None for a host without gpus/slots
    speed: float


@dataclass(frozen=True)
class PlannedQueue:
    machine: Machine
    cells: tuple[Cell, ...]
    cost: float  # declared cost units
    load: float | None = None  # the balanced weight in the model's unit; None: `cost`
    eta_seconds: float | None = None  # expected seconds to run it all (learned model only)

    @property
    def queue(self) -> str:
        return self.machine.queue

    @property
    def finish(self) -> float:
        """When it drains, in the model's unit: declared cost / speed before any history, seconds
        once learned (then equal to `eta_seconds`)."""
        if self.eta_seconds is not None:
            return self.eta_seconds
        return (self.cost if self.load is None else self.load) / self.machine.speed

    def text(self) -> str:
        slot = "" if self.machine.slot is None else f" slot={self.machine.slot}"
        rows = [f"# ablate: host={self.machine.host}{slot}", *(c.queue_line for c in self.cells)]
        return "".join(row + "\n" for row in rows)

    def to_json(self) -> dict[str, Any]:
        return {"queue": self.queue, "host": self.machine.host, "slot": self.machine.slot,
                "cells": [c.name for c in self.cells], "cost": _r(self.cost), "finish": _r(self.finish),
                "priorities": {c.name: c.priority for c in self.cells if c.priority},
                "eta_seconds": None if self.eta_seconds is None else _r(self.eta_seconds)}


@dataclass(frozen=True)
class FileChange:
    action: str  # "write" | "unchanged" | "remove" | "set aside" | "keep"
    path: Path
    dest: Path | None = None  # where "set aside" moves it

    def describe(self, base: Path) -> str:
        rel = _rel(self.path, base)
        if self.action == "set aside" and self.dest is not None:
            return f"set aside {rel} -> {_rel(self.dest, base)} (its cells are in the planned queues)"
        if self.action == "keep":
            return f"kept {rel} (not written by plan; its cells stay in the roster)"
        return {"write": "wrote", "unchanged": "unchanged", "remove": "removed"}[self.action] + f" {rel}"


@dataclass(frozen=True)
class PlanResult:
    queues: tuple[PlannedQueue, ...]
    makespan: float
    lower_bound: float
    changes: tuple[FileChange, ...]
    written: bool  # False for a dry run (write=False)
    base: Path  # the project dir, for relative paths in lines()
    model: CostModel | None = None  # what the weights and the ETA came from

    @property
    def eta_seconds(self) -> float | None:
        return self.makespan if self.model is not None and self.model.learned else None

    def to_json(self) -> dict[str, Any]:
        eta = self.eta_seconds
        model = self.model.to_json() if self.model is not None else {"source": "declared", "cells": 0}
        return {"queues": [q.to_json() for q in self.queues], "makespan": _r(self.makespan),
                "lower_bound": _r(self.lower_bound), "eta_seconds": None if eta is None else _r(eta),
                "model": model}

    def lines(self) -> list[str]:
        width = max([len("queue"), *(len(q.queue) for q in self.queues)])
        out = [f"{'queue':<{width}}  {'host':<12} {'slot':>4} {'cells':>6} {'cost':>10} {'finish':>10} "
               f"{'eta':>8}"]
        for q in self.queues:
            slot = "-" if q.machine.slot is None else str(q.machine.slot)
            out.append(f"{q.queue:<{width}}  {q.machine.host:<12} {slot:>4} {len(q.cells):>6} "
                       f"{q.cost:>10.2f} {q.finish:>10.2f} {duration(q.eta_seconds):>8}")
        ratio = self.makespan / self.lower_bound if self.lower_bound > 0 else 1.0
        n = sum(len(q.cells) for q in self.queues)
        out.append(f"{n} cells on {len(self.queues)} queues: makespan {self.makespan:.2f}, "
                   f"lower bound {self.lower_bound:.2f} (ratio {ratio:.3f})")
        for q in self.queues:
            if any(c.priority for c in q.cells):
                out.append(f"{q.queue}: by priority: {priority_text(q.cells)}")
        if self.model is not None:
            out.append(eta_line(self.model, self.eta_seconds, "plan"))
        if self.written:  # each file was already reported through `log` as it was written
            counts: dict[str, int] = {}
            for c in self.changes:
                counts[c.action] = counts.get(c.action, 0) + 1
            out.append("queue files: " + ", ".join(f"{n} {_PAST[a]}" for a, n in counts.items()))
        else:
            out.extend("would have " + c.describe(self.base) for c in self.changes)
            out.append("dry run: nothing written")
        return out


_PAST = {"write": "written", "unchanged": "unchanged", "remove": "removed", "set aside": "set aside",
         "keep": "kept (not written by plan)"}


def priority_text(cells: Sequence[Cell]) -> str:
    """`2: 3 cells, 0: 5 cells` (highest first)."""
    counts: dict[int, int] = {}
    for c in cells:
        counts[c.priority] = counts.get(c.priority, 0) + 1
    return ", ".join(f"{p}: {n} cell{'s' if n != 1 else ''}" for p, n in sorted(counts.items(), reverse=True))


def _r(x: float) -> float:
    return round(x, 6)


def _rel(path: Path, base: Path) -> str:
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- inputs


def machines(project: Project, hosts: Sequence[str] | None = None) -> list[Machine]:
    """Every (host, slot) of the selected hosts, in ablate.yaml order."""
    if hosts is not None:
        wanted = [h.strip() for h in hosts if h.strip()]
        if not wanted:
            raise ConfigError("--hosts names no host; give a comma-separated list like h1,h2")
        for name in wanted:
            project.host(name)  # unknown host: ConfigError with did-you-mean
        selected = [h for h in project.hosts.values() if h.name in set(wanted)]
    else:
        selected = list(project.hosts.values())
    out: list[Machine] = []
    seen: dict[str, str] = {}
    for host in selected:
        slots = host.slots
        for slot in slots:
            queue = host.name if len(slots) == 1 else f"{host.name}-g{slot}"
            cellmod.check_queue_name(queue)
            if queue in seen:
                raise ConfigError(f"{CONFIG_NAME}: queue name {queue!r} would be used by both host "
                                  f"{seen[queue]} and host {host.name}; rename one host")
            seen[queue] = host.name
            out.append(Machine(queue, host.name, slot, host.speed))
    return out


def glob_cells(project: Project) -> list[Cell]:
    """The cells of the `cells:` globs, deduplicated; a glob matching nothing is an error."""
    found: dict[str, tuple[Cell, str]] = {}
    cfg_file = project.config_path
    for i, src in enumerate(project.cells):
        origin = f"{cfg_file}: cells[{i}] (glob {src.glob!r})"
        try:
            paths = sorted(rel for rel in (p.relative_to(project.dir).as_posix()
                                           for p in project.dir.glob(src.glob) if p.is_file())
                           if _wanted(rel, src.glob))
        except ValueError as e:
            raise ConfigError(f"{origin}: not a usable glob: {e}") from e
        if not paths:
            raise ConfigError(f"{origin}: matches no file under {project.dir}")
        epochs = src.epochs or project.tasks[src.task].epochs
        for rel in paths:
            where = f"{origin} matched {rel!r}"
            if not cellmod.SAFE_CFG.match(rel):
                raise ConfigError(f"{where}: the path has characters a shell would interpret; rename it "
                                  "to letters, digits and . _ / + @ , = -")
            prio = f" priority={src.priority}" if src.priority else ""
            cell = cellmod.parse_line(f"{rel} {src.task} {epochs}{prio}", project.tasks, where)
            assert cell is not None
            prev = found.get(cell.name)
            if prev is None:
                found[cell.name] = (cell, where)
            elif prev[0] != cell:
                raise ConfigError(f"name collision: {prev[1]} ({prev[0].line!r}) and {where} "
                                  f"({cell.line!r}) both map to cell {cell.name!r}; rename one config")
    return [cell for cell, _ in found.values()]


def _wanted(rel: str, pattern: str) -> bool:
    """As in a shell, `*` and `**` skip dot files and dot directories (.git, .ablate) unless the
    pattern names a dot itself; ablate.yaml is never a cell."""
    if rel == CONFIG_NAME:
        return False
    if "/." in f"/{pattern}":
        return True
    return not any(part.startswith(".") for part in rel.split("/"))


def cost(project: Project, cell: Cell) -> float:
    """The declared cost (`costs:` overrides, else the task's cost per epoch x epochs)."""
    return declared_cost(project, cell)


# --------------------------------------------------------------------------- plan


def plan(project: Project, hosts: Sequence[str] | None = None, write: bool = True,
         log: Log | None = None) -> PlanResult:
    mach = machines(project, hosts)
    snap = _snapshot(project)
    existing = cellmod.read_all_queues(project)  # a bad queue file is refused here (QueueError)
    rebalance = not project.cells
    if rebalance:
        todo = list(cellmod.build_roster(existing).cells.values())
        if not todo:
            raise ConfigError(f"nothing to plan: {CONFIG_NAME} has no `cells:` globs and "
                              f"{project.queues_dir} holds no queue lines")
    else:
        todo = glob_cells(project)

    todo.sort(key=lambda c: (c.name, c.line))
    # Balanced on the model: declared costs and speeds, or, once history exists, expected seconds
    # on a speed-1.0 machine and the learned host speeds.
    model = load_model(project, todo)
    mach = [replace(m, speed=model.speed(m.host, m.slot)) for m in mach]
    costs = [model.cost(c) for c in todo]
    # The fixed time per cell (learned: start-up, data load, sync) is balanced as work at speed 1.0.
    weights = [model.weight(c) + model.rates.pooled_overhead for c in todo]
    speeds = [m.speed for m in mach]
    where = balance(weights, speeds)
    per: list[list[int]] = [[] for _ in mach]
    for i, j in enumerate(where):
        per[j].append(i)
    # Inside a queue: higher priority first (the balance across queues stays by cost); then longest
    # first: its tail holds the small cells, what a drained runner steals.
    queues = tuple(
        PlannedQueue(m, tuple(todo[i] for i in sorted(idx, key=lambda i: (
            -todo[i].priority, -weights[i], todo[i].cfg, todo[i].task, todo[i].epochs))),
                     sum(costs[i] for i in idx), sum(weights[i] for i in idx),
                     _seconds(model, m, [todo[i] for i in idx]))
        for m, idx in zip(mach, per, strict=True))
    makespan = max(q.finish for q in queues)

    changes, final = _changes(project, queues, existing, snap, rebalance)
    cellmod.build_roster(final)  # name collisions between the planned and the kept files
    if write:
        with contextlib.ExitStack() as lock:  # _check takes the controller lock once it reads the FS
            _check(project, queues, existing, changes, rebalance, log, lock)
            _apply(project, queues, snap, changes, log)
    return PlanResult(queues, makespan, lower_bound(weights, speeds), tuple(changes), write, project.dir,
                      model)


def _seconds(model: CostModel, m: Machine, cells: Sequence[Cell]) -> float | None:
    """Expected seconds to run `cells` on `m` (the runners' own figures); None before any history."""
    return sum(model.seconds(c, m.host, m.slot) or 0.0 for c in cells) if model.learned else None


def _is_plan_written(qf: QueueFile) -> bool:
    first = qf.lines[0].text.strip() if qf.lines else ""
    return qf.host is not None and cellmod.HEADER.match(first) is not None


def _changes(project: Project, queues: Sequence[PlannedQueue], existing: Sequence[QueueFile],
             snap: dict[Path, bytes], rebalance: bool) -> tuple[list[FileChange], list[QueueFile]]:
    """What each file becomes, and the queue files of the roster afterwards."""
    qdir = project.queues_dir
    old = {qf.name: qf for qf in existing}
    changes: list[FileChange] = []
    final: list[QueueFile] = []
    for q in queues:
        path = qdir / f"{q.queue}.txt"
        final.append(cellmod.parse_queue_text(q.queue, q.text(), project.tasks, path))
        if q.queue in old and snap.get(path) == q.text().encode():
            changes.append(FileChange("unchanged", path))
        else:
            changes.append(FileChange("write", path))
    planned = {q.queue for q in queues}
    for qf in existing:
        if rebalance and not _is_plan_written(qf):
            changes.append(FileChange("set aside", qf.path, qf.path.with_name(qf.path.name + ASIDE_SUFFIX)))
        elif qf.name in planned:
            continue
        elif _is_plan_written(qf):
            changes.append(FileChange("remove", qf.path))
        else:
            changes.append(FileChange("keep", qf.path))
            final.append(qf)
    return changes, final


def _check(project: Project, queues: Sequence[PlannedQueue], existing: Sequence[QueueFile],
           changes: Sequence[FileChange], rebalance: bool, log: Log | None,
           lock: contextlib.ExitStack | None = None) -> None:
    """Every refusal of the overwrite rule (module docstring), before anything is written."""
    old = {qf.path: qf for qf in existing}
    new_names = {c.name for q in queues for c in q.cells}
    touched: list[str] = []
    for ch in changes:
        if ch.action in ("unchanged", "keep"):
            continue
        queue = ch.path.name[: -len(".txt")]
        touched.append(queue)
        qf = old.get(ch.path)
        if ch.action == "set aside":
            assert ch.dest is not None
            if ch.dest.exists():
                raise AblateError(f"{_rel(ch.dest, project.dir)} already exists; plan sets "
                                  f"{_rel(ch.path, project.dir)} aside there before re-balancing. "
                                  "Move one of them away and re-run plan")
            continue
        if qf is None:
            continue  # a new file
        if not _is_plan_written(qf):
            if rebalance:
                continue  # set aside before the new file is written (its own change)
            raise AblateError(
                f"{_rel(qf.path, project.dir)} was not written by plan (no `# ablate: host=...` "
                f"first line) and differs from the planned queue {queue!r}; plan does not overwrite "
                "your queue files. Rename or remove it, then re-run plan")
        for ln in qf.cells:
            assert ln.cell is not None
            if ln.cell.name not in new_names:
                verb = "rewrite" if ch.action == "write" else "remove"
                raise AblateError(
                    f"{ln.where}: cell {ln.cell.name!r} ({ln.text.strip()!r}) is not in the new plan "
                    f"(no `cells:` glob gives it); plan would {verb} {_rel(qf.path, project.dir)} and "
                    "lose it. Add it to a glob or its own queue file, or delete the line, then re-run plan")
    if not touched:
        return
    layout = project.layout()
    try:
        fs = shared_fs(project)  # reached only when some file would change
        ledgers = set(fs.listdir(layout.queues))
        launched = [q for q in touched if f"{q}.ledger" in ledgers]
        if not launched and lock is not None:
            # Held until the files are written, and checked again under it: no launch slips in.
            lock.enter_context(controller_lock(project, "plan", log=log))
            ledgers = set(fs.listdir(layout.queues))
            launched = [q for q in touched if f"{q}.ledger" in ledgers]
    except Busy:
        raise
    except (AblateError, OSError) as e:
        rewritten = sorted(q for q in touched if (project.queues_dir / f"{q}.txt").exists())
        if rewritten:
            raise AblateError(
                f"cannot check on the shared FS whether queue {', '.join(rewritten)} was launched "
                f"({getattr(e, 'message', e)}); plan changes an existing queue file only after that "
                "check. Bring a host up (`ablate doctor`) and re-run plan") from e
        # A first plan before any instance is up: nothing exists locally to protect, and launch
        # checks the ledger itself.
        if log is not None:
            log(f"note: shared FS not reachable ({getattr(e, 'message', e)}); "
                "not checked whether these queue names were launched before")
        return
    if launched:
        raise AblateError(
            f"queue {', '.join(launched)} has been launched (ledger {layout.ledger(launched[0])}); "
            "plan does not rewrite, remove or reuse a launched queue. Add cells with `ablate append`, "
            "re-run failed ones with `ablate remediate`, or use a new sweep name")


def _snapshot(project: Project) -> dict[Path, bytes]:
    if not project.queues_dir.is_dir():
        return {}
    return {p: p.read_bytes() for p in sorted(project.queues_dir.glob("*.txt")) if p.is_file()}


def _apply(project: Project, queues: Sequence[PlannedQueue], snap: dict[Path, bytes],
           changes: Sequence[FileChange], log: Log | None) -> None:
    text = {project.queues_dir / f"{q.queue}.txt": q.text() for q in queues}
    if _snapshot(project) != snap:  # re-check: no queue file changed since validation
        raise AblateError(f"{_rel(project.queues_dir, project.dir)} changed while planning; re-run plan")

    def done(ch: FileChange) -> None:
        if log is not None:
            log(ch.describe(project.dir))

    # Order: set-aside copies (a hard link never overwrites an existing name), then the new
    # files, then unlinks, so every cell is in at least one queue file at every moment.
    aside = [ch for ch in changes if ch.action == "set aside" and ch.dest is not None]
    for ch in aside:
        assert ch.dest is not None
        os.link(ch.path, ch.dest)
    for ch in changes:
        if ch.action == "write":
            atomic_write(ch.path, text[ch.path].encode())
            done(ch)
    for ch in aside:
        if ch.path not in text:
            ch.path.unlink()
        done(ch)
    for ch in changes:
        if ch.action == "remove":
            ch.path.unlink()
            done(ch)
