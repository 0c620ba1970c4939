"""`ablate pull`: copy the durable results from the shared FS to this machine, checksummed, resumable.

Every published result dir `final_ckpts/<name>/` (one with a MANIFEST.json) is copied, roster cells
and unexpected ones alike (the FS is the truth; a result dir not in this controller's roster may
belong to a queue file this laptop lacks, and copying it loses nothing). Staging dirs
(`.staging.*`) are never copied. Per file:
  a local file whose size and sha256 match the FS MANIFEST.json is skipped;
  otherwise it is streamed to a temp file beside it, checked for size and sha256 against the
  manifest, and only then renamed over the old one: a short or damaged copy never sits where a good
  one is expected (a bad FS copy is reported in `failed`, the local file left as it was).
MANIFEST.json itself is placed last, and only when every artifact of the dir is in place.

Progress goes to stderr: a bar (bytes and files, rate, time left) on a terminal, one line per cell
through `log` otherwise (`ablate.util.progress`).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.config.project import Project
from ablate.remote.checkpoints import verify
from ablate.remote.checkpoints.artifacts import manifest_files, sha256_file  # the one hash helper
from ablate.remote.layout import MANIFEST, SweepLayout
from ablate.results.common import artifacts_arg, default_results_dir
from ablate.sweep.classify import sweep_roster
from ablate.transport import SharedFS, shared_fs
from ablate.util.fmt import Log, size
from ablate.util.progress import TransferProgress, transfer_progress


@dataclass
class PullResult:
    to: str
    copied: int = 0  # files fetched
    skipped: int = 0  # files already up to date
    bytes: int = 0  # bytes fetched
    cells: int = 0  # result dirs present locally after the pull
    missing: list[str] = field(default_factory=list)  # roster cells with no result on the FS
    unexpected: list[str] = field(default_factory=list)  # pulled dirs not in the roster
    failed: list[dict[str, str]] = field(default_factory=list)  # {"name", "file", "error"}

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self) -> dict[str, Any]:
        return {"copied": self.copied, "skipped": self.skipped, "bytes": self.bytes, "cells": self.cells,
                "to": self.to, "missing": self.missing, "unexpected": self.unexpected, "failed": self.failed}

    def lines(self) -> list[str]:
        out = [f"failed: {f['name']}: {f['file'] or '-'}: {f['error']}" for f in self.failed]
        out += [f"not on the shared FS yet: {n}" for n in self.missing]
        out += [f"unexpected: {n} (not in the roster; pulled anyway)" for n in self.unexpected]
        out.append(f"pulled {self.cells} result dirs to {self.to}: {self.copied} files copied "
                   f"({size(self.bytes)}), {self.skipped} already up to date"
                   + (f", {len(self.failed)} failed" if self.failed else ""))
        return out


def pull(project: Project, to: Path | str | None = None, log: Log | None = None,
         bar: bool | None = None) -> PullResult:
    """Copy every published result dir. `bar`: a progress bar on stderr (default: when stderr is a
    terminal and `log` is given); otherwise one line per cell through `log`."""
    dest = Path(to).resolve() if to else default_results_dir(project)
    sfs = shared_fs(project)
    roster = sweep_roster(project, sfs, log)
    layout = SweepLayout(sfs.root)
    # One round trip: the listing and every manifest; no hashing or loading on the FS side.
    tree = sfs.probe("verify", {"dir": layout.final, "artifacts": artifacts_arg(project), "names": [],
                                "also": list(roster.cells), "load": False, "hash": False})
    result = PullResult(to=str(dest))
    published = [d for d in tree["dirs"] if tree["cells"][d]["manifest_sha256"] is not None]
    result.missing = [n for n in roster.cells if n not in published]
    result.unexpected = [d for d in published if d not in roster.cells]
    total_bytes, total_files = _totals(tree, published)
    with transfer_progress(log, total_bytes, total_files, bar) as progress:
        for i, name in enumerate(published, 1):
            before = (result.copied, result.skipped, result.bytes, len(result.failed))
            ok = _pull_dir(sfs, f"{layout.final}/{name}", dest / name, name, tree["cells"][name], result,
                           progress)
            result.cells += ok
            copied, skipped, nbytes = (result.copied - before[0], result.skipped - before[1],
                                       result.bytes - before[2])
            note = (f"{copied} file(s) copied ({size(nbytes)}), {skipped} up to date" if ok else
                    f"FAILED: {'; '.join(f['file'] + ': ' + f['error'] for f in result.failed[before[3]:])}")
            progress.cell_done(i, len(published), name, note)
    return result


def _totals(tree: dict[str, Any], published: list[str]) -> tuple[int, int]:
    """Bytes and files a full pull moves, from the manifests (MANIFEST.json's own size from the listing)."""
    nbytes = files = 0
    for name in published:
        info = tree["cells"][name]
        manifest = info.get("manifest")
        for _, entry in manifest_files(manifest if isinstance(manifest, dict) else None):
            if isinstance(entry, dict) and isinstance(entry.get("size"), int):
                nbytes += entry["size"]
                files += 1
        listed = (info.get("files") or {}).get(MANIFEST)
        nbytes += int(listed[0]) if isinstance(listed, list) and listed else 0
        files += 1
    return nbytes, files


def _pull_dir(sfs: SharedFS, remote: str, local: Path, name: str, info: dict[str, Any],
              result: PullResult, progress: TransferProgress) -> bool:
    manifest = info["manifest"]
    if not isinstance(manifest, dict):
        result.failed.append({"name": name, "file": MANIFEST, "error": "MANIFEST.json on the "
                              "shared FS is unreadable; run `ablate reconcile --fs`"})
        return False
    local.mkdir(parents=True, exist_ok=True)
    all_ok = True
    for role, entry in manifest_files(manifest):
        file = entry.get("file") if isinstance(entry, dict) else None
        if not verify.safe_relpath(file) or not isinstance(entry.get("size"), int) \
                or not isinstance(entry.get("sha256"), str):
            result.failed.append({"name": name, "file": str(file or role),
                                  "error": f"MANIFEST.json entry for {role} is malformed"})
            all_ok = False
            continue
        all_ok &= _pull_file(sfs, f"{remote}/{file}", local / str(file), entry["size"], entry["sha256"],
                             name, result, progress)
    if all_ok:
        all_ok = _pull_file(sfs, f"{remote}/{MANIFEST}", local / MANIFEST, None,
                            info["manifest_sha256"], name, result, progress)
    return all_ok


def _matches(path: Path, size: int | None, sha256: str) -> bool:
    try:
        if size is not None and path.stat().st_size != size:
            return False
        return sha256_file(path) == sha256
    except OSError:
        return False


def _pull_file(sfs: SharedFS, remote: str, local: Path, size: int | None, sha256: str, name: str,
               result: PullResult, progress: TransferProgress) -> bool:
    if _matches(local, size, sha256):
        result.skipped += 1
        progress.advance(local.stat().st_size)
        progress.file_done()
        return True
    local.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{local.name}.", suffix=".part", dir=local.parent)
    os.close(fd)
    try:
        try:
            got = sfs.fetch(remote, tmp, progress.advance)
        except OSError as e:
            result.failed.append({"name": name, "file": local.name,
                                  "error": f"cannot copy from the shared FS: {e}"})
            return False
        digest = sha256_file(Path(tmp))
        if (size is not None and got != size) or digest != sha256:
            # Silent short copies happen on network FSs; the manifest is the reference.
            want = f"{size} bytes" if size is not None else "the manifest's"
            result.failed.append({"name": name, "file": local.name,
                                  "error": f"copy has {got} bytes / sha256 {digest[:12]}, expected "
                                           f"{want} / {sha256[:12]}: the FS copy is damaged; "
                                           "run `ablate reconcile --fs`"})
            return False
        os.replace(tmp, local)
        tmp = ""
        result.copied += 1
        result.bytes += got
        progress.file_done()
        return True
    finally:
        if tmp:
            Path(tmp).unlink(missing_ok=True)
