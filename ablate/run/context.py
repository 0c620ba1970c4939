"""One launch's world, built once and handed down (`launch`, `launch --all`; `append` and
`remediate --launch` through `launch`).

`LocalQueues.read` (ablate/run/local_queues.py): the local queue files, each read once, and the roster
they make (a name collision refuses the command here, before the lock is taken). `launch_context`:
the shared FS built once, the controller lock entered once with it, and a `LaunchContext` holding
all of it plus one transport per host, each built on first use and reused, and (for storage hosts'
queues) the controller's AWS credentials, read once on first use. A queue file that changed while
the lock was awaited (a `plan` in another shell) is read again under the lock, so what launches is
what the files say once nobody else may change them.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ablate.config.project import Project
from ablate.errors import RemoteError
from ablate.run.local_queues import LocalQueues
from ablate.run.store_launch import controller_credentials
from ablate.sweep import autostop_view
from ablate.sweep.lock import controller_lock
from ablate.sweep.snapshot import Snapshot
from ablate.transport import HostTransport, SharedFS, connect_ahead, host_transport, shared_fs
from ablate.util.fmt import Log

__all__ = ["LaunchContext", "LocalQueues", "launch_context"]


@dataclass(frozen=True)
class LaunchContext:
    """What a launch acts on, built once by `launch_context` under the controller lock."""

    project: Project
    local: LocalQueues
    fs: SharedFS
    log: Log | None
    skip_stopped: bool = False  # launch --all: plan only the live hosts
    _transports: dict[str, HostTransport] = field(default_factory=dict, repr=False, compare=False)
    _mutex: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _creds: list[dict[str, str]] = field(default_factory=list, repr=False, compare=False)

    def transport(self, host: str) -> HostTransport:
        """The one transport of `host` for this launch (hosts are asked from several threads)."""
        with self._mutex:
            if host not in self._transports:
                self._transports[host] = host_transport(self.project, self.project.hosts[host])
            return self._transports[host]

    def gone(self, snap: Snapshot) -> dict[str, Exception]:
        """`launch --all` (`skip_stopped`): the hosts that stopped themselves (autostop) and had no
        launch since, each with why it is not asked (a connect time-out would be all it answers)."""
        if not self.skip_stopped:
            return {}
        gone = [a for a in autostop_view.of_snapshot(snap).values() if a.stopped]
        return {a.host: RemoteError(f"{a.host} {a.why()} (autostop); once it is up again: `ablate launch "
                                    f"QUEUE --host {a.host}`") for a in gone}

    def credentials(self) -> dict[str, str]:
        """The controller's AWS credentials for storage hosts' queues, read once per launch (never
        kept beyond it); {} when it has none."""
        with self._mutex:
            if not self._creds:
                self._creds.append(controller_credentials())
            return self._creds[0]


@contextlib.contextmanager
def launch_context(project: Project, local: LocalQueues, op: str, hosts: Iterable[str],
                   log: Log | None, skip_stopped: bool = False) -> Iterator[LaunchContext]:
    """The controller lock (as `op`), entered once with the one shared FS, for the block; the
    context over `local` (read again only where a file changed meanwhile). `hosts`: those the
    launch will ask, connected to in the background while the lock is taken."""
    connect_ahead(project, hosts)
    fs = shared_fs(project)
    with controller_lock(project, op, log=log, fs=fs):
        yield LaunchContext(project, local.fresh(project), fs, log, skip_stopped)
