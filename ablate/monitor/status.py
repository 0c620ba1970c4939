"""`ablate status`: per queue, where it is, what it runs, how fresh its heartbeat is, and what it
has produced — rebuilt from the shared FS (one probe) and each host's tmux (one query per host, all
hosts in parallel and alongside the probe, so a dead host costs one connect time-out in all).

A host that cannot be reached is not a lost instance on that one signal: its queue counts as
`running` while its heartbeat, read from the FS through another host, is fresh."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from ablate.config.project import Project
from ablate.monitor.hostinfo import attach_live, gather, live_lines
from ablate.plan.cost import CostModel, eta_line, fmt_eta, learn, queue_eta
from ablate.remote.layout import session_name
from ablate.sweep.cells import Cell, QueueFile, parse_queue_text, read_all_queues
from ablate.sweep.classify import CellState, IdleHost, for_status, state_counts, state_lines
from ablate.transport import fan_out, host_transport, shared_fs
from ablate.util.fs import read_json_object


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
    idle: list[IdleHost] = field(default_factory=list)  # hosts idle and costing money
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)  # live: GPUs per host (hostinfo)

    @property
    def eta(self) -> float | None:
        """The sweep's: its slowest queue's."""
        etas = [r.eta for r in self.rows if r.eta is not None]
        return max(etas) if etas and self.model is not None and self.model.learned else None

    def to_json(self) -> dict[str, Any]:
        return {
            "sweep": self.sweep, "roster": self.roster, "synced": self.synced,
            "verified": self.verified, "unreachable": self.unreachable, "via": self.via,
            "queues": [asdict(r) for r in self.rows], "eta": self.eta,
            "model": self.model.to_json() if self.model else {"source": "declared", "cells": 0},
            "states": state_counts(self.cells.values()),
            "cells": {n: c.to_json() for n, c in self.cells.items()},
            "idle_hosts": [i.to_json() for i in self.idle], "hosts": self.hosts,
        }

    def lines(self) -> list[str]:
        out = [f"{'QUEUE':<16} {'HOST':<12} {'STATE':<12} {'K/N':>7} {'CURRENT':<22} "
               f"{'ELAPSED':>8} {'HB AGE':>7} {'DONE':>5} {'FAIL':>5} {'SYNCED':>6} {'ETA':>8}"]
        for r in self.rows:
            out.append(
                f"{r.queue:<16} {(r.host or '-'):<12} {r.state:<12} {f'{r.index}/{r.total}':>7} "
                f"{(r.current or '-'):<22} {_dur(r.elapsed):>8} {_dur(r.heartbeat_age):>7} "
                f"{r.done:>5} {r.failed:>5} {r.synced:>6} {fmt_eta(r.eta):>8}"
            )
        verified = "not reconciled" if self.verified is None else f"{self.verified} verified by load"
        out.append(f"sweep {self.sweep}: {self.synced}/{self.roster} cells synced to the shared FS, "
                   f"{verified}")
        if self.model is not None:
            out.append(eta_line(self.model, self.eta))
        for host, why in self.unreachable.items():
            alive = [r.queue for r in self.rows if r.host == host and r.state == "running"]
            note = (f"; its queue(s) {', '.join(alive)} alive (fresh heartbeat read through "
                    f"{self.via or 'the shared FS'})" if alive else "")
            out.append(f"host {host} unreachable: {why}{note}")
        return out + state_lines(self.cells, self.idle) + live_lines(self)


def _dur(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def status(project: Project, live_info: bool = False) -> StatusReport:
    """`live_info`: also each host's GPUs and the running cells' log progress (one more command per host,
    hosts in parallel; `ablate.monitor.hostinfo`)."""
    layout = project.layout()
    fs = shared_fs(project)

    def ask_tmux(name: str) -> set[str]:
        return host_transport(project, project.hosts[name]).tmux_sessions()

    # The hosts' tmux and the FS probe at once: the slowest host, not the sum, sets the wall time.
    with ThreadPoolExecutor(max_workers=2) as pool:
        asked = pool.submit(fan_out, list(project.hosts), ask_tmux)
        gathered = pool.submit(gather, project) if live_info else None  # GPUs, running logs' tails
        snap: Mapping[str, Any] = fs.probe("snapshot", {"root": layout.root})
        answers = asked.result()
        host_data = gathered.result() if gathered is not None else None
    now = float(snap["now"])
    local = {q.name: q for q in read_all_queues(project)}
    fs_queues = {name: parse_queue_text(name, text, project.tasks, project.queues_dir / f"{name}.txt")
                 for name, text in snap.get("queues", {}).items() if name not in local}
    queues: dict[str, QueueFile] = {**fs_queues, **local}
    final = set(snap["final"])
    known = {ln.cell.name: ln.cell for q in queues.values() for ln in q.cells if ln.cell is not None}
    model = learn(project, snap, known)

    sessions: dict[str, set[str] | None] = {}
    unreachable: dict[str, str] = {}
    for name in project.hosts:
        got = answers[name]
        if isinstance(got, Exception):  # one host failing never hides the others
            sessions[name] = None
            unreachable[name] = str(got).splitlines()[0] if str(got) else type(got).__name__
        else:
            sessions[name] = got

    stale_after = max(3 * project.heartbeat_secs, 30)
    rows = []
    roster: set[str] = set()
    for qname in sorted(queues):
        q = queues[qname]
        names = [ln.cell.name for ln in q.cells if ln.cell is not None]
        roster.update(names)
        ledger = snap["ledgers"].get(qname) or []
        host: str | None = ledger[-1].get("host") if ledger else q.host
        slot = ledger[-1].get("slot") if ledger else q.slot
        events = snap["events"].get(f"{host}.{qname}", []) if host else []
        hb = snap["heartbeats"].get(f"{host}.{qname}") if host else None
        hb_data = (hb or {}).get("data") or {}
        outcome = {e.get("cell"): e for e in events if e.get("ev") in ("end", "skip")}
        done = sum(1 for e in outcome.values() if e.get("ev") == "end" and e.get("rc") == 0)
        failed = sum(1 for e in outcome.values() if e.get("ev") == "end" and e.get("rc") != 0)
        host_sessions = sessions.get(host) if host else set()
        session = session_name(project.sweep, host or "", qname)
        live = None if host_sessions is None else session in host_sessions
        age = now - float(hb["mtime"]) if hb else None
        if not ledger:
            state = "not_launched"
        elif live or (live is None and age is not None and age < stale_after):
            state = "stale" if age is not None and age > stale_after else "running"
        elif hb_data.get("state") == "drained":
            state = "drained"
        else:
            state = "stopped"
        current = hb_data.get("cell") if state in ("running", "stale") else None
        started = hb_data.get("cell_started")
        elapsed = (now - float(started)) if current and started else None
        eta = _eta(model, host, qname, state, names, outcome, final, snap.get("claims") or {}, known,
                   current, elapsed)
        rows.append(QueueRow(
            queue=qname, host=host, slot=slot, state=state,
            index=min(len(names), sum(1 for n in names if n in outcome)), total=len(names),
            current=current,
            elapsed=elapsed,
            heartbeat_age=age, done=done, failed=failed,
            synced=sum(1 for n in names if n in final), live=live, cells=names, eta=eta,
        ))
    record = fs.read_bytes(layout.reconcile_record)
    cells, idle = for_status(project, queues, snap, sessions, record)
    report = StatusReport(
        sweep=project.sweep, roster=len(roster), synced=len(roster & final),
        verified=_last_verified(record, roster),
        rows=rows, unreachable=unreachable, via=getattr(fs, "via", None), model=model,
        cells=cells, idle=idle,
    )
    if host_data is not None:
        attach_live(project, report, host_data)
    return report


def _eta(model: CostModel, host: str | None, queue: str, state: str, names: list[str],
         outcome: Mapping[Any, Any], final: set[str], claims: Mapping[str, str],
         known: Mapping[str, Cell], current: Any, elapsed: float | None) -> float | None:
    """Remaining seconds of a running queue: its cells with no outcome here, no durable result and
    no claim by another queue (a stolen cell counts for its thief), plus the current cell's
    expected remainder. 0 once drained; None when it is not moving or nothing is learned yet."""
    if not model.learned or host is None:
        return None
    if state == "drained":
        return 0.0
    if state not in ("running", "stale"):
        return None
    cur = known.get(current) if isinstance(current, str) else None

    def ours(name: str) -> bool:
        owner = (claims.get(name) or "").split()
        return not owner or owner[:2] == [host, queue]

    left = [known[n] for n in names
            if n in known and n not in outcome and n not in final and n != current and ours(n)]
    return queue_eta(model, host, left, cur, elapsed)


def _last_verified(raw: bytes | None, roster: set[str]) -> int | None:
    rec = read_json_object(raw)
    if rec is None:
        return None
    cells = rec.get("cells") or {}
    return sum(1 for n in cells if n in roster)


def watch(project: Project, interval: float) -> None:
    """A live table until q or Ctrl-C; the terminal is left clean."""
    from ablate.monitor.watch import run_watch

    run_watch(lambda: status(project, live_info=True), interval)
