"""What a launch tells a host's autostop watcher (`ablate/remote/host/autostop_watch.py`): its
settings, `autostop/<host>.settings.json` on the sweep's storage, written with the launch's ledger
entries (so the queue's runner process finds it when it starts, and starts the watcher); removed
when the host has no `autostop:` any more (its watcher then ends). The latest launch onto a host
wins; `ablate autostop` changes them on a live sweep through `<host>.control.json` instead."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable

from ablate.config.project import Host, Project
from ablate.transport.base import FSOp, Remove, WriteAtomic


def settings_path(root: str, host: str) -> str:
    return posixpath.join(root, "autostop", f"{host}.settings.json")


def settings(project: Project, host: Host) -> dict[str, object] | None:
    """The watcher's settings for `host`; None when autostop is off for it (a Slurm host's job
    ends by itself when its queue drains: never a watcher there)."""
    a = host.autostop
    if a is None or host.transport == "slurm":
        return None
    arts = project.artifacts
    artifacts: dict[str, object] = {"checkpoint": list(arts.checkpoint), "pick": arts.pick,
                                    "metrics": arts.metrics, "metrics_keys": list(arts.metrics_keys)}
    if arts.verify:
        artifacts["verify"] = dict(arts.verify)
    return {"idle": a.idle, "command": a.command, "keep": a.keep, "artifacts": artifacts,
            "steal": project.steal, "heartbeat": project.heartbeat_secs,
            "tasks": " ".join(f"{t.name}={t.epochs}" for t in project.tasks.values())}


def settings_ops(project: Project, root: str, hosts: Iterable[str]) -> list[FSOp]:
    """One op per launched host: its settings written, or removed when autostop is off for it."""
    ops: list[FSOp] = []
    for name in sorted(set(hosts)):
        got = settings(project, project.hosts[name])
        path = settings_path(root, name)
        ops.append(Remove(path) if got is None else
                   WriteAtomic(path, (json.dumps(got, sort_keys=True) + "\n").encode()))
    return ops


def autostop_note(e: BaseException) -> str:
    return (f"autostop's settings were not written ({e}): the hosts' watchers keep what they had; "
            "launch again to write them")
