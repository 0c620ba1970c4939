"""`ablate autostop [--cancel] [--idle D] [--host H]...`: show, or change on a live sweep, what each
instance's autostop watcher does (ablate/remote/host/autostop_watch.py).

Alone it shows, per host, what autostop waits for (`ablate.sweep.autostop_view`). `--cancel` and
`--idle D` write `autostop/<host>.control.json` (`{"cancelled", "idle", "t", "by"}`), which the
watcher reads at each check: cancelled, it never stops the instance; an idle, it replaces the
configured one. `--idle D` alone clears a cancel (it resumes autostop); `--cancel` alone records no
idle; both: cancelled, the idle kept for the record. Without `--host`: every host with autostop on
(`autostop/<host>.settings.json`, written at launch). The records are written under the controller
lock, atomically, in one round trip; bad input (an unknown host, a bad duration, no host with
autostop on) is refused before anything is written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ablate.config.project import Project
from ablate.config.settings import parse_duration
from ablate.errors import AblateError
from ablate.sweep import autostop_view
from ablate.sweep.autostop_view import HostAutostop
from ablate.sweep.lock import controller_lock, whoami
from ablate.transport import SharedFS, shared_fs
from ablate.transport.base import WriteAtomic
from ablate.util.fmt import duration


@dataclass(frozen=True)
class AutostopResult:
    sweep: str
    hosts: dict[str, HostAutostop]  # what each host's autostop does (with the new control, when written)
    changed: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> the control record written

    def to_json(self) -> dict[str, Any]:
        return {"hosts": {h: a.to_json() for h, a in self.hosts.items()}, "changed": self.changed}

    def lines(self) -> list[str]:
        if not self.hosts:
            return [f"autostop is off on every host of sweep {self.sweep} (no autostop/<host>.settings.json "
                    "on the shared FS: a launch writes it when `autostop:` is set)"]
        out = []
        for host, a in self.hosts.items():
            rec = self.changed.get(host)
            if rec is None:
                out.append(f"{host}: {a.why()}{_control_text(a)}")
                continue
            if rec["cancelled"]:
                idle = f" (idle {duration(rec['idle'])} recorded)" if rec["idle"] is not None else ""
                did = (f"autostop cancelled{idle}: it will not stop itself (`ablate autostop --idle D "
                       f"--host {host}` resumes it)")
            else:
                did = f"autostop idle set to {duration(rec['idle'])}"
            off = "" if a.on else "; autostop is not on for it yet (recorded for when it is)"
            every = a.record.every if a.record is not None else None
            when = f"at its next check (every {every:g}s)" if every else "at its next check"
            out.append(f"{host}: {did}{off}; its watcher applies it {when}")
        return out


def _control_text(a: HostAutostop) -> str:
    c = a.control
    if c is None:
        return ""
    by = f" by {c.by}" if c.by else ""
    if c.cancelled:
        return f" (cancelled{by})"
    return f" (idle {duration(c.idle)}{by})" if c.idle is not None else ""


def _names(project: Project, hosts: Sequence[str] | None) -> list[str] | None:
    """The hosts named (each entry one name or `a,b`), every one a host of ablate.yaml."""
    if hosts is None:
        return None
    names = [n.strip() for h in hosts for n in h.split(",")]
    if not names or not all(names):
        raise AblateError(f"--host {','.join(hosts)!r}: expected host names like h1 or h1,h2")
    for h in names:
        project.host(h)  # an unknown host: ConfigError (exit 2), nothing read or written
    return list(dict.fromkeys(names))


def _read(project: Project, fs: SharedFS) -> Mapping[str, Any]:
    """The FS clock, `autostop/` and the ledgers in one round trip (a sweep kept in an object store
    answers only the whole snapshot)."""
    op = "snapshot" if project.sweep_store() is not None else "autostop"
    got = fs.probe(op, {"root": fs.root, "touch": True})
    return got if isinstance(got, dict) else {}


def autostop(project: Project, hosts: Sequence[str] | None = None, *, cancel: bool = False,
             idle: str | None = None) -> AutostopResult:
    """Show each host's autostop (`hosts`, else every host with autostop on, a record or a
    control), or, with `cancel` / `idle`, write the hosts' control records (`hosts`, else every
    host with autostop on). `hosts`: names, or comma-separated lists of them (`--host a,b`)."""
    names = _names(project, hosts)
    seconds = parse_duration(idle, "--idle", zero=True) if idle is not None else None
    fs = shared_fs(project)
    if not cancel and seconds is None:
        return AutostopResult(project.sweep, _view(_read(project, fs), names))
    what = " ".join(["--cancel"] * cancel + ([f"--idle {idle}"] if idle is not None else [])
                    + [f"--host {h}" for h in names or ()])
    with controller_lock(project, f"autostop {what}", fs=fs):
        raw = _read(project, fs)
        on = sorted(h for h, a in autostop_view.of_raw(raw).items() if a.on)
        targets = names if names is not None else on
        if not targets:
            raise AblateError(f"autostop is on for no host of sweep {project.sweep}: no "
                              "autostop/<host>.settings.json on the shared FS (a launch writes it when "
                              "`autostop:` is set); name a host with --host to record this for it anyway")
        rec = {"cancelled": cancel, "idle": seconds, "t": time.time(), "by": whoami()}
        data = (json.dumps(rec) + "\n").encode()
        fs.apply([WriteAtomic(autostop_view.control_path(fs.root, h), data) for h in targets])
    controls = raw.get("autostop_control")
    after = {**raw, "autostop_control": {**(controls if isinstance(controls, dict) else {}),
                                         **{h: rec for h in targets}}}
    return AutostopResult(project.sweep, _view(after, targets), {h: rec for h in targets})


def _view(raw: Mapping[str, Any], hosts: Sequence[str] | None) -> dict[str, HostAutostop]:
    ledgers = raw.get("ledgers")
    now = raw.get("now")
    return autostop_view.read(float(now) if isinstance(now, (int, float)) else time.time(), raw,
                              ledgers if isinstance(ledgers, dict) else {}, hosts)
