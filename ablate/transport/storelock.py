"""The controller lock in an object store: a lease, where a shared FS has flock(2).

The lock is one object (`locks/controller.lock`) holding `{"by", "pid", "host", "t", "lease", "id",
"renewed"}`. Taking it is a conditional create (`If-None-Match: *`): exactly one taker gets it.
While another holds it, the taker reads it (at most every `POLL` s: one GET) until its time-out. The holder
renews it every `lease / 3` s from a daemon thread, by a conditional replace (`If-Match` on the etag
it wrote; every renewal's bytes are new, so its etag is too). A lease not renewed for `lease`
seconds, by the store's clock (the object's `LastModified` against `Store.now()`), was held by a
holder that died: it is taken over by a replace with `If-Match` on the etag read, so of two takers
exactly one gets it. `release()` stops the renewals and deletes the object only while it is still
ours (`If-Match`).

So where flock's lock dies with its holder, this one expires `lease` seconds (60 by default) after
its holder died: a killed controller holds the sweep up for at most that long, and nobody breaks
anything by hand. A holder that could not renew for a whole lease (a laptop asleep, the store out
of reach) may find its lease taken over when it wakes: `lost` says so, and its `release()` then
leaves the new holder's lock alone.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import threading
import time
import uuid
from typing import Any

from ablate.remote.store.client import Store, StoreError

LEASE = 60.0  # seconds a lease lasts unless renewed
POLL = 1.0  # seconds between a waiting taker's tries, at most
SLACK = 1.0  # LastModified has whole seconds: an age within this of the lease is not yet past it


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


class StoreLease:
    """A held lease (`HeldLock`): renewed until `release()`."""

    def __init__(self, store: Store, rel: str, body: dict[str, Any], etag: str, lease: float,
                 record: str | None) -> None:
        self.store, self.rel, self.body, self.etag, self.lease = store, rel, body, etag, lease
        self.record = record
        self.lost = False  # taken over after a lease went by unrenewed: no longer ours
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="ablate-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 3):
            with self._mutex:
                body = {**self.body, "renewed": int(self.body.get("renewed", 0)) + 1}
                etag = self.etag
            try:
                got = self.store.replace(self.rel, _bytes(body), etag)
            except StoreError:
                continue  # the store out of reach: the next tick tries again, within the lease
            with self._mutex:
                if got is None:
                    self.lost = True
                    return
                self.body, self.etag = body, got

    def release(self) -> None:
        """Stop renewing; remove the holder record, then the lease while it is still ours."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        try:
            if self.record is not None:
                self.store.delete(self.record)
        finally:
            with self._mutex:
                if not self.lost:
                    self.store.delete_if(self.rel, self.etag)


def _bytes(body: dict[str, Any]) -> bytes:
    return (json.dumps(body) + "\n").encode()


def _lease_of(data: bytes) -> float:
    try:
        got = json.loads(data)
    except ValueError:
        return LEASE
    lease = got.get("lease") if isinstance(got, dict) else None
    if isinstance(lease, (int, float)) and not isinstance(lease, bool) and 0 < lease < 1e6:
        return float(lease)
    return LEASE


def acquire(store: Store, rel: str, timeout: float, *, lease: float = LEASE,
            record: tuple[str, bytes] | None = None) -> StoreLease | None:
    """The lease on `rel`, waiting up to `timeout` seconds; None when another still holds it then.
    `record` (key, bytes): put once the lease is held (deleted by `release`)."""
    deadline = time.monotonic() + max(0.0, timeout)
    offset: float | None = None  # the store's clock minus this one, measured when first needed
    while True:
        body = {"by": _who(), "pid": os.getpid(), "host": socket.gethostname(), "t": time.time(),
                "lease": lease, "id": uuid.uuid4().hex, "renewed": 0}
        got = store.get(rel)  # one read a try while another holds it
        etag: str | None = None
        if got is None:
            etag = store.create(rel, _bytes(body))  # of two takers, one
        else:
            held_for = _lease_of(got.data)
            if offset is None or time.time() + offset - got.mtime > held_for + SLACK:
                offset = store.now() - time.time()  # confirmed by the store's own clock
            if time.time() + offset - got.mtime > held_for + SLACK:
                etag = store.replace(rel, _bytes(body), got.etag)  # its holder is gone: one taker
        if etag is not None:
            held = StoreLease(store, rel, body, etag, lease, record[0] if record else None)
            if record is not None:
                try:
                    store.put(record[0], record[1])
                except BaseException:
                    held.record = None  # never written
                    held.release()
                    raise
            return held
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(POLL, left))
