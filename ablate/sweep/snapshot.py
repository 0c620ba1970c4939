"""One typed snapshot of the sweep, and the single rule that says whether a queue is live.

Every reader of the sweep's state — status, the dashboard, reconcile's classification, remediate,
release, deploy --gc, logs, report — builds a `SweepState` with `load()`: one probe of the shared FS
(`ablate.remote.probe.snapshot`, one round trip) and, at the same time, one tmux query per host
(hosts in parallel). The raw JSON is parsed once here into frozen types; nothing downstream reads
the probe's dicts. A malformed file (another controller's, another version's, a torn write) becomes
one named warning in `warnings` and is otherwise ignored: never a crash.

**Liveness** (`SweepState.live`), the one rule: a queue is live when its host answers and its tmux
session is there; or, its host not answering, when its heartbeat says `running` and is fresh — its
age by the FS's clock at most `stale_after` = max(3 x heartbeat_secs, 30) s. A dropped link is not a
dead queue, and "SSH failed" alone never makes a host lost: a host is lost only when it does not
answer AND every heartbeat of it is stale (or it has none).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ablate.config.project import Project
from ablate.errors import AblateError
from ablate.remote.layout import session_name
from ablate.sweep.cells import QueueFile, parse_queue_text, read_all_queues
from ablate.sweep.ledger import LedgerEntry, parse_entries
from ablate.transport import SharedFS, fan_out, host_transport, shared_fs
from ablate.util.fmt import age as fmt_age
from ablate.util.jsonv import as_int, as_num, as_str

QUEUE_STATES = ("not_launched", "running", "stale", "drained", "stopped")





# --------------------------------------------------------------------------- parts of a snapshot


@dataclass(frozen=True)
class Event:
    """One line of `events/<host>.<queue>.jsonl` (docs/ARCHITECTURE.md, "Events")."""

    ev: str
    t: float | None = None
    host: str | None = None
    queue: str | None = None
    cell: str | None = None
    idx: int | None = None
    rc: int | None = None
    dur: float | None = None
    resume: bool = False
    from_queue: str | None = None
    reason: str | None = None
    by: str | None = None
    slot: int | None = None

    @classmethod
    def parse(cls, obj: Any) -> Event | None:
        if not isinstance(obj, dict) or not isinstance(obj.get("ev"), str):
            return None
        return cls(obj["ev"], as_num(obj.get("t")), as_str(obj.get("host")), as_str(obj.get("queue")),
                   as_str(obj.get("cell")), as_int(obj.get("idx")), as_int(obj.get("rc")),
                   as_num(obj.get("dur")), bool(obj.get("resume")), as_str(obj.get("from_queue")),
                   as_str(obj.get("reason")), as_str(obj.get("by")), as_int(obj.get("slot")))


@dataclass(frozen=True)
class Heartbeat:
    """`heartbeats/<host>.<queue>`: its mtime (the FS clock) is the beat; the JSON says the rest."""

    key: str  # the file name, host.queue
    mtime: float
    host: str | None = None
    queue: str | None = None
    state: str = ""  # running | drained | stopped ("" when the file does not say)
    t: float | None = None  # host clock
    slot: int | None = None
    pid: int | None = None
    pgid: int | None = None
    idx: int | None = None
    cell: str | None = None
    cell_started: float | None = None
    from_queue: str | None = None
    log_mtime: float | None = None
    log_size: int | None = None
    run_queue: str | None = None
    spec: str | None = None

    @classmethod
    def parse(cls, key: str, mtime: float, data: Any) -> Heartbeat:
        d = data if isinstance(data, dict) else {}
        return cls(key, mtime, as_str(d.get("host")), as_str(d.get("queue")),
                   str(as_str(d.get("state")) or ""),
                   as_num(d.get("t")), as_int(d.get("slot")), as_int(d.get("pid")), as_int(d.get("pgid")),
                   as_int(d.get("idx")), as_str(d.get("cell")), as_num(d.get("cell_started")),
                   as_str(d.get("from_queue")), as_num(d.get("log_mtime")), as_int(d.get("log_size")),
                   as_str(d.get("run_queue")), as_str(d.get("spec")))

    @classmethod
    def from_bytes(cls, key: str, raw: bytes | None) -> Heartbeat | None:
        """A heartbeat read alone (stop, append, logs -f poll one file); no mtime: 0."""
        from ablate.util.fs import read_json_object

        data = read_json_object(raw)
        return None if data is None else cls.parse(key, 0.0, data)

    @property
    def files(self) -> set[str]:
        """The wrapper and spec files (relative to the root) its run reads."""
        out = set()
        if self.run_queue:
            out.add(f"wrappers/{self.run_queue}")
        if self.spec:
            out.add(f"specs/{self.spec}")
        return out


@dataclass(frozen=True)
class Claim:
    """`claims/<name>/owner`: `host queue idx t`; empty while the claimer has yet to write it."""

    name: str
    host: str | None
    queue: str | None
    raw: str

    @classmethod
    def parse(cls, name: str, text: Any) -> Claim:
        raw = text.strip() if isinstance(text, str) else ""
        parts = raw.split()
        if len(parts) < 2:
            return cls(name, None, None, raw)
        return cls(name, parts[0], parts[1], raw)


@dataclass(frozen=True)
class Result:
    """A published result `final_ckpts/<name>/` with its MANIFEST.json's identity."""

    name: str
    sha256: str | None  # of the MANIFEST.json bytes
    valid: bool  # the manifest parses as a JSON object
    cfg: str | None = None
    task: str | None = None
    epochs: int | None = None
    cfg_sha256: str | None = None
    host: str | None = None
    queue: str | None = None

    @classmethod
    def parse(cls, name: str, m: Any) -> Result:
        if not isinstance(m, dict):
            return cls(name, None, False)
        return cls(name, as_str(m.get("sha256")), bool(m.get("valid")), as_str(m.get("cfg")),
                   as_str(m.get("task")), as_int(m.get("epochs")), as_str(m.get("cfg_sha256")),
                   as_str(m.get("host")), as_str(m.get("queue")))


@dataclass(frozen=True)
class Tail:
    """`tails/<name>.log`: the last log lines run_queue kept of a cell that failed."""

    lines: tuple[str, ...]
    oom: str | None  # the first line that reads as an out-of-memory death
    mtime: float | None


@dataclass(frozen=True)
class Approval:
    """`gate/release.<host>.json`: `ablate release` approved (and maybe released) the host."""

    host: str
    t: float  # when it was approved (the controller's clock), for people
    mtime: float  # the record's mtime (the FS's clock), to compare with the host's last event
    ran: str | None  # the profile's release command that ran, or None (approval recorded only)
    by: str | None


@dataclass(frozen=True)
class Snapshot:
    """What the shared FS held at one moment (`now`, the FS's own clock), parsed."""

    now: float
    events: Mapping[str, tuple[Event, ...]] = field(default_factory=dict)  # host.queue -> events
    events_mtime: Mapping[str, float] = field(default_factory=dict)
    heartbeats: Mapping[str, Heartbeat] = field(default_factory=dict)  # host.queue -> heartbeat
    claims: Mapping[str, Claim] = field(default_factory=dict)
    results: Mapping[str, Result] = field(default_factory=dict)  # published: MANIFEST.json present
    partial: frozenset[str] = frozenset()  # result dirs without MANIFEST.json
    staging: tuple[str, ...] = ()  # `.staging.*` entries of final_ckpts/
    tails: Mapping[str, Tail] = field(default_factory=dict)
    ledgers: Mapping[str, tuple[LedgerEntry, ...]] = field(default_factory=dict)
    queue_copies: Mapping[str, str] = field(default_factory=dict)  # queues/<q>.txt on the FS
    released: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # released/ entries by cell
    approvals: Mapping[str, Approval] = field(default_factory=dict)
    reconcile: Mapping[str, Any] | None = None  # gate/reconcile.json, the last reconcile's record
    warnings: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)  # what an op adds (report: metrics)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> Snapshot:
        warn: list[str] = []
        now = as_num(raw.get("now"))
        if now is None:
            raise AblateError("the shared FS probe answered without a clock (`now`); is the probe "
                              "on the host the same version as this ablate?")
        events = {str(k): tuple(e for e in (Event.parse(o) for o in v) if e is not None)
                  for k, v in _dict(raw.get("events")).items() if isinstance(v, list)}
        heartbeats = {}
        for key, hb in _dict(raw.get("heartbeats")).items():
            mtime = as_num(hb.get("mtime")) if isinstance(hb, dict) else None
            if mtime is None:
                continue
            data = hb.get("data")
            if not isinstance(data, dict):
                warn.append(f"heartbeats/{key} on the shared FS is not a JSON object; only its age is used")
            heartbeats[str(key)] = Heartbeat.parse(str(key), mtime, data)
        ledgers = {}
        for q, objs in _dict(raw.get("ledgers")).items():
            objs = objs if isinstance(objs, list) else []
            ledgers[str(q)] = parse_entries(objs)
            skipped = len(objs) - len(ledgers[str(q)])
            if skipped:
                warn.append(f"queues/{q}.ledger on the shared FS has {skipped} line(s) that are not "
                            "ledger entries; they are ignored")
        tails = {}
        for name, tl in _dict(raw.get("tails")).items():
            if isinstance(tl, dict):
                lines = tuple(str(x) for x in tl.get("lines") or () if isinstance(x, str))
                tails[str(name)] = Tail(lines, as_str(tl.get("oom")), as_num(tl.get("mtime")))
        approvals = {}
        for host, rec in _dict(raw.get("approvals")).items():
            t = as_num(rec.get("t")) if isinstance(rec, dict) else None
            if t is None or not isinstance(rec, dict):
                warn.append(f"gate/release.{host}.json on the shared FS is unreadable; ignored")
                continue
            approvals[str(host)] = Approval(str(host), t, as_num(rec.get("mtime")) or t,
                                            as_str(rec.get("ran")), as_str(rec.get("by")))
        manifests = _dict(raw.get("manifests"))
        known = {"now", "events", "events_mtime", "heartbeats", "claims", "final", "manifests", "partial",
                 "staging", "tails", "ledgers", "queues", "released", "approvals", "reconcile"}
        return cls(
            now=now, events=events,
            events_mtime={str(k): float(v) for k, v in _dict(raw.get("events_mtime")).items()
                          if as_num(v) is not None},
            heartbeats=heartbeats,
            claims={str(n): Claim.parse(str(n), o) for n, o in _dict(raw.get("claims")).items()},
            results={str(n): Result.parse(str(n), manifests.get(n)) for n in _list(raw.get("final"))},
            partial=frozenset(str(n) for n in _list(raw.get("partial"))),
            staging=tuple(str(n) for n in _list(raw.get("staging"))),
            tails=tails, ledgers=ledgers,
            queue_copies={str(q): t for q, t in _dict(raw.get("queues")).items() if isinstance(t, str)},
            released={str(n): tuple(str(e) for e in v) for n, v in _dict(raw.get("released")).items()
                      if isinstance(v, list)},
            approvals=approvals, warnings=tuple(warn),
            reconcile=raw["reconcile"] if isinstance(raw.get("reconcile"), dict) else None,
            extra={k: v for k, v in raw.items() if k not in known},
        )

    def heartbeat(self, host: str | None, queue: str | None) -> Heartbeat | None:
        return self.heartbeats.get(f"{host}.{queue}") if host and queue else None

    def age(self, hb: Heartbeat) -> float:
        return self.now - hb.mtime


def _dict(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, dict) else {}


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


# --------------------------------------------------------------------------- the state of a sweep


@dataclass(frozen=True)
class QueueView:
    """One queue as every command reports it."""

    name: str
    host: str | None  # its last launch's host, else its header's
    slot: int | None
    state: str  # one of QUEUE_STATES
    live: bool
    heartbeat: Heartbeat | None
    heartbeat_age: float | None
    file: QueueFile | None


class SweepState:
    """A snapshot, each host's tmux answer (None: the host did not answer) and the queue files
    (local ones, plus the FS copies of queues this controller lacks). Pure: no I/O."""

    def __init__(self, snap: Snapshot, sessions: Mapping[str, set[str] | None], *,
                 sweep: str, stale_after: float, queues: Mapping[str, QueueFile] | None = None,
                 unreachable: Mapping[str, str] | None = None, warnings: Sequence[str] = ()) -> None:
        self.snap = snap
        self.now = snap.now
        self.sessions = dict(sessions)
        self.sweep = sweep
        self.stale_after = stale_after
        self.queues: dict[str, QueueFile] = dict(queues or {})
        self.unreachable = dict(unreachable if unreachable is not None else
                                {h: "did not answer" for h, s in sessions.items() if s is None})
        self.warnings: tuple[str, ...] = tuple(snap.warnings) + tuple(warnings)
        # Per cell: (events file, position) of its start/end/synced/sync_failed events.
        self._by_cell: dict[str, list[tuple[str, int]]] = {}
        for key, evs in snap.events.items():
            for i, e in enumerate(evs):
                if e.cell is not None and e.ev in ("start", "end", "synced", "sync_failed"):
                    self._by_cell.setdefault(e.cell, []).append((key, i))

    # ------------------------------------------------------------------ hosts and queues

    def reachable(self, host: str | None) -> bool:
        return host is not None and self.sessions.get(host) is not None

    def heartbeat(self, host: str | None, queue: str | None) -> tuple[float | None, Heartbeat | None]:
        """(age by the FS clock, heartbeat) of a queue on a host; (None, None) when it has none."""
        hb = self.snap.heartbeat(host, queue)
        return (None, None) if hb is None else (self.snap.age(hb), hb)

    def fresh(self, host: str | None, queue: str | None) -> bool:
        age, _ = self.heartbeat(host, queue)
        return age is not None and age <= self.stale_after

    def live(self, host: str | None, queue: str | None) -> bool:
        """THE liveness rule (module docstring)."""
        if host is None or queue is None:
            return False
        got = self.sessions.get(host)
        if got is not None:
            return session_name(self.sweep, host, queue) in got
        age, hb = self.heartbeat(host, queue)
        return age is not None and hb is not None and age <= self.stale_after and hb.state == "running"

    def busy(self, host: str | None, queue: str | None) -> bool:
        """The rule before anything is destroyed (a host released, a wrapper removed): live, or a
        fresh heartbeat that says running whatever tmux says (the process wrote it moments ago:
        it may be ending, or run under another tmux server)."""
        if self.live(host, queue):
            return True
        _, hb = self.heartbeat(host, queue)
        return hb is not None and hb.state == "running" and self.fresh(host, queue)

    def ledger(self, queue: str) -> tuple[LedgerEntry, ...]:
        return self.snap.ledgers.get(queue, ())

    def queue_host(self, queue: str) -> str | None:
        ledger = self.ledger(queue)
        if ledger and ledger[-1].host:
            return ledger[-1].host
        qf = self.queues.get(queue)
        return qf.host if qf else None

    def queue(self, name: str) -> QueueView:
        ledger = self.ledger(name)
        qf = self.queues.get(name)
        host = self.queue_host(name)
        slot = ledger[-1].slot if ledger else (qf.slot if qf else None)
        age, hb = self.heartbeat(host, name)
        live = self.live(host, name)
        if not ledger:
            state = "not_launched"
        elif live:
            state = "stale" if age is not None and age > self.stale_after else "running"
        elif hb is not None and hb.state == "drained":
            state = "drained"
        else:
            state = "stopped"
        return QueueView(name, host, slot, state, live, hb, age, qf)

    def queue_names(self) -> list[str]:
        return sorted(set(self.queues) | set(self.snap.ledgers))

    def sessions_on(self, host: str, hosts: Sequence[str]) -> set[str]:
        """This sweep's tmux sessions on `host` (not those of a host whose name extends it)."""
        got = self.sessions.get(host) or set()
        prefix = session_name(self.sweep, host, "")
        longer = [session_name(self.sweep, o, "") for o in hosts if o != host]
        longer = [p for p in longer if len(p) > len(prefix) and p.startswith(prefix)]
        return {s for s in got if s.startswith(prefix) and not any(s.startswith(p) for p in longer)}

    def busy_queues_on(self, host: str, hosts: Sequence[str]) -> dict[str, str]:
        """queue -> why it is busy on `host` (`busy`): a session of this sweep there (even of a
        queue this controller does not know), or a fresh heartbeat that says running."""
        out: dict[str, str] = {}
        names = set(self.queue_names()) | {hb.queue for hb in self.snap.heartbeats.values()
                                           if hb.host == host and hb.queue}
        for s in sorted(self.sessions_on(host, hosts)):
            q = next((n for n in sorted(names) if session_name(self.sweep, host, n) == s),
                     s[len(session_name(self.sweep, host, "")):])
            out[q] = f"is live on {host} (tmux session {s})"
        for q in sorted(names):
            age, _ = self.heartbeat(host, q)
            if q not in out and age is not None and self.busy(host, q):
                down = "" if self.reachable(host) else f"; {host} does not answer"
                out[q] = f"on {host} reported running {max(age, 0.0):.0f}s ago (heartbeat {host}.{q}{down})"
        return out

    def lost_hosts(self) -> dict[str, str]:
        """Hosts that do not answer AND whose every heartbeat is stale (or that have none): gone."""
        out: dict[str, str] = {}
        for host, got in self.sessions.items():
            if got is not None:
                continue
            ages = [self.snap.age(hb) for hb in self.snap.heartbeats.values() if hb.host == host]
            if not ages or min(ages) > self.stale_after:
                age = f"newest heartbeat {fmt_age(min(ages))} old" if ages else "no heartbeat"
                out[host] = f"unreachable and {age}"
        return out

    # ------------------------------------------------------------------ cells

    def cell_events(self, name: str, key: str | None = None) -> list[tuple[str, int, Event]]:
        """The cell's start/end/synced/sync_failed events (in `key`'s file only, when given)."""
        return [(k, i, self.snap.events[k][i]) for k, i in self._by_cell.get(name, ())
                if key is None or k == key]

    def stopped_after(self, key: str, pos: int) -> Event | None:
        """A `stopped` / `queue_stop` event in this events file after position `pos`."""
        return next((e for e in self.snap.events.get(key, ())[pos + 1:]
                     if e.ev in ("stopped", "queue_stop")), None)

    def running_cell(self, name: str) -> Heartbeat | None:
        """The heartbeat of a live queue that is running `name` now."""
        for hb in self.snap.heartbeats.values():
            if hb.cell == name and hb.state == "running" and hb.cell_started is not None \
                    and self.live(hb.host, hb.queue):
                return hb
        return None


# --------------------------------------------------------------------------- loading


def stale_after(project: Project) -> float:
    """A heartbeat older than this (FS clock) is stale: max(3 x heartbeat_secs, 30) s."""
    return float(max(3 * project.heartbeat_secs, 30))


def all_queues(project: Project, copies: Mapping[str, str]) -> tuple[dict[str, QueueFile], list[str]]:
    """The local queue files, plus the FS copies of queues this laptop lacks (another controller's),
    each copy that does not parse named in a warning and left out."""
    local = {q.name: q for q in read_all_queues(project)}
    out: dict[str, QueueFile] = {}
    warnings: list[str] = []
    for name, text in sorted(copies.items()):
        if name in local:
            continue
        try:
            out[name] = parse_queue_text(name, text, project.tasks, project.queues_dir / f"{name}.txt")
        except AblateError as e:
            warnings.append(f"queues/{name}.txt on the shared FS (another controller's) is not a queue "
                            f"this ablate.yaml can read ({e.message}); left out of the roster")
    out.update(local)
    return dict(sorted(out.items())), warnings


def ask_tmux(project: Project, hosts: Sequence[str]) -> tuple[dict[str, set[str] | None], dict[str, str]]:
    """Each host's live tmux sessions (None: not reachable) and why the unreachable ones are."""
    answers = fan_out(list(hosts), lambda n: host_transport(project, project.hosts[n]).tmux_sessions())
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


def state_of(project: Project, raw: Mapping[str, Any], sessions: Mapping[str, set[str] | None],
             unreachable: Mapping[str, str] | None = None) -> SweepState:
    """A SweepState from a probe's answer and the hosts' tmux answers (no I/O beyond the local
    queue files)."""
    snap = Snapshot.parse(raw)
    queues, warnings = all_queues(project, snap.queue_copies)
    return SweepState(snap, sessions, sweep=project.sweep, stale_after=stale_after(project), queues=queues,
                      unreachable=unreachable, warnings=warnings)


Sessions = tuple[dict[str, set[str] | None], dict[str, str]]  # ask_tmux: per host, and why not


def load(project: Project, fs: SharedFS | None = None, *, op: str = "snapshot",
         args: Mapping[str, Any] | None = None, touch: bool = True,
         ask: Callable[[], Sessions] | None = None) -> SweepState:
    """Probe the shared FS and ask every host's tmux at once (the slowest host, not the sum, sets
    the wall time), then parse. `op`/`args`: a probe op that extends `snapshot` (report). `ask`:
    what asks the hosts instead of `ask_tmux` (status asks each host one command for more)."""
    fs = fs or shared_fs(project)
    with ThreadPoolExecutor(max_workers=1) as pool:
        asked = pool.submit(ask or (lambda: ask_tmux(project, list(project.hosts))))
        raw = fs.probe(op, {"root": fs.root, "touch": touch, **(args or {})})
        sessions, unreachable = asked.result()
    return state_of(project, raw, sessions, unreachable)


def probe_only(project: Project, fs: SharedFS, *, touch: bool = False) -> Snapshot:
    """The snapshot alone, for commands that ask the hosts themselves (launch)."""
    return Snapshot.parse(fs.probe("snapshot", {"root": fs.root, "touch": touch}))


__all__ = ["QUEUE_STATES", "Approval", "Claim", "Event", "Heartbeat", "QueueView", "Result", "Snapshot",
           "SweepState", "Tail", "all_queues", "ask_tmux", "load", "probe_only", "stale_after", "state_of"]
