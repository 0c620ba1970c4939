"""What the controller makes of the autostop watchers' files (`<root>/autostop/`, read by the probe in
the same round trip as the rest of the sweep): per host, what its watcher waits for, whether the
watcher still checks, and whether the host is known to have stopped itself.

The watcher (ablate/remote/host/autostop_watch.py) rewrites `<host>.state.json` at every check with
its verdict (`kind`, `why`, times on the FS's clock); `<host>.settings.json` (written at launch) says
autostop is on for the host; `<host>.control.json` is `ablate autostop`'s (`cancelled`, `idle`).

A host is known as stopped when its last record says `stopped` and no queue was launched on it since
(a ledger's launch entry after `stopped_at`): it is gone on purpose, so it is neither idle and costing
money nor unreachable, and `status` does not wait for its connect time-out. A record older than
`SILENT_AFTER` checks, unless it says `stopped`, is a silent watcher: what it last said may no
longer hold.
"""

from __future__ import annotations

import math
import posixpath
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ablate.util.fmt import age as fmt_age
from ablate.util.jsonv import as_int, as_num, as_str


class Snapshot(Protocol):
    """What is read of `ablate.sweep.snapshot.Snapshot` (which imports this module)."""

    @property
    def now(self) -> float: ...
    @property
    def extra(self) -> Mapping[str, Any]: ...
    @property
    def ledgers(self) -> Mapping[str, Any]: ...

DIR = "autostop"
STOPPED, STOPPING, STOP_FAILED = "stopped", "stopping", "stop_failed"
SILENT_AFTER = 3  # checks (`every` seconds each) a record may be old before its watcher is silent


def control_path(root: str, host: str) -> str:
    """`autostop/<host>.control.json`: `ablate autostop`'s record the watcher reads at each check."""
    return posixpath.join(root, DIR, f"{host}.control.json")


def minutes(secs: float) -> str:
    """`6 min` (rounded up), `45 s` under a minute: as the watcher says it."""
    return f"{math.ceil(secs / 60)} min" if secs >= 60 else f"{max(0, math.ceil(secs))} s"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


@dataclass(frozen=True)
class Record:
    """`autostop/<host>.state.json`: the watcher's last verdict (times on the FS's clock)."""

    kind: str  # off | running | unsure | unverified | kept | idle | stopping | stopped | stop_failed
    why: str
    t: float | None = None
    every: float | None = None
    idle: float | None = None
    last_work: float | None = None
    stop_at: float | None = None
    stopped_at: float | None = None
    billed_idle: float | None = None
    stop_rc: int | None = None
    stop_out: str | None = None
    pid: int | None = None

    @classmethod
    def parse(cls, obj: Any) -> Record | None:
        if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
            return None
        return cls(obj["kind"], as_str(obj.get("why")) or "", as_num(obj.get("t")), as_num(obj.get("every")),
                   as_num(obj.get("idle")), as_num(obj.get("last_work")), as_num(obj.get("stop_at")),
                   as_num(obj.get("stopped_at")), as_num(obj.get("billed_idle")), as_int(obj.get("stop_rc")),
                   as_str(obj.get("stop_out")), as_int(obj.get("pid")))


@dataclass(frozen=True)
class Control:
    """`autostop/<host>.control.json`: what `ablate autostop` asked of the host's watcher."""

    cancelled: bool
    idle: float | None = None
    t: float | None = None
    by: str | None = None

    @classmethod
    def parse(cls, obj: Any) -> Control | None:
        if not isinstance(obj, dict):
            return None
        return cls(obj.get("cancelled") is True, as_num(obj.get("idle")), as_num(obj.get("t")),
                   as_str(obj.get("by")))

    def to_json(self) -> dict[str, Any]:
        return {"cancelled": self.cancelled, "idle": self.idle, "t": self.t, "by": self.by}


@dataclass(frozen=True)
class HostAutostop:
    """One host's autostop as `status` and `ablate autostop` show it, at the FS time `now`."""

    host: str
    now: float
    on: bool  # autostop/<host>.settings.json exists
    record: Record | None = None
    control: Control | None = None
    launched_since: bool = False  # a queue was launched on it after it stopped itself

    @property
    def kind(self) -> str | None:
        return self.record.kind if self.record else None

    @property
    def age(self) -> float | None:
        """Seconds since the watcher's last check (FS clock)."""
        return None if self.record is None or self.record.t is None else max(0.0, self.now - self.record.t)

    @property
    def silent(self) -> bool:
        """The watcher has not checked for `SILENT_AFTER` of its periods (a stopped host's is gone)."""
        r, age = self.record, self.age
        return (r is not None and r.kind != STOPPED and r.every is not None and r.every > 0
                and age is not None and age > SILENT_AFTER * r.every)

    @property
    def went(self) -> bool:
        """Its stop command ran and took the instance away: its last record says `stopped`, or
        `stopping` and its watcher went silent after it (the command took the box, the watcher
        with it, before it could record its end)."""
        return self.kind == STOPPED or (self.kind == STOPPING and self.silent)

    @property
    def stopped(self) -> bool:
        """It stopped itself and nothing was launched on it since: gone on purpose."""
        return self.went and not self.launched_since

    @property
    def stop_failed(self) -> bool:
        return self.kind == STOP_FAILED

    def failure(self) -> str | None:
        """Its stop command's failure, one line: rc and the last line of its output."""
        r = self.record
        if r is None or r.kind != STOP_FAILED:
            return None
        out = next((ln.strip() for ln in reversed((r.stop_out or "").splitlines()) if ln.strip()), "")
        rc = f"exited {r.stop_rc}" if r.stop_rc is not None else "failed"
        return f"its stop command {rc}" + (f": {out[-200:]}" if out else " (no output)")

    def why(self) -> str:
        """What autostop waits for on this host, one line (stop times recomputed against `now`)."""
        r = self.record
        if r is None:
            if self.control is not None and self.control.cancelled:
                return "autostop cancelled (`ablate autostop --idle D` resumes it)"
            return "autostop is on; its watcher has not reported yet" if self.on else "autostop is off"
        if self.went:
            when = _when(r.stopped_at) if r.stopped_at is not None else "an unknown time"
            billed = f", billed {minutes(r.billed_idle)} idle" if r.billed_idle is not None else ""
            text = f"stopped itself at {when}{billed}"
            return text + ("; a queue was launched on it since" if self.launched_since else "")
        if r.kind == STOP_FAILED:
            return f"{r.why or 'its stop failed'}; {self.failure()}: it keeps billing"
        if r.kind == "idle" and r.stop_at is not None:
            left = r.stop_at - self.now
            text = f"stops in {minutes(left)}" if left > 0 else "idle time passed: it stops at its next check"
        else:
            text = r.why or r.kind
        if self.silent:
            age = self.age or 0.0
            return (f"its watcher is silent: no check for {fmt_age(age)} (every {r.every:g}s); it last "
                    f"said: {text}")
        return text

    def line(self) -> str:
        if self.stopped:
            return f"host {self.host} stopped (autostop): {self.why()}"
        return f"host {self.host} autostop: {self.why()}"

    def to_json(self) -> dict[str, Any]:
        r = self.record
        age = self.age
        return {"on": self.on, "kind": self.kind, "why": self.why(), "stopped": self.stopped,
                "silent": self.silent, "age": None if age is None else round(age, 1),
                "stop_at": r.stop_at if r else None, "stopped_at": r.stopped_at if r else None,
                "billed_idle": r.billed_idle if r else None, "stop_rc": r.stop_rc if r else None,
                "stop_out": r.stop_out if r else None,
                "control": self.control.to_json() if self.control else None}


def _dict(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, dict) else {}


def _launches(ledgers: Mapping[str, Any]) -> dict[str, list[float]]:
    """host -> the times of the launches the ledgers record (raw JSON entries or parsed ones)."""
    out: dict[str, list[float]] = {}
    for entries in ledgers.values():
        for e in entries if isinstance(entries, (list, tuple)) else ():
            if isinstance(e, dict):
                host, t, op = e.get("host"), as_num(e.get("t")), e.get("op") or "launch"
            else:  # a parsed LedgerEntry (a snapshot's)
                host, t, op = getattr(e, "host", None), as_num(getattr(e, "t", None)), getattr(e, "op", None)
            if isinstance(host, str) and t is not None and op == "launch":
                out.setdefault(host, []).append(t)
    return out


def read(now: float, doc: Mapping[str, Any], ledgers: Mapping[str, Any],
         hosts: Iterable[str] | None = None) -> dict[str, HostAutostop]:
    """Per host (those with autostop on, a record or a control; or those named), from the probe's
    `autostop`, `autostop_on` and `autostop_control` keys (`doc`: its answer, or a snapshot's
    `extra`) and the ledgers (raw or parsed)."""
    states = _dict(doc.get("autostop"))
    listed = doc.get("autostop_on")
    on = {h for h in listed if isinstance(h, str)} if isinstance(listed, list) else set()
    controls = _dict(doc.get("autostop_control"))
    launches = _launches(ledgers)
    names = list(hosts) if hosts is not None else sorted(on | set(states) | set(controls))
    out: dict[str, HostAutostop] = {}
    for h in names:
        rec = Record.parse(states.get(h))
        since = bool(rec is not None and rec.kind in (STOPPED, STOPPING) and rec.stopped_at is not None
                     and any(t > rec.stopped_at for t in launches.get(h, ())))
        out[h] = HostAutostop(h, now, h in on, rec, Control.parse(controls.get(h)), since)
    return out


def of_raw(raw: Mapping[str, Any]) -> dict[str, HostAutostop]:
    """From a probe's answer (`snapshot` or `autostop`)."""
    now = as_num(raw.get("now")) or 0.0
    return read(now, raw, _dict(raw.get("ledgers")))


def of_snapshot(snap: Snapshot) -> dict[str, HostAutostop]:
    """From a parsed `Snapshot` (the probe's autostop keys are in its `extra`)."""
    return read(snap.now, snap.extra, snap.ledgers)


def stopped_hosts(raw: Mapping[str, Any]) -> set[str]:
    """The hosts a probe's answer says stopped themselves (and were not launched on since)."""
    return {h for h, a in of_raw(raw).items() if a.stopped}


__all__ = ["DIR", "SILENT_AFTER", "STOPPED", "STOPPING", "STOP_FAILED", "Control", "HostAutostop", "Record",
           "control_path", "minutes", "of_raw", "of_snapshot", "read", "stopped_hosts"]
