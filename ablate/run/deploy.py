"""`ablate deploy`: place the wrappers and one run spec per host on the shared FS
(ablate/run/placement.py, which every launch runs too); `--gc` removes the old versions no queue
reads any more.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass
from typing import Any

from ablate.config.project import Project
from ablate.errors import AblateError, CheckFailed
from ablate.remote.layout import SweepLayout
from ablate.run.placement import (
    DeployResult,
    packaged_learn,
    packaged_runner,
    packaged_wrappers,
    place,
    render_spec,
)
from ablate.sweep.classify import warn
from ablate.sweep.lock import controller_lock
from ablate.sweep.snapshot import load
from ablate.transport import SharedFS, shared_fs
from ablate.util.fmt import Log
from ablate.util.fs import read_json_object

# The placement's pieces, still reached here by the scripts and tests that deploy by hand.
__all__ = ["DeployResult", "GcResult", "deploy", "gc", "old_readers", "packaged_learn", "packaged_runner",
           "packaged_wrappers", "render_spec"]

def deploy(project: Project, log: Log | None = None) -> DeployResult:
    fs = shared_fs(project)
    with controller_lock(project, "deploy", log=log, fs=fs):
        return place(project, fs, log)


# --------------------------------------------------------------------------- gc

_OLD_WRAPPER = re.compile(r"^(?:(?:run_queue|run_one)\.[0-9a-f]{12}\.sh|learn\.[0-9a-f]{12}\.py"
                          r"|runner\.[0-9a-f]{12}\.pyz)$")
_OLD_SPEC = re.compile(r"^[0-9a-f]{12}\.env$")


@dataclass(frozen=True)
class GcResult:
    removed: tuple[str, ...]  # paths relative to the sweep root
    kept: tuple[str, ...]  # what DEPLOYED.json names, and files gc does not own

    def to_json(self) -> dict[str, Any]:
        return {"removed": list(self.removed), "kept": list(self.kept)}

    def lines(self) -> list[str]:
        if not self.removed:
            return [f"nothing to remove: only the deployed version is on the FS "
                    f"({len(self.kept)} file(s) kept)"]
        return [f"removed {len(self.removed)} old file(s), kept {len(self.kept)}:",
                *(f"  removed {p}" for p in self.removed)]


def gc(project: Project, log: Log | None = None) -> GcResult:
    """Remove the wrappers and specs DEPLOYED.json does not name; refused (CheckFailed, nothing
    removed) while any queue may still read one of them: a live tmux session or a fresh `running`
    heartbeat that names it, or a host that cannot be asked while its heartbeat names it."""
    fs = shared_fs(project)
    with controller_lock(project, "deploy --gc", log=log, fs=fs):
        layout = SweepLayout(fs.root)
        current = read_json_object(fs.read_bytes(layout.deployed))
        if current is None:
            raise AblateError(f"nothing is deployed on {layout.root} (no DEPLOYED.json); "
                              "`ablate deploy` first")
        keep = {f"wrappers/{current.get('run_queue')}", f"wrappers/{current.get('run_one')}",
                f"wrappers/{current.get('runner')}",
                *(f"specs/{s}" for s in (current.get("specs") or {}).values())}
        old: list[str] = []
        kept: list[str] = []
        for folder, pattern in ((layout.wrappers, _OLD_WRAPPER), (layout.specs, _OLD_SPEC)):
            for name in fs.listdir(folder):
                rel = posixpath.relpath(posixpath.join(folder, name), layout.root)
                (old if pattern.match(name) and rel not in keep else kept).append(rel)
        if not old:
            return GcResult((), tuple(sorted(kept)))
        readers = old_readers(project, fs, layout, set(old), log)
        if readers:
            raise CheckFailed("deploy --gc refused: " + "; ".join(readers) + "; nothing removed. Wait "
                              "for those queues to drain (`ablate status`) or stop them, then run it again")
        for rel in old:
            fs.remove(posixpath.join(layout.root, rel))
            if log:
                log(f"removed {rel}")
        return GcResult(tuple(sorted(old)), tuple(sorted(kept)))


def old_readers(project: Project, fs: SharedFS, layout: SweepLayout, old: set[str],
                log: Log | None = None) -> list[str]:
    """One message per queue that may still read a file in `old` (paths relative to the root): a
    live queue (the one liveness rule), or, its host not answering, any queue whose heartbeat names
    the file — a file removed under a queue that comes back would fail its next cell."""
    state = load(project, fs)
    warn(log, state.warnings)
    # (host, queue) -> the files its run reads: from its heartbeat and its last ledger entry
    uses: dict[tuple[str, str], set[str]] = {}
    for beat in state.snap.heartbeats.values():
        if beat.host and beat.queue:
            uses.setdefault((beat.host, beat.queue), set()).update(beat.files)
    for queue, ledger in state.snap.ledgers.items():
        last = ledger[-1] if ledger else None
        if last is not None and last.host:
            files = {f"wrappers/{last.run_queue}"} if last.run_queue else set()
            files |= {f"specs/{last.spec}"} if last.spec else set()
            uses.setdefault((last.host, queue), set()).update(files)
    run_one_of: dict[str, str | None] = {}  # a spec names the run_one its cells run
    for files in uses.values():
        for spec in [f for f in files if f.startswith("specs/")]:
            if spec not in run_one_of:
                run_one_of[spec] = _spec_run_one(fs.read_bytes(posixpath.join(layout.root, spec)))
            if run_one_of[spec]:
                files.add(f"wrappers/{run_one_of[spec]}")
    out: list[str] = []
    for (host, queue), files in sorted(uses.items()):
        names = sorted(files & old)
        if not names:
            continue
        age, hb = state.heartbeat(host, queue)
        if state.live(host, queue):
            why = f"is live on {host}" + (" (tmux)" if state.reachable(host) else
                                          f" (heartbeat {max(age or 0.0, 0.0):.0f}s old, host not answering)")
        elif state.busy(host, queue):  # not live, but a fresh beat says running: wait for it
            why = f"reported running on {host} {max(age or 0.0, 0.0):.0f}s ago"
        elif not state.reachable(host) and hb is not None:
            why = f"may still run: {host} cannot be reached and its heartbeat names it"
        else:
            continue
        out.append(f"queue {queue} {why}, reading {', '.join(names)}")
    return out


def _spec_run_one(raw: bytes | None) -> str | None:
    for line in (raw or b"").decode(errors="replace").splitlines():
        if line.startswith("ABLATE_RUN_ONE="):
            words = shlex.split(line.partition("=")[2])
            return posixpath.basename(words[0]) if words else None
    return None
