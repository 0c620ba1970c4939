"""`ablate remediate [--hosts a,b] [--launch]`: re-run every cell that is not done, doing or about to
be done, with its identical queue line, on the live hosts only (DESIGN rule 8).

Under the controller lock: classify every cell (`ablate.sweep.classify.collect`); the targets are the
`never_ran`, `lost`, `interrupted`, `oom`, `crashed`, `service_down`, `sync_failed`, `corrupt` and
`stale` cells.
`queued`, `running`, `synced` and `verified` cells are left alone; `hung` ones are reported with
`ablate stop QUEUE --host H` as the step before. A target already in a `remediate-*` queue that was
never launched and whose host answers (the previous `remediate`'s) gets no new line: that queue
will run it. Then, in this order, so an interruption never strands a cell:
1. a target's durable result that must not stand (corrupt, stale, a partial dir) and any leftover
   staging dir of it are renamed to `final_ckpts/.aside.<name>.<t>[.staging-<k>]/` (never deleted);
2. a target's claim gets `release.json` {"t", "by", "state", "reason"} and is renamed to
   `released/<name>.<t>/` (recorded, never deleted), so a new queue can claim it;
3. one new queue file per live machine (host, or GPU slot) that gets cells:
   `queues/remediate-<n>-<host>[-g<slot>].txt` with plan's header `# ablate: host=H [slot=N]` and
   the cells' original queue lines byte for byte (never a patched config: same (cfg, task, epochs),
   the same roster cell), balanced by cost (`ablate.plan.cost`'s model, learned when there is history)
   over the live hosts' speeds with `ablate.plan.balance`;
4. `remediation/<t>.json` {"t", "by", "cells": {name: state}, "queues": {queue: host},
   "released": [..], "aside": [..]}.
With `--launch` each new queue, and each never-launched `remediate-*` queue of a live host, is
launched. Nothing changed and nothing launched: "nothing new" (idempotent).
"""

from __future__ import annotations

import json
import posixpath
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ablate.config.project import Project
from ablate.errors import AblateError, CheckFailed
from ablate.plan.balance import balance
from ablate.plan.cost import known_cells, learn
from ablate.remote.layout import SweepLayout
from ablate.sweep import resume_view
from ablate.sweep.cells import QueueFile, check_queue_name, load_roster
from ablate.sweep.classify import TARGETS, CellState, Classification, cell_lines, collect, count_line, warn
from ablate.sweep.lock import controller_lock, whoami
from ablate.transport import SharedFS, connect_ahead, shared_fs
from ablate.util.fmt import Log
from ablate.util.fs import atomic_write
from ablate.util.progress import steps

if TYPE_CHECKING:  # launch is imported when --launch needs it
    from ablate.run.pipeline import LaunchResult

PREFIX = "remediate-"
_NUMBERED = re.compile(r"^remediate-(\d+)-")
OOM_ADVICE = ("the identical config will most likely run out of memory again unless you fixed the "
              "cause; ablate never changes a config for you (no halved batch size): edit the config "
              "(or write a new one and re-plan) yourself, then run the queue")


@dataclass(frozen=True)
class NewQueue:
    queue: str
    host: str
    slot: int | None
    cells: tuple[str, ...]
    lines: tuple[str, ...]  # the cells' original queue lines, byte for byte
    cost: float
    path: Path

    def text(self) -> str:
        slot = "" if self.slot is None else f" slot={self.slot}"
        return "".join(row + "\n" for row in (f"# ablate: host={self.host}{slot}", *self.lines))

    def to_json(self) -> dict[str, Any]:
        return {"queue": self.queue, "host": self.host, "slot": self.slot, "cells": list(self.cells),
                "cost": round(self.cost, 6)}


@dataclass
class RemediateResult:
    t: str
    cells: dict[str, CellState]  # every roster cell, classified
    targets: dict[str, CellState] = field(default_factory=dict)  # re-run (or released for a pending queue)
    queues: list[NewQueue] = field(default_factory=list)
    pending: dict[str, str] = field(default_factory=dict)  # target -> the never-launched queue holding it
    released: list[str] = field(default_factory=list)  # released/<name>.<t> paths
    aside: list[str] = field(default_factory=list)  # final_ckpts/.aside.* paths
    record: str | None = None
    launched: list[LaunchResult] = field(default_factory=list)
    down: dict[str, str] = field(default_factory=dict)  # host -> why it is not live
    # cells that look like targets on a view that may be stale: left alone this time (classify)
    unconfirmed: dict[str, CellState] = field(default_factory=dict)
    resume: dict[str, Any] = field(default_factory=dict)  # what each cut target resumes from (resume_view)

    @property
    def nothing_new(self) -> bool:
        return not (self.queues or self.released or self.aside)

    @property
    def hung(self) -> list[CellState]:
        return [c for c in self.cells.values() if c.state == "hung"]

    @property
    def failed_launches(self) -> list[str]:
        return [r.queue for r in self.launched if r.status == "failed"]

    def advice(self) -> list[str]:
        out = [f"hung: {c.name} on {c.host}: `ablate stop {c.queue} --host {c.host}` first, then "
               "`ablate remediate` again" for c in self.hung]
        out += [f"oom: {c.name}: {OOM_ADVICE}" for c in self.targets.values() if c.state == "oom"]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "t": self.t, "nothing_new": self.nothing_new,
            "targets": {n: c.to_json() for n, c in self.targets.items()},
            "queues": [q.to_json() for q in self.queues], "pending": self.pending,
            "released": self.released, "aside": self.aside, "record": self.record,
            "hung": {c.name: c.to_json() for c in self.hung}, "advice": self.advice(),
            "down": self.down, "launched": [r.to_json() for r in self.launched],
            "unconfirmed": {n: c.to_json() for n, c in self.unconfirmed.items()},
            "states": _counts(self.cells.values()), "resume": self.resume,
        }

    def lines(self) -> list[str]:
        out = [count_line(_counts(self.cells.values()))]
        rerun = [c for n, c in self.targets.items() if n not in self.pending]
        if rerun:
            out.append(f"{len(rerun)} cell(s) to re-run "
                       f"({', '.join(f'{n} {s}' for s, n in _counts(rerun).items())}):")
            out += cell_lines(rerun)
            out += resume_view.lines({n: r for n, r in self.resume.items() if n not in self.pending},
                                     self.targets)
        for nq in self.queues:
            slot = "" if nq.slot is None else f" slot {nq.slot}"
            out.append(f"wrote queues/{nq.queue}.txt for {nq.host}{slot}: {len(nq.cells)} cell(s), "
                       f"cost {nq.cost:.2f}")
        for name, q in sorted(self.pending.items()):
            out.append(f"{name}: already in queues/{q}.txt (not launched yet); no new line")
        if self.unconfirmed:
            looks = "/".join(sorted({c.state for c in self.unconfirmed.values()}))
            out.append(f"{len(self.unconfirmed)} cell(s) left alone: they look {looks} only on a view "
                       "that may be stale; `ablate remediate` again once it settles:")
            out += cell_lines(list(self.unconfirmed.values()))
        out += [f"released claim -> {p}" for p in self.released]
        out += [f"set aside -> {p}" for p in self.aside]
        out += self.advice()
        for host, why in self.down.items():
            out.append(f"host {host} not used: {why}")
        if self.nothing_new:
            out.append("nothing new to remediate: no cell changed state since the last remediate"
                       if self.pending or not self.targets else "nothing new to remediate")
        if self.record:
            out.append(f"recorded {self.record}")
        for r in self.launched:
            out += r.lines()
        waiting = sorted({q for q in self.pending.values()} | {q.queue for q in self.queues}
                         - {r.queue for r in self.launched})
        if waiting and not self.launched:
            out.append("next: `ablate remediate --launch` (or `ablate launch --all`) starts "
                       + ", ".join(waiting))
        return out


def _counts(cells: Any) -> dict[str, int]:
    from ablate.sweep.classify import state_counts

    return state_counts(cells)


def remediate(project: Project, hosts: Sequence[str] | None = None, launch: bool = False,
              log: Log | None = None) -> RemediateResult:
    selected = _selected(project, hosts)
    connect_ahead(project, project.hosts)  # every host is asked: connected while the lock is taken
    with controller_lock(project, "remediate --launch" if launch else "remediate", log=log):
        load_roster(project)  # a name collision anywhere is refused before anything changes
        fs = shared_fs(project)
        got = collect(project, fs)
        warn(log, got.state.warnings)
        return _remediate(project, fs, got, selected, launch, log)


def _selected(project: Project, hosts: Sequence[str] | None) -> list[str]:
    if hosts is None:
        return list(project.hosts)
    names = [h.strip() for h in hosts if h.strip()]
    if not names:
        raise AblateError("--hosts names no host; give a comma-separated list like h1,h2")
    for name in names:
        project.host(name)  # unknown host: ConfigError with did-you-mean
    return [h for h in project.hosts if h in set(names)]


def _remediate(project: Project, fs: SharedFS, got: Classification, selected: list[str], launch: bool,
               log: Log | None) -> RemediateResult:
    t = f"{time.time():.3f}"
    layout = SweepLayout(fs.root)
    snap = got.state.snap
    ledgers = snap.ledgers
    live = [h for h in selected if got.state.reachable(h)]
    down = {h: got.lost_hosts.get(h) or f"not answering ({got.unreachable.get(h, 'unreachable')})"
            for h in selected if h not in live}
    result = RemediateResult(t, dict(got.cells), down=down)

    # Never-launched remediate queues of hosts that answer will run what they hold once launched.
    waiting: dict[str, QueueFile] = {}
    pending_of: dict[str, str] = {}
    for q in got.queues.values():
        if not q.name.startswith(PREFIX) or ledgers.get(q.name) or not q.host \
                or not got.state.reachable(q.host):
            continue
        waiting[q.name] = q
        for ln in q.cells:
            assert ln.cell is not None
            pending_of.setdefault(ln.cell.name, q.name)
    targets = {n: c for n, c in got.cells.items() if c.state in TARGETS and not c.unconfirmed}
    result.targets = targets
    result.resume = resume_view.resume_from(snap.extra.get("resume") or {}, targets, snap.now)
    result.unconfirmed = {n: c for n, c in got.cells.items() if c.state in TARGETS and c.unconfirmed}
    result.pending = {n: pending_of[n] for n in targets if n in pending_of}
    rerun = [n for n in targets if n not in pending_of]
    if rerun and not live:
        raise CheckFailed("no live host to remediate onto: " + "; ".join(f"{h}: {w}" for h, w in down.items())
                          + f". {len(rerun)} cell(s) wait: {', '.join(rerun[:10])}; bring a host up "
                          "(`ablate doctor`) or add one to ablate.yaml")
    to_launch = [q for q, qf in waiting.items() if qf.host in live]
    if launch and result.pending and not live:
        raise CheckFailed("--launch: no live host to launch on: "
                          + "; ".join(f"{h}: {w}" for h, w in down.items()))

    new_queues = _plan(project, got, rerun, live, t) if rerun else []
    for nq in new_queues:  # checked before anything changes
        if nq.path.exists() or ledgers.get(nq.queue):
            raise AblateError(f"queues/{nq.queue}.txt exists already; remove it or re-run remediate")

    # 1 and 2: results set aside and claims released before any queue could claim the cells.
    claims = snap.claims
    staging = list(snap.staging)
    with steps(log, len(targets), "remediate: set aside + release") as bar:
        for name, c in targets.items():
            result.aside += _set_aside(fs, layout, name, c, t, staging, list(project.hosts))
            if name in claims:
                result.released.append(_release(fs, layout, name, c, t))
            bar.advance(name)
    # 3 and 4.
    for nq in new_queues:
        atomic_write(nq.path, nq.text().encode())
        if log:
            log(f"wrote queues/{nq.queue}.txt: {len(nq.cells)} cell(s) for {nq.host}")
    result.queues = new_queues
    if not result.nothing_new:
        result.record = layout.remediation_record(t)
        record = {"t": float(t), "by": whoami(), "cells": {n: c.state for n, c in targets.items()},
                  "queues": {nq.queue: nq.host for nq in new_queues}, "released": result.released,
                  "aside": result.aside}
        fs.write_atomic(result.record, (json.dumps(record) + "\n").encode())
    if launch:
        result.launched = _launch(project, [nq.queue for nq in new_queues] + to_launch, waiting,
                                  new_queues, log)
    return result


def _plan(project: Project, got: Classification, names: list[str], live: list[str], t: str) -> list[NewQueue]:
    """Balance the cells' original lines over the live machines by cost; one queue per machine used."""
    lines: dict[str, str] = {}
    for q in sorted(got.queues.values(), key=lambda q: (q.name.startswith(PREFIX), q.name)):
        for ln in q.cells:
            assert ln.cell is not None
            lines.setdefault(ln.cell.name, ln.text)  # the original line, byte for byte (CR stripped)
    known = known_cells(project, got.state.snap)
    model = learn(project, got.state.snap, known)
    machines = [(h, slot) for h in live for slot in project.hosts[h].slots]
    costs = [model.weight(known[n]) if n in known else 1.0 for n in names]
    speeds = [model.speed(h) for h, _ in machines]
    where = balance(costs, speeds)
    n = _next_number(project, got)
    out = []
    for j, (host, slot) in enumerate(machines):
        mine = [i for i, m in enumerate(where) if m == j]
        if not mine:
            continue
        several = len(project.hosts[host].slots) > 1
        queue = check_queue_name(f"{PREFIX}{n}-{host}" + (f"-g{slot}" if several else ""))
        out.append(NewQueue(queue, host, slot, tuple(names[i] for i in mine),
                            tuple(lines[names[i]] for i in mine), sum(costs[i] for i in mine),
                            project.queues_dir / f"{queue}.txt"))
    return out


def _next_number(project: Project, got: Classification) -> int:
    seen = [p.stem for p in project.queues_dir.glob(f"{PREFIX}*.txt")] if project.queues_dir.is_dir() else []
    seen += list(got.state.snap.queue_copies) + list(got.state.snap.ledgers)
    nums = [int(m.group(1)) for s in seen if (m := _NUMBERED.match(s))]
    return max(nums, default=0) + 1


def _set_aside(fs: SharedFS, layout: SweepLayout, name: str, c: CellState, t: str, staging: list[str],
               hosts: list[str]) -> list[str]:
    """Rename a result that must not stand, and leftover staging dirs of the cell, out of the way."""
    out = []
    if c.aside:
        dst = layout.aside_dir(name, t)
        if fs.rename_noreplace(layout.final_dir(name), dst):
            out.append(dst)
    k = 0
    for entry in staging:
        rest = entry[len(f".staging.{name}."):] if entry.startswith(f".staging.{name}.") else None
        host, _, pid = (rest or "").rpartition(".")
        if rest is None or host not in hosts or not pid.isdigit():
            continue
        k += 1
        dst = layout.aside_dir(name, t, k)
        if fs.rename_noreplace(posixpath.join(layout.final, entry), dst):
            out.append(dst)
    return out


def _release(fs: SharedFS, layout: SweepLayout, name: str, c: CellState, t: str) -> str:
    """The claim, with why it was released written inside it first, renamed to released/."""
    claim = layout.claim(name)
    note = {"t": float(t), "by": whoami(), "state": c.state, "reason": c.reason}
    fs.write_atomic(posixpath.join(claim, "release.json"), (json.dumps(note) + "\n").encode())
    dst = layout.released_claim(name, t)
    fs.rename_noreplace(claim, dst)
    return dst


def _launch(project: Project, queues: list[str], waiting: Mapping[str, QueueFile],
            new_queues: list[NewQueue], log: Log | None) -> list[LaunchResult]:
    from ablate.remote.layout import session_name
    from ablate.run.pipeline import LaunchResult, launch

    hosts = {nq.queue: nq.host for nq in new_queues}
    hosts.update({q: qf.host for q, qf in waiting.items() if qf.host})
    out = []
    for q in queues:
        host = hosts[q]
        try:
            out.append(launch(project, q, host, log=log))
        except AblateError as e:  # one queue failing never hides the others
            out.append(LaunchResult(q, host, "failed", session_name(project.sweep, host, q), error=e.message))
    return out
