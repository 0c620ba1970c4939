"""Every roster cell's state, from what the shared FS and the hosts' tmux say (DESIGN rules 6-8).

`classify()` is pure: it reads one `snapshot` probe (events of every `events/*.jsonl`, heartbeats,
claims, ledgers, the FS copies of the queues, published results with their manifests' identity,
partial and staging dirs, failed cells' log tails, released claims), which hosts answered and with
which tmux sessions, the local repo's cfg sha256s and the last verification (reconcile). `collect()`
does that I/O (one probe round trip and one tmux query per host, all at once) and classifies.

States, first match wins:
  durable copy `final_ckpts/<name>/MANIFEST.json` present:
    stale       its manifest names another (cfg, task, epochs), or its cfg_sha256 differs from the
                cfg file in the local repo now;
    corrupt     the last reconcile found it does not load / does not match its manifest (and the
                manifest is still the one reconcile saw);
    verified    the last reconcile verified this very manifest;
    synced      otherwise (present, not yet verified by load).
  no durable copy, the cell claimed (`claims/<name>/owner` = host queue):
    its last `end` in the owner's events: reason no_progress -> too_long (two time-limit cuts left
    its checkpoint as it was); reason service_down -> service_down (a service beside it
    died: not the trainer's failure); rc 0 -> sync_failed (no durable copy); rc 3 with a
    `sync_failed` event -> sync_failed; 129/130/143 -> interrupted (lost when its host is);
    137 or an OOM line in `tails/<name>.log` -> oom; other -> crashed (with the tail);
    no `end`: the owner queue live (tmux session or Slurm job; or, host unreachable, a fresh
    running heartbeat) and running it -> running, or hung when its log has been silent longer than
    hung_after (heartbeat `t` - `log_mtime`, both host clock, plus the heartbeat's age; without log
    fields the heartbeat's age); live but not on it -> queued (its queue re-enters its claimed
    cells: a job Slurm requeued, a relaunch); owner host unreachable and its heartbeat stale, or
    the Slurm node of its claim out of service -> lost (never on one signal); else -> interrupted
    (stopped, or its process is gone while the host is alive).
  no claim: a live queue has the line at or after its current index -> queued; else never_ran.
A result dir without MANIFEST.json (a partial copy) makes a cell that is not running sync_failed.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ablate.config.project import Project
from ablate.sweep.alarms import HostAlarm
from ablate.sweep.cells import Cell, QueueFile, Roster, build_roster
from ablate.sweep.snapshot import Event, Heartbeat, Result, SweepState, Tail, all_queues, load
from ablate.transport import SharedFS, shared_fs
from ablate.util.fmt import Log
from ablate.util.fmt import age as _age

STATES = ("verified", "synced", "queued", "running", "hung", "lost", "interrupted", "oom", "crashed",
          "service_down", "sync_failed", "too_long", "corrupt", "stale", "never_ran")
# What `ablate remediate` re-runs: everything that is not done, doing, or about to be done.
TARGETS = frozenset({"never_ran", "lost", "interrupted", "oom", "crashed", "service_down", "sync_failed",
                     "too_long", "corrupt", "stale"})
# Decided from an absence (no claim, end, result or fresh heartbeat): facts only on a settled view.
FROM_ABSENCE = frozenset({"never_ran", "lost", "interrupted", "sync_failed"})
SIGNALLED = {129: "HUP", 130: "INT", 143: "TERM"}
CHECKS = ("loaded", "structure", "hash", "size")  # verify's ways a file passed, strongest first
# A verified cell's reason, by the weakest check of its checkpoint files (verify's `checks`).
VERIFIED_BY = {"loaded": "every checkpoint file loaded",
               "structure": "checkpoint files loaded or checked by structure (parsed, never run)",
               "hash": "a checkpoint file checked by size and sha256 only, not loaded",
               "size": "a checkpoint file checked by size only"}
TAIL_SHOWN = 3  # tail lines per failed cell in text output (JSON carries the probe's tail)


@dataclass(frozen=True)
class CellState:
    name: str
    state: str
    reason: str  # one line
    host: str | None = None
    queue: str | None = None
    rc: int | None = None
    tail: tuple[str, ...] = ()  # last log lines, for crashed / oom
    pending: str | None = None  # a launched-never queue on a reachable host that holds the cell
    aside: bool = False  # a durable or partial result dir to set aside before a re-run
    # A state decided from something NOT being there, on a view that may be stale (a host not read
    # through itself, within the FS's lag): why it is not yet a fact. Nothing acts on such a cell.
    unconfirmed: str | None = None
    verified_by: str | None = None  # verified: the weakest check of its checkpoint files (loaded, ...)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "host": self.host, "queue": self.queue,
                               "rc": self.rc, "reason": self.reason}
        if self.tail:
            out["tail"] = list(self.tail)
        if self.pending:
            out["pending"] = self.pending
        if self.unconfirmed:
            out["unconfirmed"] = self.unconfirmed
        if self.verified_by:
            out["verified_by"] = self.verified_by
        return out

    def line(self) -> str:
        where = f"{self.host or '-'}/{self.queue or '-'}"
        note = f" [unconfirmed: {self.unconfirmed}]" if self.unconfirmed else ""
        return f"{self.state:<12} {self.name:<24} {where:<20} {self.reason}{note}"


@dataclass(frozen=True)
class Verification:
    """What the last reconcile found, keyed by the sha256 of the MANIFEST.json it saw."""

    verified: Mapping[str, str | None]
    corrupt: Mapping[str, tuple[str, str | None]]  # name -> (error, manifest sha256)
    source: str = "local"
    by: Mapping[str, str] = field(default_factory=dict)  # name -> its checkpoint's weakest check

    @classmethod
    def from_record(cls, rec: Mapping[str, Any] | None) -> Verification | None:
        """From `gate/reconcile.json` (its `cells` are the verified ones; `corrupt` added by this
        module's reconcile, absent in older records, and so is a cell's `verified_by`)."""
        if not rec:
            return None
        raw_cells, raw_bad = rec.get("cells"), rec.get("corrupt")
        cells: Mapping[str, Any] = raw_cells if isinstance(raw_cells, dict) else {}
        bad: Mapping[str, Any] = raw_bad if isinstance(raw_bad, dict) else {}
        verified = {n: (c or {}).get("manifest_sha256") for n, c in cells.items() if isinstance(c, dict)}
        corrupt = {n: (str(b.get("error") or "failed verification"), b.get("manifest_sha256"))
                   for n, b in bad.items() if isinstance(b, dict)}
        by = {n: c["verified_by"] for n, c in cells.items()
              if isinstance(c, dict) and isinstance(c.get("verified_by"), str)}
        return cls(verified, corrupt, str(rec.get("source") or "local"), by)


@dataclass
class Classification:
    """Every roster cell's state, and the SweepState it was decided from."""

    cells: dict[str, CellState]  # roster order
    state: SweepState

    @property
    def unreachable(self) -> dict[str, str]:
        return self.state.unreachable

    @property
    def queues(self) -> Mapping[str, QueueFile]:
        return self.state.queues

    @property
    def lost_hosts(self) -> dict[str, str]:
        return self.state.lost_hosts()

    def counts(self) -> dict[str, int]:
        return state_counts(self.cells.values())

    def not_verified(self) -> list[CellState]:
        return [c for c in self.cells.values() if c.state != "verified"]


def check_counts(hows: Iterable[str]) -> dict[str, int]:
    """{check: n}, strongest first (only the checks that occur; a word not in CHECKS last): its
    last key is the weakest."""
    rank = {h: i for i, h in enumerate(CHECKS)}
    return dict(sorted(Counter(hows).items(), key=lambda kv: rank.get(kv[0], len(CHECKS))))


def counts_text(counts: Mapping[str, int], noun: str = "files") -> str:
    """`loaded 12 files, structure 8, hash 1` (the noun once, after the first count)."""
    return ", ".join(f"{h} {n}" + (f" {noun}" if i == 0 else "") for i, (h, n) in enumerate(counts.items()))


def state_counts(cells: Any) -> dict[str, int]:
    counts = dict.fromkeys(STATES, 0)
    for c in cells:
        counts[c.state] += 1
    return {s: n for s, n in counts.items() if n}


def count_line(counts: Mapping[str, int]) -> str:
    return "cells: " + (", ".join(f"{n} {s}" for s, n in counts.items()) or "none")


# Text output lists what needs a hand first: a long sweep's queued cells must not hide a crash.
_URGENCY = {s: i for i, s in enumerate((
    "hung", "lost", "oom", "crashed", "service_down", "sync_failed", "too_long", "corrupt", "stale",
    "interrupted", "never_ran",
    "running", "queued", "synced", "verified"))}


def cell_lines(cells: Sequence[CellState], limit: int = 60) -> list[str]:
    """One line per cell (+ a few tail lines for crashed / oom), most urgent first, at most `limit`."""
    out: list[str] = []
    cells = sorted(cells, key=lambda c: _URGENCY[c.state])  # stable: roster order within a state
    for c in cells[:limit]:
        out.append("  " + c.line())
        shown = [t for t in c.tail if not t.startswith("# ablate")]  # the wrapper's own lines aside
        out += [f"      | {t}" for t in shown[-TAIL_SHOWN:]]
    if len(cells) > limit:
        out.append(f"  ... and {len(cells) - limit} more (--json lists every cell)")
    return out


def state_lines(cells: Mapping[str, CellState], hosts: Sequence[HostAlarm]) -> list[str]:
    """The per-state count, every cell that is not verified, and the host alarms."""
    out = []
    if cells:
        out.append(count_line(state_counts(cells.values())))
        out += cell_lines([c for c in cells.values() if c.state != "verified"])
    out += [h.line() for h in hosts]
    return out


def warning_lines(warnings: Sequence[str]) -> list[str]:
    return [f"warning: {w}" for w in warnings]


# --------------------------------------------------------------------------- I/O


def warn(log: Log | None, warnings: Sequence[str]) -> None:
    """Each warning about a malformed file on the shared FS, one line through `log` (stderr)."""
    if log is not None:
        for w in warnings:
            log(f"warning: {w}")


def sweep_roster(project: Project, fs: SharedFS, log: Log | None = None) -> Roster:
    """The roster of the local queue files plus the FS copies of launched queues this laptop lacks,
    so a controller whose local state is gone rebuilds it from the FS (one probe round trip). When
    the FS cannot be read, the local queue files alone (a command that needs the FS fails there).
    A copy that does not parse is left out, with a warning through `log`."""
    from ablate.errors import AblateError

    try:
        copies = fs.probe("queues", {"root": fs.root}).get("queues") or {}
    except (AblateError, OSError):
        copies = {}
    queues, warnings = all_queues(project, {str(k): v for k, v in copies.items() if isinstance(v, str)})
    warn(log, warnings)
    return build_roster(queues.values())


def cfg_hashes(project: Project, queues: Mapping[str, QueueFile]) -> dict[str, str | None]:
    """sha256 of each cell's cfg file in the local repo now (None when not readable here)."""
    out: dict[str, str | None] = {}
    for q in queues.values():
        for ln in q.cells:
            cell = ln.cell
            if cell is None or cell.name in out:
                continue
            path = Path(cell.cfg) if cell.cfg.startswith("/") else project.dir / cell.cfg
            try:
                out[cell.name] = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError:
                out[cell.name] = None
    return out


def classify_state(project: Project, state: SweepState,
                   verification: Verification | None = None) -> Classification:
    """Every cell of `state`'s queues; the verification defaults to the snapshot's reconcile record."""
    if verification is None:
        verification = Verification.from_record(state.snap.reconcile)
    cells = classify(state, cfg_sha=cfg_hashes(project, state.queues), verification=verification,
                     hung_after=project.monitor.hung_after)
    return Classification(cells, state)


def collect(project: Project, fs: SharedFS | None = None,
            verification: Verification | None = None) -> Classification:
    """Snapshot the FS and ask every host's tmux at once (`snapshot.load`), then classify every cell."""
    return classify_state(project, load(project, fs or shared_fs(project)), verification)


# --------------------------------------------------------------------------- the pure part


def classify(state: SweepState, *, cfg_sha: Mapping[str, str | None], verification: Verification | None,
             hung_after: float) -> dict[str, CellState]:
    """name -> CellState for every cell line of the state's queues (first-seen order). Pure."""
    snap = state.snap
    roster: dict[str, Cell] = {}
    for q in state.queues.values():
        for ln in q.cells:
            if ln.cell is not None and ln.cell.name not in roster:
                roster[ln.cell.name] = ln.cell
    queued, pending, idle_reason = _positions(state)
    unsettled = state.unsettled()
    out: dict[str, CellState] = {}
    for name, cell in roster.items():
        if name in snap.results:
            st = _durable(name, cell, snap.results[name], cfg_sha.get(name), verification)
        elif name in snap.claims:
            st = _claimed(state, name, snap.tails.get(name), hung_after, queued.get(name))
        elif name in queued:
            host, qn = queued[name]
            st = CellState(name, "queued", f"queue {qn} on {host} has yet to reach it", host, qn)
        elif name in pending:
            host, qn = pending[name]
            st = CellState(name, "never_ran", f"in queues/{qn}.txt, not launched yet "
                           f"(`ablate launch {qn} --host {host}`)", host, qn, pending=qn)
        else:
            why = idle_reason.get(name) or "no queue has reached it"
            if name in snap.released:
                why = f"its claim was released by `ablate remediate`; {why}"
            st = CellState(name, "never_ran", why)
        if name in snap.partial and st.state not in ("running", "hung"):
            st = CellState(name, "sync_failed", f"final_ckpts/{name}/ exists without MANIFEST.json "
                           "(a partial copy); `ablate remediate` sets it aside and re-runs the cell",
                           st.host, st.queue, st.rc, st.tail, st.pending, aside=True)
        out[name] = _confirm(st, unsettled, name in snap.claims)
    return out


def _confirm(st: CellState, unsettled: Mapping[str, str], claimed: bool) -> CellState:
    """Unconfirmed while a host that could have written the missing thing is not settled (its
    owner for a claimed cell; anyone, a steal, otherwise: `SweepState.unsettled`)."""
    hosts = [st.host] if claimed and st.host else list(unsettled)
    why = next((unsettled[h] for h in hosts if h in unsettled), None)
    return st if why is None or st.state not in FROM_ABSENCE else replace(st, unconfirmed=why)


def _positions(state: SweepState) -> tuple[
        dict[str, tuple[str, str]], dict[str, tuple[str, str]], dict[str, str]]:
    """Which live queue will still reach each cell (queued), which launched-never queue on a
    reachable host holds it (pending), and why a cell's own queue will not reach it."""
    queued: dict[str, tuple[str, str]] = {}
    pending: dict[str, tuple[str, str]] = {}
    why: dict[str, str] = {}
    for q in state.queues.values():
        view = state.queue(q.name)
        host = view.host
        if view.state == "not_launched":
            for ln in q.cells:
                assert ln.cell is not None
                name = ln.cell.name
                if host and state.reachable(host):
                    pending.setdefault(name, (host, q.name))
                elif host:
                    why.setdefault(name, f"in queues/{q.name}.txt for {host}, which does not answer")
                else:
                    why.setdefault(name, f"in queues/{q.name}.txt, not launched yet (no host header)")
            continue
        hb, age = view.heartbeat, view.heartbeat_age
        if view.live:
            assert host is not None
            if hb is not None and hb.from_queue:  # on another queue's cell: its own position is
                # `next` (an older run_queue took one only once its own lines were all behind it)
                cur = hb.next_line if hb.next_line is not None else len(q.lines)
            elif hb is not None and hb.idx is not None:
                cur = hb.idx
            else:
                start = state.ledger(q.name)[-1].start_index
                cur = start if start is not None else 0
            later = set(hb.deferred) if hb is not None else set()  # lines it left to the head deal
            for ln in q.cells:
                assert ln.cell is not None
                if (ln.index >= cur or ln.index in later) and ln.cell.name not in queued:
                    queued[ln.cell.name] = (host, q.name)
            continue
        if not state.reachable(host) and (age is None or age > state.stale_after):
            note = f"its queue {q.name} is on {host}, which is lost (unreachable, heartbeat " \
                   f"{'missing' if age is None else _age(age) + ' old'})"
        elif view.state == "stopped" and hb is not None and hb.state == "stopped":
            last = next((e for e in reversed(state.snap.events.get(f"{host}.{q.name}", []))
                         if e.ev in ("service_failed", "queue_start")), None)
            failed = last if last is not None and last.ev == "service_failed" else None
            note = f"its queue {q.name} on {host} was stopped before reaching it" if failed is None else \
                f"its queue {q.name} on {host} stopped: service {failed.service} {failed.reason}"
        elif view.state == "drained":
            note = f"its queue {q.name} on {host} drained without running it"
        else:
            note = f"its queue {q.name} on {host} is not running (its process is gone)"
        for ln in q.cells:
            assert ln.cell is not None
            why.setdefault(ln.cell.name, note)
    return queued, pending, why


def _durable(name: str, cell: Cell, m: Result, local_sha: str | None,
             verification: Verification | None) -> CellState:
    if not m.valid:
        return CellState(name, "corrupt", "final_ckpts MANIFEST.json is unreadable or not a manifest",
                         aside=True)
    host, queue = m.host, m.queue
    recorded = (m.cfg, m.task, m.epochs)
    if recorded != (cell.cfg, cell.task, cell.epochs):
        return CellState(name, "stale", f"its result was made from cfg={recorded[0]} task={recorded[1]} "
                         f"epochs={recorded[2]}; the roster has {cell.line}", host, queue, aside=True)
    want = m.cfg_sha256
    if want is not None and local_sha is not None and local_sha != want:
        return CellState(name, "stale", f"{cell.cfg} changed since the result was made "
                         f"(sha256 {want[:12]} then, {local_sha[:12]} now)", host, queue, aside=True)
    if verification is not None:
        bad = verification.corrupt.get(name)
        if bad is not None and (bad[1] is None or bad[1] == m.sha256):
            where = "durable copy" if verification.source == "fs" else "pulled copy"
            return CellState(name, "corrupt", f"{where} fails verification: {bad[0]}", host, queue,
                             aside=True)
        if name in verification.verified and verification.verified[name] == m.sha256:
            by = verification.by.get(name)
            if by is None:  # an older record (no `verified_by`): reconcile loaded what it verified
                return CellState(name, "verified", "loaded by the last reconcile", host, queue)
            return CellState(name, "verified", f"verified by the last reconcile: {VERIFIED_BY.get(by, by)}",
                             host, queue, verified_by=by)
    how = "`ablate pull && ablate reconcile`" if verification is None or verification.source != "fs" \
        else "`ablate reconcile --fs`"
    return CellState(name, "synced", f"durable copy on the shared FS, not verified since it was made: {how}",
                     host, queue)


def _claimed(state: SweepState, name: str, tail: Tail | None, hung_after: float,
             reached: tuple[str, str] | None) -> CellState:
    """`reached`: the live queue that will still reach the cell, if one will."""
    claim = state.snap.claims[name]
    if claim.host is None or claim.queue is None:
        # mkdir'd, owner not (yet) written: a runner claiming it now, or one that died doing so
        hb = next((h for h in state.snap.heartbeats.values() if h.cell == name), None)
        if hb is not None and hb.state == "running" and state.live(hb.host, hb.queue):
            return CellState(name, "running", f"running on {hb.host}", hb.host, hb.queue)
        if reached is not None:  # run_queue takes it over after ABLATE_CLAIM_WAIT (remote/defaults.py)
            host, qn = reached
            return CellState(name, "queued", f"its claim has no owner (its runner died while claiming); "
                             f"queue {qn} on {host}, live, takes it over when it gets there", host, qn)
        return CellState(name, "interrupted", "claimed, but its claim has no owner (its runner died "
                         "while claiming); `ablate remediate` re-runs it")
    host, queue = claim.host, claim.queue
    evs = state.cell_events(name, f"{host}.{queue}")  # the owner's file (a thief's, for a stolen cell)
    # The owner's last start or end of this cell: an `end` is an outcome; a `start` is a run in
    # progress, or one that was cut (a resumed cell starts again after its cut).
    last = next(((k, i, e) for k, i, e in reversed(evs) if e.ev in ("start", "end")), None)
    if last is not None and last[2].ev == "end":
        return _ended(state, name, host, queue, last, evs, tail)
    age, hb = state.heartbeat(host, queue)
    on_it = hb is not None and hb.state == "running" and hb.cell == name
    if state.live(host, queue) and (on_it or not evs):
        if not state.reachable(host):
            where = f"on {host} (not answering; its heartbeat, {_age(age or 0)} old, is fresh)"
        else:
            where = f"on {host}"
        silent = _silence(age, hb)
        if on_it and silent is not None and silent > hung_after:
            return CellState(name, "hung", f"running {where}, but its log has been silent for {_age(silent)} "
                             f"(hung_after {_age(hung_after)}); `ablate stop {queue} --host {host}`, then "
                             "`ablate remediate`", host, queue)
        return CellState(name, "running", f"running {where}", host, queue)
    if state.live(host, queue):  # cut, and its queue is live again (a job Slurm requeued): the
        # queue re-enters its claimed cells, resumable; nothing else may run it meanwhile
        return CellState(name, "queued", f"cut, and its queue {queue} on {host} is live again (a requeued "
                         "or relaunched job): it re-enters the cell with resume=1", host, queue)
    if not state.reachable(host) and not state.fresh(host, queue):
        seen = "no heartbeat" if age is None else f"heartbeat {_age(age)} old"
        return CellState(name, "lost", f"claimed by {queue} on {host}, which does not answer ({seen}): "
                         "the instance is gone", host, queue)
    out = state.nodes_out(host).get(claim.node or "")
    if out is not None:
        return CellState(name, "lost", f"claimed by {queue} on {host}, whose node {claim.node} is "
                         f"{out} in Slurm: the job is gone with it; `ablate remediate` re-runs it",
                         host, queue)
    start = next(((k, i) for k, i, e in reversed(evs) if e.ev == "start"), None)
    stop = state.stopped_after(start[0], start[1]) if start else None
    if stop is not None and stop.ev == "stopped":
        why = f"cut by `{stop.by or 'ablate stop'}` of {queue} on {host}"
    elif _restarts_spent(state, f"{host}.{queue}"):
        why = (f"cut, and its queue {queue} on {host} then ended: its job had restarted more than "
               "slurm.max_restarts times")
    elif hb is not None and hb.state == "stopped":
        why = f"its queue {queue} on {host} was stopped (signal) during the cell"
    elif start is None:
        why = f"claimed by {queue} on {host}, which is not running it"
    else:
        why = f"its queue {queue} on {host} is gone mid-cell (killed or rebooted) while the host is up"
    return CellState(name, "interrupted", f"{why}; `ablate launch {queue} --host {host}` resumes it there, "
                     "`ablate remediate` re-runs it", host, queue)


def _restarts_spent(state: SweepState, key: str) -> bool:
    """The queue's last `queue_stop` says its job restarted more than slurm.max_restarts times."""
    stop = next((e for e in reversed(state.snap.events.get(key, ())) if e.ev == "queue_stop"), None)
    return stop is not None and stop.reason == "max_restarts"


def _silence(age: float | None, hb: Heartbeat | None) -> float | None:
    """How long the running cell's log has been silent: heartbeat `t` - `log_mtime` (one host
    clock) plus the heartbeat's own age (FS clock); the heartbeat's age without log fields."""
    if age is None or hb is None:
        return None
    if hb.t is not None and hb.log_mtime is not None:
        return max(0.0, hb.t - hb.log_mtime) + max(0.0, age)
    return max(0.0, age)


def _ended(state: SweepState, name: str, host: str, queue: str, last_end: tuple[str, int, Event],
           evs: list[tuple[str, int, Event]], tail_info: Tail | None) -> CellState:
    e = last_end[2]
    rc = e.rc
    tail = tail_info.lines if tail_info is not None else ()
    oom_line = tail_info.oom if tail_info is not None else None
    sync_fail = next((x for _, i, x in reversed(evs) if x.ev == "sync_failed" and i < last_end[1]), None)
    if e.reason == "no_progress":  # run_queue: two time-limit cuts, the same checkpoint after both
        return CellState(name, "too_long", "cut at Slurm's time limit twice with its checkpoint "
                         "unchanged: it needs more than time - grace from where it resumes, or its trainer "
                         "does not resume; raise slurm.time or make the trainer save and honour {resume}, "
                         "then `ablate remediate`", host, queue, rc, tail)
    if e.reason == "service_down":  # a service beside it died (or never came up): not the trainer's
        return CellState(name, "service_down", f"its service {e.service or '?'} died while it ran (exit "
                         f"{rc}); `ablate remediate` re-runs it", host, queue, rc, tail)
    if rc == 0:
        return CellState(name, "sync_failed", "trained with exit 0, but there is no durable copy in "
                         "final_ckpts/", host, queue, rc)
    if rc == 3 and sync_fail is not None:
        return CellState(name, "sync_failed", f"trained, but the copy to the shared FS failed: "
                         f"{sync_fail.reason or 'no reason recorded'}; the instance-local checkpoint "
                         f"on {host} is kept", host, queue, rc)
    if rc in SIGNALLED:
        if not state.reachable(host) and not state.fresh(host, queue):
            return CellState(name, "lost", f"ended by SIG{SIGNALLED[rc]} on {host}, which does not answer "
                             "now (heartbeat stale)", host, queue, rc)
        return CellState(name, "interrupted", f"ended by SIG{SIGNALLED[rc]} (exit {rc}) on {host}; "
                         "`ablate remediate` re-runs it", host, queue, rc)
    if rc == 137 or oom_line:
        what = f"exit {rc}" + (" (SIGKILL: the OOM killer, usually)" if rc == 137 else "")
        seen = f"; log: {oom_line.strip()[:160]}" if oom_line else ""
        return CellState(name, "oom", f"out of memory: {what}{seen}", host, queue, rc, tail)
    if rc == 125:
        return CellState(name, "crashed", "exit 125: the wrapper could not set up the run (spec, ckpt dir "
                         "or log not writable)", host, queue, rc, tail)
    last_line = next((t.strip() for t in reversed(tail) if t.strip() and not t.startswith("# ablate")), "")
    seen = f": {last_line[:160]}" if last_line else ""
    return CellState(name, "crashed", f"exit {rc}{seen}", host, queue, rc, tail)
