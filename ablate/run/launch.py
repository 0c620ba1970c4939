"""`ablate launch` and `launch --all`: one detached tmux session per queue per host.

A launch validates everything first (roster, host, slot, start index, the launched prefix of the
queue file, no live copy) and changes nothing when it refuses. Then it deploys (idempotent), writes
the FS copy of the queue, appends a ledger entry (`ablate.sweep.ledger`) and starts `run_queue` in
tmux.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ablate.config.project import Host, Project
from ablate.errors import AblateError, CheckFailed
from ablate.plan.cost import refresh_estimates
from ablate.remote.layout import SweepLayout, session_name
from ablate.run.deploy import DeployResult, deploy
from ablate.sweep.cells import QueueFile, check_queue_name, load_roster, read_queue
from ablate.sweep.ledger import LedgerEntry, check_prefix, entry_line, new_entry, parse_ledger
from ablate.sweep.lock import controller_lock
from ablate.sweep.snapshot import Snapshot, probe_only
from ablate.transport import HostTransport, SharedFS, fan_out, host_transport, shared_fs
from ablate.util.fmt import Log
from ablate.util.progress import steps


@dataclass(frozen=True)
class LaunchResult:
    queue: str
    host: str
    status: str  # launched | running (already live; launch --all) | failed (launch --all)
    session: str
    slot: int | None = None
    start_index: int | None = None
    total_lines: int = 0
    cells: int = 0  # cell lines from start_index on
    resumed: bool = False  # a relaunch whose start index was chosen as the first unfinished cell
    version: str | None = None
    spec: str | None = None
    run_queue: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"queue": self.queue, "host": self.host, "status": self.status, "session": self.session,
                "slot": self.slot, "start_index": self.start_index, "lines": self.total_lines,
                "cells": self.cells, "resumed": self.resumed, "version": self.version, "spec": self.spec,
                "run_queue": self.run_queue, "error": self.error}

    def lines(self) -> list[str]:
        if self.status == "running":
            return [f"{self.queue}: already running on {self.host} (tmux {self.session}); not relaunched"]
        if self.status == "failed":
            return [f"{self.queue}: not launched on {self.host}: {self.error}"]
        slot = f" slot {self.slot}" if self.slot is not None else ""
        how = "resumed" if self.resumed else "launched"
        return [f"{how} {self.queue} on {self.host}{slot} at line {self.start_index}: {self.cells} cell(s) "
                f"to go, tmux {self.session}, wrappers {self.version}"]


# --------------------------------------------------------------------------- launch


def is_live(project: Project, host: Host, queue: str, transport: HostTransport | None = None) -> bool:
    ht = transport or host_transport(project, host)
    return session_name(project.sweep, host.name, queue) in ht.tmux_sessions()


def _slot(h: Host, qf: QueueFile, slot: int | None) -> int | None:
    if slot is None and qf.host == h.name:
        slot = qf.slot
    if slot is not None and (not h.gpus or slot not in h.gpus):
        have = ", ".join(map(str, h.gpus)) if h.gpus else "none (no `gpus:` for it in ablate.yaml)"
        raise AblateError(f"slot {slot} is not a GPU slot of host {h.name} (slots: {have}); "
                          "pass --slot with one of them, or fix `gpus:` in ablate.yaml")
    return slot


def _resume_index(snap: Snapshot, qf: QueueFile) -> int:
    """The first cell line without a durable result (an interrupted cell re-enters via its claim)."""
    for ln in qf.cells:
        if ln.cell is not None and ln.cell.name not in snap.results:
            return ln.index
    return len(qf.lines)


def _check_args(project: Project, queue: str, host: str, start_index: int | None,
                slot: int | None) -> tuple[Host, QueueFile, int | None]:
    """The checks on the user's input alone (no FS, no host): made before the lock is taken too."""
    h = project.host(host)
    qf = read_queue(project, check_queue_name(queue))
    rel = f"queues/{queue}.txt"
    if qf.host and qf.host != host:
        raise AblateError(f"{rel} is planned for host {qf.host} (its `# ablate: host=` header); "
                          f"launch it with --host {qf.host}, or change the header")
    slot = _slot(h, qf, slot)
    n = len(qf.lines)
    if start_index is not None and not 0 <= start_index < n:
        raise AblateError(f"--start-index {start_index} is out of range: {rel} has {n} lines "
                          f"(indices 0..{n - 1})")
    return h, qf, slot


def _launch(project: Project, queue: str, host: str, start_index: int | None, slot: int | None,
            log: Log | None, *, dep: DeployResult | None, report_live: bool) -> LaunchResult:
    h, qf, slot = _check_args(project, queue, host, start_index, slot)
    session = session_name(project.sweep, host, queue)
    n = len(qf.lines)

    ht = host_transport(project, h)
    fs = shared_fs(project)
    layout = SweepLayout(fs.root)
    ledger = parse_ledger(fs.read_bytes(layout.ledger(queue)))
    live_on = [host] if is_live(project, h, queue, ht) else []
    last_host = ledger[-1].host if ledger else None
    if not live_on and isinstance(last_host, str) and last_host != host and last_host in project.hosts:
        try:
            if is_live(project, project.hosts[last_host], queue):
                live_on = [last_host]
        except AblateError as e:  # the previous host is gone: moving the queue is the point
            if log:
                log(f"{queue}: cannot ask {last_host} whether it still runs it ({e.message}); going on")
    if live_on:
        if report_live:
            return LaunchResult(queue, live_on[0], "running", session_name(project.sweep, live_on[0], queue))
        raise AblateError(f"{queue} is already running on {live_on[0]}; "
                          f"`ablate stop {queue} --host {live_on[0]}` first")
    check_prefix(qf, ledger, fs.read_bytes(layout.queue_file(queue)))
    resumed = False
    snap: Snapshot | None = None  # read once: the resume index, then the estimates
    if start_index is None:
        if ledger:
            snap = probe_only(project, fs)
        start_index = _resume_index(snap, qf) if snap is not None else 0
        resumed = bool(ledger)
    # Rule 5 and code drift: refused with the numbers (exit 1) before anything changes.
    problem = _host_refusal(project, host, queue, fs, ht)
    if problem:
        raise CheckFailed(problem)

    # Everything is checked: from here on, things change.
    dep = dep or deploy(project, log)
    hl = project.layout(h)
    fs.write_atomic(layout.queue_file(queue), qf.normalized_text().encode())
    cleared = fs.remove(layout.stop_request(host, queue))
    fs.append_line(layout.ledger(queue), entry_line(new_entry(qf, host, slot, start_index, dep.specs[host],
                                                              dep.run_queue, "launch", cleared)))
    refresh_estimates(project, fs, snap, log)  # what drained runners steal by, before this one runs
    argv = ["bash", dep.run_queue_path(hl), dep.spec_path(hl, host), queue, str(start_index)]
    if slot is not None:
        argv.append(str(slot))
    ht.tmux_start(session, argv, {})
    cells = sum(1 for ln in qf.cells if ln.index >= start_index)
    if log:
        log(f"{host}: tmux {session} runs {queue} from line {start_index} ({cells} cell(s))")
    return LaunchResult(queue, host, "launched", session, slot, start_index, n, cells, resumed,
                        dep.version, dep.specs[host], dep.run_queue)


def launch(project: Project, queue: str, host: str, start_index: int | None = None,
           slot: int | None = None, log: Log | None = None) -> LaunchResult:
    load_roster(project)  # a name collision anywhere refuses before anything runs
    _check_args(project, queue, host, start_index, slot)
    with controller_lock(project, f"launch {queue} --host {host}", log=log):
        return _launch(project, queue, host, start_index, slot, log, dep=None, report_live=False)


def launch_all(project: Project, log: Log | None = None) -> list[LaunchResult]:
    """Every queue whose `# ablate: host=H` header names a host, on all hosts at once.

    The shared-FS work stays serial and batched: deploy, one snapshot for every ledger, launched
    queue copy and result, then the queue copies and ledger entries. The per-host work (is the
    queue live there? start its tmux session) runs on every host in parallel, one connection each,
    so a dead host costs one connect time-out, not one per queue. Live queues are reported, not
    relaunched; a queue or host that fails is reported (`failed`, with the error) and the others
    still go."""
    load_roster(project)  # a name collision refuses before the lock (and its file) is taken
    with controller_lock(project, "launch --all", log=log):
        return _launch_all(project, log)


def _launch_all(project: Project, log: Log | None) -> list[LaunchResult]:
    roster = load_roster(project)
    planned = [q for q in roster.queues if q.host]
    if not planned:
        raise AblateError("no queue file has a `# ablate: host=H` header; run `ablate plan`, "
                          "or launch one with `ablate launch QUEUE --host H`")
    for q in roster.queues:
        if not q.host and log:
            log(f"{q.name}: no `# ablate: host=` header; skipped (launch it with --host)")
    dep = deploy(project, log)
    fs = shared_fs(project)
    layout = SweepLayout(fs.root)
    snap = probe_only(project, fs)
    ledgers = {q.name: snap.ledgers.get(q.name, ()) for q in planned}
    asked: set[str] = {q.host for q in planned if q.host and q.host in project.hosts}
    asked |= {str(lg[-1].host) for lg in ledgers.values() if lg and lg[-1].host in project.hosts}
    sessions: Mapping[str, set[str] | Exception] = fan_out(sorted(asked),
                       lambda name: host_transport(project, project.hosts[name]).tmux_sessions())

    results: dict[str, LaunchResult] = {}
    ready: list[_Ready] = []
    for q in planned:
        assert q.host is not None
        try:
            got = _prepare(project, q, q.host, ledgers[q.name], snap, sessions, log)
        except AblateError as e:
            got = _failed(project, q.name, q.host, e.message)
        if isinstance(got, LaunchResult):
            results[q.name] = got
        else:
            ready.append(got)

    # Rule 5 and code drift, per host in parallel, before anything is written (as `launch` does).
    by_host_ready: dict[str, list[_Ready]] = {}
    for r in ready:
        by_host_ready.setdefault(r.host, []).append(r)
    checked = fan_out(sorted(by_host_ready),
                      lambda host: _host_refusal(project, host, by_host_ready[host][0].qf.name, fs))
    refused = {host: (_message(v) if isinstance(v, Exception) else v) for host, v in checked.items()
               if isinstance(v, Exception) or v}
    for r in [r for r in ready if r.host in refused]:
        results[r.qf.name] = _failed(project, r.qf.name, r.host, str(refused[r.host]))
    ready = [r for r in ready if r.host not in refused]

    # Everything is checked: from here on, things change. The FS first: each queue's copy, then its
    # ledger entry (queues write disjoint files, so a few at once; sshd allows ~10 per connection).
    def record(r: _Ready) -> None:
        fs.write_atomic(layout.queue_file(r.qf.name), r.qf.normalized_text().encode())
        cleared = fs.remove(layout.stop_request(r.host, r.qf.name))
        fs.append_line(layout.ledger(r.qf.name), entry_line(new_entry(
            r.qf, r.host, r.slot, r.start_index, dep.specs[r.host], dep.run_queue, "launch", cleared)))

    recorded = fan_out(range(len(ready)), lambda i: record(ready[i]), max_workers=4)
    written: list[_Ready] = []
    for i, r in enumerate(ready):
        err = recorded.failed.get(i)
        if err is not None:
            results[r.qf.name] = _failed(project, r.qf.name, r.host, _message(err))
        else:
            written.append(r)

    if written:  # what drained runners steal by, from the snapshot read above: one FS write
        refresh_estimates(project, fs, snap, log)
    by_host: dict[str, list[_Ready]] = {}
    for r in written:
        by_host.setdefault(r.host, []).append(r)
    with steps(log, len(written), "launch", unit="queues") as bar:
        started = fan_out(sorted(by_host),
                          lambda host: _start_on_host(project, dep, by_host[host], bar.advance))
    for host, rs in by_host.items():
        outcome = started[host]
        for r in rs:
            err = outcome if isinstance(outcome, Exception) else outcome.get(r.qf.name)
            if err is not None:
                results[r.qf.name] = _failed(project, r.qf.name, host, _message(err))
                continue
            cells = sum(1 for ln in r.qf.cells if ln.index >= r.start_index)
            results[r.qf.name] = LaunchResult(
                r.qf.name, host, "launched", r.session, r.slot, r.start_index, len(r.qf.lines), cells,
                r.resumed, dep.version, dep.specs[host], dep.run_queue)
    return [results[q.name] for q in planned]


@dataclass(frozen=True)
class _Ready:
    """A queue of `launch --all` that passed every check and is about to start."""

    qf: QueueFile
    host: str
    session: str
    slot: int | None
    start_index: int
    resumed: bool


def _host_refusal(project: Project, host: str, queue: str, fs: SharedFS,
                  ht: HostTransport | None = None) -> str | None:
    """The disk/inode budget and the code drift, as `ablate doctor` checks them; None when fine."""
    from ablate.run.doctor import budget_check, drift_check

    h = project.host(host)
    ht = ht or host_transport(project, h)
    return budget_check(project, h, ht, queue=queue, fs=fs) or drift_check(project, h, ht)


def _message(e: BaseException) -> str:
    if isinstance(e, AblateError):
        return e.message
    return f"{type(e).__name__}: {e}"


def _failed(project: Project, queue: str, host: str, error: str) -> LaunchResult:
    return LaunchResult(queue, host, "failed", session_name(project.sweep, host, queue), error=error)


def _prepare(project: Project, qf: QueueFile, host: str, ledger: Sequence[LedgerEntry],
             snap: Snapshot, sessions: Mapping[str, set[str] | Exception],
             log: Log | None) -> _Ready | LaunchResult:
    """The checks of `_launch`, from one FS snapshot and the hosts' tmux sessions asked at once."""
    h = project.host(host)
    slot = _slot(h, qf, None)
    session = session_name(project.sweep, host, qf.name)
    mine = sessions.get(host)
    if isinstance(mine, Exception):
        raise AblateError(f"cannot reach {host}: {_message(mine)}")
    if mine is not None and session in mine:
        return LaunchResult(qf.name, host, "running", session)
    last_host = ledger[-1].host if ledger else None
    if isinstance(last_host, str) and last_host != host and last_host in project.hosts:
        theirs = sessions.get(last_host)
        if isinstance(theirs, Exception):  # the previous host is gone: moving the queue is the point
            if log:
                log(f"{qf.name}: cannot ask {last_host} whether it still runs it "
                    f"({_message(theirs)}); going on")
        elif theirs is not None and session_name(project.sweep, last_host, qf.name) in theirs:
            return LaunchResult(qf.name, last_host, "running",
                                session_name(project.sweep, last_host, qf.name))
    check_prefix(qf, ledger, snap.queue_copies.get(qf.name))
    if not ledger:
        return _Ready(qf, host, session, slot, 0, False)
    return _Ready(qf, host, session, slot, _resume_index(snap, qf), True)


def _start_on_host(project: Project, dep: DeployResult, ready: Sequence[_Ready],
                   log: Log | None) -> dict[str, Exception | None]:
    """Start this host's queues over its one connection; per queue, None or what went wrong."""
    h = project.host(ready[0].host)
    ht = host_transport(project, h)
    hl = project.layout(h)
    out: dict[str, Exception | None] = {}
    for r in ready:
        argv = ["bash", dep.run_queue_path(hl), dep.spec_path(hl, r.host), r.qf.name, str(r.start_index)]
        if r.slot is not None:
            argv.append(str(r.slot))
        try:
            ht.tmux_start(r.session, argv, {})
        except Exception as e:  # one queue failing never hides the others
            out[r.qf.name] = e
            continue
        out[r.qf.name] = None
        if log:
            cells = sum(1 for ln in r.qf.cells if ln.index >= r.start_index)
            log(f"{r.host}: tmux {r.session} runs {r.qf.name} from line {r.start_index} ({cells} cell(s))")
    return out
