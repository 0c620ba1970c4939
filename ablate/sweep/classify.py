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
    its last `end` in the owner's events: rc 0 -> sync_failed (no durable copy); rc 3 with a
    `sync_failed` event -> sync_failed; 129/130/143 -> interrupted (lost when its host is);
    137 or an OOM line in `tails/<name>.log` -> oom; other -> crashed (with the tail);
    no `end`: the owner queue live (tmux session; or, host unreachable, a fresh running heartbeat)
    and running it -> running, or hung when its log has been silent longer than hung_after
    (heartbeat `t` - `log_mtime`, both host clock, plus the heartbeat's age; without log fields
    the heartbeat's age); owner host unreachable and its heartbeat stale -> lost (never on one
    signal); else -> interrupted (stopped, or its process is gone while the host is alive).
  no claim: a live queue has the line at or after its current index -> queued; else never_ran.
A result dir without MANIFEST.json (a partial copy) makes a cell that is not running sync_failed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.config.project import Project
from ablate.errors import AblateError
from ablate.remote.layout import SweepLayout, session_name
from ablate.sweep.cells import Cell, QueueFile, Roster, build_roster, parse_queue_text, read_all_queues
from ablate.transport import SharedFS, fan_out, host_transport, shared_fs
from ablate.util.fs import read_json_object

STATES = ("verified", "synced", "queued", "running", "hung", "lost", "interrupted", "oom", "crashed",
          "sync_failed", "corrupt", "stale", "never_ran")
# What `ablate remediate` re-runs: everything that is not done, doing, or about to be done.
TARGETS = frozenset({"never_ran", "lost", "interrupted", "oom", "crashed", "sync_failed", "corrupt", "stale"})
SIGNALLED = {129: "HUP", 130: "INT", 143: "TERM"}
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

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "host": self.host, "queue": self.queue,
                               "rc": self.rc, "reason": self.reason}
        if self.tail:
            out["tail"] = list(self.tail)
        if self.pending:
            out["pending"] = self.pending
        return out

    def line(self) -> str:
        where = f"{self.host or '-'}/{self.queue or '-'}"
        return f"{self.state:<12} {self.name:<24} {where:<20} {self.reason}"


@dataclass(frozen=True)
class Verification:
    """What the last reconcile found, keyed by the sha256 of the MANIFEST.json it saw."""

    verified: Mapping[str, str | None]
    corrupt: Mapping[str, tuple[str, str | None]]  # name -> (error, manifest sha256)
    source: str = "local"

    @classmethod
    def from_record(cls, rec: Mapping[str, Any] | None) -> Verification | None:
        """From `gate/reconcile.json` (its `cells` are the verified ones; `corrupt` added by this
        module's reconcile, absent in older records)."""
        if not rec:
            return None
        raw_cells, raw_bad = rec.get("cells"), rec.get("corrupt")
        cells: Mapping[str, Any] = raw_cells if isinstance(raw_cells, dict) else {}
        bad: Mapping[str, Any] = raw_bad if isinstance(raw_bad, dict) else {}
        verified = {n: (c or {}).get("manifest_sha256") for n, c in cells.items() if isinstance(c, dict)}
        corrupt = {n: (str(b.get("error") or "failed verification"), b.get("manifest_sha256"))
                   for n, b in bad.items() if isinstance(b, dict)}
        return cls(verified, corrupt, str(rec.get("source") or "local"))


@dataclass
class Classification:
    cells: dict[str, CellState]  # roster order
    unreachable: dict[str, str] = field(default_factory=dict)  # host -> why
    snap: Mapping[str, Any] = field(default_factory=dict)
    sessions: Mapping[str, set[str] | None] = field(default_factory=dict)
    queues: Mapping[str, QueueFile] = field(default_factory=dict)
    lost_hosts: dict[str, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return state_counts(self.cells.values())

    def not_verified(self) -> list[CellState]:
        return [c for c in self.cells.values() if c.state != "verified"]


def state_counts(cells: Any) -> dict[str, int]:
    counts = dict.fromkeys(STATES, 0)
    for c in cells:
        counts[c.state] += 1
    return {s: n for s, n in counts.items() if n}


def count_line(counts: Mapping[str, int]) -> str:
    return "cells: " + (", ".join(f"{n} {s}" for s, n in counts.items()) or "none")


# Text output lists what needs a hand first: a long sweep's queued cells must not hide a crash.
_URGENCY = {s: i for i, s in enumerate((
    "hung", "lost", "oom", "crashed", "sync_failed", "corrupt", "stale", "interrupted", "never_ran",
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


# --------------------------------------------------------------------------- I/O


def stale_after(project: Project) -> float:
    """A heartbeat older than this (FS clock) is stale: the same rule as status and release."""
    return float(max(3 * project.heartbeat_secs, 30))


def all_queues(project: Project, snap: Mapping[str, Any]) -> dict[str, QueueFile]:
    """The local queue files, plus the FS copies of queues this laptop lacks (another controller's)."""
    local = {q.name: q for q in read_all_queues(project)}
    out: dict[str, QueueFile] = {}
    for name, text in sorted((snap.get("queues") or {}).items()):
        if name in local:
            continue
        try:
            out[name] = parse_queue_text(name, text, project.tasks, project.queues_dir / f"{name}.txt")
        except AblateError:
            continue  # an unreadable foreign copy is no roster of ours
    out.update(local)
    return dict(sorted(out.items()))


def sweep_roster(project: Project, fs: SharedFS) -> Roster:
    """The roster of the local queue files plus the FS copies of launched queues this laptop lacks,
    so a controller whose local state is gone rebuilds it from the FS (one probe round trip). When
    the FS cannot be read, the local queue files alone (a command that needs the FS fails there)."""
    try:
        copies = fs.probe("queues", {"root": fs.root})
    except (AblateError, OSError):
        copies = {}
    return build_roster(all_queues(project, copies).values())


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


def ask_hosts(project: Project, hosts: Sequence[str]) -> tuple[dict[str, set[str] | None], dict[str, str]]:
    """Each host's live tmux sessions (None: not reachable) and why the unreachable ones are."""
    answers = fan_out(list(hosts), lambda n: host_transport(project, project.hosts[n]).tmux_sessions())
    return sessions_of(project, answers)


def sessions_of(project: Project, answers: Mapping[str, Any]) -> tuple[dict[str, set[str] | None],
                                                                         dict[str, str]]:
    sessions: dict[str, set[str] | None] = {}
    unreachable: dict[str, str] = {}
    for name in project.hosts:
        got = answers.get(name)
        if isinstance(got, Exception) or got is None:
            sessions[name] = None
            text = str(got) if got is not None else "not asked"
            unreachable[name] = text.splitlines()[0] if text else type(got).__name__
        else:
            sessions[name] = set(got)
    return sessions, unreachable


def collect(project: Project, fs: SharedFS | None = None,
            verification: Verification | None = None) -> Classification:
    """Snapshot the FS and ask every host's tmux at once, then classify every cell."""
    fs = fs or shared_fs(project)
    with ThreadPoolExecutor(max_workers=1) as pool:
        asked = pool.submit(ask_hosts, project, list(project.hosts))
        snap: Mapping[str, Any] = fs.probe("snapshot", {"root": fs.root})
        sessions, unreachable = asked.result()
    if verification is None:
        verification = Verification.from_record(
            read_json_object(fs.read_bytes(SweepLayout(fs.root).reconcile_record)))
    queues = all_queues(project, snap)
    cells = classify(queues, snap, sessions, sweep=project.sweep, cfg_sha=cfg_hashes(project, queues),
                     verification=verification, stale_after=stale_after(project),
                     hung_after=project.monitor.hung_after)
    return Classification(cells, unreachable, snap, sessions, queues,
                          lost_hosts(snap, sessions, stale_after(project)))


def for_status(project: Project, queues: Mapping[str, QueueFile], snap: Mapping[str, Any],
               sessions: Mapping[str, set[str] | None], record: bytes | None) -> tuple[
                   dict[str, CellState], list[IdleHost]]:
    """`ablate status`'s cell states and idle hosts, from the snapshot and tmux answers it read."""
    stale = stale_after(project)
    cells = classify(queues, snap, sessions, sweep=project.sweep, cfg_sha=cfg_hashes(project, queues),
                     verification=Verification.from_record(read_json_object(record)),
                     stale_after=stale, hung_after=project.monitor.hung_after)
    idle = idle_hosts(list(project.hosts), snap, sessions, sweep=project.sweep, stale_after=stale,
                      idle_after=project.monitor.idle_after)
    return cells, idle


def state_lines(cells: Mapping[str, CellState], idle: Sequence[IdleHost]) -> list[str]:
    """The per-state count, every cell that is not verified, and the idle alarm."""
    out = []
    if cells:
        out.append(count_line(state_counts(cells.values())))
        out += cell_lines([c for c in cells.values() if c.state != "verified"])
    out += [i.line() for i in idle]
    return out


# --------------------------------------------------------------------------- the pure part


def lost_hosts(snap: Mapping[str, Any], sessions: Mapping[str, set[str] | None],
               stale: float) -> dict[str, str]:
    """Hosts that do not answer AND whose every heartbeat is stale (or that have none): gone."""
    now = float(snap["now"])
    out: dict[str, str] = {}
    for host, got in sessions.items():
        if got is not None:
            continue
        ages = [now - float(hb["mtime"]) for hb in (snap.get("heartbeats") or {}).values()
                if isinstance(hb, dict) and (hb.get("data") or {}).get("host") == host]
        if not ages or min(ages) > stale:
            age = f"newest heartbeat {_age(min(ages))} old" if ages else "no heartbeat"
            out[host] = f"unreachable and {age}"
    return out


class _View:
    """Indexes over one snapshot, shared by every cell's decision."""

    def __init__(self, snap: Mapping[str, Any], sessions: Mapping[str, set[str] | None], sweep: str,
                 stale: float) -> None:
        self.snap = snap
        self.now = float(snap["now"])
        self.sessions = sessions
        self.sweep = sweep
        self.stale = stale
        self.heartbeats: Mapping[str, Any] = snap.get("heartbeats") or {}
        self.ledgers: Mapping[str, list[dict[str, Any]]] = snap.get("ledgers") or {}
        # Per events file (key host.queue): its events; per cell: (file, position) of its events.
        self.events: Mapping[str, list[dict[str, Any]]] = snap.get("events") or {}
        self.by_cell: dict[str, list[tuple[str, int]]] = {}
        for key, evs in self.events.items():
            for i, e in enumerate(evs):
                cell = e.get("cell")
                if isinstance(cell, str) and e.get("ev") in ("start", "end", "synced", "sync_failed"):
                    self.by_cell.setdefault(cell, []).append((key, i))

    def reachable(self, host: str | None) -> bool:
        return host is not None and self.sessions.get(host) is not None

    def heartbeat(self, host: str | None, queue: str | None) -> tuple[float | None, dict[str, Any]]:
        hb = self.heartbeats.get(f"{host}.{queue}") if host and queue else None
        if not isinstance(hb, dict):
            return None, {}
        data = hb.get("data")
        return self.now - float(hb["mtime"]), data if isinstance(data, dict) else {}

    def fresh(self, host: str | None, queue: str | None) -> bool:
        age, _ = self.heartbeat(host, queue)
        return age is not None and age <= self.stale

    def live(self, host: str | None, queue: str | None) -> bool:
        """The queue runs: its tmux session is there; or, its host not answering, its heartbeat is
        fresh and says running (a dropped link is not a dead queue)."""
        if host is None or queue is None:
            return False
        got = self.sessions.get(host)
        if got is not None:
            return session_name(self.sweep, host, queue) in got
        age, data = self.heartbeat(host, queue)
        return age is not None and age <= self.stale and data.get("state") == "running"

    def queue_host(self, q: QueueFile) -> str | None:
        ledger = self.ledgers.get(q.name) or []
        host = ledger[-1].get("host") if ledger else None
        return host if isinstance(host, str) else q.host

    def cell_events(self, name: str, key: str | None = None) -> list[tuple[str, int, dict[str, Any]]]:
        return [(k, i, self.events[k][i]) for k, i in self.by_cell.get(name, ()) if key is None or k == key]

    def stopped_after(self, key: str, pos: int) -> dict[str, Any] | None:
        """A `stopped` / `queue_stop` event in this file after position `pos`."""
        for e in self.events.get(key, [])[pos + 1:]:
            if e.get("ev") in ("stopped", "queue_stop"):
                return e
        return None


def classify(queues: Mapping[str, QueueFile], snap: Mapping[str, Any],
             sessions: Mapping[str, set[str] | None], *, sweep: str,
             cfg_sha: Mapping[str, str | None], verification: Verification | None,
             stale_after: float, hung_after: float) -> dict[str, CellState]:
    """name -> CellState for every cell line of `queues` (first-seen order). Pure."""
    view = _View(snap, sessions, sweep, stale_after)
    roster: dict[str, Cell] = {}
    for q in queues.values():
        for ln in q.cells:
            if ln.cell is not None and ln.cell.name not in roster:
                roster[ln.cell.name] = ln.cell
    queued, pending, idle_reason = _positions(view, queues)
    final = set(snap.get("final") or [])
    partial = set(snap.get("partial") or [])
    manifests: Mapping[str, Any] = snap.get("manifests") or {}
    claims: Mapping[str, str] = snap.get("claims") or {}
    released: Mapping[str, list[str]] = snap.get("released") or {}
    out: dict[str, CellState] = {}
    for name, cell in roster.items():
        if name in final:
            st = _durable(name, cell, manifests.get(name), cfg_sha.get(name), verification)
        elif name in claims:
            st = _claimed(view, name, claims[name], snap.get("tails") or {}, hung_after)
        elif name in queued:
            host, qn = queued[name]
            st = CellState(name, "queued", f"queue {qn} on {host} has yet to reach it", host, qn)
        elif name in pending:
            host, qn = pending[name]
            st = CellState(name, "never_ran", f"in queues/{qn}.txt, not launched yet "
                           f"(`ablate launch {qn} --host {host}`)", host, qn, pending=qn)
        else:
            why = idle_reason.get(name) or "no queue has reached it"
            if name in released:
                why = f"its claim was released by `ablate remediate`; {why}"
            st = CellState(name, "never_ran", why)
        if name in partial and st.state not in ("running", "hung"):
            st = CellState(name, "sync_failed", f"final_ckpts/{name}/ exists without MANIFEST.json "
                           "(a partial copy); `ablate remediate` sets it aside and re-runs the cell",
                           st.host, st.queue, st.rc, st.tail, st.pending, aside=True)
        out[name] = st
    return out


def _positions(view: _View, queues: Mapping[str, QueueFile]) -> tuple[
        dict[str, tuple[str, str]], dict[str, tuple[str, str]], dict[str, str]]:
    """Which live queue will still reach each cell (queued), which launched-never queue on a
    reachable host holds it (pending), and why a cell's own queue will not reach it."""
    queued: dict[str, tuple[str, str]] = {}
    pending: dict[str, tuple[str, str]] = {}
    why: dict[str, str] = {}
    for q in queues.values():
        host = view.queue_host(q)
        launched = bool(view.ledgers.get(q.name))
        if not launched:
            for ln in q.cells:
                assert ln.cell is not None
                name = ln.cell.name
                if host and view.reachable(host):
                    pending.setdefault(name, (host, q.name))
                elif host:
                    why.setdefault(name, f"in queues/{q.name}.txt for {host}, which does not answer")
                else:
                    why.setdefault(name, f"in queues/{q.name}.txt, not launched yet (no host header)")
            continue
        age, hb = view.heartbeat(host, q.name)
        if view.live(host, q.name):
            cur = hb.get("idx")
            if hb.get("from_queue"):
                cur = len(q.lines)  # on a stolen cell: its own lines are all behind it
            elif not isinstance(cur, int):
                start = (view.ledgers.get(q.name) or [{}])[-1].get("start_index")
                cur = start if isinstance(start, int) else 0
            for ln in q.cells:
                assert ln.cell is not None
                if ln.index >= cur and ln.cell.name not in queued:
                    assert host is not None
                    queued[ln.cell.name] = (host, q.name)
            continue
        if not view.reachable(host) and (age is None or age > view.stale):
            note = f"its queue {q.name} is on {host}, which is lost (unreachable, heartbeat " \
                   f"{'missing' if age is None else _age(age) + ' old'})"
        elif hb.get("state") == "stopped":
            note = f"its queue {q.name} on {host} was stopped before reaching it"
        elif hb.get("state") == "drained":
            note = f"its queue {q.name} on {host} drained without running it"
        else:
            note = f"its queue {q.name} on {host} is not running (its process is gone)"
        for ln in q.cells:
            assert ln.cell is not None
            why.setdefault(ln.cell.name, note)
    return queued, pending, why


def _durable(name: str, cell: Cell, m: Any, local_sha: str | None,
             verification: Verification | None) -> CellState:
    if not isinstance(m, dict) or not m.get("valid"):
        return CellState(name, "corrupt", "final_ckpts MANIFEST.json is unreadable or not a manifest",
                         aside=True)
    host, queue = m.get("host"), m.get("queue")
    recorded = (m.get("cfg"), m.get("task"), m.get("epochs"))
    if recorded != (cell.cfg, cell.task, cell.epochs):
        return CellState(name, "stale", f"its result was made from cfg={recorded[0]} task={recorded[1]} "
                         f"epochs={recorded[2]}; the roster has {cell.line}", host, queue, aside=True)
    want = m.get("cfg_sha256")
    if isinstance(want, str) and local_sha is not None and local_sha != want:
        return CellState(name, "stale", f"{cell.cfg} changed since the result was made "
                         f"(sha256 {want[:12]} then, {local_sha[:12]} now)", host, queue, aside=True)
    sha = m.get("sha256")
    if verification is not None:
        bad = verification.corrupt.get(name)
        if bad is not None and (bad[1] is None or bad[1] == sha):
            where = "durable copy" if verification.source == "fs" else "pulled copy"
            return CellState(name, "corrupt", f"{where} fails verification: {bad[0]}", host, queue,
                             aside=True)
        if name in verification.verified and verification.verified[name] == sha:
            return CellState(name, "verified", "loaded by the last reconcile", host, queue)
    how = "`ablate pull && ablate reconcile`" if verification is None or verification.source != "fs" \
        else "`ablate reconcile --fs`"
    return CellState(name, "synced", f"durable copy on the shared FS, not verified since it was made: {how}",
                     host, queue)


def _claimed(view: _View, name: str, owner: str, tails: Mapping[str, Any], hung_after: float) -> CellState:
    parts = owner.split()
    if len(parts) < 2:  # mkdir'd, owner not (yet) written: a runner claiming it now, or one that died
        on = next((hb.get("data") or {} for hb in view.heartbeats.values() if isinstance(hb, dict)
                   and (hb.get("data") or {}).get("cell") == name), None)
        if on and view.live(on.get("host"), on.get("queue")) and on.get("state") == "running":
            return CellState(name, "running", f"running on {on.get('host')}", on.get("host"), on.get("queue"))
        return CellState(name, "interrupted", "claimed, but its claim has no owner (its runner died "
                         "while claiming); `ablate remediate` re-runs it")
    host, queue = parts[0], parts[1]
    evs = view.cell_events(name, f"{host}.{queue}")  # the owner's file (a thief's, for a stolen cell)
    # The owner's last start or end of this cell: an `end` is an outcome; a `start` is a run in
    # progress, or one that was cut (a resumed cell starts again after its cut).
    last = next(((k, i, e) for k, i, e in reversed(evs) if e.get("ev") in ("start", "end")), None)
    if last is not None and last[2].get("ev") == "end":
        return _ended(view, name, host, queue, last, evs, tails.get(name))
    age, hb = view.heartbeat(host, queue)
    on_it = hb.get("state") == "running" and hb.get("cell") == name
    if view.live(host, queue) and (on_it or not evs):
        if not view.reachable(host):
            where = f"on {host} (not answering; its heartbeat, {_age(age or 0)} old, is fresh)"
        else:
            where = f"on {host}"
        silent = _silence(view, age, hb)
        if on_it and silent is not None and silent > hung_after:
            return CellState(name, "hung", f"running {where}, but its log has been silent for {_age(silent)} "
                             f"(hung_after {_age(hung_after)}); `ablate stop {queue} --host {host}`, then "
                             "`ablate remediate`", host, queue)
        return CellState(name, "running", f"running {where}", host, queue)
    if not view.reachable(host) and not view.fresh(host, queue):
        seen = "no heartbeat" if age is None else f"heartbeat {_age(age)} old"
        return CellState(name, "lost", f"claimed by {queue} on {host}, which does not answer ({seen}): "
                         "the instance is gone", host, queue)
    start = next(((k, i) for k, i, e in reversed(evs) if e.get("ev") == "start"), None)
    stop = view.stopped_after(start[0], start[1]) if start else None
    if stop is not None and stop.get("ev") == "stopped":
        why = f"cut by `{stop.get('by') or 'ablate stop'}` of {queue} on {host}"
    elif hb.get("state") == "stopped":
        why = f"its queue {queue} on {host} was stopped (signal) during the cell"
    elif start is None:
        why = f"claimed by {queue} on {host}, which is not running it"
    else:
        why = f"its queue {queue} on {host} is gone mid-cell (killed or rebooted) while the host is up"
    return CellState(name, "interrupted", f"{why}; `ablate launch {queue} --host {host}` resumes it there, "
                     "`ablate remediate` re-runs it", host, queue)


def _silence(view: _View, age: float | None, hb: Mapping[str, Any]) -> float | None:
    """How long the running cell's log has been silent: heartbeat `t` - `log_mtime` (one host
    clock) plus the heartbeat's own age (FS clock); the heartbeat's age without log fields."""
    if age is None:
        return None
    t, mtime = hb.get("t"), hb.get("log_mtime")
    if isinstance(t, (int, float)) and isinstance(mtime, (int, float)):
        return max(0.0, float(t) - float(mtime)) + max(0.0, age)
    return max(0.0, age)


def _ended(view: _View, name: str, host: str | None, queue: str | None,
           last_end: tuple[str, int, dict[str, Any]], evs: list[tuple[str, int, dict[str, Any]]],
           tail_info: Any) -> CellState:
    e = last_end[2]
    rc = e.get("rc") if isinstance(e.get("rc"), int) else None
    tail = tuple((tail_info or {}).get("lines") or ()) if isinstance(tail_info, dict) else ()
    oom_line = tail_info.get("oom") if isinstance(tail_info, dict) else None
    sync_fail = next((x for _, i, x in reversed(evs)
                      if x.get("ev") == "sync_failed" and i < last_end[1]), None)
    if rc == 0:
        return CellState(name, "sync_failed", "trained with exit 0, but there is no durable copy in "
                         "final_ckpts/", host, queue, rc)
    if rc == 3 and sync_fail is not None:
        return CellState(name, "sync_failed", f"trained, but the copy to the shared FS failed: "
                         f"{sync_fail.get('reason') or 'no reason recorded'}; the instance-local checkpoint "
                         f"on {host} is kept", host, queue, rc)
    if rc in SIGNALLED:
        if not view.reachable(host) and not view.fresh(host, queue):
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


# --------------------------------------------------------------------------- idle hosts


@dataclass(frozen=True)
class IdleHost:
    host: str
    idle_for: float  # seconds since its last event (FS clock)
    reachable: bool

    @property
    def next_step(self) -> str:
        return f"ablate reconcile, then ablate release {self.host}"

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "state": "idle_costing_money", "idle_for": round(self.idle_for, 1),
                "reachable": self.reachable, "next": self.next_step}

    def line(self) -> str:
        down = "" if self.reachable else " (not answering)"
        return (f"host {self.host} idle_costing_money{down}: no queue of this sweep runs there, last event "
                f"{_age(self.idle_for)} ago; next: `ablate reconcile`, then `ablate release {self.host}`")


def idle_hosts(hosts: Sequence[str], snap: Mapping[str, Any], sessions: Mapping[str, set[str] | None], *,
               sweep: str, stale_after: float, idle_after: float) -> list[IdleHost]:
    """Hosts none of whose queues is live and whose last event (events file mtime, FS clock) is
    older than idle_after. A host that never ran anything is not flagged."""
    view = _View(snap, sessions, sweep, stale_after)
    mtimes: Mapping[str, float] = snap.get("events_mtime") or {}
    out = []
    for host in hosts:
        keys = [k for k, evs in view.events.items() if evs and evs[0].get("host") == host]
        last = [float(mtimes[k]) for k in keys if k in mtimes]
        if not last:
            continue
        queues = {str(evs[0].get("queue")) for k, evs in view.events.items() if k in keys}
        if any(view.live(host, q) for q in queues):
            continue
        got = sessions.get(host)
        prefix = session_name(sweep, host, "")
        if got is not None and any(s.startswith(prefix) for s in got):
            continue  # a live queue this snapshot has no events of yet
        idle = view.now - max(last)
        if idle > idle_after:
            out.append(IdleHost(host, idle, got is not None))
    return out


def _age(seconds: float) -> str:
    s = int(max(0.0, seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
