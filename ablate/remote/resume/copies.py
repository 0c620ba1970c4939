"""A running cell's resume checkpoint made durable on the sweep's shared FS, and brought back where
the cell runs again (issue 45; docs/ARCHITECTURE.md, "Resume copies"). Stdlib only: part of the
runner's zipapp; the checks it runs on a copy import their libraries only when a file needs them.

Under the sweep root, per cell:

    resume/<cell>/<seq>/                a committed copy: the files at their paths under the
                                        cell's {ckpt_dir}, and RESUME.json, written last
    resume/<cell>/.stage.<seq>.<host>.<pid>/   one being written: never restored
    resume/<cell>/attempts              one line per start of the cell (`host queue t`)

A copy is staged, each file checked against its source (size and sha256, and the sources unchanged
since they were looked at: a file the trainer rewrote meanwhile is no copy of one checkpoint), the
symbolic links among them kept as links, mtimes kept, RESUME.json written, and committed by one
rename of the staging dir to its sequence number: a copy either is whole or is not there. The two
newest committed copies are kept (the older is the fallback when the newer is found damaged);
older ones go at each commit, and all of them once the cell's result is published.

RESUME.json: `{"cell", "seq", "committed", "source": {"host", "queue", "attempt"}, "step",
"files": [{"path", "size", "sha256", "mtime_ns"}], "links": [{"path", "target"}]}`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from ablate.remote.checkpoints import filecheck, loaders
from ablate.remote.checkpoints.artifacts import covers, sha256_file

DIR = "resume"
RECORD = "RESUME.json"
ATTEMPTS = "attempts"
KEEP = 2  # committed copies kept per cell: the newest, and the one before as its fallback
STAGE = ".stage."
SEQ_NAME = re.compile(r"[0-9]{1,9}")
# The step a checkpoint's name says: HF's checkpoint-N, accelerate's checkpoint_N, Lightning's step=N
_STEP = re.compile(r"(?:^|/)(?:checkpoint[-_]|[^/]*step=)([0-9]{1,12})(?:[^0-9/][^/]*)?(?:/|$)")


class Look(NamedTuple):
    """What a cell's resume entries name in its {ckpt_dir} at one look: regular files with their
    (size, mtime_ns), and symbolic links with their targets (relative paths, sorted)."""

    files: tuple[tuple[str, int, int], ...]
    links: tuple[tuple[str, str], ...]

    @property
    def empty(self) -> bool:
        return not self.files

    @property
    def newest_ns(self) -> int:
        return max((f[2] for f in self.files), default=0)


class Copy(NamedTuple):
    seq: int
    path: str


def cell_dir(root: str, cell: str) -> str:
    return os.path.join(root, DIR, cell)


def committed(root: str, cell: str) -> list[Copy]:
    """The cell's committed copies, newest first."""
    try:
        names = os.listdir(cell_dir(root, cell))
    except OSError:
        return []
    seqs = sorted((int(n) for n in names if SEQ_NAME.fullmatch(n)), reverse=True)
    return [Copy(s, os.path.join(cell_dir(root, cell), str(s))) for s in seqs]


def read_record(path: str) -> dict[str, Any] | None:
    """A copy's RESUME.json, or None when it is missing or not one."""
    try:
        with open(os.path.join(path, RECORD), encoding="utf-8") as f:
            rec = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("files"), list):
        return None
    return rec if isinstance(rec.get("links", []), list) else None


def step_of(paths: Sequence[str]) -> int | None:
    """The training step the checkpoint's names say (the highest), or None."""
    found = [int(m.group(1)) for p in paths if (m := _STEP.search(p))]
    return max(found) if found else None


def inside(ckpt_dir: str, rel: str) -> bool:
    return not rel.startswith("/") and ".." not in rel.split("/") and rel not in ("", ".")


def _link_target(ckpt_dir: str, rel: str) -> str | None:
    """A symbolic link's target, relative to ckpt_dir, when it stays inside it; else None."""
    try:
        raw = os.readlink(os.path.join(ckpt_dir, rel))
    except OSError:
        return None
    if raw.startswith("/"):
        return None
    target = os.path.normpath(os.path.join(os.path.dirname(rel), raw))
    return target if inside(ckpt_dir, target) else None


def look(ckpt_dir: str, rels: Sequence[str]) -> Look:
    """The files `rels` (as the entries resolved them) with their sizes and mtimes; a link to a file
    inside ckpt_dir is kept as a link, its target a file of the look (Lightning's `save_last:
    link`); a link leading out is a file (its bytes are what resumes). Gone files are left out."""
    files: dict[str, tuple[int, int]] = {}
    links: dict[str, str] = {}
    for rel in rels:
        path = os.path.join(ckpt_dir, rel)
        target = _link_target(ckpt_dir, rel) if os.path.islink(path) else None
        if target is not None:
            links[rel] = target
            rel, path = target, os.path.join(ckpt_dir, target)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if os.path.isfile(path):
            files[rel] = (st.st_size, st.st_mtime_ns)
    return Look(tuple(sorted((r, s, m) for r, (s, m) in files.items())),
                tuple(sorted((r, t) for r, t in links.items() if t in files)))


class CopyFailed(Exception):
    """A copy could not be made (its staging dir is gone); the message says why."""


def commit(root: str, cell: str, ckpt_dir: str, seen: Look, source: Mapping[str, str],
           still_ours: Callable[[], bool] = lambda: True) -> Copy:
    """`seen` copied from ckpt_dir to the next committed copy of `cell`; older copies pruned.
    Raises CopyFailed (nothing committed) when a file changed or went while it was copied, a copy
    differs from its source, the storage refused, or the cell is no longer this run's."""
    top = cell_dir(root, cell)
    os.makedirs(top, exist_ok=True)
    have = committed(root, cell)
    seq = (have[0].seq if have else 0) + 1
    stage = os.path.join(top, f"{STAGE}{seq}.{source.get('host', '-')}.{os.getpid()}")
    try:
        files = [_copy_one(ckpt_dir, stage, rel, size, mtime) for rel, size, mtime in seen.files]
        for rel, target in seen.links:
            dst = os.path.join(stage, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(os.path.relpath(os.path.join(stage, target), os.path.dirname(dst)), dst)
        if look(ckpt_dir, [f["path"] for f in files] + [r for r, _ in seen.links]) != seen:
            raise CopyFailed("the checkpoint changed while it was copied")
        rec = record(cell, seq, source, seen, files)
        with open(os.path.join(stage, RECORD), "w", encoding="utf-8") as f:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if not still_ours():
            raise CopyFailed("the cell's claim is no longer this run's")
        final = os.path.join(top, str(seq))
        os.rename(stage, final)  # the commit (a dir of that name already there: refused)
    except CopyFailed:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    except OSError as e:
        shutil.rmtree(stage, ignore_errors=True)
        raise CopyFailed(f"cannot write the copy: {e.strerror or e}") from None
    prune(root, cell)
    return Copy(seq, final)


def record(cell: str, seq: int, source: Mapping[str, str], seen: Look,
           files: Sequence[Mapping[str, object]]) -> dict[str, Any]:
    """A copy's RESUME.json (see the module's docstring): `files` as copied, `seen` the look copied."""
    return {"cell": cell, "seq": seq, "committed": round(time.time(), 3), "source": dict(source),
            "step": step_of([r for r, _, _ in seen.files] + [r for r, _ in seen.links]),
            "files": list(files), "links": [{"path": r, "target": t} for r, t in seen.links]}


def _copy_one(ckpt_dir: str, stage: str, rel: str, size: int, mtime_ns: int) -> dict[str, Any]:
    src, dst = os.path.join(ckpt_dir, rel), os.path.join(stage, rel)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    try:
        shutil.copyfile(src, dst)
        want, got = sha256_file(src), sha256_file(dst)
        st = os.stat(src)
    except FileNotFoundError:
        raise CopyFailed(f"{rel} went while it was copied (the trainer rotated it out)") from None
    if (st.st_size, st.st_mtime_ns) != (size, mtime_ns) or want != got or os.stat(dst).st_size != size:
        raise CopyFailed(f"{rel} changed while it was copied")
    os.utime(dst, ns=(mtime_ns, mtime_ns))
    return {"path": rel, "size": size, "sha256": want, "mtime_ns": mtime_ns}


def prune(root: str, cell: str, keep: int = KEEP) -> None:
    """Remove committed copies older than the `keep` newest, and staging dirs left by runs that
    died mid-copy (their process gone on this host, or older than an hour)."""
    for old in committed(root, cell)[keep:]:
        _remove(old.path)
    top = cell_dir(root, cell)
    with contextlib.suppress(OSError):
        for name in os.listdir(top):
            if name.startswith(STAGE):
                path = os.path.join(top, name)
                with contextlib.suppress(OSError):
                    if time.time() - os.stat(path).st_mtime > 3600:
                        _remove(path)


def _remove(path: str) -> None:
    """A copy removed: renamed aside first, so no reader ever finds half of one under its name."""
    aside = f"{os.path.dirname(path)}/.gone.{os.path.basename(path)}.{os.getpid()}"
    try:
        os.rename(path, aside)
    except OSError:
        return
    shutil.rmtree(aside, ignore_errors=True)


def drop(root: str, cell: str) -> None:
    """Every copy of the cell (its result is published: nothing resumes from them any more)."""
    top = cell_dir(root, cell)
    if os.path.isdir(top):
        _remove(top)


def verify(path: str, modes: Mapping[str, str] | None = None) -> str | None:
    """A committed copy's first problem, or None when every file is there with its recorded size
    and sha256 and its structure checks (`filecheck`, as `reconcile` checks a result: no pickle is
    ever run; `modes`: artifacts.verify's {entry: load|structure|hash})."""
    rec = read_record(path)
    if rec is None:
        return f"{RECORD} is missing or unreadable (a half-written copy)"
    for f in rec["files"]:
        rel = f.get("path") if isinstance(f, dict) else None
        if not isinstance(rel, str) or not inside(path, rel):
            return f"{RECORD} names a file outside the copy: {rel!r}"
        full = os.path.join(path, rel)
        try:
            size = os.stat(full).st_size
        except OSError:
            return f"{rel} is missing"
        if size != f.get("size"):
            return f"{rel}: {size} bytes, {RECORD} says {f.get('size')} (truncated or changed)"
        mode = next((m for e, m in (modes or {}).items() if covers(e, rel)), None)
        try:
            out = filecheck.check(full, mode=mode or "structure", sha256=str(f.get("sha256")), load=True,
                                  hashed=True)
        except (loaders.NoLoader, OSError) as e:
            return f"{rel}: {e}"
        if out.kind:
            return f"{rel}: {out.error}"
    return None


def restore(path: str, ckpt_dir: str, move: bool = False) -> list[str]:
    """The copy's files and links written into ckpt_dir at their paths, with their mtimes (each file
    by a rename: a trainer never sees half of one). `move`: the copy is a download of this run's
    own, its files moved rather than copied where the disk allows. Returns the paths restored."""
    rec = read_record(path) or {"files": [], "links": []}
    done: list[str] = []
    for f in rec["files"]:
        rel = str(f["path"])
        dst = os.path.join(ckpt_dir, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = f"{dst}.ablate-restore.{os.getpid()}"
        try:
            if not move:
                raise OSError
            os.rename(os.path.join(path, rel), tmp)
        except OSError:  # another disk (or a copy kept where it is): copied
            shutil.copyfile(os.path.join(path, rel), tmp)
        ns = int(f.get("mtime_ns") or 0)
        if ns:
            os.utime(tmp, ns=(ns, ns))
        os.replace(tmp, dst)
        done.append(rel)
    for ln in rec.get("links", []):
        rel, target = str(ln["path"]), str(ln["target"])
        dst = os.path.join(ckpt_dir, rel)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dst)
        os.symlink(os.path.relpath(os.path.join(ckpt_dir, target), os.path.dirname(dst)), dst)
        done.append(rel)
    return done


class FsPlace:
    """Where a sweep on a shared FS keeps its copies: `resume/` under its root (the functions
    above). The object store's: `store_place.StorePlace`, the same methods."""

    def __init__(self, root: str) -> None:
        self.root = root

    def committed(self, cell: str) -> list[Copy]:
        return committed(self.root, cell)

    def record(self, copy: Copy) -> dict[str, Any] | None:
        return read_record(copy.path)

    @contextlib.contextmanager
    def fetched(self, copy: Copy) -> Iterator[tuple[str, bool]]:
        """(a local dir holding the copy, whether restore may move its files): the copy itself."""
        yield copy.path, False

    def commit(self, cell: str, ckpt_dir: str, seen: Look, source: Mapping[str, str],
               still_ours: Callable[[], bool] = lambda: True) -> Copy:
        return commit(self.root, cell, ckpt_dir, seen, source, still_ours)

    def published(self, cell: str) -> bool:
        return os.path.exists(os.path.join(self.root, "final_ckpts", cell, "MANIFEST.json"))

    def drop(self, cell: str) -> None:
        drop(self.root, cell)

    def count_attempt(self, cell: str, line: str) -> int:
        return count_attempt(self.root, cell, line)


def count_attempt(root: str, cell: str, line: str) -> int:
    """Record a start of the cell (one line, appended) and return its number, 1 for the first."""
    top = cell_dir(root, cell)
    os.makedirs(top, exist_ok=True)
    path = os.path.join(top, ATTEMPTS)
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            before = sum(1 for ln in f if ln.strip())
    except FileNotFoundError:
        before = 0
    with open(path, "a", encoding="utf-8") as f:
        f.write(line.replace("\n", " ") + "\n")
    return before + 1
