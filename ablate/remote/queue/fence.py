"""The fence of a revived queue (docs/ARCHITECTURE.md, "A queue that comes back"): while a cell runs,
the queue's runner process watches the cell's claim, and stops the cell when the claim is no longer
this run's. Stdlib only (in the runner's zipapp).

A Vast.ai interruptible instance is paused when outbid (every process frozen, the box unreachable)
and resumes by itself, disk intact, minutes or hours later; a host can come back from a network
partition. Meanwhile the controller may call its cell `lost` and `ablate remediate` run it elsewhere:
the claim `claims/<name>/owner` is moved to `released/<name>.<t>/` (the same directory, renamed, so
its `owner` is this run's line) and another queue claims the cell anew. A run whose claim is gone
has been superseded: it must stop, and never publish.

The lease is the claim's owner line as it was when the cell started (`host queue idx t attempt
node`: the claim time tells two runs of one queue name apart, a queue restarted on a new box under
the old host's name); when the claim was not this queue's then (released or taken between the claim
and the cell's start) or could not be read, any line of this host and queue stands for it, and the
first such line read becomes the lease. A check reads the claim as the FS's server (an open) or the
store has it now:

- the owner line is the lease: `held`;
- another owner line: `taken` by that host/queue (a fact: this client wrote the lease, so its view
  never holds an older line than it);
- no owner, and a `released/<name>.*/owner` that is the lease: `released` by remediate (a fact: the
  claim's own directory, renamed);
- no owner and no such record: on a network FS this may be a stale view (a client's negative cache
  of a name another node created, NFS's acdirmax): `gone` only once it has stayed so for the FS's
  longest lag (`claim_wait`, as a claimer waits before taking an ownerless claim over), and the FS
  answered each time; until then nothing is concluded;
- the FS or the store could not be read (an outage, the link still down): nothing is concluded.

`Fence` holds one cell's lease and the time it was last seen held; `Watcher` checks it every
heartbeat in a thread of the served runner and, on a verdict, writes the verdict file (`{"how", "by",
"away"}`) and rings run_queue's shell (SIGUSR1), which stops a cell whose verdict file is there, so the
cell is stopped within one heartbeat period of the queue coming back. `end_fields` turns the file into
the cell's `end` fields when it has ended.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# A name from the queue's own checked values (host, queue: safe path components)
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}")


@dataclass(frozen=True)
class Seen:
    """One read of a cell's claim: its owner line (None: no owner), the owner lines of its released
    claims, and whether the storage answered at all."""

    owner: str | None
    released: tuple[str, ...] = ()
    answered: bool = True


DOWN = Seen(None, (), answered=False)


@dataclass(frozen=True)
class Verdict:
    how: str  # held | taken | released | gone | unsure
    by: str = "-"  # taken: the owner's host/queue; released: remediate; gone: -
    why: str = ""  # unsure: what is being waited for

    @property
    def superseded(self) -> bool:
        return self.how in ("taken", "released", "gone")

    def text(self, name: str) -> str:
        if self.how == "taken":
            return f"the claim of {name} is {self.by}'s now"
        if self.how == "released":
            return f"the claim of {name} was released by `ablate remediate`"
        if self.how == "gone":
            return f"the claim of {name} is gone (no owner, no release record)"
        return f"the claim of {name} is this run's" if self.how == "held" else self.why


def words(line: str | None) -> list[str]:
    return line.split() if line else []


def by_of(owner: str) -> str:
    """`host/queue` of an owner line, `?` when it does not name them plainly."""
    w = owner.split()
    return f"{w[0]}/{w[1]}" if len(w) >= 2 and _WORD.fullmatch(w[0]) and _WORD.fullmatch(w[1]) else "?"


def judge(lease: str | None, me: tuple[str, str], seen: Seen, absent_for: float,
          claim_wait: float) -> Verdict:
    """The verdict on one read (the module's docstring); `absent_for`: how long the claim has been
    seen without an owner, every read answered (0 at the first). Without a lease (the claim was
    not this queue's, or not readable, as the cell started) any line of this host and queue is its."""
    if not seen.answered:
        return Verdict("unsure", why="the sweep's storage did not answer")

    def mine(line: str) -> bool:
        return words(line) == words(lease) if lease else words(line)[:2] == list(me)

    if seen.owner is not None and words(seen.owner):
        if mine(seen.owner):
            return Verdict("held")
        return Verdict("taken", by_of(seen.owner))
    if any(mine(r) for r in seen.released):
        return Verdict("released", "remediate")
    if absent_for >= claim_wait:
        return Verdict("gone")
    return Verdict("unsure", why=f"no owner for {absent_for:.0f}s, within the FS's lag ({claim_wait:.0f}s)")


def ours(owner: str | None, host: str, queue: str) -> bool:
    """The owner line names this host and queue."""
    return words(owner)[:2] == [host, queue]


# ---------------------------------------------------------------- reading a claim


def _read_line(path: str) -> str | None:
    """The first line of `path`; None when it or its directory does not exist; OSError otherwise."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:  # an open asks a network FS's server
            return f.readline().strip()
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise


def read_fs(root: str, name: str) -> Seen:
    """The claim on the shared FS: `claims/<name>/owner`, and when it has none, the owners of
    `released/<name>.<t>/`."""
    try:
        owner = _read_line(os.path.join(root, "claims", name, "owner"))
        if owner:
            return Seen(owner)
        released = []
        try:
            entries = os.listdir(os.path.join(root, "released"))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            if entry.startswith(name + ".") and entry[len(name) + 1:].replace(".", "").isdigit():
                line = _read_line(os.path.join(root, "released", entry, "owner"))
                if line:
                    released.append(line)
        return Seen(None, tuple(released))
    except OSError:
        return DOWN


def read_store(store: object, name: str) -> Seen:
    """The claim in a sweep's object store (`ablate/remote/store/client.py`'s Store): strongly
    consistent, so its absence is as sure as its presence."""
    try:
        got = store.get(f"claims/{name}/owner")  # type: ignore[attr-defined]
        if got is not None and got.data.strip():
            return Seen(got.data.decode("utf-8", "replace").strip())
        released = []
        for obj in store.list(f"released/{name}."):  # type: ignore[attr-defined]
            rest = obj.key[len(f"released/{name}."):]
            if rest.endswith("/owner") and rest[:-len("/owner")].replace(".", "").isdigit():
                rec = store.get(obj.key)  # type: ignore[attr-defined]
                if rec is not None:
                    released.append(rec.data.decode("utf-8", "replace").strip())
        return Seen(None, tuple(released))
    except Exception:  # the store unreachable (its client waited, then gave up): nothing concluded
        return DOWN


# ---------------------------------------------------------------- one cell's fence


class Fence:
    """One running cell's lease and what its checks have seen."""

    def __init__(self, name: str, lease: str | None, me: tuple[str, str], read: Callable[[str], Seen],
                 claim_wait: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.lease, self.me, self.read = name, lease, me, read
        self.claim_wait, self.clock = claim_wait, clock
        self.held_at = clock()  # when the claim was last seen held (the lease was read then)
        self.absent_since: float | None = None

    def check(self) -> Verdict:
        seen = self.read(self.name)
        now = self.clock()
        if seen.answered and seen.owner is None:  # an absence counts over reads that answered
            self.absent_since = now if self.absent_since is None else self.absent_since
        else:
            self.absent_since = None
        v = judge(self.lease, self.me, seen, 0.0 if self.absent_since is None else now - self.absent_since,
                  self.claim_wait)
        if v.how == "held":
            self.held_at = now
            self.lease = self.lease or seen.owner
        return v

    def away(self) -> float:
        """Seconds since the claim was last seen held: how long the queue was gone (paused, cut off)."""
        return max(0.0, self.clock() - self.held_at)


def verdict_line(v: Verdict, away: float) -> str:
    """The verdict file's one line: the fields of the stopped cell's `end` event, as JSON."""
    return json.dumps({"how": v.how, "by": v.by, "away": round(away, 1)}) + "\n"


def end_fields(path: str, rc: int) -> str:
    """What the cell's `end` event says of a supersession (`, "reason": "superseded", "how": ...`;
    "" for none), when the cell has ended: from the verdict file, which is removed, or (no file: the
    runner that wrote it is gone) from run_one's exit 75."""
    try:
        with open(path, encoding="utf-8") as f:
            got = json.loads(f.readline())
        os.unlink(path)
    except (OSError, ValueError):
        got = None
    if not isinstance(got, dict):
        return ', "reason": "superseded"' if rc == 75 else ""
    fields = {"reason": "superseded", **{k: got.get(k) for k in ("how", "by", "away")}}
    return "".join(f", {json.dumps(k)}: {json.dumps(v)}" for k, v in fields.items())


def write_verdict(path: str, line: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(line)
    os.replace(tmp, path)


class Watcher:
    """The served runner's thread: the armed cell's claim checked every `period` seconds. When the
    run is superseded: the verdict file written once, and `ring` (run_queue's shell) sent SIGUSR1,
    again each period until the cell is disarmed (a ring that came just before the shell began to
    wait is not lost). `arm` and `disarm` come from run_queue's `watch` requests, `check_now` from
    run_one's `fence` before it publishes (the file only: run_one itself refuses to publish)."""

    def __init__(self, me: tuple[str, str], read: Callable[[str], Seen], period: float,
                 claim_wait: float) -> None:
        self.me, self.read, self.period, self.claim_wait = me, read, max(0.2, period), claim_wait
        self.lock = threading.Lock()
        self.fence: Fence | None = None
        self.path = ""
        self.ring = 0  # the pid to signal, 0: none
        self.rung = False  # the armed cell's verdict is written: ring until it is disarmed
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    def arm(self, name: str, path: str, lease: str | None, ring: int = 0) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # an earlier cell's verdict, never this one's
        with self.lock:
            self.fence = Fence(name, lease, self.me, self.read, self.claim_wait)
            self.path, self.ring, self.rung = path, ring, False
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="fence", daemon=True)
            self.thread.start()
        if lease is None:  # not this queue's claim as the cell starts: checked at once
            self.wake.set()

    def disarm(self) -> None:
        with self.lock:
            self.fence, self.ring, self.rung = None, 0, False

    def check_now(self, name: str) -> Verdict | None:
        """One check of the armed cell `name` now (None when it is not the armed one); a verdict
        is written to the file."""
        with self.lock:
            fence = self.fence if self.fence is not None and self.fence.name == name else None
        if fence is None:
            return None
        v = fence.check()
        if v.superseded:
            self._record(fence, v)
        return v

    def _record(self, fence: Fence, v: Verdict) -> bool:
        """The verdict written, once per armed cell; False when it was disarmed meanwhile."""
        with self.lock:
            if self.fence is not fence or self.rung:
                return self.fence is fence
            self.rung = True
            path = self.path
        write_verdict(path, verdict_line(v, fence.away()))
        return True

    def _ring(self) -> None:
        with self.lock:
            pid = self.ring if self.rung else 0
        if pid > 0:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGUSR1)

    def _run(self) -> None:
        while True:
            self.wake.wait(self.period)
            self.wake.clear()
            with self.lock:
                fence, rung = self.fence, self.rung
            if fence is None:
                continue
            if rung:
                self._ring()
                continue
            try:
                v = fence.check()
                if v.superseded and self._record(fence, v):
                    self._ring()
            except Exception:  # a check that fails concludes nothing; the next one tries again
                continue
