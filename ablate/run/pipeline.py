"""The launch pipeline: how `launch`, `launch --all` (ablate/run/launch.py), `append`'s restart of a
drained queue and `remediate --launch` start queues. Every step reads the one `LaunchContext`
(ablate/run/context.py: the local queue files read once, the shared FS, one transport per host,
under one entry of the controller lock) and one list of `LaunchRequest`s: `launch` feeds it one
request and raises what refused it; `launch --all` feeds it every planned queue and reports each
one `launched`, `running` or `failed`, a failure never hiding the others. In order:

1. `_validate`: the user's input alone (per request the host, the queue name, the header's host,
   the slot, the start index). `launch` runs it before the controller lock too, so such a refusal
   does not even create the lock file.
2. Under the lock, `_observe`: ONE snapshot of the shared FS (every ledger, FS queue copy and
   result) and, at the same time, ONE command per requested host (`_ask`: its tmux sessions and
   what the budget and drift checks of ablate/run/refusals.py measure), hosts in parallel; then one
   tmux query per queue's last ledger host not asked yet (a queue that moves).
3. `_prepare`, per request: live on its host or on the ledger's last host → `running`; the launched
   prefix (`ledger.check_prefix`, naming the line from the FS copy); the start index (the given
   one, else on a relaunch the first cell line without a durable result, else 0).
4. `_refusals`: the disk/inode budget and the code drift, once per host, from what step 2 measured.
5. Only when something will start, `_start_all`, in two round trips to the FS: the placement
   (`placement.place_and_read`, idempotent) with the read of each queue's stop request; then
   DEPLOYED.json when it changes, every queue's FS copy, its stop request removed and its ledger
   entry (saying whether it cleared one), the estimates and each host's autostop settings
   (ablate/run/autostop_launch.py); then the tmux sessions, one command per host, hosts in
   parallel (`_argv` builds the `run_queue` command line); on a storage host that command is its
   boot program (ablate/run/store_launch.py: its files fetched from the store to the instance's
   own copy, the sessions started, credentials handed over).

Nothing changes on the FS before step 5: a refusal leaves the project and the FS as they were.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

from ablate.config.project import Host, Project
from ablate.errors import AblateError, CheckFailed, RemoteError
from ablate.plan.cost import estimates_note, estimates_op
from ablate.remote.host import session_env
from ablate.remote.layout import SweepLayout, session_name
from ablate.run.autostop_launch import autostop_note, settings_ops
from ablate.run.context import LaunchContext, LocalQueues, launch_context
from ablate.run.host_measure import Section, measure
from ablate.run.placement import DeployResult, place_and_read
from ablate.run.refusals import controller_commit, count_cells, launch_refusal, launch_sections
from ablate.run.store_launch import BootPlan, boot, boot_plan, configs_to_store, creds_note
from ablate.sweep.cells import QueueFile
from ablate.sweep.ledger import check_prefix, entry_line, new_entry
from ablate.sweep.snapshot import Snapshot, probe_only
from ablate.transport import HostTransport, fan_out, host_transport
from ablate.transport.base import AppendLine, FSOp, Remove, WriteAtomic, apply_groups
from ablate.transport.fanout import gather, start_each
from ablate.transport.shellhost import LIST_SESSIONS, NO_TMUX_SERVER
from ablate.transport.slurm import SlurmHost
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


@dataclass(frozen=True)
class LaunchRequest:
    queue: str
    host: str
    start_index: int | None = None  # None: 0 on a first launch, the first unfinished cell after
    slot: int | None = None  # None: the header's `slot=`, if any


@dataclass(frozen=True)
class _Checked:
    """A request whose input holds: its queue file read, its slot resolved."""

    qf: QueueFile
    host: str
    slot: int | None
    start_index: int | None


@dataclass(frozen=True)
class _Ready:
    """A request that passed every check on the FS and the hosts: about to start."""

    qf: QueueFile
    host: str
    slot: int | None
    start_index: int
    resumed: bool

    @property
    def cells(self) -> int:
        return sum(1 for ln in self.qf.cells if ln.index >= self.start_index)


@dataclass(frozen=True)
class _Asked:
    """A requested host's answer to the one command `_ask` sends it before anything starts."""

    sessions: set[str]  # its live tmux sessions
    measured: Mapping[str, Section]  # `refusals.launch_sections`, for `_refusals`
    why: str | None  # why some of them are missing


# Per request: launched / running, or what refused it (`launch` raises it, `launch --all` reports it).
Outcome: TypeAlias = LaunchResult | Exception
Sessions: TypeAlias = Mapping[str, set[str] | Exception]  # host -> its tmux sessions, or why not
Asked: TypeAlias = Mapping[str, _Asked | Exception]  # requested host -> its answer, or why none


# --------------------------------------------------------------------------- the entry points


def launch(project: Project, queue: str, host: str, start_index: int | None = None,
           slot: int | None = None, log: Log | None = None) -> LaunchResult:
    """One queue on one host (`ablate launch`, append's restart, remediate's launches); raises what
    refused it, or that it already runs."""
    req = LaunchRequest(queue, host, start_index, slot)
    local = LocalQueues.read(project)  # a name collision refuses before the lock is taken
    checked = _validate(project, local, [req])[0]  # and so does bad input
    if isinstance(checked, AblateError):
        raise checked
    with launch_context(project, local, f"launch {queue} --host {host}", [host], log) as ctx:
        [got] = _pipeline(ctx, [req])
    if isinstance(got, Exception):
        raise got
    if got.status == "running":
        raise AblateError(f"{queue} is already running on {got.host}; "
                          f"`ablate stop {queue} --host {got.host}` first")
    return got


def launch_each(ctx: LaunchContext, requests: Sequence[LaunchRequest]) -> list[LaunchResult]:
    """Every request through the pipeline, in order; one refused or failed is reported (`failed`,
    with the error) and never stops the others (`launch --all`)."""
    got = _pipeline(ctx, requests)
    return [g if isinstance(g, LaunchResult) else _failed(ctx.project, r.queue, r.host, _message(g))
            for r, g in zip(requests, got, strict=True)]


def is_live(project: Project, host: Host, queue: str) -> bool:
    return session_name(project.sweep, host.name, queue) in host_transport(project, host).tmux_sessions()


# --------------------------------------------------------------------------- the pipeline


def _pipeline(ctx: LaunchContext, requests: Sequence[LaunchRequest]) -> list[Outcome]:
    """The steps of the module docstring, under the controller lock; one outcome per request."""
    out: dict[int, Outcome] = {}
    checked: dict[int, _Checked] = {}
    for i, got in _validate(ctx.project, ctx.local, requests).items():
        if isinstance(got, _Checked):
            checked[i] = got
        else:
            out[i] = got
    if checked:
        snap, asked, sessions = _observe(ctx, checked.values())
        ready: dict[int, _Ready] = {}
        for i, c in checked.items():
            prepared = _prepare(ctx.project, c, snap, sessions, ctx.log)
            if isinstance(prepared, _Ready):
                ready[i] = prepared
            else:
                out[i] = prepared
        out.update(_refusals(ctx, snap, ready, asked))
        ready = {i: r for i, r in ready.items() if i not in out}
        if ready:
            out.update(_start_all(ctx, snap, ready))
    return [out[i] for i in range(len(requests))]


def _validate(project: Project, local: LocalQueues,
              requests: Sequence[LaunchRequest]) -> dict[int, _Checked | AblateError]:
    """The checks on the user's input alone (no FS, no host), each refusing its request. (A name
    collision anywhere in the roster refused the whole command when `local` was read.)"""
    out: dict[int, _Checked | AblateError] = {}
    for i, req in enumerate(requests):
        try:
            out[i] = _check(project, local, req)
        except AblateError as e:
            out[i] = e
    return out


def _check(project: Project, local: LocalQueues, req: LaunchRequest) -> _Checked:
    h = project.host(req.host)
    qf = local.get(project, req.queue)
    rel = f"queues/{req.queue}.txt"
    if qf.host and qf.host != req.host:
        raise AblateError(f"{rel} is planned for host {qf.host} (its `# ablate: host=` header); "
                          f"launch it with --host {qf.host}, or change the header")
    slot = _slot(h, qf, req.slot)
    n = len(qf.lines)
    if req.start_index is not None and not 0 <= req.start_index < n:
        raise AblateError(f"--start-index {req.start_index} is out of range: {rel} has {n} lines "
                          f"(indices 0..{n - 1})")
    return _Checked(qf, req.host, slot, req.start_index)


def _slot(h: Host, qf: QueueFile, slot: int | None) -> int | None:
    if slot is None and qf.host == h.name:
        slot = qf.slot
    if slot is not None and (not h.gpus or slot not in h.gpus):
        have = ", ".join(map(str, h.gpus)) if h.gpus else "none (no `gpus:` for it in ablate.yaml)"
        raise AblateError(f"slot {slot} is not a GPU slot of host {h.name} (slots: {have}); "
                          "pass --slot with one of them, or fix `gpus:` in ablate.yaml")
    return slot


def _observe(ctx: LaunchContext, checked: Iterable[_Checked]) -> tuple[Snapshot, Asked, Sessions]:
    """One snapshot of the shared FS and, at the same time, `_ask` of each requested host; then
    the tmux sessions of each queue's last ledger host not asked yet; hosts in parallel (a host
    that cannot be asked: its exception)."""
    project = ctx.project
    checked = list(checked)
    requested = sorted({c.host for c in checked})
    pending = start_each(requested, lambda name: _ask(ctx, project.hosts[name]))
    snap = probe_only(project, ctx.fs)
    asked = gather(pending, ctx.gone(snap))  # launch --all: a host that stopped itself is not waited for
    sessions: dict[str, set[str] | Exception] = {
        h: a.sessions if isinstance(a, _Asked) else a for h, a in asked.items()}
    moved: set[str] = set()
    for c in checked:
        ledger = snap.ledgers.get(c.qf.name, ())
        last = ledger[-1].host if ledger else None
        if last is not None and last in project.hosts and last not in sessions:
            moved.add(last)
    sessions.update(fan_out(sorted(moved), lambda name: ctx.transport(name).tmux_sessions()))
    return snap, asked, sessions


def _ask(ctx: LaunchContext, host: Host) -> _Asked:
    """One command on `host`: its tmux sessions (as `tmux_sessions` reads them) and what the budget
    and drift checks measure. Raises what the transport raises when the host cannot be asked."""
    ht = ctx.transport(host.name)
    tmux = ("tmux", ["sh", "-c", LIST_SESSIONS, "sh", *ht.tmux_argv()])
    got, why = measure(ht, [tmux, *launch_sections(ctx.project, host)])
    sec = got.get("tmux")
    if sec is None:
        raise RemoteError(f"{host.name}: tmux was not asked: {why}")
    if sec.rc == 0:
        return _Asked({ln for ln in sec.out.splitlines() if ln}, got, why)
    if NO_TMUX_SERVER.search(sec.out):
        return _Asked(set(), got, why)
    raise RemoteError(f"{host.name}: `tmux list-sessions` exited {sec.rc}: {sec.out.strip()[-300:]!r}")


def _prepare(project: Project, c: _Checked, snap: Snapshot, sessions: Sessions,
             log: Log | None) -> _Ready | Outcome:
    """Live (here, or on the ledger's last host) → `running`; else the launched prefix and the
    start index, from the snapshot."""
    name = c.qf.name
    mine = sessions.get(c.host)
    if isinstance(mine, Exception):  # cannot ask whether it runs the queue: never start a second copy
        return RemoteError(f"cannot reach {c.host}: {_message(mine)}")
    ledger = snap.ledgers.get(name, ())
    last = ledger[-1].host if ledger else None
    live_on = c.host if mine is not None and session_name(project.sweep, c.host, name) in mine else None
    if live_on is None and last is not None and last != c.host and last in project.hosts:
        theirs = sessions.get(last)
        if isinstance(theirs, Exception):  # the previous host is gone: moving the queue is the point
            if log:
                log(f"{name}: cannot ask {last} whether it still runs it ({_message(theirs)}); going on")
        elif theirs is not None and session_name(project.sweep, last, name) in theirs:
            live_on = last
    if live_on is not None:
        return LaunchResult(name, live_on, "running", session_name(project.sweep, live_on, name))
    try:
        check_prefix(c.qf, ledger, snap.queue_copies.get(name))
    except AblateError as e:
        return e
    if c.start_index is not None:
        return _Ready(c.qf, c.host, c.slot, c.start_index, False)
    if not ledger:
        return _Ready(c.qf, c.host, c.slot, 0, False)
    return _Ready(c.qf, c.host, c.slot, _resume_index(snap, c.qf), True)


def _resume_index(snap: Snapshot, qf: QueueFile) -> int:
    """The first cell line without a durable result (an interrupted cell re-enters via its claim)."""
    for ln in qf.cells:
        if ln.cell is not None and ln.cell.name not in snap.results:
            return ln.index
    return len(qf.lines)


def _by_host(ready: Mapping[int, _Ready]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, r in ready.items():
        out.setdefault(r.host, []).append(i)
    return out


def _refusals(ctx: LaunchContext, snap: Snapshot, ready: Mapping[int, _Ready],
              asked: Asked) -> dict[int, Exception]:
    """Rule 5 and code drift (`ablate doctor`'s checks), once per host, from what `_ask` measured
    there: each request on a refused host gets the refusal (CheckFailed, exit 1). The host's first
    queue counts for it in the budget (a queue without a header is launched there)."""
    project = ctx.project
    hosts = _by_host(ready)
    ours = controller_commit(project) if hosts else None
    out: dict[int, Exception] = {}
    for host, idx in sorted(hosts.items()):
        got = asked.get(host)
        if not isinstance(got, _Asked):  # never: a ready request's host answered `_ask`
            err: Exception = got or RemoteError(f"{host}: not asked before the launch")
        else:
            h = project.host(host)
            cells = count_cells(project, None, (ready[idx[0]].qf.name, host), ledgers=snap.ledgers,
                                queues=ctx.local.queues, published=snap.results)
            why = launch_refusal(project, h, got.measured, got.why, cells, ours)
            if why is None:
                continue
            err = CheckFailed(why)
        out.update((i, err) for i in idx)
    return out


def _start_all(ctx: LaunchContext, snap: Snapshot, ready: Mapping[int, _Ready]) -> dict[int, Outcome]:
    """Everything is checked: from here on, things change. The FS first (every queue's copy and
    ledger entry before any queue starts), then the tmux sessions."""
    project, log = ctx.project, ctx.log
    dep, failed = _record(ctx, snap, ready)
    out: dict[int, Outcome] = dict(failed)
    written = {i: r for i, r in ready.items() if i not in out}
    if not written:
        return out
    hosts = _by_host(written)
    with steps(log, len(written), "launch", unit="queues") as bar:
        started = fan_out(sorted(hosts), lambda host: _start_on_host(
            ctx, dep, host, {i: written[i] for i in hosts[host]}, bar.advance))
    for host, got in started.items():
        for i in hosts[host]:
            r = written[i]
            err = got if isinstance(got, Exception) else got[i]
            if isinstance(err, _AlreadyRunning):  # another start won the race: one live copy
                out[i] = LaunchResult(r.qf.name, host, "running",
                                      session_name(project.sweep, host, r.qf.name))
                continue
            out[i] = err if err is not None else LaunchResult(
                r.qf.name, host, "launched", session_name(project.sweep, host, r.qf.name), r.slot,
                r.start_index, len(r.qf.lines), r.cells, r.resumed, dep.version, dep.specs[host],
                dep.run_queue)
    return out


def _record(ctx: LaunchContext, snap: Snapshot,
            ready: Mapping[int, _Ready]) -> tuple[DeployResult, dict[int, Exception]]:
    """Two round trips: the placement with the read of each queue's stop request (under the lock);
    then DEPLOYED.json when it changes (its failure fails the launch: nothing runs wrappers it does
    not name), per queue its FS copy, its stop request removed and its ledger entry (saying whether
    it cleared one), the estimates and each host's autostop settings. The placement, and per
    request what failed: queues write disjoint files, one queue's failed write is its outcome and
    never stops the others' (`apply_groups`)."""
    project, fs, log = ctx.project, ctx.fs, ctx.log
    layout = SweepLayout(fs.root)
    order = sorted(ready)
    placed = place_and_read(project, fs, log, [layout.stop_request(ready[i].host, ready[i].qf.name)
                                               for i in order])
    dep = placed.result
    try:  # in a store: for instances whose clone of the repo lacks one
        configs_to_store(project, fs, (ln.cell.cfg for i in order for ln in ready[i].qf.cells
                                       if ln.cell is not None))
    except AblateError as e:
        return dep, {i: e for i in order}
    entries: list[list[FSOp]] = []
    for i, stop in zip(order, placed.read, strict=True):
        r = ready[i]
        line = entry_line(new_entry(r.qf, r.host, r.slot, r.start_index, dep.specs[r.host], dep.run_queue,
                                    "launch", cleared_stop=stop is not None))
        entries.append([WriteAtomic(layout.queue_file(r.qf.name), r.qf.normalized_text().encode()),
                        Remove(layout.stop_request(r.host, r.qf.name)),
                        AppendLine(layout.ledger(r.qf.name), line)])
    try:  # what drained runners steal by, before these run (a failure is a note, never fatal)
        estimates: list[FSOp] = [estimates_op(project, fs.root, snap, queues=ctx.local.queues)[0]]
    except (AblateError, OSError) as e:
        estimates = []
        if log is not None:
            log(estimates_note(e))
    autostop = settings_ops(project, fs.root, (ready[i].host for i in order))  # its runner reads them
    first = [placed.deployed] if placed.deployed is not None else []
    *got, est, put = apply_groups(fs, [*entries, estimates, autostop], first=first)
    for err, note in ((est if estimates else None, estimates_note), (put, autostop_note)):
        if isinstance(err, Exception) and log is not None:
            log(note(err))
    return dep, {i: g for i, g in zip(order, got, strict=True) if isinstance(g, Exception)}


class _AlreadyRunning(Exception):
    """The queue's tmux session appeared between our look and our start."""


def _start_on_host(ctx: LaunchContext, dep: DeployResult, host: str, ready: Mapping[int, _Ready],
                   advance: Callable[[str], None]) -> dict[int, Exception | None]:
    """Start this host's queues in one command (a tmux new-session each); per request, None or
    what went wrong. Raises what the transport raises when the host cannot be reached."""
    project = ctx.project
    ht = ctx.transport(host)
    sessions = {i: session_name(project.sweep, host, r.qf.name) for i, r in ready.items()}
    plan = boot_plan(project, project.hosts[host], dep)
    if plan is not None:  # no shared FS there: its files fetched from the store, then the queues
        return _booted(ctx, ht, plan, dep, sessions, ready, advance)
    commands = {i: shlex.join(_argv(project, dep, r)) for i, r in ready.items()}
    array = ht.array_argv([(sessions[i], commands[i]) for i in ready]) if isinstance(ht, SlurmHost) else None
    if array is not None:
        return _array_started(ht, host, array, sessions, ready, advance)
    got, why = measure(ht, [(f"q{i}", _new_session(ht, sessions[i], _argv(project, dep, r)))
                            for i, r in ready.items()])
    out: dict[int, Exception | None] = {}
    for i, r in ready.items():
        sec = got.get(f"q{i}")
        waits = next((ln.split(": ", 1)[-1] for ln in (sec.out.splitlines() if sec is not None else ())
                      if ln.startswith(f"waiting {sessions[i]}:")), None)
        if sec is not None and sec.rc == 0 and waits is not None:  # Slurm's submit limit: it waits
            out[i] = None  # on the shared FS, submitted as an earlier job ends (status: WAITING)
            advance(f"{host}: {sessions[i]} waits to be submitted ({waits}); it runs {r.qf.name} from "
                    f"line {r.start_index} once an earlier job ends")
        elif sec is not None and sec.rc == 0:
            out[i] = None
            advance(f"{host}: tmux {sessions[i]} runs {r.qf.name} from line {r.start_index} "
                    f"({r.cells} cell(s))")
        elif sec is not None and "duplicate session:" in sec.out:
            # tmux refuses a second session of the name: a start still in flight from a killed
            # controller, or another controller, landed after we looked. It runs; never twice.
            out[i] = _AlreadyRunning()
        else:  # one queue failing never hides the others
            reason = repr(sec.out.strip()[-300:]) if sec is not None else why
            out[i] = RemoteError(f"{host}: tmux could not start session {sessions[i]}: {reason}")
    return out


def _new_session(ht: HostTransport, session: str, argv: Sequence[str]) -> list[str]:
    """The tmux new-session starting one queue, in the environment of the connection that runs it
    (ablate/remote/host/session_env.py); Slurm's adapter submits it, and `sbatch` exports that."""
    if isinstance(ht, SlurmHost):
        return [*ht.tmux_argv(), "new-session", "-d", "-s", session, shlex.join(argv)]
    name = session_env.new_name(session)
    return session_env.captured(name, [*ht.tmux_argv(), "new-session", "-d", "-s", session,
                                       session_env.session_command(name, argv)])


def _booted(ctx: LaunchContext, ht: HostTransport, plan: BootPlan, dep: DeployResult,
            sessions: Mapping[int, str], ready: Mapping[int, _Ready], advance: Callable[[str], None],
            ) -> dict[int, Exception | None]:
    """A storage host's queues started by its boot program (ablate/run/store_launch.py), per request
    as `_start_on_host` answers."""
    creds = ctx.credentials()
    got = boot(ht, plan, {sessions[i]: _argv(ctx.project, dep, r) for i, r in ready.items()}, creds)
    out: dict[int, Exception | None] = {}
    for i, r in ready.items():
        s = got[sessions[i]]
        out[i] = None if s.state == "started" else _AlreadyRunning() if s.state == "running" \
            else RemoteError(f"{plan.host}: {s.why}")
        if s.state == "started":
            advance(f"{plan.host}: tmux {sessions[i]} runs {r.qf.name} from line {r.start_index} "
                    f"({r.cells} cell(s)); {creds_note(creds)}")
    return out


def _array_started(ht: HostTransport, host: str, argv: list[str], sessions: Mapping[int, str],
                   ready: Mapping[int, _Ready], advance: Callable[[str], None],
                   ) -> dict[int, Exception | None]:
    """A Slurm host's queues submitted as job arrays (`SlurmHost.array_argv`), per request as
    `_start_on_host` answers."""
    got, why = measure(ht, [("array", argv)], timeout=120.0)
    sec = got.get("array")
    lines = sec.out.splitlines() if sec is not None else []
    started = {w[1]: w[2] for w in (ln.split() for ln in lines) if len(w) == 3 and w[0] == "started"}
    out: dict[int, Exception | None] = {}
    for i, r in ready.items():
        if sessions[i] in started:
            out[i] = None
            advance(f"{host}: array task {started[sessions[i]]} runs {r.qf.name} from line "
                    f"{r.start_index} ({r.cells} cell(s))")
        elif any(ln.startswith(f"duplicate session: {sessions[i]} ") for ln in lines):
            out[i] = _AlreadyRunning()
        else:
            reason = repr(sec.out.strip()[-300:]) if sec is not None else why
            out[i] = RemoteError(f"{host}: sbatch could not start {sessions[i]} in a job array: {reason}")
    return out


def _argv(project: Project, dep: DeployResult, r: _Ready) -> list[str]:
    """`bash run_queue.<sha>.sh SPEC QUEUE START_INDEX [SLOT]`, paths as the host sees them."""
    hl = project.layout(project.hosts[r.host])
    argv = ["bash", dep.run_queue_path(hl), dep.spec_path(hl, r.host), r.qf.name, str(r.start_index)]
    return argv if r.slot is None else [*argv, str(r.slot)]


def _message(e: BaseException) -> str:
    return e.message if isinstance(e, AblateError) else f"{type(e).__name__}: {e}"


def _failed(project: Project, queue: str, host: str, error: str) -> LaunchResult:
    return LaunchResult(queue, host, "failed", session_name(project.sweep, host, queue), error=error)
