"""Autostop's decision (issue 46, first step: the decision alone, not yet run on an instance): may
this instance stop itself now? Stdlib only (it is meant to run on the instance, in the runner's
zipapp, with the controller absent).

An instance stops itself only when all of these hold, checked in this order (the first that does
not hold is what it waits for, and what `status` will say):

1. autostop is on for it and was not cancelled;
2. none of its queues has a running or claimable cell (`running cells: q1 q2`);
3. nothing in the sweep is left that it could take: an unclaimed line of its own queues, or (with
   stealing on) one a steal would give it (`work left: 3 cells`);
4. every result it published is durable and verified in place, the way `reconcile --fs` checks
   (never a pickle executed): while one is not, its own disk may hold the only good copy
   (`unverified result: c4 (hash mismatch)`);
5. it is not one of the `keep` instances kept up while cells of the sweep wait for `ablate
   remediate` (failed, lost or unverified): who stays is decided once, on the sweep's storage, so
   that two instances never each count on the other (`kept for remediation`);
6. its idle time has passed since its last useful work (`stops in 6 min`); then `stop`.

`elect` picks the instances kept for remediation: the fastest by learned speed, ties by name.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Settings:
    """`autostop: {idle, command, keep}` of one host (the profile's, else ablate.yaml's)."""

    idle: float  # seconds after the last useful work
    command: str  # run through `sh -c` on the instance
    keep: int = 1  # instances kept up while cells wait for remediate


@dataclass(frozen=True)
class Facts:
    """What the instance sees of the sweep at one check."""

    now: float
    host: str
    running: Sequence[str] = ()  # its queues with a running or claimable cell
    own_unclaimed: Sequence[str] = ()  # cells of its own queues' lines nobody has claimed
    stealable: Sequence[str] = ()  # cells a steal would give it (stealing on)
    unverified: Mapping[str, str] = field(default_factory=dict)  # cell -> why its result is not verified
    waiting: Sequence[str] = ()  # cells of the sweep failed, lost or unverified, waiting for remediate
    keepers: Sequence[str] | None = None  # the instances kept for remediation, once elected
    last_work: float = 0.0  # when it last did useful work (a cell's end or sync, a launch, an append)
    cancelled: bool = False  # `ablate autostop --cancel`


@dataclass(frozen=True)
class Verdict:
    kind: str  # off | running | work_left | unverified | kept | idle | stop
    why: str  # one line, as status shows it
    stop_at: float | None = None  # idle: when it stops if nothing changes

    @property
    def stop(self) -> bool:
        return self.kind == "stop"


def _names(xs: Sequence[str], most: int = 3) -> str:
    shown = " ".join(sorted(xs)[:most])
    return shown + (f" (+{len(xs) - most} more)" if len(xs) > most else "")


def _minutes(secs: float) -> str:
    return f"{math.ceil(secs / 60)} min" if secs >= 60 else f"{math.ceil(secs)} s"


def decide(s: Settings | None, f: Facts) -> Verdict:
    """The verdict of one check (the module's docstring)."""
    if s is None or f.cancelled:
        return Verdict("off", "autostop cancelled" if s is not None else "autostop is off")
    if f.running:
        return Verdict("running", f"running cells: {_names(f.running)}")
    left = [*f.own_unclaimed, *f.stealable]
    if left:
        cells = f"{len(left)} cell{'s' if len(left) != 1 else ''}"
        return Verdict("work_left", f"work left: {cells} it could take ({_names(left)})")
    bad = dict(f.unverified)
    if bad:
        name = sorted(bad)[0]
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        return Verdict("unverified", f"unverified result: {name} ({bad[name]}){more}: its disk may hold the "
                                     "only good copy")
    if f.waiting and (f.keepers is None or f.host in f.keepers):
        who = "who stays for remediation is not decided yet" if f.keepers is None else "kept for remediation"
        return Verdict("kept", f"{who}: {len(f.waiting)} cell(s) wait for `ablate remediate` "
                               f"({_names(f.waiting)})")
    stop_at = f.last_work + s.idle
    if f.now < stop_at:
        return Verdict("idle", f"stops in {_minutes(stop_at - f.now)}", stop_at)
    return Verdict("stop", f"idle since {_minutes(f.now - f.last_work)} ago: stopping", stop_at)


def elect(speeds: Mapping[str, float], keep: int) -> tuple[str, ...]:
    """The `keep` instances kept up for remediation: the fastest by learned speed (a host with no
    figure counts as 1.0), ties by name."""
    order = sorted(speeds, key=lambda h: (-speeds[h], h))
    return tuple(order[:max(0, keep)])


def elect_once(path: str, speeds: Mapping[str, float], keep: int, host: str, now: float) -> tuple[str, ...]:
    """The election, decided once on the sweep's shared FS: the first instance to need it writes
    `path` (a temp file hard-linked into place: exclusive, on NFS and sshfs too); every instance
    then reads the same answer. A record that cannot be parsed counts as no keeper elected: every
    instance stays up (never a stranded sweep)."""
    try:
        with open(path, encoding="utf-8") as f:
            return _keepers(f.read(), speeds)
    except FileNotFoundError:
        pass
    chosen = elect(speeds, keep)
    tmp = f"{path}.{host}.{os.getpid()}.tmp"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"hosts": list(chosen), "keep": keep, "by": host, "t": now}) + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another instance decided first: its answer stands
    finally:
        os.unlink(tmp)
    with open(path, encoding="utf-8") as f:
        return _keepers(f.read(), speeds)


def _keepers(text: str, speeds: Mapping[str, float]) -> tuple[str, ...]:
    try:
        rec = json.loads(text)
        hosts = rec["hosts"] if isinstance(rec, dict) else None
    except (ValueError, KeyError):
        hosts = None
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        return tuple(speeds)  # unreadable: everyone is kept
    return tuple(hosts)
