"""One typed snapshot of the sweep, and the single rule that says whether a queue is live.

Every reader of the sweep's state — status, the dashboard, reconcile's classification, remediate,
release, deploy --gc, logs, report — builds a `SweepState` with `load()`: one probe of the shared FS
(`ablate.remote.host.probe.snapshot`, one round trip) and, at the same time, one tmux query per host
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

from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ablate.config.project import Project
from ablate.errors import AblateError
from ablate.remote.layout import session_name
from ablate.sweep import autostop_view
from ablate.sweep.cells import QueueFile, parse_queue_text, read_all_queues
from ablate.sweep.hostview import Asked, ask_hosts, finish_asks, start_asks
from ablate.sweep.ledger import LedgerEntry, parse_entries
from ablate.sweep.records import Approval, Claim, Event, Heartbeat, Result, Tail
from ablate.sweep.views import FsLag, merge_views
from ablate.transport import SharedFS, shared_fs
from ablate.util.fmt import age as fmt_age
from ablate.util.jsonv import as_num, as_str

QUEUE_STATES = ("not_launched", "running", "stale", "drained", "stopped")





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
                 "staging", "aside", "tails", "ledgers", "queues", "released", "approvals", "reconcile",
                 "fs_lag"}
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
                 unreachable: Mapping[str, str] | None = None, warnings: Sequence[str] = (),
                 confirmed: Collection[str] | None = None, lag: FsLag | None = None,
                 view_errors: Mapping[str, str] | None = None) -> None:
        self.snap = snap
        # Hosts whose own files were read through themselves (or a coherent local FS: all); the
        # others' files are as the FS host sees them, up to `lag` old (ablate.sweep.views).
        self.confirmed = frozenset(sessions if confirmed is None else confirmed)
        self.lag = lag or FsLag.local()
        self.view_errors = dict(view_errors or {})
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

    def allowance(self, host: str | None) -> float:
        """How much older than the truth this host's files may look here: 0 when read through the
        host itself, else the FS's visibility lag."""
        return 0.0 if host in self.confirmed else self.lag.seconds

    def fresh(self, host: str | None, queue: str | None) -> bool:
        """The heartbeat is fresh: at most `stale_after` old, plus the lag when it was read through
        another host (a cached view makes it look older than it is: absence never taken on it)."""
        age, _ = self.heartbeat(host, queue)
        return age is not None and age <= self.stale_after + self.allowance(host)

    def last_evidence(self, host: str) -> float | None:
        """When (FS clock; a ledger's t for a launch) `host` last showed it was working, as seen here."""
        times = [hb.mtime for hb in self.snap.heartbeats.values() if hb.host == host]
        times += [m for k, m in self.snap.events_mtime.items() if k.startswith(f"{host}.")]
        times += [e.t for es in self.snap.ledgers.values() for e in es if e.host == host and e.t is not None]
        return max(times) if times else None

    def unsettled(self) -> dict[str, str]:
        """Hosts whose writes may still be invisible here (not read through themselves, and active
        within `stale_after` + the lag): host -> why. What is *absent* from their files (an end, a
        claim, a result) is not a fact until this is empty for them."""
        out: dict[str, str] = {}
        for host in self.sessions:
            if host in self.confirmed:
                continue
            last = self.last_evidence(host)
            if last is None or self.now - last > self.stale_after + self.lag.seconds:
                continue
            why = self.unreachable.get(host) or self.view_errors.get(host) or "its own view was not read"
            wait = fmt_age(max(self.stale_after + self.lag.seconds - (self.now - last), 1))
            out[host] = (f"{host}'s files were read through the FS host ({why}); they may be up to "
                         f"{self.lag.seconds:.0f} s old ({self.lag.note}); settled in {wait}")
        return out

    def live(self, host: str | None, queue: str | None) -> bool:
        """THE liveness rule (module docstring)."""
        if host is None or queue is None:
            return False
        got = self.sessions.get(host)
        if got is not None:
            return session_name(self.sweep, host, queue) in got
        _, hb = self.heartbeat(host, queue)
        return hb is not None and hb.state == "running" and self.fresh(host, queue)

    def _marked(self, host: str, mark: str) -> list[str]:
        """The payloads of a Slurm host's `!<mark> ...` lines in its session answer."""
        return [s[len(mark) + 2:] for s in self.sessions.get(host) or () if s.startswith(f"!{mark} ")]

    def nodes_out(self, host: str) -> dict[str, str]:
        """A Slurm host's nodes out of service (node -> Slurm's state), as its answer listed them."""
        return {p[0]: p[1] for p in (m.split() for m in self._marked(host, "node")) if len(p) == 2}

    def jobs(self, host: str) -> dict[str, dict[str, str]]:
        """A Slurm host's jobs (job name -> id, state, nodes, reason), as its answer listed them."""
        keys = ("id", "state", "nodes", "reason")
        return {p[0]: dict(zip(keys, p[1:], strict=True))
                for p in (m.split("|") for m in self._marked(host, "job")) if len(p) == 5}

    def ended_jobs(self, host: str) -> dict[str, dict[str, str]]:
        """A Slurm host's last job of each of this sweep's sessions that squeue no longer lists, by
        sacct where the cluster keeps accounting (session -> id, state, nodes, exit): a hint, never
        a result (the FS says what happened)."""
        keys = ("id", "state", "nodes", "exit")
        return {p[0]: dict(zip(keys, p[1:], strict=True))
                for p in (m.split("|") for m in self._marked(host, "done")) if len(p) == 5}

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
            if not ages or min(ages) > self.stale_after + self.allowance(host):
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


def state_of(project: Project, raw: Mapping[str, Any], sessions: Mapping[str, set[str] | None] | Asked,
             unreachable: Mapping[str, str] | None = None) -> SweepState:
    """A SweepState from a probe's answer and the hosts' answers (`Asked`: with their own views,
    merged over the probe's; or tmux sessions alone). No I/O beyond the local queue files."""
    if not isinstance(sessions, Asked):
        down = {h: "did not answer" for h, s in sessions.items() if s is None}
    asked = sessions if isinstance(sessions, Asked) else Asked(dict(sessions), dict(unreachable or down))
    coherent = project.profile.transport == "local"  # one local directory: every view is the truth
    snap = Snapshot.parse(merge_views(raw, asked.views) if asked.views else raw)
    queues, warnings = all_queues(project, snap.queue_copies)
    return SweepState(snap, asked.sessions, sweep=project.sweep, stale_after=stale_after(project),
                      queues=queues, unreachable=asked.unreachable, warnings=warnings,
                      confirmed=set(asked.sessions) | set(project.hosts) if coherent else set(asked.views),
                      lag=FsLag.local() if coherent else FsLag.from_record(raw.get("fs_lag")),
                      view_errors=asked.view_errors)


def load(project: Project, fs: SharedFS | None = None, *, op: str = "snapshot",
         args: Mapping[str, Any] | None = None, touch: bool = True,
         ask: Callable[[], Asked] | None = None) -> SweepState:
    """Probe the shared FS and ask every host at once (its tmux and its own view: `hostview`; the
    slowest host, not the sum, sets the wall time), then merge and parse. `op`/`args`: a probe op
    that extends `snapshot` (report). `ask`: what asks the hosts instead of `ask_hosts` (status
    asks each host one command for more)."""
    fs = fs or shared_fs(project)
    if project.sweep_store() is not None:
        # The hosts first, then the store: a queue that ended between the two is then seen gone
        # with its last events (run_queue waits for them to reach the store before its session
        # ends), never claimed with no end and no session (interrupted: a cell run twice). A
        # shared FS has each host's own view for that.
        got = (ask or (lambda: ask_hosts(project)))()
        raw = fs.probe(op, {"root": fs.root, "touch": touch, **(args or {})})
        return state_of(project, raw, got)
    if ask is None:  # a host the probe says stopped itself (autostop) is not waited for
        futures = start_asks(project)
        raw = fs.probe(op, {"root": fs.root, "touch": touch, **(args or {})})
        gone = {h: "stopped itself (autostop)" for h in autostop_view.stopped_hosts(raw)}
        return state_of(project, raw, finish_asks(project, futures, gone))
    with ThreadPoolExecutor(max_workers=1) as pool:
        asked = pool.submit(ask)
        raw = fs.probe(op, {"root": fs.root, "touch": touch, **(args or {})})
        got = asked.result()
    return state_of(project, raw, got)


def probe_only(project: Project, fs: SharedFS, *, touch: bool = False) -> Snapshot:
    """The snapshot alone, for commands that ask the hosts themselves (launch)."""
    return Snapshot.parse(fs.probe("snapshot", {"root": fs.root, "touch": touch}))


__all__ = ["QUEUE_STATES", "Approval", "Asked", "Claim", "Event", "Heartbeat", "QueueView", "Result",
           "Snapshot", "SweepState", "Tail", "all_queues", "load", "probe_only", "stale_after", "state_of"]
