"""Hosts that cost money with nothing of this sweep running: idle, or approved for release.

A host that stopped itself (autostop, `ablate.sweep.autostop_view`) is gone on purpose and never
listed; one whose stop command failed is listed as idle and costing money whatever its idle time
(its watcher found nothing left for it, and it bills on), with the command's failure."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ablate.sweep import autostop_view
from ablate.sweep.snapshot import Approval, SweepState
from ablate.util.fmt import age as _age


@dataclass(frozen=True)
class HostAlarm:
    """A host with no live queue of this sweep that still matters for money: idle and costing it,
    or already approved for release by `ablate release` (the gate's record on the FS)."""

    host: str
    idle_for: float  # seconds since its last event (FS clock); 0 when it never ran anything
    reachable: bool
    approval: Approval | None = None  # a release approval newer than the host's last event
    stop_failed: str | None = None  # its autostop's stop command failed: how (one line)

    @property
    def state(self) -> str:
        if self.approval is None:
            return "idle_costing_money"
        return "released" if self.approval.ran else "release_approved"

    @property
    def next_step(self) -> str:
        a = self.approval
        if a is None:
            return f"ablate reconcile, then ablate release {self.host}"
        if a.ran:
            return f"none: `{a.ran}` ran; check the platform's console that it no longer bills"
        return "release it in the platform's console (its profile has no release command)"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host": self.host, "state": self.state, "idle_for": round(self.idle_for, 1),
                               "reachable": self.reachable, "next": self.next_step}
        if self.approval is not None:
            out["approved"] = {"t": self.approval.t, "by": self.approval.by, "ran": self.approval.ran}
        out["stop_failed"] = self.stop_failed
        return out

    def line(self) -> str:
        down = "" if self.reachable else " (not answering)"
        a = self.approval
        if a is None:
            failed = f"; autostop could not stop it: {self.stop_failed}" if self.stop_failed else ""
            return (f"host {self.host} idle_costing_money{down}: no queue of this sweep runs there, last "
                    f"event {_age(self.idle_for)} ago{failed}; next: `ablate reconcile`, then `ablate "
                    f"release {self.host}`")
        when = _when(a.t)
        if a.ran:
            return f"host {self.host} released{down} {when} by {a.by or 'ablate release'}: ran `{a.ran}`"
        return (f"host {self.host} release_approved{down} {when} by {a.by or 'ablate release'}: no release "
                "command ran; release it in the platform's console")


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def host_alarms(state: SweepState, hosts: Sequence[str], idle_after: float) -> list[HostAlarm]:
    """Hosts none of whose queues is live: approved for release since their last event (whatever
    the idle time), whose autostop could not stop them (whatever the idle time), or idle longer
    than idle_after (last event = the newest events file's mtime, FS clock). A host that never ran
    anything and was never approved is not listed, nor one that stopped itself (autostop)."""
    snap = state.snap
    autostop = autostop_view.of_snapshot(snap)
    out = []
    for host in hosts:
        auto = autostop.get(host)
        if auto is not None and auto.stopped:
            continue  # gone on purpose: it bills no more
        failed = auto.failure() if auto is not None else None
        keys = [k for k, evs in snap.events.items() if evs and evs[0].host == host]
        last = [snap.events_mtime[k] for k in keys if k in snap.events_mtime]
        approval = snap.approvals.get(host)
        if approval is not None and last and approval.mtime < max(last):
            approval = None  # something ran there after the approval: it no longer holds
        if not last and approval is None and not failed:
            continue
        queues = {evs[0].queue for k, evs in snap.events.items() if k in keys}
        if any(state.live(host, q) for q in queues) or state.sessions_on(host, hosts):
            continue  # a live queue (or a session this snapshot has no events of yet)
        idle = state.now - max(last) if last else 0.0
        if approval is not None or failed or idle > idle_after:
            out.append(HostAlarm(host, idle, state.reachable(host), approval, failed))
    return out
