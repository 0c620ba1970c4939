"""The autostop watcher's side of a sweep kept in an object store (`ABLATE_STORE`). On a storage host
ROOT is the instance's own copy of the sweep (`ablate/remote/store/local_copy.py`): the watcher
(`ablate/remote/host/autostop_watch.py`) reads and writes files there as on a shared FS, and this
keeps that copy and the store in step around each check:

- `sync`: before each check, the copy brought up to the store's state: what the walk reads
  (`local_copy.WALK`: claims, the committed results as their MANIFEST.json, stop files, heartbeats,
  events, queue files and ledgers, the estimates, calibration) and `autostop/` (the launch's
  settings, `ablate autostop`'s controls, the other watchers' records, the elections);
- `verify_files`: the files of this host's own committed results (their MANIFEST.json names it)
  fetched into the copy, once per publish, so that `autostop.unverified_of` verifies in place what
  the store holds (verification reads the files: never a pickle executed);
- `publish`: the watcher's record, `autostop/<host>.state.json`, put whole; its lines of
  `autostop/<host>.jsonl` appended by conditional appends of the new whole lines (what was sent is
  kept under `.mirror/`: never lost through an outage, never sent twice);
- `elect_once`: who stays for remediation, decided once in the store (a conditional create of
  `autostop/keepers.<gen>.json`) where a shared FS decides it by a hard link.

Both records are this host's own keys in the copy (`Mirror.claim_own`): no sync replaces them. Times
are this machine's clock, which the copy's mtimes are moved into (the store's offset). The store's
client takes the standard credential chain: here the environment the watcher inherited from its
queue's runner process (run_queue hands the launch's credentials to that process alone). Nothing
here writes or logs them, and the stop command runs without them (`CREDENTIALS`): the instance's own
chain applies to it, as on a host that mounts a shared FS.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Iterable, Mapping

from ablate.remote.host import autostop
from ablate.remote.host.autostop import Unsure
from ablate.remote.store.client import Store, StoreDown, StoreError
from ablate.remote.store.local_copy import MANIFEST, WALK, Mirror, json_or_none, read_or_none, write_atomic

PREFIXES = (*WALK, "autostop/")  # WALK has estimates.tsv (the speeds an election is by)
# The launch's credentials, in the watcher's environment for the store alone: never the stop command's
CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


class StoreSide:
    """The store side of `host`'s autostop watcher on its copy `root` of the sweep at `url`."""

    credentials = CREDENTIALS

    def __init__(self, root: str, host: str, url: str, endpoint: str | None) -> None:
        self.root, self.host = root, host
        self.state = f"autostop/{host}.state.json"
        self.events = f"autostop/{host}.jsonl"
        # botocore's own retries only bridge a blip: the outage wait (ABLATE_FS_WAIT) retries the rest
        self.store = Store(url, endpoint, attempts=2)
        self.mirror = Mirror(self.store, root, own={self.state, self.events})
        self.mirror.claim_own((self.state, self.events))
        self.sent_path = os.path.join(root, ".mirror", f"sent.autostop.{host}")
        self.etag: tuple[str, bytes] | None = None  # the events object as last written here
        self.failed: dict[str, str] = {}  # key -> why its last send failed (sent again next time)
        # why the last sync, or a send since, found the store down: nothing is sent until a sync succeeds
        self.down: str | None = None

    @property
    def error(self) -> str | None:
        """Why the store does not have the watcher's latest record or lines; None when it does."""
        return next(iter(self.failed.values()), None)

    # ------------------------------------------------------------------ the sweep, from the store

    def sync(self) -> None:
        """The copy up to the store's state (StoreError when the store cannot be read)."""
        try:
            self.mirror.sync(PREFIXES, results="manifest")
        except StoreError as e:
            self.down = str(e)
            raise
        self.down = None

    def pending(self, verified: Collection[str]) -> list[str]:
        """This host's committed results in the copy whose MANIFEST.json's sha256 is not among
        `verified` (the watcher's cache of verified manifests)."""
        final = os.path.join(self.root, "final_ckpts")
        try:
            names = sorted(n for n in os.listdir(final) if not n.startswith("."))
        except OSError:
            return []
        out = []
        for name in names:
            data = read_or_none(os.path.join(final, name, MANIFEST))
            if data is not None and hashlib.sha256(data).hexdigest() not in verified \
                    and _host_of(data) == self.host:
                out.append(name)
        return out

    def verify_files(self, names: Iterable[str]) -> list[str]:
        """The files of each of `names` that is this host's own committed result, fetched from the
        store into the copy (once per publish: a result fetched whole is not fetched again); the
        names whose files are all here. Unsure when the store does not give them."""
        done = []
        for name in names:
            here = os.path.join(self.root, "final_ckpts", name)
            if not name or name.startswith(".") or "/" in name \
                    or _host_of(read_or_none(os.path.join(here, MANIFEST))) != self.host:
                continue  # another host's result: its own watcher verifies it
            try:
                if self.mirror.fetch_result(name):
                    done.append(name)
            except Exception as e:  # StoreError, and boto3's transfer manager has errors of its own
                raise Unsure(f"the files of {name} could not be fetched from the store: {e}") from None
        return done

    def elect_once(self, path: str, speeds: Mapping[str, float], keep: int, host: str,
                   now: float) -> tuple[str, ...]:
        """`autostop.elect_once` with the store as the sweep's storage: the first instance to need
        the election creates its record there (a conditional create: exactly one answer); each
        instance takes that one into its copy and reads it as on a shared FS."""
        rel = os.path.relpath(path, self.root)
        try:
            got = self.store.get(rel)
            if got is None:
                data = (json.dumps({"hosts": list(autostop.elect(speeds, keep)), "keep": keep, "by": host,
                                    "t": now}) + "\n").encode()
                etag = self.store.create(rel, data)
                if etag is not None:
                    self.mirror.adopt(rel, data, etag)
                    return autostop.elect_once(path, speeds, keep, host, now)
                got = self.store.get(rel)  # another instance decided first: its answer stands
            if got is None:
                raise Unsure(f"the election's record {self.store.where(rel)} was there, then gone")
            self.mirror.adopt(rel, got.data, got.etag)
        except StoreError as e:
            raise Unsure(f"who stays for remediation could not be decided in the store: {e}") from None
        return autostop.elect_once(path, speeds, keep, host, now)

    # ------------------------------------------------------------------ the watcher's records, to the store

    def publish(self, paths: Iterable[str]) -> bool:
        """The watcher's own files among `paths` sent to the store: its record put whole, its lines
        appended. False when one could not be sent (`error` says why; the next call sends it)."""
        for path in paths:
            rel = os.path.relpath(path, self.root)
            if rel not in (self.state, self.events):
                continue  # never anything but its own two keys
            if self.down is not None:  # the store just failed: not waited out again in this check
                self.failed[rel] = f"not sent: {self.down}"
                continue
            try:
                if rel == self.state:
                    data = read_or_none(path)
                    if data is not None:
                        self.store.put(rel, data)
                else:
                    self._push_events()
            except StoreError as e:
                self.failed[rel] = str(e)
                if isinstance(e, StoreDown):  # its outage wait spent: not waited out again in this check
                    self.down = str(e)
                if rel == self.events:
                    self.etag = None  # read again before the next append
                continue
            self.failed.pop(rel, None)
        return not self.failed

    def _push_events(self) -> None:
        data = read_or_none(os.path.join(self.root, self.events))
        if data is None:
            return
        if not os.path.exists(self.sent_path):
            self._first_sent(data)
        sent = self._sent()
        if sent > len(data):
            sent = 0  # a new file (the copy was cleared): everything in it is new
        end = data.rfind(b"\n", sent) + 1  # whole lines only
        if end <= sent:
            return
        self.etag = self.store.append(self.events, data[sent:end], known=self.etag)
        write_atomic(self.sent_path, str(end).encode(), None)

    def _first_sent(self, local: bytes) -> None:
        """No record of what was sent (this watcher's first send on this copy): what the store
        already holds of the local file counts as sent (never appended twice)."""
        got = self.store.get(self.events)
        have = got.data if got is not None else b""
        n = len(local) if have.startswith(local) else len(have) if local.startswith(have) else 0
        write_atomic(self.sent_path, str(n).encode(), None)

    def _sent(self) -> int:
        try:
            with open(self.sent_path, encoding="ascii") as f:
                return int(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0


def _host_of(manifest: bytes | None) -> str | None:
    rec = json_or_none(manifest) if manifest is not None else None
    host = rec.get("host") if isinstance(rec, dict) else None
    return host if isinstance(host, str) else None


def from_env(root: str, host: str) -> StoreSide | None:
    """The watcher's store side when its queue's spec names a store (run_queue exports ABLATE_STORE,
    and the watcher inherits its runner process's environment), else None."""
    url = os.environ.get("ABLATE_STORE", "")
    if not url:
        return None
    return StoreSide(root, host, url, os.environ.get("ABLATE_STORE_ENDPOINT") or None)
