"""A queue's side of a sweep kept in an object store (`ABLATE_STORE`): its runner process keeps the
instance-local copy of the sweep (`ABLATE_ROOT`, `ablate/remote/store/local_copy.py`) and the store in step,
so that run_queue, run_one and the walk go on reading and writing files.

- `pull`: the copy brought up to the store's state (claims, results, stop files, the other queues'
  heartbeats and events, the queue files, the estimates, calibration) before each step of the walk
  and before each line's stop check; before the walk's first step, the calibration figures alone
  every `PULL_SECS` (a calibrating queue waits for the others'). Nothing else is asked of the store
  while a cell trains: a queue-hour costs its heartbeats.
- `push`: what this queue writes, sent to the store as it is written (a thread, every `PUSH_SECS`;
  at once after a cell's `start`, so that it is in the store before the trainer starts, and after
  its `end`; before each pull and at the queue's end): its events by conditional appends of the new
  lines (never lost while the instance lives: the local file keeps them through an outage; never
  twice: the sent length is kept in `.mirror/`), its heartbeat by a put (its age is the store's
  `LastModified`), the failed cells' tails, calibration figures and services' logs it wrote. Each
  pass sends files before the events, so a reader that sees an `end` finds its tail.
- `claim NAME IDX`: the claim itself, a conditional create of `claims/<name>/owner` (exactly one
  claimer gets it), then in the local copy as the store has it (released there, gone here).
- `autostop_settings`: this host's `autostop/<host>.settings.json` (the launch's) into the copy as
  the queue starts, so that its runner process starts the autostop watcher.
- `config CFG WORKDIR`: a cell's config the instance's clone of the repo lacks, from launch's copy
  in the store (`cfgs/<cfg>`).
- `commit NAME STAGING STARTED`: run_one's publish: the staged files uploaded under a name of this
  publish's own (`results/<name>/<nonce>/`, MANIFEST.json last), each checked by size, the claim
  checked to be this queue's, then one conditional create of `commits/<name>`: the result exists
  for readers from that write on, once.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import traceback
import uuid
from collections.abc import Callable

from ablate.remote.queue.publish import files_under
from ablate.remote.store.client import Store, StoreError
from ablate.remote.store.local_copy import MANIFEST, WALK, Mirror, json_or_none, write_atomic

PUSH_SECS = 1.0
PULL_SECS = 10.0
_PUSHED_DIRS = ("tails", "calib", "services")


class Agent:
    """The store side of one queue (`host`, `queue`) on this instance."""

    def __init__(self, root: str, host: str, queue: str, url: str, endpoint: str | None) -> None:
        self.root, self.host, self.queue = root, host, queue
        self.events = f"events/{host}.{queue}.jsonl"
        self.heartbeat = f"heartbeats/{host}.{queue}"
        self.store = Store(url, endpoint or None)
        self.mirror = Mirror(self.store, root, own={self.events, self.heartbeat})
        self.lock = threading.RLock()
        self.seen: dict[str, tuple[int, int]] = {}  # what the last pass found of each pushed file
        self.sent_path = os.path.join(root, ".mirror", f"sent.{host}.{queue}")
        self.etag: tuple[str, bytes] | None = None  # the events object as last written here
        self.pulled = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # This queue's own files are written here, by run_queue: no sync of this copy (another
        # queue's of this host) may replace them under it. Then where its events stand.
        self.mirror.claim_own((self.events, self.heartbeat))
        self._first_sent()
        self._mark_all()  # what is here already is not this queue's to send

    # ------------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="ablate-store", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """The queue's end: a last push (its final heartbeat and events)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.push()

    def _loop(self) -> None:
        calib = 0.0
        while not self._stop.wait(PUSH_SECS):
            try:
                self.push()
                # Before its walk's first step the queue may be calibrating: its wait reads the
                # other queues' figures. After it, every read follows a pull of the walk's own.
                if not self.pulled and time.monotonic() - calib > PULL_SECS:
                    with self.lock:
                        self.mirror.sync(("calib/",))
                        self._mark_all()
                    calib = time.monotonic()
            except StoreError:
                pass  # an outage: the next pass sends it (the local files keep everything)
            except Exception:  # a bug must not end the sending: said in the pane, tried again
                traceback.print_exc()

    # ------------------------------------------------------------------ pull and push

    def pull(self, fresh: float = 0.0) -> None:
        """The local copy up to the store's state (not again within `fresh` seconds)."""
        with self.lock:
            if fresh and time.monotonic() - self.pulled < fresh:
                return
            self.push()
            self.mirror.sync(WALK)
            self._mark_all()
            self.pulled = time.monotonic()

    def autostop_settings(self) -> None:
        """This host's autostop settings (`autostop/<host>.settings.json`, written into the store by
        the launch) brought into the copy as the store has them (gone there: gone here), so that the
        queue's start finds them and starts the watcher (ablate/remote/host/autostop_watch.py), which
        keeps them in step from then on."""
        with self.lock:
            self.mirror.sync((f"autostop/{self.host}.settings.json",))

    def push(self) -> None:
        with self.lock:
            for rel in self._changed():
                path = os.path.join(self.root, rel)
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError:
                    continue
                self.store.put(rel, data)
                self.seen[rel] = _stamp(path)
            self._push_events()

    def _changed(self) -> list[str]:
        """The files this queue wrote since the last pass: its heartbeat last (it follows the
        others' writes), the tails, calibration and services' logs first."""
        out = []
        for d in _PUSHED_DIRS:
            top = os.path.join(self.root, d)
            for fn in _names(top):
                rel = f"{d}/{fn}"
                if self.seen.get(rel) != _stamp(os.path.join(top, fn)):
                    out.append(rel)
        if self.seen.get(self.heartbeat) != _stamp(os.path.join(self.root, self.heartbeat)):
            out.append(self.heartbeat)
        return out

    def _mark_all(self) -> None:
        """Everything in the pushed dirs now counts as seen (the pull's own downloads)."""
        for d in _PUSHED_DIRS:
            top = os.path.join(self.root, d)
            for fn in _names(top):
                self.seen[f"{d}/{fn}"] = _stamp(os.path.join(top, fn))

    def _push_events(self) -> None:
        """The local events file's lines not yet sent, appended to the store's object."""
        try:
            with open(os.path.join(self.root, self.events), "rb") as f:
                data = f.read()
        except OSError:
            return
        sent = self._sent()
        if sent > len(data):
            sent = 0  # a new file (the copy was cleared): everything in it is new
        new = data[sent:]
        end = new.rfind(b"\n") + 1  # whole lines only: a line being written waits for the next pass
        if end <= 0:
            return
        self.etag = self.store.append(self.events, new[:end], known=self.etag)
        self._set_sent(sent + end)

    def _first_sent(self) -> None:
        """No record of what was sent (this queue never ran in this copy): what the local file
        holds that the store has already counts as sent (a copy a sync made before this queue
        claimed it), never appended twice."""
        if os.path.exists(self.sent_path):
            return
        try:
            with open(os.path.join(self.root, self.events), "rb") as f:
                local = f.read()
        except OSError:
            return
        got = self.store.get(self.events)
        have = got.data if got is not None else b""
        self._set_sent(len(local) if have.startswith(local) else len(have) if local.startswith(have) else 0)

    def _sent(self) -> int:
        try:
            with open(self.sent_path, encoding="ascii") as f:
                return int(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0

    def _set_sent(self, n: int) -> None:
        write_atomic(self.sent_path, str(n).encode(), None)

    # ------------------------------------------------------------------ claims and commits

    def claim(self, name: str, idx: int, attempt: str, node: str) -> bool:
        """`claims/<name>` for this queue, exactly once among every claimer; its local copy."""
        line = f"{self.host} {self.queue} {idx} {time.time():.6f} {attempt or '-'} {node or '-'}\n".encode()
        etag = self.store.create(f"claims/{name}/owner", line)
        if etag is None:
            return False
        self.mirror.adopt(f"claims/{name}/owner", line, etag)
        return True

    def fetch_config(self, cfg: str, workdir: str) -> bool:
        """`cfgs/<cfg>` (launch's copy of the controller's config) into `workdir/<cfg>`: False when
        the store has none."""
        got = self.store.get(f"cfgs/{cfg}")
        if got is None:
            return False
        write_atomic(os.path.join(workdir, cfg), got.data, None)
        return True

    def commit(self, name: str, staging: str, started: str, attempt: str,
               say: Callable[[str], None]) -> int:
        """Publish the staged result: 0 committed (or committed by this very run before: an answer
        lost), 1 refused (its reason through `say`)."""
        mine = self.store.get(f"commits/{name}")
        if mine is not None:
            rec = json_or_none(mine.data)
            if isinstance(rec, dict) and rec.get("host") == self.host and rec.get("started") == started:
                return 0
            say(f"final_ckpts/{name} already exists; a durable result is never overwritten")
            return 1
        nonce = f"{self.host}.{uuid.uuid4().hex[:12]}"
        base = f"results/{name}/{nonce}/"
        files = files_under(staging)
        if MANIFEST not in files:
            say(f"{staging} has no {MANIFEST}")
            return 1
        for rel in [f for f in files if f != MANIFEST] + [MANIFEST]:
            path = os.path.join(staging, rel)
            self.store.upload(base + rel, path)
            got = self.store.head(base + rel)
            if got is None or got.size != os.path.getsize(path):
                say(f"the store holds {got.size if got else 'no'} bytes of {rel} after its upload, "
                    f"not {os.path.getsize(path)}")
                return 1
        owner = self.store.get(f"claims/{name}/owner")
        fields = owner.data.decode("utf-8", "replace").split() if owner is not None else []
        if fields[:2] != [self.host, self.queue] or (attempt and fields[4:5] != [attempt]):
            say(f"fenced: the claim of {name} is {' '.join(fields[:2]) or 'gone'}"
                f"{' attempt ' + fields[4] if len(fields) > 4 else ''} now, not this queue's; it does "
                f"not publish")
            return 1
        with open(os.path.join(staging, MANIFEST), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        rec = {"nonce": nonce, "manifest_sha256": digest, "host": self.host, "queue": self.queue,
               "attempt": attempt or None, "started": started, "t": time.time()}
        if self.store.create(f"commits/{name}", json.dumps(rec).encode()) is None:
            say(f"final_ckpts/{name} appeared while syncing; a durable result is never overwritten")
            return 1
        return 0


def _names(top: str) -> list[str]:
    try:
        names = os.listdir(top)
    except OSError:
        return []
    return sorted(n for n in names if not n.startswith(".") and os.path.isfile(os.path.join(top, n)))


def _stamp(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, -1)
    return (st.st_mtime_ns, st.st_size)


def from_env(root: str, host: str, queue: str) -> Agent | None:
    """The queue's agent when its spec names a store (run_queue exports ABLATE_STORE), else None."""
    url = os.environ.get("ABLATE_STORE", "")
    if not url:
        return None
    return Agent(root, host, queue, url, os.environ.get("ABLATE_STORE_ENDPOINT") or None)
