"""`ablate status`'s round trips, started the moment the project is loaded (`cli.status`), before
the modules that read their answers are imported: each host's query (`hostinfo.ask_each`) and the
shared FS's snapshot probe go out first, and the ~0.1 s of imports runs while they are out.

`start` begins them (and each ssh host's `ssh -G`) and keeps them for the next `take` of the same
project in this process (a live status's: `live_info`); `take` hands over what was started (once)
or starts them now. What a round trip raises is raised where its answer is read, as when it ran
there. A sweep kept in a store is read in its own order (the hosts,
then the store: `ablate.sweep.snapshot.load`): nothing is started ahead for it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from ablate.config.project import Project
from ablate.errors import AblateError
from ablate.monitor.hostinfo import HostLive, ask_each
from ablate.transport import SharedFS, fanout, resolve_ahead, shared_fs


@dataclass(frozen=True)
class Started:
    asking: dict[str, Future[HostLive]]  # each host's query
    probe: Future[Any]  # the FS's `snapshot` probe: its raw answer

    def snapshot(self) -> Any:
        """The probe's answer (what `fs.probe` returned, or raised)."""
        return self.probe.result()


_STARTED: dict[tuple[str, str, bool], Started] = {}
_LOCK = threading.Lock()


def _key(project: Project, live_info: bool) -> tuple[str, str, bool]:
    return str(project.dir), project.sweep, live_info


def _begin(project: Project, fs: SharedFS, live_info: bool) -> Started:
    asking = ask_each(project, live=live_info)
    probe = fanout.start_each(["probe"], lambda _: fs.probe("snapshot", {"root": fs.root, "touch": True}))
    return Started(asking, probe["probe"])


def start(project: Project, trips: bool = True) -> None:
    """Start each ssh host's `ssh -G` now (`resolve_ahead`) and, with `trips`, status's round trips
    (a live status's). A project whose FS cannot be opened starts no trip: `status` says why where
    it always has."""
    resolve_ahead(project)
    if not trips or project.sweep_store() is not None:
        return
    try:
        fs = shared_fs(project)
    except AblateError:
        return
    started = _begin(project, fs, True)
    with _LOCK:
        _STARTED[_key(project, True)] = started


def take(project: Project, fs: SharedFS, live_info: bool) -> Started:
    """The round trips `start` began for this project (handed over once), else started now."""
    with _LOCK:
        started = _STARTED.pop(_key(project, live_info), None)
    return started if started is not None else _begin(project, fs, live_info)
