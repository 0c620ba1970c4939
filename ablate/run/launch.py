"""`ablate launch` and `launch --all`: one detached tmux session per queue per host.

`launch QUEUE --host H` is `pipeline.launch` (append and remediate start queues through it too).
`launch --all` reads the local queue files once, takes every queue whose `# ablate: host=` header
names a host, and sends them all through the launch pipeline (ablate/run/pipeline.py) in one
`LaunchContext` (ablate/run/context.py): one shared FS, one snapshot, one transport per host, one
entry of the controller lock for the whole command.
"""

from __future__ import annotations

from ablate.config.project import Project
from ablate.errors import AblateError
from ablate.run.context import LocalQueues, launch_context
from ablate.run.pipeline import LaunchRequest, LaunchResult, launch, launch_each
from ablate.util.fmt import Log

__all__ = ["LaunchResult", "launch", "launch_all"]


def launch_all(project: Project, log: Log | None = None,
               local: LocalQueues | None = None) -> list[LaunchResult]:
    """Every queue whose `# ablate: host=H` header names a host, on all hosts at once. Live queues
    are reported (`running`), not relaunched; a queue or host that fails is reported (`failed`,
    with the error) and the others still go. `local`: the queue files as `connect_planned` read them."""
    if local is None:
        local = LocalQueues.read(project)  # a name collision refuses before the lock (and its file) is taken
    ahead = [r.host for r in _planned(local, None)]  # connected to while the lock is taken
    with launch_context(project, local, "launch --all", ahead, log, skip_stopped=True) as ctx:
        return launch_each(ctx, _planned(ctx.local, log))


def _planned(local: LocalQueues, log: Log | None) -> list[LaunchRequest]:
    planned = [LaunchRequest(q.name, q.host) for q in local.queues if q.host]
    if not planned:
        raise AblateError("no queue file has a `# ablate: host=H` header; run `ablate plan`, "
                          "or launch one with `ablate launch QUEUE --host H`")
    for q in local.queues:
        if not q.host and log:
            log(f"{q.name}: no `# ablate: host=` header; skipped (launch it with --host)")
    return planned
