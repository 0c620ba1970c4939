"""A local copy of a sweep kept in an object store: what lets every reader of the sweep root (the
controller's probe, the runner's walk) read the store's state as files, unchanged.

The store's keys are the sweep root's paths, except a cell's result (S3 has no rename, so nothing
becomes visible by one):

- `results/<name>/<nonce>/<file>`: a result's files and its MANIFEST.json, uploaded by its
  publisher under a name of its own (`nonce`, one per publish), never read as a result by itself;
- `commits/<name>`: `{"nonce", "manifest_sha256", "host", "queue", "attempt", "t"}`, created once
  (`If-None-Match: *`) after every file and the MANIFEST are uploaded: the result exists for readers
  from this one write on, and a second publisher of the same cell is refused by it;
- `aside/<name>.<t>`: a commit remediate set aside (a copy; then `commits/<name>` is deleted).

Here a committed result is `final_ckpts/<name>/` (its MANIFEST.json, and more files when asked),
an aside one `final_ckpts/.aside.<name>.<t>/`, as on a shared FS. Every other key is copied to the
same path. A key gone from the store is gone here (a released claim's directory too). Keys named in
`own` (and claimed by `claim_own`, by any process on this copy) are this host's own files (its
queues' events and heartbeats): written here first, never overwritten by a sync; and a sync removes
only files it wrote.

Time. Files get the store's `LastModified` moved into this machine's clock by the store's offset
(its `Date` header against this clock at each listing), so that a local clock reading (a touched
file's mtime, `time.time()`) compares with them as the store's clock would: heartbeats are judged
by the store's clock, to its 1 s resolution.

One sync at a time per copy (`flock` on `.mirror/lock`); what each file was last synced from
(etag, size) is kept in `.mirror/state.json`, so that a sync fetches only what changed: an events
object that grew (it is only ever appended to) by a range read of the new bytes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ablate.remote.store.client import Obj, Store

# What each reader needs: the walk (claims, results done, stop files, others' heartbeats and events,
# the queue files, the estimates, calibration) and every controller command (all of the state).
WALK = ("claims/", "commits/", "control/", "events/", "heartbeats/", "queues/", "calib/",
        "estimates.tsv")
STATE = (*WALK, "aside/", "tails/", "gate/", "released/", "remediation/", "services/", "resume/",
         "DEPLOYED.json")
# Of `resume/` (the cells' resume copies: ablate/remote/resume/store_place.py) only what `status`
# reads: each committed copy's record and each cell's attempts, never a checkpoint's bytes.
RESUME_READ = ("/RESUME.json", "/attempts")
MANIFEST = "MANIFEST.json"
_META = ".mirror"


class Mirror:
    """The local copy at `root` of `store`. `offset`: the store's clock minus this one (seconds),
    as the last sync measured it."""

    def __init__(self, store: Store, root: str, own: Collection[str] = (), workers: int = 16) -> None:
        self.store, self.root, self.own = store, root, set(own)
        self.workers = workers
        self.offset = 0.0
        self.fetched = 0  # objects read by the last sync

    # ------------------------------------------------------------------ the sync

    def sync(self, prefixes: Iterable[str] = STATE, results: str = "manifest") -> None:
        """Bring the copy of `prefixes` up to the store's state. `results`: which files of a
        committed result are here, "manifest" (MANIFEST.json only), "small" (also the metrics and
        log files its MANIFEST names: what a report reads) or "all"."""
        meta = os.path.join(self.root, _META)
        os.makedirs(meta, exist_ok=True)
        with open(os.path.join(meta, "lock"), "a") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            state = self._load()
            self._own_here()
            self.fetched = 0
            listed: dict[str, list[Obj]] = {}
            for p in prefixes:
                listed[p] = self._listing(p)
            for p, objs in listed.items():
                if p == "commits/":
                    self._commits(objs, state, results)
                elif p == "aside/":
                    self._aside(objs)
                else:
                    self._files(p, objs, state)
            self._save(state)

    def claim_own(self, keys: Iterable[str]) -> None:
        """Keys written here, by a queue of this host (its events, its heartbeat): from now on no
        sync of this copy, by any process, writes or removes them (a marker under `.mirror/own/`,
        made under the copy's lock: a sync under way finishes first)."""
        d = os.path.join(self.root, _META, "own")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(self.root, _META, "lock"), "a") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            for key in keys:
                write_atomic(os.path.join(d, key.replace("/", "%")), b"", None)
                self.own.add(key)

    def _own_here(self) -> None:
        """The keys the queues of this host claimed (`claim_own`), those of other processes too."""
        with contextlib.suppress(OSError):
            self.own |= {n.replace("%", "/") for n in os.listdir(os.path.join(self.root, _META, "own"))
                         if not n.startswith(".")}

    def _listing(self, prefix: str) -> list[Obj]:
        local_before = time.time()
        objs = self.store.list(prefix)
        date = self.store.last_date
        if date is not None:
            self.offset = date - (local_before + time.time()) / 2
        if not prefix.endswith("/"):
            objs = [o for o in objs if o.key == prefix]
        return objs

    def _local(self, mtime: float) -> float:
        return mtime - self.offset

    def _files(self, prefix: str, objs: list[Obj], state: dict[str, list[Any]]) -> None:
        if prefix == "resume/":
            objs = [o for o in objs if o.key.endswith(RESUME_READ)]
        seen = {o.key for o in objs}
        todo = [o for o in objs if o.key not in self.own and not _hidden(o.key)
                and state.get(o.key) != [o.etag, o.size]]
        with ThreadPoolExecutor(max(1, min(self.workers, len(todo)))) as pool:
            for o, ok in zip(todo, pool.map(lambda o: self._fetch(o, state.get(o.key)), todo), strict=False):
                if ok:
                    state[o.key] = [o.etag, o.size]
        # what the store no longer has is gone here too (a released claim: its directory as well); files
        # written here (this host's own, not yet sent) are never the sync's to remove
        top = os.path.join(self.root, prefix)
        if prefix.endswith("/"):
            for dirpath, _dirnames, filenames in os.walk(top, topdown=False):
                for fn in filenames:
                    rel = os.path.relpath(os.path.join(dirpath, fn), self.root)
                    if fn.startswith(".") or rel in seen or rel not in state:
                        continue  # a file this copy never had from the store is a local one
                    _unlink(os.path.join(dirpath, fn))
                    state.pop(rel, None)
                if os.path.normpath(dirpath) != os.path.normpath(top):  # never the prefix dir itself
                    with contextlib.suppress(OSError):
                        os.rmdir(dirpath)  # only when empty
        elif prefix not in seen and prefix not in self.own and state.pop(prefix, None) is not None:
            _unlink(top)

    def _fetch(self, o: Obj, was: list[Any] | None) -> bool:
        path = os.path.join(self.root, o.key)
        data: bytes | None = None
        if o.key.startswith("events/") and was is not None and 0 < was[1] < o.size:
            try:  # appended to only: the new bytes, by a range read
                with open(path, "rb") as f:
                    old = f.read()
            except OSError:
                old = b""
            if len(old) == was[1]:
                tail = self.store.get_range(o.key, len(old))
                if tail is not None:
                    data = old + tail
        if data is None:
            got = self.store.get(o.key)
            if got is None:
                return False  # gone since the listing: the next sync removes it
            data = got.data
        self.fetched += 1
        write_atomic(path, data, self._local(o.mtime))
        return True

    def _commits(self, objs: list[Obj], state: dict[str, list[Any]], results: str) -> None:
        final = os.path.join(self.root, "final_ckpts")
        os.makedirs(final, exist_ok=True)
        names = {o.key[len("commits/"):]: o for o in objs if "/" not in o.key[len("commits/"):]}
        for name in os.listdir(final):  # a commit gone (set aside): its result is gone
            if not name.startswith(".") and name not in names:
                shutil.rmtree(os.path.join(final, name), ignore_errors=True)
                state.pop(f"commits/{name}", None)

        def one(item: tuple[str, Obj]) -> None:
            name, o = item
            here = os.path.join(final, name)
            if state.get(o.key) == [o.etag, o.size] and _complete(here, results):
                return
            got = self.store.get(o.key)
            rec = json_or_none(got.data) if got is not None else None
            if got is None or not isinstance(rec, dict) or not isinstance(rec.get("nonce"), str):
                return
            nonce = rec["nonce"]
            base = f"results/{name}/{nonce}/"
            mtime = self._local(got.mtime)
            m = self.store.get(base + MANIFEST)
            if m is None:
                return
            if read_or_none(os.path.join(here, _NONCE)) != nonce.encode():
                shutil.rmtree(here, ignore_errors=True)  # another publish's files (set aside, re-run)
            write_atomic(os.path.join(here, MANIFEST), m.data, mtime)
            write_atomic(os.path.join(here, _NONCE), nonce.encode(), None)
            self.fetched += 1
            files = [o2.key[len(base):] for o2 in self.store.list(base)] if results == "all" else \
                _small(json_or_none(m.data)) if results == "small" else []
            for rel in files:
                dst = os.path.join(here, rel)
                if rel == MANIFEST or os.path.exists(dst):
                    continue
                if results == "small" and self.store.head(base + rel) is None:
                    continue  # named, never uploaded: what reads it says so (no metrics file)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                tmp = f"{dst}.part.{os.getpid()}"
                self.store.download(base + rel, tmp)
                os.utime(tmp, (mtime, mtime))
                os.replace(tmp, dst)
                self.fetched += 1
            if results != "manifest":
                write_atomic(os.path.join(here, _MARKS[results]), b"", mtime)
            state[o.key] = [o.etag, o.size]

        items = sorted(names.items())
        with ThreadPoolExecutor(max(1, min(self.workers, len(items)))) as pool:
            list(pool.map(one, items))

    def _aside(self, objs: list[Obj]) -> None:
        final = os.path.join(self.root, "final_ckpts")
        os.makedirs(final, exist_ok=True)
        for o in objs:
            entry = o.key[len("aside/"):]
            if entry and "/" not in entry:
                os.makedirs(os.path.join(final, f".aside.{entry}"), exist_ok=True)

    def fetch_result(self, name: str) -> bool:
        """Every file of the committed result `name` into its directory here, as a sync with
        results="all" brings them, for this one result only (its commit synced first: the MANIFEST.json
        and the publish it is of are here). False when the copy holds no commit of it. Not under the
        copy's lock (a checkpoint takes minutes; the queues' pulls go on meanwhile): each file lands
        by a rename, and a result another publish replaced meanwhile is not marked complete."""
        here = os.path.join(self.root, "final_ckpts", name)
        nonce = read_or_none(os.path.join(here, _NONCE))
        if not nonce or not os.path.exists(os.path.join(here, MANIFEST)):
            return False
        if _complete(here, "all"):
            return True
        base = f"results/{name}/{nonce.decode('utf-8', 'replace')}/"
        mtime = os.stat(os.path.join(here, MANIFEST)).st_mtime
        for o in self.store.list(base):
            rel = o.key[len(base):]
            dst = os.path.join(here, rel)
            if rel == MANIFEST or not _plain(rel) or os.path.exists(dst):
                continue
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            tmp = f"{dst}.part.{os.getpid()}"
            try:
                self.store.download(o.key, tmp)
                os.utime(tmp, (mtime, mtime))
                os.replace(tmp, dst)
            finally:
                _unlink(tmp)
            self.fetched += 1
        if read_or_none(os.path.join(here, _NONCE)) != nonce:
            return False  # set aside and published again meanwhile: the next call fetches that one
        write_atomic(os.path.join(here, _MARKS["all"]), b"", mtime)
        return True

    def adopt(self, rel: str, data: bytes, etag: str) -> None:
        """A key this host just wrote to the store itself (its claim): in the copy at once, and the
        copy's like any other (gone from here when it is gone from the store)."""
        meta = os.path.join(self.root, _META)
        os.makedirs(meta, exist_ok=True)
        with open(os.path.join(meta, "lock"), "a") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            state = self._load()
            write_atomic(os.path.join(self.root, rel), data, None)
            state[rel] = [etag, len(data)]
            self._save(state)

    # ------------------------------------------------------------------ the state

    def _load(self) -> dict[str, list[Any]]:
        try:
            with open(os.path.join(self.root, _META, "state.json"), encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, ValueError):
            return {}
        if not isinstance(raw, dict):
            return {}
        return {k: v for k, v in raw.items() if isinstance(v, list) and len(v) == 2}

    def _save(self, state: dict[str, list[Any]]) -> None:
        write_atomic(os.path.join(self.root, _META, "state.json"), json.dumps(state).encode(), None)

    def store_time(self) -> float:
        """The store's clock now, as the last sync measured its offset."""
        return time.time() + self.offset


def _hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/"))


# What a result dir holds besides MANIFEST.json: a file per mode, once all it needs is here
_MARKS = {"small": ".small", "all": ".complete"}
_NONCE = ".nonce"  # the publish the files here are of


def _complete(path: str, results: str) -> bool:
    if results == "manifest":
        return True
    marks = [_MARKS["all"]] if results == "all" else list(_MARKS.values())
    return any(os.path.exists(os.path.join(path, m)) for m in marks)


def _plain(rel: str) -> bool:
    """A result's file name safe to write under its directory: relative, no empty, '.' or '..'
    part, none of the copy's own marks."""
    marks = (_NONCE, *_MARKS.values())
    return bool(rel) and rel not in marks and all(p not in ("", ".", "..") for p in rel.split("/"))


def _small(manifest: Any) -> list[str]:
    """The metrics and log files a MANIFEST.json names (plain relative paths only)."""
    arts = manifest.get("artifacts") if isinstance(manifest, dict) else None
    out = []
    for role in ("metrics", "log"):
        entry = arts.get(role) if isinstance(arts, dict) else None
        f = entry.get("file") if isinstance(entry, dict) else None
        if isinstance(f, str) and f and not f.startswith("/") and ".." not in f.split("/") and f != MANIFEST:
            out.append(f)
    return out


def read_or_none(path: str) -> bytes | None:
    """A file's bytes; None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def json_or_none(data: bytes) -> Any:
    """The JSON document in `data`, or None when it is not one."""
    try:
        return json.loads(data)
    except ValueError:
        return None


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def write_atomic(path: str, data: bytes, mtime: float | None) -> None:
    """Atomically: a temp file beside `path`, its mtime set, then renamed over it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{os.path.join(os.path.dirname(path), '.' + os.path.basename(path))}.sync.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    if mtime is not None:
        os.utime(tmp, (mtime, mtime))
    os.replace(tmp, path)

