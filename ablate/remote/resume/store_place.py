"""A cell's resume copies kept in the sweep's object store (`storage: s3://…`), for sweeps with no
shared FS: the same copies as `copies.py` keeps under a shared sweep root, with S3's guarantees in
place of a rename (issue 45; docs/ARCHITECTURE.md, "Resume copies"). Stdlib only at import: the
store's client imports boto3 when a `Store` is made.

Keys, per cell:

    resume/<cell>/<seq>/<path>          a copy's files, at their paths under the cell's {ckpt_dir}
    resume/<cell>/<seq>/RESUME.json     written last, by a conditional create: the commit
    resume/<cell>/attempts              one line per start of the cell, by conditional appends

A copy exists for readers once its RESUME.json does; files without one (an upload cut midway, a
commit refused) are never restored, and go at the next commit's prune. Each file is hashed, uploaded
and its object's size checked, and the sources are looked at again once all are up: a checkpoint
that changed meanwhile is no copy of one. A restore downloads the copy to the instance's disk
(`.resume-fetch/` under the sweep's local copy), checks it there as `copies.verify` checks any copy
(sizes, sha256, structure; no pickle run), and moves its files into {ckpt_dir}. S3 has no symbolic
links: RESUME.json's `links` are made again at the restore.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ablate.remote.checkpoints.artifacts import sha256_file
from ablate.remote.resume import copies

if TYPE_CHECKING:
    from ablate.remote.store.client import Store

FETCH = ".resume-fetch"
STALE_SECS = 3600.0  # an uncommitted upload older than this is a dead one's
LISTED_SECS = 10.0


class StorePlace:
    """The copies of one sweep in `store`; `root` is this instance's local copy of the sweep."""

    def __init__(self, store: Store, root: str) -> None:
        self.store, self.root = store, root
        # The last listing of a cell's copies and when, reused for LISTED_SECS (a run's prep and its
        # keeper's start list it once); every write of this place lists again.
        self._listed: dict[str, tuple[float, dict[int, dict[str, Any]]]] = {}

    def _top(self, cell: str) -> str:
        return f"{copies.DIR}/{cell}"

    def _seqs(self, cell: str, fresh: bool = True) -> dict[int, dict[str, Any]]:
        """Per sequence number found: {"keys": [its objects], "committed": bool, "mtime": newest}.
        `fresh`: listed now; else the listing of the last LISTED_SECS will do."""
        was = self._listed.get(cell)
        if not fresh and was is not None and time.monotonic() - was[0] < LISTED_SECS:
            return was[1]
        top = self._top(cell) + "/"
        out: dict[int, dict[str, Any]] = {}
        for o in self.store.list(top):
            head, _, rest = o.key[len(top):].partition("/")
            if not rest or not copies.SEQ_NAME.fullmatch(head):
                continue
            seq = out.setdefault(int(head), {"keys": [], "committed": False, "mtime": 0.0})
            seq["keys"].append(o.key)
            seq["committed"] |= rest == copies.RECORD
            seq["mtime"] = max(seq["mtime"], o.mtime)
        self._listed[cell] = (time.monotonic(), out)
        return out

    def committed(self, cell: str) -> list[copies.Copy]:
        """The cell's committed copies, newest first."""
        seqs = self._seqs(cell, fresh=False)
        return [copies.Copy(s, f"{self._top(cell)}/{s}") for s in sorted(seqs, reverse=True)
                if seqs[s]["committed"]]

    def record(self, copy: copies.Copy) -> dict[str, Any] | None:
        got = self.store.get(f"{copy.path}/{copies.RECORD}")
        try:
            rec = json.loads(got.data) if got is not None else None
        except ValueError:
            return None
        return rec if isinstance(rec, dict) and isinstance(rec.get("files"), list) else None

    @contextlib.contextmanager
    def fetched(self, copy: copies.Copy) -> Iterator[tuple[str, bool]]:
        """The copy downloaded to a directory of this run's own on the instance's disk (removed
        afterwards): its RESUME.json and every file it names that the store has (one it lacks is
        left out, and `copies.verify` says so)."""
        from ablate.remote.store.client import StoreError

        local = os.path.join(self.root, FETCH, f"{os.path.basename(os.path.dirname(copy.path))}."
                                               f"{copy.seq}.{os.getpid()}")
        shutil.rmtree(local, ignore_errors=True)
        os.makedirs(local)
        try:
            got = self.store.get(f"{copy.path}/{copies.RECORD}")
            if got is not None:
                rec = json.loads(got.data)
                for f in rec.get("files") or [] if isinstance(rec, dict) else []:
                    rel = f.get("path") if isinstance(f, dict) else None
                    if not isinstance(rel, str) or not copies.inside(local, rel):
                        continue  # verify names it
                    os.makedirs(os.path.dirname(os.path.join(local, rel)), exist_ok=True)
                    with contextlib.suppress(StoreError):  # gone from the store: verify says so
                        self.store.download(f"{copy.path}/{rel}", os.path.join(local, rel))
                with open(os.path.join(local, copies.RECORD), "wb") as out:
                    out.write(got.data)
            yield local, True
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def commit(self, cell: str, ckpt_dir: str, seen: copies.Look, source: Mapping[str, str],
               still_ours: Callable[[], bool] = lambda: True) -> copies.Copy:
        """`seen` uploaded as the cell's next copy, committed by its RESUME.json; older copies and
        dead uploads pruned. Raises copies.CopyFailed (nothing committed, its uploads removed)."""
        from ablate.remote.store.client import StoreError

        seq = max(self._seqs(cell), default=0) + 1
        top = f"{self._top(cell)}/{seq}"
        sent: list[str] = []
        try:
            files: list[dict[str, object]] = []
            for rel, size, mtime_ns in seen.files:
                src = os.path.join(ckpt_dir, rel)
                try:
                    want = sha256_file(src)
                    self.store.upload(f"{top}/{rel}", src)
                    sent.append(f"{top}/{rel}")
                    st = os.stat(src)
                except FileNotFoundError:
                    raise copies.CopyFailed(f"{rel} went while it was copied (the trainer rotated it out)") \
                        from None
                obj = self.store.head(f"{top}/{rel}")
                if (st.st_size, st.st_mtime_ns) != (size, mtime_ns) or obj is None or obj.size != size:
                    raise copies.CopyFailed(f"{rel} changed while it was copied")
                files.append({"path": rel, "size": size, "sha256": want, "mtime_ns": mtime_ns})
            if copies.look(ckpt_dir, [r for r, _, _ in seen.files] + [r for r, _ in seen.links]) != seen:
                raise copies.CopyFailed("the checkpoint changed while it was copied")
            rec = copies.record(cell, seq, source, seen, files)
            if not still_ours():
                raise copies.CopyFailed("the cell's claim is no longer this run's")
            body = (json.dumps(rec, sort_keys=True) + "\n").encode()
            if self.store.create(f"{top}/{copies.RECORD}", body) is None:
                raise copies.CopyFailed(f"copy {seq} was committed by another run meanwhile")
        except (copies.CopyFailed, StoreError, OSError) as e:
            for key in sent:
                with contextlib.suppress(StoreError):
                    self.store.delete(key)
            if isinstance(e, copies.CopyFailed):
                raise
            raise copies.CopyFailed(f"cannot write the copy: {e}") from None
        self.prune(cell)
        return copies.Copy(seq, top)

    def prune(self, cell: str, keep: int = copies.KEEP) -> None:
        """Committed copies older than the `keep` newest, and uploads never committed that are
        older than the newest committed copy or than STALE_SECS, deleted (their RESUME.json first:
        no reader finds half a copy under a committed name)."""
        seqs = self._seqs(cell)
        done = sorted((s for s, v in seqs.items() if v["committed"]), reverse=True)
        newest = done[0] if done else 0
        now = time.time()
        for s, v in seqs.items():
            if (v["committed"] and s not in done[:keep]) or (not v["committed"] and (
                    s < newest or now - v["mtime"] > STALE_SECS)):
                record = f"{self._top(cell)}/{s}/{copies.RECORD}"
                for key in sorted(v["keys"], key=lambda k: k != record):
                    self.store.delete(key)
        self._listed.pop(cell, None)  # what this listing saw is gone in part

    def published(self, cell: str) -> bool:
        return self.store.head(f"commits/{cell}") is not None

    def drop(self, cell: str) -> None:
        """Every copy of the cell, and its attempts (its result is published): the records first."""
        self._listed.pop(cell, None)
        keys = [o.key for o in self.store.list(self._top(cell) + "/")]
        for key in sorted(keys, key=lambda k: not k.endswith("/" + copies.RECORD)):
            self.store.delete(key)

    def count_attempt(self, cell: str, line: str) -> int:
        """A start of the cell recorded in the store (one line, by a conditional append: never lost,
        never twice) and its number, 1 for the first."""
        _etag, body = self.store.append(f"{self._top(cell)}/{copies.ATTEMPTS}",
                                        (line.replace("\n", " ") + "\n").encode())
        return sum(1 for ln in body.decode("utf-8", "replace").splitlines() if ln.strip())
