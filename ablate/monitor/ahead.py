"""`ablate status`'s round trips, started the moment the project is loaded (`cli.status`), before
the modules that read their answers are imported: each host's query (`hostinfo.ask_each`) and the
shared FS's snapshot probe go out first, and the ~0.1 s of imports runs while they are out.

`start` begins them (and each ssh host's `ssh -G`) and returns them; the caller hands them to the
`status` that follows (`status(..., sent=...)`), which begins its own when given none. Nothing is
kept between calls: a status never reads another's answers. What a round trip raises is raised where
its answer is read, as when it ran there. A sweep kept in a store is read in its own order (the
hosts, then the store: `ablate.sweep.snapshot.load`): nothing is started ahead for it.
"""

from __future__ import annotations

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


def begin(project: Project, fs: SharedFS, live_info: bool) -> Started:
    """Each host's query and the FS's snapshot probe, sent now."""
    asking = ask_each(project, live=live_info)
    probe = fanout.start_each(["probe"], lambda _: fs.probe("snapshot", {"root": fs.root, "touch": True}))
    return Started(asking, probe["probe"])


def start(project: Project, trips: bool = True) -> Started | None:
    """Start each ssh host's `ssh -G` now (`resolve_ahead`) and, with `trips`, a live status's round
    trips, returned for it. A project whose FS cannot be opened starts no trip: `status` says why
    where it always has."""
    resolve_ahead(project)
    if not trips or project.sweep_store() is not None:
        return None
    try:
        fs = shared_fs(project)
    except AblateError:
        return None
    return begin(project, fs, True)
