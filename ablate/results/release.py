"""`ablate release HOST`: the teardown gate of rule 8.

A host may be released only when the last reconcile (gate/reconcile.json) was complete, of the
current roster, of pulled local copies, loaded (not --no-load), the pulled copies are still what
was verified (re-stat; a file whose size or mtime moved is re-hashed against its MANIFEST), no queue
of this sweep is live on the host (tmux session, or a running heartbeat younger than
max(3 x heartbeat_secs, 30 s) by the FS's clock), and the user approves. Every unmet condition is
listed in one CheckFailed. Then the profile's `release` command runs on the controller (argv split
with shlex before the fields are filled in, never through a shell), or with none the approval is
recorded and the host declared safe to release. Either way `gate/release.<host>.json` is written.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import shlex
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablate.config.project import Host, Project
from ablate.errors import CheckFailed, ConfigError, RemoteError
from ablate.remote.checkpoints.artifacts import manifest_files
from ablate.remote.layout import MANIFEST, SweepLayout
from ablate.sweep.cells import Roster, build_roster
from ablate.sweep.classify import warn
from ablate.sweep.snapshot import SweepState, load
from ablate.transport import SharedFS, shared_fs
from ablate.util.fmt import Log
from ablate.util.fs import read_json_object

RELEASE_TIMEOUT = 600.0
Confirm = Callable[[str], bool]


@dataclass(frozen=True)
class ReleaseResult:
    host: str
    ran: str | None  # the release command, or None when only the approval was recorded
    message: str
    record: str
    roster_digest: str

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "approved": True, "ran": self.ran, "message": self.message,
                "record": self.record}

    def lines(self) -> list[str]:
        return [self.message]


def release(project: Project, host: str, yes: bool = False, confirm: Confirm | None = None,
            log: Log | None = None) -> ReleaseResult:
    from ablate.sweep.lock import controller_lock

    project.host(host)  # unknown host: ConfigError, exit 2, before touching the FS
    with controller_lock(project, f"release {host}"):  # nothing may launch between check and release
        return _release(project, host, yes, confirm, log)


def _release(project: Project, host: str, yes: bool, confirm: Confirm | None,
             log: Log | None) -> ReleaseResult:
    h = project.host(host)
    argv = release_argv(h)
    sfs = shared_fs(project)
    state = load(project, sfs)  # one read of the FS (and each host's tmux) for the roster and the queues
    warn(log, state.warnings)
    roster = build_roster(state.queues.values())  # local queue files + the FS copies this laptop lacks
    layout = SweepLayout(sfs.root)

    unmet = reconcile_conditions(sfs, layout, roster)
    unmet += live_queues(project, h, state)
    if unmet:
        raise CheckFailed(f"release {host} refused: " + "; ".join(unmet))

    if h.transport == "slurm":  # a cluster is not released: the sweep's scratch is cleaned
        argv = None
        what = f"remove its cells' scratch under {h.ckpt_root}"
    else:
        what = f"run `{shlex.join(argv)}`" if argv else "record the approval"
    question = f"All {len(roster.cells)} cells are verified locally. Release {host} ({what})?"
    if not yes:
        if confirm is None:
            raise CheckFailed(f"release {host} needs confirmation: pass --yes")
        if not confirm(question):
            raise CheckFailed(f"release {host} not confirmed; nothing done")

    ran = None
    if argv:
        _run_release(host, argv)
        ran = shlex.join(argv)
    elif h.transport == "slurm":
        ran = _clean_scratch(project, h, roster)
    record = {"t": time.time(), "host": host, "roster_digest": roster.digest(), "by": _who(), "ran": ran}
    path = layout.release_record(host)
    sfs.write_atomic(path, (json.dumps(record, indent=1) + "\n").encode())
    message = (f"{host}: the sweep's results are pulled and verified; {ran}" if h.transport == "slurm"
               else f"released {host}: ran `{ran}`" if ran else f"safe to release {host}")
    return ReleaseResult(host, ran, message, path, roster.digest())


def release_argv(h: Host) -> list[str] | None:
    """The profile's release template as argv, fields filled per token (no shell, no re-splitting)."""
    template = h.profile.release
    if not template:
        return None
    if "{instance_id}" in template and not h.instance_id:
        raise ConfigError(f"host {h.name} has no instance_id, but the release command of profile "
                          f"{h.profile.name} needs {{instance_id}}; "
                          f"add hosts.{h.name}.instance_id to ablate.yaml")
    try:
        tokens = shlex.split(template)
    except ValueError as e:
        raise ConfigError(f"{h.profile.source}: release: cannot split {template!r}: {e}") from e
    fields = {"{instance_id}": h.instance_id or "", "{host}": h.name, "{ssh}": h.ssh}
    out = []
    for token in tokens:
        for key, value in fields.items():
            token = token.replace(key, value)
        out.append(token)
    return out


def _clean_scratch(project: Project, h: Host, roster: Roster) -> str:
    """A Slurm host's release: each roster cell's checkpoint dir and log under ckpt_root removed
    where Slurm's commands run (shared scratch; a node-local ckpt_root is the nodes' to clean)."""
    from ablate.transport import host_transport

    paths = [f"{h.ckpt_root}/{n}{ext}" for n in roster.names for ext in ("", ".log")]
    r = host_transport(project, h).run(["rm", "-rf", "--", *paths], timeout=RELEASE_TIMEOUT)
    if r.rc != 0:
        raise RemoteError(f"release {h.name}: could not remove the sweep's scratch under {h.ckpt_root} "
                          f"(rc {r.rc}): {r.stderr.strip()[-300:]!r}")
    return f"rm -rf of {len(roster.names)} cell(s)' scratch under {h.ckpt_root}"


def _run_release(host: str, argv: list[str]) -> None:
    # The environment is inherited (API keys live there) and never printed.
    try:
        p = subprocess.run(argv, capture_output=True, timeout=RELEASE_TIMEOUT, stdin=subprocess.DEVNULL)
    except FileNotFoundError as e:
        raise RemoteError(f"release command for {host} not found: {argv[0]}; "
                          "fix the profile's release") from e
    except subprocess.TimeoutExpired as e:
        raise RemoteError(f"release command for {host} `{shlex.join(argv)}` timed out after "
                          f"{RELEASE_TIMEOUT:.0f}s; check the instance in the provider's console") from e
    if p.returncode != 0:
        out = p.stdout.decode(errors="replace").strip()[-300:]
        err = p.stderr.decode(errors="replace").strip()[-300:]
        raise RemoteError(f"release command for {host} `{shlex.join(argv)}` exited {p.returncode}; "
                          f"stdout: {out!r}; stderr: {err!r}; the host was not recorded as released")


def _who() -> str:
    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


# --------------------------------------------------------------------------- conditions


def reconcile_conditions(sfs: SharedFS, layout: SweepLayout, roster: Roster) -> list[str]:
    raw = sfs.read_bytes(layout.reconcile_record)
    if raw is None:
        return ["no reconcile recorded: run `ablate pull` then `ablate reconcile`"]
    rec = read_json_object(raw)
    if rec is None:
        return [f"{layout.reconcile_record} is unreadable: run `ablate reconcile` again"]
    unmet = []
    if rec.get("roster_digest") != roster.digest():
        unmet.append(f"the roster changed since the last reconcile ({len(roster.cells)} cells now, "
                     f"{rec.get('roster')} then); reconcile again")
    if not rec.get("complete"):
        unmet.append(f"the last reconcile was not complete ({rec.get('verified')}/{rec.get('roster')} cells "
                     "verified); fix the cells and run `ablate reconcile` again")
    if rec.get("source") != "local":
        unmet.append("the last reconcile checked the shared FS (--fs), not pulled copies; rule 8 needs "
                     "local copies: run `ablate pull` then `ablate reconcile`")
    elif not rec.get("load", False):
        unmet.append("the last reconcile did not load the artifacts (--no-load): run `ablate reconcile`")
    if not unmet:
        changed = changed_copies(rec, roster)
        if changed:
            shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
            unmet.append(f"pulled copies changed since the last reconcile: {shown}; "
                         "run `ablate pull` and `ablate reconcile` again")
    return unmet


def changed_copies(rec: dict[str, Any], roster: Roster) -> list[str]:
    """Cells whose pulled copy is no longer what the reconcile verified ("name (file: why)").

    Same size and mtime: trusted. Otherwise the file is re-hashed against the recorded manifest.
    """
    results = Path(str(rec.get("results_dir", "")))
    cells: dict[str, Any] = rec.get("cells") or {}
    out = []
    for name in roster.cells:
        entry = cells.get(name)
        if not isinstance(entry, dict):
            out.append(f"{name} (not in the reconcile record)")
            continue
        why = _cell_changed(results / name, entry)
        if why:
            out.append(f"{name} ({why})")
    return out


def _cell_changed(cell_dir: Path, entry: dict[str, Any]) -> str | None:
    manifest: dict[str, Any] | None = None
    for file, stat in (entry.get("files") or {}).items():
        size, mtime_ns = stat if isinstance(stat, list) and len(stat) == 2 else (None, None)
        path = cell_dir / file
        try:
            st = path.stat()
        except OSError:
            return f"{file}: gone"
        if st.st_size == size and st.st_mtime_ns == mtime_ns:
            continue
        if manifest is None:
            manifest = _manifest_if_unchanged(cell_dir, entry.get("manifest_sha256"))
            if manifest is None:
                return f"{MANIFEST}: changed"
        if file == MANIFEST:
            continue  # touched but byte-identical: _manifest_if_unchanged just checked it
        art = next((a for _, a in manifest_files(manifest)
                    if isinstance(a, dict) and a.get("file") == file), None)
        if art is None or art.get("size") != st.st_size or _sha256(path) != art.get("sha256"):
            return f"{file}: changed"
    return None


def _manifest_if_unchanged(cell_dir: Path, want: Any) -> dict[str, Any] | None:
    try:
        raw = (cell_dir / MANIFEST).read_bytes()
    except OSError:
        return None
    if hashlib.sha256(raw).hexdigest() != want:
        return None
    return read_json_object(raw)


def _sha256(path: Path) -> str | None:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def live_queues(project: Project, h: Host, state: SweepState) -> list[str]:
    """One message per queue of this sweep still busy on host h (`SweepState.busy`: a tmux session
    of this sweep there, or a fresh heartbeat that says running)."""
    busy = state.busy_queues_on(h.name, list(project.hosts))
    return [f"queue {q} {why}; wait for it to drain or run `ablate stop {q} --host {h.name}`"
            for q, why in sorted(busy.items())]
