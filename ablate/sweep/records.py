"""The records a snapshot of the shared FS is made of, parsed from the probe's JSON: one line of
an events file, a heartbeat, a claim, a published result, a failure tail, a release approval."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ablate.util.jsonv import as_int, as_num, as_str


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
    service: str | None = None  # service_start/ready/down/failed; an `end` failed by service_down
    secs: float | None = None  # calibrate: the benchmark's measured seconds (absent when it failed)
    kept: bool = False  # calibrate: the figure was kept from an earlier sweep on the same machine
    how: str | None = None  # an `end` superseded: taken | released | gone (ablate/remote/queue/fence.py)
    away: float | None = None  # an `end` superseded: seconds since its claim was last seen held
    restored: str | None = None  # a `restore`: what the run started from (its `from`: local | copy | none)
    written: float | None = None  # a `restore`: when the checkpoint it started from was written

    @classmethod
    def parse(cls, obj: Any) -> Event | None:
        if not isinstance(obj, dict) or not isinstance(obj.get("ev"), str):
            return None
        return cls(obj["ev"], as_num(obj.get("t")), as_str(obj.get("host")), as_str(obj.get("queue")),
                   as_str(obj.get("cell")), as_int(obj.get("idx")), as_int(obj.get("rc")),
                   as_num(obj.get("dur")), bool(obj.get("resume")), as_str(obj.get("from_queue")),
                   as_str(obj.get("reason")), as_str(obj.get("by")), as_int(obj.get("slot")),
                   as_str(obj.get("service")), as_num(obj.get("secs")), obj.get("kept") is True,
                   as_str(obj.get("how")), as_num(obj.get("away")), as_str(obj.get("from")),
                   as_num(obj.get("written")))


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
    # services: name -> {"state": starting|ready|down|stopped|failed|off, "port", "gpus", "pid", "starts"}
    services: tuple[tuple[str, dict[str, Any]], ...] = ()
    # own lines passed and left to the shared head's deal: this queue takes them back if nobody does
    deferred: tuple[int, ...] = ()
    next_line: int | None = None  # its own next line (`idx` is another queue's on a cell taken from it)

    @classmethod
    def parse(cls, key: str, mtime: float, data: Any) -> Heartbeat:
        d = data if isinstance(data, dict) else {}
        svc = d.get("services")
        services = tuple((str(k), v) for k, v in svc.items() if isinstance(v, dict)) \
            if isinstance(svc, dict) else ()
        raw = d.get("deferred")
        deferred = tuple(x for x in raw if as_int(x) is not None) if isinstance(raw, list) else ()
        return cls(key, mtime, as_str(d.get("host")), as_str(d.get("queue")),
                   str(as_str(d.get("state")) or ""),
                   as_num(d.get("t")), as_int(d.get("slot")), as_int(d.get("pid")), as_int(d.get("pgid")),
                   as_int(d.get("idx")), as_str(d.get("cell")), as_num(d.get("cell_started")),
                   as_str(d.get("from_queue")), as_num(d.get("log_mtime")), as_int(d.get("log_size")),
                   as_str(d.get("run_queue")), as_str(d.get("spec")), services, deferred,
                   as_int(d.get("next")))

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
    """`claims/<name>/owner`: `host queue idx t [attempt node]`; empty while the claimer has yet to
    write it."""

    name: str
    host: str | None
    queue: str | None
    raw: str
    node: str | None = None  # a Slurm attempt's node (`host queue idx t attempt node`)

    @classmethod
    def parse(cls, name: str, text: Any) -> Claim:
        raw = text.strip() if isinstance(text, str) else ""
        parts = raw.split()
        if len(parts) < 2:
            return cls(name, None, None, raw)
        node = parts[5] if len(parts) >= 6 and parts[5] != "-" else None
        return cls(name, parts[0], parts[1], raw, node)


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


__all__ = ["Approval", "Claim", "Event", "Heartbeat", "Result", "Tail"]
