"""Merging the hosts' own views over the FS host's snapshot, and how old a view may be. Pure.

A network FS caches on each client: what host A wrote may be invisible through host B for the FS's
visibility lag (sshfs ~20 s by default; NFS `actimeo`), while A's own writes are coherent for A.
So each queue's truth is read through the host that writes it (`ablate.sweep.hostview`), and:

- **events** files are append-only: of two views of one file, the longer is the newer;
- a **heartbeat** is rewritten in place: the later mtime (the FS server's clock) wins;
- a **claim** or a **published result** seen by its writer counts even if the FS host cannot see it
  yet, unless the controller removed it since (remediate moves a claim to `released/` and sets a
  result aside as `final_ckpts/.aside.<name>.<t>`): the writer's cache may still show the removed
  entry, so an entry older than its removal is not brought back;
- a result dir without a MANIFEST.json is **partial** only if no view sees the MANIFEST.

What nothing can confirm (a host that does not answer) stays as the FS host sees it; `FsLag` says
how old that may be: the lag `ablate doctor` measured and recorded (`gate/fslag.json`), with a
margin, or a conservative default until it has. A sweep kept in an object store has no lag: the
store is strongly consistent, and its hosts' views are empty (`ablate.sweep.hostview`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ablate.remote.host.probe import RELEASED_RE
from ablate.remote.layout import ASIDE_PREFIX

DEFAULT_LAG = 60.0  # seconds assumed until `ablate doctor` measures it: NFS's acdirmax, 3 x sshfs's 20 s
# `.aside.<name>.<t>[.staging-<k>]`, t as remediate writes it (as in `released/<name>.<t>`)
_ASIDE_RE = re.compile(r"^" + re.escape(ASIDE_PREFIX) + r"(.+)\.(\d+\.\d+)(?:\.staging-\d+)?$")


@dataclass(frozen=True)
class FsLag:
    """How long another host's write may stay invisible through this FS (seconds), and why we think so."""

    seconds: float
    note: str
    measured: float | None = None  # what doctor measured (None: not measured, or a local FS)
    store: bool = False  # the sweep is kept in an object store

    @classmethod
    def local(cls) -> FsLag:
        return cls(0.0, "one local directory: no client cache")

    @classmethod
    def from_record(cls, rec: Any) -> FsLag:
        """From `gate/fslag.json` (doctor's): its `lag` plus a margin (x1.5, at least +2 s: the lag
        moves with load); without one, `DEFAULT_LAG`. An object store's snapshot answers with
        `{"store": url, "note"}` instead: strongly consistent, no lag."""
        if isinstance(rec, dict) and isinstance(rec.get("store"), str):
            return cls(0.0, str(rec.get("note") or f"an object store ({rec['store']}): no client cache"),
                       store=True)
        lag = rec.get("lag") if isinstance(rec, dict) else None
        if isinstance(lag, (int, float)) and not isinstance(lag, bool) and 0 <= lag < 1e6:
            used = max(lag * 1.5, lag + 2.0)
            return cls(used, f"measured {lag:.1f} s by `ablate doctor`; {used:.0f} s allowed", float(lag))
        return cls(DEFAULT_LAG, f"not measured (`ablate doctor` measures it); {DEFAULT_LAG:.0f} s assumed")


def _times(entries: Any, pattern: re.Pattern[str]) -> dict[str, float]:
    """name -> the latest t of `<prefix><name>.<t>` entries."""
    out: dict[str, float] = {}
    for e in entries if isinstance(entries, list) else ():
        m = pattern.match(str(e))
        if m:
            out[m.group(1)] = max(out.get(m.group(1), 0.0), float(m.group(2)))
    return out


def _claim_time(owner: Any) -> float | None:
    parts = owner.split() if isinstance(owner, str) else []
    try:
        return float(parts[3]) if len(parts) >= 4 else None
    except ValueError:
        return None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _d(v: Any) -> dict[str, Any]:
    return dict(v) if isinstance(v, dict) else {}


def merge_views(raw: Mapping[str, Any], views: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The FS host's snapshot with each host's own view (`probe.mine`) merged over it (module doc)."""
    out = dict(raw)
    events, events_mtime, heartbeats = _d(raw.get("events")), _d(raw.get("events_mtime")), \
        _d(raw.get("heartbeats"))
    claims, manifests, tails = _d(raw.get("claims")), _d(raw.get("manifests")), _d(raw.get("tails"))
    final = [str(n) for n in raw.get("final") or () if isinstance(n, str)]
    partial = {str(n) for n in raw.get("partial") or () if isinstance(n, str)}
    released = _times([e for es in _d(raw.get("released")).values() if isinstance(es, list) for e in es],
                      RELEASED_RE)
    aside = _times(raw.get("aside"), _ASIDE_RE)
    for view in views.values():
        for key, evs in _d(view.get("events")).items():
            if isinstance(evs, list) and len(evs) >= len(events.get(key) or ()):
                events[key] = evs  # append-only: the longer view is the newer
        for key, m in _d(view.get("events_mtime")).items():
            if _num(m) is not None:
                events_mtime[key] = max(_num(events_mtime.get(key)) or 0.0, float(m))
        for key, hb in _d(view.get("heartbeats")).items():
            mine, theirs = _num(_d(hb).get("mtime")), _num(_d(heartbeats.get(key)).get("mtime"))
            if mine is not None and (theirs is None or mine >= theirs):
                heartbeats[key] = hb
        for name, owner in _d(view.get("claims")).items():
            if claims.get(name):
                continue
            t = _claim_time(owner)
            if name in released and (t is None or t <= released[name]):
                continue  # released by remediate since: the writer's cache still shows it
            if name not in claims or owner:
                claims[name] = owner
        vmanifests = _d(view.get("manifests"))
        for name in view.get("final") or ():
            if not isinstance(name, str) or name in manifests:
                continue
            m = _d(vmanifests.get(name))
            mtime = _num(m.get("mtime"))
            if name in aside and (mtime is None or mtime <= aside[name]):
                continue  # set aside by remediate since
            final.append(name)
            manifests[name] = m
        partial |= {str(n) for n in view.get("partial") or () if isinstance(n, str) and n not in aside}
        for name, tl in _d(view.get("tails")).items():
            if (_num(_d(tl).get("mtime")) or 0.0) >= (_num(_d(tails.get(name)).get("mtime")) or 0.0):
                tails[name] = tl
    out.update(events=events, events_mtime=events_mtime, heartbeats=heartbeats, claims=claims,
               final=final, manifests=manifests, partial=sorted(partial - set(final)), tails=tails)
    return out


__all__ = ["DEFAULT_LAG", "FsLag", "merge_views"]
