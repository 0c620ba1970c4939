"""`ablate status`: per queue, where it is, what it runs, how fresh its heartbeat is, and what it
has produced — rebuilt from the shared FS (one probe) and each host's tmux (one query per host, all
hosts in parallel and alongside the probe, so a dead host costs one connect time-out in all).

A host that cannot be reached is not a lost instance on that one signal: its queue counts as
`running` while its heartbeat, read from the FS through another host, is fresh. A host that stopped
itself (autostop: the probe's answer says so, `ablate.sweep.autostop_view`) is not waited for at
all: it is `stopped (autostop)`, never unreachable, and its connect time-out costs nothing."""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ablate.config.project import Project
from ablate.monitor import ahead
from ablate.monitor.hostinfo import HostLive, asked_of, attach_live, collect, gather, live_lines
from ablate.remote.layout import session_name
from ablate.sweep import autostop_view
from ablate.sweep.autostop_view import HostAutostop
from ablate.sweep.snapshot import Asked, Snapshot, SweepState, load, state_of
from ablate.transport import SharedFS, shared_fs
from ablate.util import timings
from ablate.util.fmt import duration

# What reads the answers (the classification, the cost model, calibration, the idle alarms, Slurm's
# job texts) is imported by `status()` while its round trips are out (`_readers`), not before them:
# a warm status spends the time of those imports waiting on its hosts anyway.
if TYPE_CHECKING:
    from ablate.monitor.calibration import Calibration
    from ablate.plan.cost import CostModel
    from ablate.sweep.alarms import HostAlarm
    from ablate.sweep.cells import Cell
    from ablate.sweep.classify import CellState


def _readers() -> None:
    """Import what reads a status's answers (see above): once, then a dictionary lookup."""
    import ablate.monitor.calibration
    import ablate.monitor.slurm_pending
    import ablate.plan.cost
    import ablate.sweep.alarms
    import ablate.sweep.classify  # noqa: F401


@dataclass
class QueueRow:
    queue: str
    host: str | None
    slot: int | None
    state: str  # not_launched | running | stale | drained | stopped
    index: int  # cells of this queue that have an outcome
    total: int
    current: str | None
    elapsed: float | None
    heartbeat_age: float | None
    done: int  # trained with exit 0 here
    failed: int  # trained with a non-zero exit here
    synced: int  # cells of this queue with a durable copy on the FS (not yet loaded)
    live: bool | None  # tmux session present (None: host not reachable)
    cells: list[str] = field(default_factory=list)
    eta: float | None = None  # seconds until it drains (running queues, learned model); 0 drained
    progress: dict[str, Any] | None = None  # live: epoch/metric from the current cell's log tail
    # its services (ablate.yaml services:), from its heartbeat: name -> {state, port, gpus, pid, starts}
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    priorities: dict[str, int] = field(default_factory=dict)  # its cells' non-zero priorities
    job: dict[str, str] | None = None  # a Slurm queue's job as squeue shows it (id, state, reason, nodes)
    # not live: its last job as sacct has it (id, state, nodes, exit), where the cluster keeps accounting
    last_job: dict[str, str] | None = None
    # cells this queue stopped because their claim was another run's when it came back (paused,
    # cut off): {cell, how, by, away, t} each (ablate/remote/queue/fence.py); not failures
    superseded: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class StatusReport:
    sweep: str
    roster: int
    synced: int
    verified: int | None  # from the last reconcile, when it still matches the roster
    rows: list[QueueRow]
    unreachable: dict[str, str]
    via: str | None = None  # the host the shared FS was read through (ssh), None when local
    model: CostModel | None = None  # what the ETAs come from
    cells: dict[str, CellState] = field(default_factory=dict)  # every roster cell's state (classify)
    idle: list[HostAlarm] = field(default_factory=list)  # hosts idle and costing money, or approved
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)  # live: GPUs per host (hostinfo)
    warnings: list[str] = field(default_factory=list)  # malformed files seen on the shared FS
    # host -> how its own files were read: through itself, or through the FS host and up to how old
    views: dict[str, dict[str, Any]] = field(default_factory=dict)
    lag: dict[str, Any] = field(default_factory=dict)  # the FS's visibility lag the rules allow for
    calibrate: Calibration | None = None  # `calibrate:`: what each queue measured, and its cost
    # the last reconcile's verified cells by the weakest check of their checkpoint files
    verified_by: dict[str, int] = field(default_factory=dict)
    autostop: dict[str, HostAutostop] = field(default_factory=dict)  # hosts with autostop on or a record
    resume: dict[str, Any] = field(default_factory=dict)  # what cut cells resume from (sweep/resume_view)
    attempts: dict[str, Any] = field(default_factory=dict)  # cells run more than once (sweep/runs)

    @property
    def eta(self) -> float | None:
        """The sweep's: its slowest queue's."""
        etas = [r.eta for r in self.rows if r.eta is not None]
        return max(etas) if etas and self.model is not None and self.model.learned else None

    def to_json(self) -> dict[str, Any]:
        from ablate.sweep.classify import state_counts

        return {
            "sweep": self.sweep, "roster": self.roster, "synced": self.synced,
            "verified": self.verified, "unreachable": self.unreachable, "via": self.via,
            "queues": [asdict(r) for r in self.rows], "eta": self.eta,
            "model": self.model.to_json() if self.model else {"source": "declared", "cells": 0},
            "states": state_counts(self.cells.values()),
            "cells": {n: c.to_json() for n, c in self.cells.items()},
            "idle_hosts": [i.to_json() for i in self.idle], "hosts": self.hosts, "warnings": self.warnings,
            "views": self.views, "fs_lag": self.lag,
            "calibrate": self.calibrate.to_json() if self.calibrate else None,
            "verified_by": self.verified_by,
            "autostop": {h: a.to_json() for h, a in self.autostop.items()},
            "resume": self.resume, "attempts": self.attempts,
        }

    def lines(self) -> list[str]:
        from ablate.monitor.slurm_pending import job_text
        from ablate.plan.cost import eta_line
        from ablate.sweep.classify import counts_text, state_lines, warning_lines

        out = [f"{'QUEUE':<16} {'HOST':<12} {'STATE':<12} {'K/N':>7} {'CURRENT':<22} "
               f"{'ELAPSED':>8} {'HB AGE':>7} {'DONE':>5} {'FAIL':>5} {'SYNCED':>6} {'ETA':>8}"]
        for r in self.rows:
            out.append(
                f"{r.queue:<16} {(r.host or '-'):<12} {r.state:<12} {f'{r.index}/{r.total}':>7} "
                f"{(r.current or '-'):<22} {duration(r.elapsed):>8} {duration(r.heartbeat_age):>7} "
                f"{r.done:>5} {r.failed:>5} {r.synced:>6} {duration(r.eta):>8}"
            )
        out += [f"  services of {r.queue}: {services_text(r.services)}" for r in self.rows if r.services]
        out += [f"  job of {r.queue}: {job_text(r.job)}" for r in self.rows if r.job]
        out += [f"  {r.queue} {r.job['stuck']}" for r in self.rows if r.job and r.job.get("stuck")]
        out += [f"  last job of {r.queue} (sacct): {job_text(r.last_job)}" for r in self.rows if r.last_job]
        out += [f"  {r.queue} by priority: {priority_text(r.priorities, r.cells)}" for r in self.rows
                if r.priorities]
        out += [f"  {r.queue} on {r.host} came back: {superseded_text(s)}"
                for r in self.rows for s in r.superseded]
        out += self.calibrate.lines() if self.calibrate else []
        verified = "not reconciled" if self.verified is None else f"{self.verified} verified by load"
        if self.verified is not None and self.verified_by:  # a record that says how (older ones: by load)
            verified = f"{self.verified} verified (checkpoint: {counts_text(self.verified_by, 'cells')})"
        out.append(f"sweep {self.sweep}: {self.synced}/{self.roster} cells synced to the shared FS, "
                   f"{verified}")
        if self.model is not None:
            out.append(eta_line(self.model, self.eta))
        for host, why in self.unreachable.items():
            alive = [r.queue for r in self.rows if r.host == host and r.state == "running"]
            note = (f"; its queue(s) {', '.join(alive)} alive (fresh heartbeat read through "
                    f"{self.via or 'the shared FS'})" if alive else "")
            out.append(f"host {host} unreachable: {why}{note}")
        out += [a.line() for a in self.autostop.values()]
        out += [f"view of {h}: {v['why']}" for h, v in self.views.items() if v.get("unsettled")]
        from ablate.sweep import resume_view
        from ablate.sweep.runs import attempts_lines

        return (out + state_lines(self.cells, self.idle) + resume_view.lines(self.resume, self.cells)
                + attempts_lines(self.attempts) + live_lines(self) + warning_lines(self.warnings))



def priority_text(priorities: dict[str, int], cells: list[str]) -> str:
    """`2: c1 c4, 0: 5 cells` (highest first; a level's names when it has at most 3)."""
    levels: dict[int, list[str]] = {}
    for c in cells:
        levels.setdefault(priorities.get(c, 0), []).append(c)
    return ", ".join(f"{p}: {' '.join(ns)}" if len(ns) <= 3 else f"{p}: {len(ns)} cells"
                     for p, ns in sorted(levels.items(), reverse=True))


def superseded_text(s: dict[str, Any]) -> str:
    """One cell a revived queue stopped: why, and how long the queue was away."""
    away = f" while the queue was away ({duration(s['away'])})" if s.get("away") else ""
    why = {"taken": f"was taken over by {s.get('by')}{away}",
           "released": f"had its claim released by `ablate remediate`{away}",
           "gone": "had lost its claim (no owner, no release record)"}.get(str(s.get("how")),
                                                                           "was another run's")
    return (f"{s.get('cell')} {why}: stopped, superseded, not published (not a failure: the cell "
            "is run elsewhere)")


def services_text(services: dict[str, dict[str, Any]]) -> str:
    """`vllm ready :8000 gpu 1, reward starting :8016 (started 2x)`."""
    out = []
    for name, s in services.items():
        gpus = f" gpu {s['gpus']}" if s.get("gpus") else ""
        again = f" (started {s['starts']}x)" if isinstance(s.get("starts"), int) and s["starts"] > 1 else ""
        out.append(f"{name} {s.get('state', '?')} :{s.get('port', '?')}{gpus}{again}")
    return ", ".join(out)


def status(project: Project, live_info: bool = False, sent: ahead.Started | None = None) -> StatusReport:
    """`live_info`: also each host's GPUs and the running cells' log progress (one more command per host,
    hosts in parallel; `ablate.monitor.hostinfo`). `sent`: its round trips, sent already
    (`ahead.start`, for a live status), else sent now."""
    fs = shared_fs(project)
    # The FS probe and one command per host (its tmux sessions and, live_info, its GPUs and log
    # tails), all at once: the slowest host, not the sum, sets the wall time.
    with ThreadPoolExecutor(max_workers=1) as pool:
        loading = pool.submit(_load, project, fs, live_info, sent)
        _readers()
        state, host_data, gone = loading.result()
    from ablate.monitor.calibration import calibration
    from ablate.monitor.slurm_pending import stuck
    from ablate.plan.cost import learn
    from ablate.sweep.alarms import host_alarms
    from ablate.sweep.classify import classify_state

    got = classify_state(project, state)
    snap = state.snap
    known = {ln.cell.name: ln.cell for q in state.queues.values() for ln in q.cells if ln.cell is not None}
    model = learn(project, snap, known)
    rows = []
    roster: set[str] = set()
    for qname in sorted(state.queues):
        q = state.queues[qname]
        view = state.queue(qname)
        names = [ln.cell.name for ln in q.cells if ln.cell is not None]
        roster.update(names)
        host = view.host
        events = snap.events.get(f"{host}.{qname}", ()) if host else ()
        outcome = {e.cell: e for e in events if e.ev in ("end", "skip")}
        done = sum(1 for e in outcome.values() if e.ev == "end" and e.rc == 0)
        failed = sum(1 for e in outcome.values() if e.ev == "end" and e.rc != 0 and e.reason != "superseded")
        hb = view.heartbeat
        current = hb.cell if hb is not None and view.state in ("running", "stale") else None
        started = hb.cell_started if hb is not None else None
        elapsed = (state.now - started) if current and started else None
        eta = _eta(model, host, view.slot, qname, view.state, names, outcome, snap, known, current, elapsed)
        reachable = state.reachable(host) if host else True
        rows.append(QueueRow(
            queue=qname, host=host, slot=view.slot, state=view.state,
            index=min(len(names), sum(1 for n in names if n in outcome)), total=len(names),
            current=current, elapsed=elapsed, heartbeat_age=view.heartbeat_age, done=done, failed=failed,
            synced=sum(1 for n in names if n in snap.results), live=view.live if reachable else None,
            cells=names, eta=eta, services=dict(hb.services) if hb is not None else {},
            priorities={ln.cell.name: ln.cell.priority for ln in q.cells if ln.cell and ln.cell.priority},
            superseded=[{"cell": e.cell, "how": e.how, "by": e.by, "away": e.away, "t": e.t} for e in events
                        if e.ev == "end" and e.reason == "superseded"],
        ))
    for row in rows:
        h = project.hosts.get(row.host or "")
        if h is not None and h.transport == "slurm":
            session = session_name(project.sweep, h.name, row.queue)
            job = state.jobs(h.name).get(session)
            fix = job and stuck(job.get("state"), job.get("reason"), job=job.get("id", "?"),
                                queue=row.queue, host=h.name)
            row.job = {**job, "stuck": fix} if job and fix else job
            row.last_job = None if row.job else state.ended_jobs(h.name).get(session)
    autostop = {h: a for h, a in autostop_view.of_snapshot(snap).items() if a.on or a.record is not None}
    autostop.update(_slurm_ends(project, rows, snap.now))
    from ablate.sweep import resume_view
    from ablate.sweep.runs import attempts_by_cell, runs_of

    report = StatusReport(
        sweep=project.sweep, roster=len(roster), synced=len(roster & set(snap.results)),
        verified=_last_verified(snap.reconcile, roster), verified_by=_verified_by(snap.reconcile, roster),
        rows=rows, unreachable=state.unreachable, via=getattr(fs, "via", None), model=model,
        cells=got.cells, idle=host_alarms(state, list(project.hosts), project.monitor.idle_after),
        warnings=list(state.warnings), views=_views(state),
        lag={"seconds": state.lag.seconds, "measured": state.lag.measured, "note": state.lag.note},
        calibrate=calibration(snap.events), autostop=autostop,
        resume=resume_view.resume_from(snap.extra.get("resume") or {}, got.cells, snap.now),
        attempts=attempts_by_cell(runs_of(snap.events, snap.heartbeats, {}, {}, snap.now)[1]),
    )
    if host_data is not None:
        attach_live(project, report, host_data)
    for host in gone:
        if host in report.hosts:
            report.hosts[host] = {**report.hosts[host], "error": STOPPED}
    return report


def _slurm_ends(project: Project, rows: list[QueueRow], now: float) -> dict[str, HostAutostop]:
    """A Slurm host needs no autostop: each queue's job ends when its queue drains."""
    out = {}
    for host in sorted({r.host for r in rows if r.host and project.hosts.get(r.host)
                        and project.hosts[r.host].transport == "slurm"}):
        live = [r.queue for r in rows if r.host == host and (r.job or r.state == "running")]
        why = (f"Slurm: each queue's job ends when its queue drains ({len(live)} still hold an allocation)"
               if live else "Slurm: its queues' jobs have ended with them: no allocation is held")
        out[host] = HostAutostop(host, now, False, autostop_view.Record("job_ends", why))
    return out


STOPPED = "stopped (autostop)"  # a host that stopped itself, where its answer would be


def _load(project: Project, fs: SharedFS, live_info: bool, sent: ahead.Started | None = None
          ) -> tuple[SweepState, dict[str, HostLive | Exception] | None, set[str]]:
    """The sweep's state, each host's answers (live_info) and the hosts that stopped themselves
    and were not waited for. Every host is asked while the FS is probed; once the probe says a host
    stopped itself, its answer is not awaited (`hostinfo.collect`)."""
    if project.sweep_store() is not None:
        # The hosts first, then the store (`snapshot.load` says why); the store's snapshot carries
        # no autostop records.
        host_data: dict[str, HostLive | Exception] | None = None

        def ask() -> Asked:
            nonlocal host_data
            host_data = gather(project)
            return asked_of(project, host_data)

        return load(project, fs, ask=ask if live_info else None), host_data, set()
    started = sent or ahead.begin(project, fs, live_info)
    raw = started.snapshot()
    stopped = autostop_view.stopped_hosts(raw) & set(project.hosts)
    got = collect(started.asking, skip=stopped)
    gone = stopped - set(got)
    asked = asked_of(project, got)
    for host in gone:
        asked.unreachable.pop(host, None)  # gone on purpose, not unreachable
    return state_of(project, raw, asked), got if live_info else None, gone


def _eta(model: CostModel, host: str | None, slot: int | None, queue: str, state: str, names: list[str],
         outcome: Mapping[Any, Any], snap: Snapshot, known: Mapping[str, Cell], current: str | None,
         elapsed: float | None) -> float | None:
    """Remaining seconds of a running queue: its cells with no outcome here, no durable result and
    no claim by another queue (a stolen cell counts for its thief), plus the current cell's
    expected remainder. 0 once drained; None when it is not moving or nothing is learned yet."""
    from ablate.plan.cost import queue_eta

    if not model.learned or host is None:
        return None
    if state == "drained":
        return 0.0
    if state not in ("running", "stale"):
        return None
    cur = known.get(current) if current is not None else None

    def ours(name: str) -> bool:
        claim = snap.claims.get(name)
        return claim is None or claim.host is None or (claim.host, claim.queue) == (host, queue)

    left = [known[n] for n in names
            if n in known and n not in outcome and n not in snap.results and n != current and ours(n)]
    return queue_eta(model, host, left, cur, elapsed, slot)


def _views(state: SweepState) -> dict[str, dict[str, Any]]:
    """Per host: its files read through itself (`max_age` 0), or through the FS host (up to the lag
    old; `unsettled` while what it may have written since could still be invisible), or from the
    object store the sweep is kept in ("store": no lag)."""
    unsettled = state.unsettled()
    store = state.lag.store
    out: dict[str, dict[str, Any]] = {}
    for host in state.sessions:
        mine = host in state.confirmed
        why = unsettled.get(host) or ("read from the object store, strongly consistent" if store else
                                      "read through itself" if mine else
                                      "read through the FS host; nothing new from it within the lag")
        through = "store" if store else host if mine else "fs"
        out[host] = {"through": through, "max_age": state.allowance(host), "unsettled": host in unsettled,
                     "why": why}
    return out


def _last_verified(rec: Mapping[str, Any] | None, roster: set[str]) -> int | None:
    if rec is None:
        return None
    cells = rec.get("cells")
    return sum(1 for n in cells if n in roster) if isinstance(cells, dict) else 0


def _verified_by(rec: Mapping[str, Any] | None, roster: set[str]) -> dict[str, int]:
    """{check: cells} of the record's roster cells; {} for an older record (no `verified_by`)."""
    from ablate.sweep.classify import check_counts

    cells = (rec or {}).get("cells")
    if not isinstance(cells, dict):
        return {}
    return check_counts(c["verified_by"] for n, c in cells.items()
                        if n in roster and isinstance(c, dict) and isinstance(c.get("verified_by"), str))


def watch(project: Project, interval: float) -> None:
    """A live table until q or Ctrl-C; the terminal is left clean. A Slurm host is asked at most
    every `slurm.poll` seconds (its adapter answers from its last answer in between), an object
    store every `storefs.POLL` seconds; the FS and the other hosts every `interval`."""
    from ablate.monitor.watch import run_watch
    from ablate.transport import storefs
    from ablate.transport.slurm import polite_polling

    def fetch() -> StatusReport:
        start = time.time()
        report = status(project, live_info=True)
        timings.span("refresh", start)
        return report

    with polite_polling(), storefs.polite_polling():
        run_watch(fetch, interval)
