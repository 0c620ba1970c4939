"""The shared FS of a sweep kept in an S3-compatible object store (`storage:` in the default profile):
a `SharedFS` over a `Store`, so that every command works on it unchanged.

`root` is the sweep's store URL (`s3://BUCKET/PREFIX/ablate/<sweep>`); a path the commands pass is
`root/<rel>` (`SweepLayout(root)`), and names the key `<rel>`. What a shared FS does by a rename or a
directory, the store does by its own keys (`ablate/remote/store/local_copy.py`):

- a committed result: `final_ckpts/<name>/<file>` is `results/<name>/<nonce>/<file>` of the nonce in
  `commits/<name>`; `final_ckpts/<name>` exists while `commits/<name>` does; a result set aside
  (`final_ckpts/.aside.<name>.<t>`) is `aside/<name>.<t>`, a copy of the commit. Nothing here
  writes or removes a result's files: ablate never deletes a result.
- `rename_noreplace`: a result set aside is its commit copied to `aside/` (a conditional create),
  then the commit deleted while it is still the one copied (`If-Match`); any other rename (a claim
  released to `released/<name>.<t>/`) copies each object under `src` to `dst` by conditional
  creates, then deletes each original while it is still the version copied.
- `create_immutable` is a conditional create; `append_line` a conditional read-modify-write
  (`Store.append`): events are never lost or reordered; `write_atomic` a put (atomic in S3).
- `lock`: a lease in the store (`ablate/transport/storelock.py`); it expires `lease` seconds after
  its holder died, where flock's dies with it.
- `probe`: the op runs in this process over a local copy of the sweep (`Mirror`, under
  `$XDG_CACHE_HOME/ablate/store/<digest>/`, else `~/.cache/...`), brought up to the store's state
  first; paths in its answer are the store's again. The copy's files carry the store's
  `LastModified` moved into this machine's clock, and the probe's clock is this machine's: ages
  are by the store's clock. A result's files are copied only for what reads them: `report` its
  metrics and log, `verify` of cells by name (`reconcile --fs`) every committed result's files,
  once each (verified here, on this machine's disk); a listing (`pull`'s) only the MANIFESTs.
- Errors: a failed store operation is an `FSError` naming "store", the operation, the s3:// URL
  and the store's reason (never a credential).

The store is strongly consistent (read-after-write, list-after-write): no visibility lag
(`ablate.sweep.views.FsLag.from_record` of the `fs_lag` a snapshot answers with).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ablate.errors import FSError
from ablate.remote.host import probe as probe_ops
from ablate.remote.layout import ASIDE_PREFIX
from ablate.remote.store.client import Store, StoreError
from ablate.remote.store.local_copy import Mirror
from ablate.transport.base import (
    AppendLine,
    CreateImmutable,
    FSOp,
    OpResult,
    Read,
    Remove,
    WriteAtomic,
    apply_each,
)
from ablate.transport.storelock import LEASE, StoreLease, acquire

VIA = "store"  # the "host" an FSError of this transport names
FINAL = "final_ckpts"
# What each probe op reads of the sweep (the mirror's prefixes) and which files of a result.
# autostop/: each instance's watcher, as status shows it; resume/: the cells' resume copies' records
_SNAPSHOT = ("claims/", "commits/", "aside/", "events/", "heartbeats/", "queues/", "gate/", "tails/",
             "released/", "autostop/", "resume/")
_PLANS: dict[str, tuple[tuple[str, ...], str]] = {
    "snapshot": (_SNAPSHOT, "manifest"), "mine": (_SNAPSHOT, "manifest"),
    "report": (_SNAPSHOT, "small"), "queues": (("queues/",), "manifest"), "now": ((), "manifest")}
_ASIDE_ENTRY = re.compile(r"^(.+)\.(\d+\.\d+)$")  # aside/<name>.<t>, t as remediate writes it
_URL_IN = re.compile(r"^\w+ s3://\S+: ")  # the op and URL a StoreError starts with (FSError says them)
COHERENT = "an object store: strongly consistent (read-after-write, list-after-write); no client cache"

_OPEN: dict[tuple[str, str | None], StoreFS] = {}
_OPEN_LOCK = threading.Lock()
# Under `polite_polling()` (`status --watch`) the store is listed at most every POLL seconds: the
# dashboard's other reads (tmux, live progress) go on every interval, and a watch left open for a
# sweep's hours costs about 10 LISTs per POLL (docs/BENCHMARKS.md) instead of per refresh.
POLL = 10.0
_POLITE = threading.Event()


@contextlib.contextmanager
def polite_polling() -> Iterator[None]:
    _POLITE.set()
    try:
        yield
    finally:
        _POLITE.clear()


def copy_dir(url: str, endpoint: str | None = None) -> str:
    """Where this machine keeps its copy of the sweep at `url` (on `endpoint`)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256((url + (f"\n{endpoint}" if endpoint else "")).encode()).hexdigest()[:16]
    return os.path.join(base, "ablate", "store", digest)


def open_store_fs(url: str, endpoint: str | None = None) -> StoreFS:
    """One `StoreFS` per store for the life of the process (a boto3 client costs ~0.1 s to make)."""
    with _OPEN_LOCK:
        key = (url.rstrip("/"), endpoint)
        if key not in _OPEN:
            _OPEN[key] = StoreFS(url, endpoint)
        return _OPEN[key]


@contextlib.contextmanager
def _op(verb: str, path: str, dst: str | None = None) -> Iterator[None]:
    """A StoreError inside (or a refusal botocore raised past `Store`) becomes the FSError of this
    operation."""
    try:
        yield
    except StoreError as e:
        raise FSError(VIA, verb, path, _URL_IN.sub("", str(e), count=1), dst=dst) from e
    except ClientError as e:
        err = e.response.get("Error") or {}
        why = ": ".join(str(x) for x in (err.get("Code"), err.get("Message")) if x) or type(e).__name__
        raise FSError(VIA, verb, path, why, dst=dst) from e
    except BotoCoreError as e:
        raise FSError(VIA, verb, path, f"{type(e).__name__}: {e}", dst=dst) from e


def _nonce(data: bytes) -> str | None:
    try:
        rec = json.loads(data)
    except ValueError:
        return None
    nonce = rec.get("nonce") if isinstance(rec, dict) else None
    return nonce if isinstance(nonce, str) and nonce and "/" not in nonce else None


class _Held:
    """A lease as `SharedFS.lock` gives it: its release's store errors are FSErrors."""

    def __init__(self, lease: StoreLease, path: str) -> None:
        self.lease, self.path = lease, path

    @property
    def lost(self) -> bool:
        return self.lease.lost

    def release(self) -> None:
        with _op("unlocking", self.path):
            self.lease.release()


class StoreFS:
    """`SharedFS` over the store at `url` (module docstring). `store`/`copy`: the `Store` and the
    local copy's directory (defaults: made from the URL); `lease`: the lock's lease in seconds."""

    def __init__(self, url: str, endpoint: str | None = None, *, store: Store | None = None,
                 copy: str | None = None, lease: float = LEASE) -> None:
        self.root = url.rstrip("/")
        self.via = "the store"  # what the FS is read through, for messages (status, doctor)
        self.store = store or Store(self.root, endpoint)
        self.copy = copy or copy_dir(self.root, endpoint)
        self.mirror = Mirror(self.store, self.copy)
        self.lease = lease
        self._synced: dict[tuple[tuple[str, ...], str], float] = {}  # when each plan last synced

    # ------------------------------------------------------------------ paths and keys

    def _rel(self, path: str, verb: str) -> str:
        if path.rstrip("/") == self.root:
            return ""
        rel = path[len(self.root) + 1:].strip("/") if path.startswith(self.root + "/") else None
        if rel is None or any(p in ("", ".", "..") for p in rel.split("/")):
            raise FSError(VIA, verb, path, f"not a path under the sweep's store root {self.root}")
        return rel

    def url(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    @staticmethod
    def _commit(entry: str) -> tuple[str, str] | None:
        """(the key of the commit, the cell) behind `final_ckpts/<entry>`; None: no such entry in a
        store (a staging dir)."""
        if entry.startswith(ASIDE_PREFIX):
            m = _ASIDE_ENTRY.match(entry[len(ASIDE_PREFIX):])
            return (f"aside/{entry[len(ASIDE_PREFIX):]}", m.group(1)) if m else None
        return None if entry.startswith(".") else (f"commits/{entry}", entry)

    def _result_base(self, entry: str) -> str | None:
        """`results/<name>/<nonce>` of the result `final_ckpts/<entry>`; None when not committed."""
        commit = self._commit(entry)
        got = self.store.get(commit[0]) if commit else None
        nonce = _nonce(got.data) if got is not None else None
        return None if commit is None or nonce is None else f"results/{commit[1]}/{nonce}"

    def _key(self, rel: str) -> str | None:
        """The key holding the file `rel`: itself, or a result's file (None: not committed)."""
        parts = rel.split("/")
        if parts[0] != FINAL or len(parts) < 3:
            return rel
        base = self._result_base(parts[1])
        return None if base is None else f"{base}/{'/'.join(parts[2:])}"

    @staticmethod
    def _refuse_results(rel: str, verb: str, path: str) -> None:
        if rel == FINAL or rel.startswith(FINAL + "/"):
            raise FSError(VIA, verb, path, "a result in a store is published by its commit and never "
                                           "changed; nothing writes or removes under final_ckpts/")

    # ------------------------------------------------------------------ reads and writes

    def read_bytes(self, path: str) -> bytes | None:
        with _op("reading", path):
            key = self._key(self._rel(path, "reading"))
            got = self.store.get(key) if key else None
            return None if got is None else got.data

    def write_atomic(self, path: str, data: bytes, mode: int = 0o644) -> None:
        with _op("writing", path):
            rel = self._rel(path, "writing")
            self._refuse_results(rel, "writing", path)
            self.store.put(rel, data)  # a PUT is atomic: readers see the old object or the new

    def create_immutable(self, path: str, data: bytes) -> bool:
        with _op("creating", path):
            rel = self._rel(path, "creating")
            self._refuse_results(rel, "creating", path)
            there = self.store.head(rel)
            if there is None and self.store.create(rel, data) is not None:
                return True
            # An S3 ETag of a plain PUT is the MD5 of the bytes: equal, nothing to read.
            if there is not None and there.etag == hashlib.md5(data, usedforsecurity=False).hexdigest():
                return False
            got = self.store.get(rel)
            if got is not None and got.data == data:
                return False
            raise FSError(VIA, "creating", path,
                          "it exists with other content; an immutable file is never overwritten")

    def append_line(self, path: str, line: str) -> None:
        with _op("appending to", path):
            rel = self._rel(path, "appending to")
            self._refuse_results(rel, "appending to", path)
            self.store.append(rel, (line.rstrip("\n") + "\n").encode())

    def apply(self, ops: Sequence[FSOp]) -> list[OpResult]:
        return apply_each(self, ops)  # no round trip to save: one request per op either way

    def exists(self, path: str) -> bool:
        with _op("looking up", path):
            rel = self._rel(path, "looking up")
            parts = rel.split("/") if rel else []
            if parts[:1] == [FINAL] and len(parts) <= 2:
                if len(parts) == 1:
                    return self.store.any_under("commits/") or self.store.any_under("aside/")
                commit = self._commit(parts[1])
                return commit is not None and self.store.head(commit[0]) is not None
            key = self._key(rel) if rel else ""
            if key is None:
                return False
            return (bool(key) and self.store.head(key) is not None) or self.store.any_under(
                key + "/" if key else "")

    def listdir(self, path: str) -> list[str]:
        with _op("listing", path):
            rel = self._rel(path, "listing")
            parts = rel.split("/") if rel else []
            if parts[:1] != [FINAL]:
                return self.store.children(rel)
            if len(parts) == 1:
                return sorted(self.store.children("commits")
                              + [ASIDE_PREFIX + e for e in self.store.children("aside")])
            base = self._result_base(parts[1])
            return [] if base is None else self.store.children("/".join([base, *parts[2:]]))

    def remove(self, path: str) -> bool:
        with _op("removing", path):
            rel = self._rel(path, "removing")
            self._refuse_results(rel, "removing", path)
            if self.store.head(rel) is None:
                return False
            self.store.delete(rel)
            return True

    def rename_noreplace(self, src: str, dst: str) -> bool:
        with _op("renaming", src, dst):
            srel, drel = self._rel(src, "renaming"), self._rel(dst, "renaming")
            sp, dp = srel.split("/"), drel.split("/")
            if FINAL in (sp[0], dp[0]):
                if not (len(sp) == len(dp) == 2 and sp[0] == dp[0] == FINAL
                        and dp[1].startswith(ASIDE_PREFIX) and not sp[1].startswith(".")):
                    if sp[0] == FINAL and len(sp) == 2 and sp[1].startswith("."):
                        return False  # a staging dir: a store has none
                    raise FSError(VIA, "renaming", src, "a result in a store is only ever set aside, "
                                  "as final_ckpts/.aside.<name>.<t>", dst=dst)
                return self._set_aside(sp[1], dp[1], src, dst)
            return self._move(srel, drel, src, dst)

    def _set_aside(self, name: str, entry: str, src: str, dst: str) -> bool:
        aside = self._commit(entry)
        if aside is None or aside[1] != name:
            raise FSError(VIA, "renaming", src, f"{entry} does not name a result of {name} set aside",
                          dst=dst)
        got = self.store.get(f"commits/{name}")
        if got is None:
            return False
        if self.store.head(aside[0]) is not None or self.store.create(aside[0], got.data) is None:
            raise FSError(VIA, "renaming", src, "the destination exists; a rename never replaces it",
                          dst=dst)
        if not self.store.delete_if(f"commits/{name}", got.etag):
            raise FSError(VIA, "renaming", src, f"commits/{name} changed while it was set aside; "
                          f"{self.url(aside[0])} holds the commit it was", dst=dst)
        return True

    def _move(self, srel: str, drel: str, src: str, dst: str) -> bool:
        """Copy every object of `srel` (one object, or the "directory") to `drel`, then delete the
        originals that are still the versions copied."""
        single = self.store.head(srel) if srel else None
        under = self.store.list(srel + "/") if srel else []
        if single is None and not under:
            return False
        if self.store.head(drel) is not None or self.store.any_under(drel + "/"):
            raise FSError(VIA, "renaming", src, "the destination exists; a rename never replaces it",
                          dst=dst)
        pairs = ([(srel, drel)] if single is not None else []) + \
            [(o.key, drel + o.key[len(srel):]) for o in under]
        copied: list[tuple[str, str]] = []
        for s, d in pairs:
            got = self.store.get(s)
            if got is None:
                continue  # gone since the listing: nothing of it to keep
            if self.store.create(d, got.data) is None:
                raise FSError(VIA, "renaming", src, f"{self.url(d)} appeared while renaming; a rename "
                              f"never replaces it", dst=dst)
            copied.append((s, got.etag))
        changed = [s for s, etag in copied if not self.store.delete_if(s, etag)]
        if changed:
            raise FSError(VIA, "renaming", src, f"{', '.join(self.url(s) for s in changed)} changed while "
                          f"renamed: kept; {dst} holds the versions copied", dst=dst)
        return True

    # ------------------------------------------------------------------ the lock

    def lock(self, path: str, timeout: float, record: tuple[str, bytes] | None = None) -> _Held | None:
        with _op("locking", path):
            rel = self._rel(path, "locking")
            rec = (self._rel(record[0], "writing"), record[1]) if record else None
            held = acquire(self.store, rel, timeout, lease=self.lease, record=rec)
            return None if held is None else _Held(held, path)

    # ------------------------------------------------------------------ the probe and copies

    def probe(self, op: str, args: Mapping[str, Any]) -> Any:
        if op != "apply" and op != "verify" and op not in _PLANS:
            raise ValueError(f"unknown probe op {op!r}")
        with _op(f"probe {op} of", self.root):
            try:
                return self._probe(op, dict(args))
            except OSError as e:  # the local copy: this machine's disk
                raise FSError(VIA, f"probe {op} of", self.root, f"the local copy in {self.copy}: {e}") from e

    def _probe(self, op: str, args: dict[str, Any]) -> Any:
        if op == "apply":
            return self._apply_wire(args.get("ops") or [])
        if op == "verify":
            names = args.get("names")
            self.mirror.sync(("commits/", "aside/"), results="all" if names is None or names else "manifest")
            where = str(args["dir"])
            here = os.path.join(self.copy, self._rel(where, "verifying"))
            tree = probe_ops.run("verify", {**args, "dir": here})
            return {**tree, "dir": where}
        prefixes, results = _PLANS[op]
        fresh = _POLITE.is_set() and time.monotonic() - self._synced.get((prefixes, results), -POLL) < POLL
        if prefixes and not fresh:
            self.mirror.sync(prefixes, results=results)
            self._synced[(prefixes, results)] = time.monotonic()
        local = {**args, "root": self.copy}
        if op == "mine":  # the host's tmux and live data are the host's, never this machine's
            local.pop("tmux", None)
            local.pop("live", None)
        got = probe_ops.run(op, local)
        if op in ("snapshot", "report"):
            got["fs_lag"] = {"store": self.root, "note": COHERENT}
        return got

    def _apply_wire(self, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """`fs_writes.apply`'s answer for ops in its wire form, run against the store."""
        typed: list[FSOp] = []
        for op in ops:
            kind, path = op["op"], str(op["path"])
            if kind == "create_immutable":
                typed.append(CreateImmutable(path, base64.b64decode(op["data"])))
            elif kind == "write_atomic":
                typed.append(WriteAtomic(path, base64.b64decode(op["data"]), int(op.get("mode", 0o644))))
            elif kind == "append_line":
                typed.append(AppendLine(path, str(op["line"])))
            elif kind in ("remove", "read"):
                typed.append(Remove(path) if kind == "remove" else Read(path))
            else:
                raise ValueError(f"unknown op {kind!r}")
        results: list[Any] = []
        for i, one in enumerate(typed):
            try:
                got = apply_each(self, [one])[0]
            except FSError as e:
                return {"results": results, "failed": {"index": i, "reason": e.reason}}
            results.append(base64.b64encode(got).decode() if isinstance(got, bytes) else got)
        return {"results": results, "failed": None}

    def fetch(self, path: str, local_path: str, on_bytes: Callable[[int], None] | None = None) -> int:
        """The file at `path` downloaded to `local_path`; OSError when it cannot be read."""
        try:
            key = self._key(self._rel(path, "fetching"))
            if key is None:
                raise FileNotFoundError(errno.ENOENT, "store: no committed result holds it", path)
            return self.store.download(key, local_path, on_bytes)
        except (StoreError, FSError) as e:
            if "no such object" in str(e):
                raise FileNotFoundError(errno.ENOENT, "store: no such object", path) from e
            raise OSError(f"store: fetching {path} failed: {_URL_IN.sub('', str(e), count=1)}") from e
        except OSError:
            raise
        except Exception as e:  # boto3's transfer manager has errors of its own
            raise OSError(f"store: fetching {path} failed: {type(e).__name__}: {e}") from e
