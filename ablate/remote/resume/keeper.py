"""The instance's side of a cell's resume state (issue 45; the copies: `copies.py`). Stdlib only:
part of the runner's zipapp. Three verbs, asked by run_one of its queue's served runner process
(else a Python start of its own):

- `resume-prep NAME CKPT_DIR RESUME ENTRIES PICK` before the trainer starts: when the entries
  (the spec's `resume:`, `-` when it is off) resolve to nothing in CKPT_DIR, the newest committed
  copy that verifies (else the one before it) is restored there. The copies are where the sweep
  is: under its root on a shared FS (`copies.FsPlace`), in its object store when the run spec names
  one (`store_place.StorePlace`: the runner process decides, by ABLATE_STORE). Answers one line,
  `resume=R attempt=N run_id=X step=S ev=FIELDS` (R: 1 when CKPT_DIR now holds something to
  resume from, else 0; RESUME, the walk's, when resume is off; S empty when the names say no step;
  FIELDS the `restore` event's JSON fields, or `-`), then lines for the cell's log.
  In the served process it also starts the cell's keeper: a thread that copies each new complete
  checkpoint to the sweep.
- `resume-end NAME RC CKPT_DIR ENTRIES PICK` when the trainer has exited: the keeper stops; a cell
  that did not succeed (cut, stopped, failed) gets one last look, its checkpoint copied if it is
  new (the trainer has ended: nothing is written any more).
- `resume-drop NAME` once the result is published: every copy of the cell goes.

Complete: a checkpoint the trainer has finished writing. Frameworks write in place (Lightning's
`.ckpt`, older HF) or under a temporary name renamed when complete (recent HF `tmp-checkpoint-N`,
which no entry names); a look counts when its files' sizes and mtimes are the same at two looks
`LOOK_SECS` apart and the newest is at least that old. So a small checkpoint is durable within about
two looks plus its copy; the work a cut can lose is the trainer's checkpoint interval plus that.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ablate.remote.queue.publish import SyncFailed, resolve
from ablate.remote.resume import copies
from ablate.remote.resume.store_place import StorePlace
from ablate.remote.store.client import StoreError

if TYPE_CHECKING:
    from ablate.remote.store.client import Store

LOOK_SECS = 1.0
VERBS = ("resume-prep", "resume-end", "resume-drop")
OFF = "-"


def run_id(root: str, cell: str) -> str:
    """The cell's identity across attempts and hosts: the sweep's and the cell's names, hashed."""
    return hashlib.sha256(f"{os.path.basename(root.rstrip('/'))}/{cell}".encode()).hexdigest()[:16]


def current(ckpt_dir: str, entries: str, pick: str) -> copies.Look:
    """What the entries name in ckpt_dir now (empty when they name nothing, or not all of it)."""
    if not entries.strip() or entries == OFF:
        return copies.Look((), ())
    try:
        rels = resolve(ckpt_dir, entries, pick)
    except (SyncFailed, OSError):
        return copies.Look((), ())
    return copies.look(ckpt_dir, rels)


def _age(secs: float) -> str:
    return f"{secs / 60:.0f} min" if secs >= 90 else f"{secs:.0f} s"


Place = copies.FsPlace | StorePlace


def place_of(where: str | Place) -> Place:
    """A sweep root's path is a shared FS's copies."""
    return copies.FsPlace(where) if isinstance(where, str) else where


def prep(where: str | Place, cell: str, ckpt_dir: str, walk_resume: str, entries: str, pick: str,
         started: str) -> tuple[list[str], dict[str, object] | None]:
    """(the answer's lines, the `restore` event's fields or None); see the module's docstring.
    `started`: where it starts (`host queue`), for the cell's attempts."""
    place = place_of(where)
    attempt = place.count_attempt(cell, f"{started} {time.time():.3f}")
    log: list[str] = []
    event: dict[str, object] | None = None
    step: int | None = None
    if entries == OFF or not entries.strip():
        resume = walk_resume if walk_resume in ("0", "1") else "0"
    elif not (here := current(ckpt_dir, entries, pick)).empty:
        resume, step = "1", copies.step_of([f[0] for f in here.files])
        log.append(f"# ablate resume: from this instance's own checkpoint ({_few(here)})")
        event = {"from": "local", "step": step, "written": round(here.newest_ns / 1e9, 3)}
    else:
        resume = "0"
        tried: list[str] = []
        for copy in place.committed(cell)[: copies.KEEP]:
            with place.fetched(copy) as (local, move):
                problem = copies.verify(local)
                if problem is None:
                    rec = copies.read_record(local) or {}
                    files = copies.restore(local, ckpt_dir, move)
            if problem is not None:
                tried.append(f"copy {copy.seq}: {problem}")
                log.append(f"# ablate resume: durable copy {copy.seq} is damaged, not restored: {problem}")
                continue
            step = rec.get("step") if isinstance(rec.get("step"), int) else None
            age = time.time() - float(rec.get("committed") or time.time())
            src: dict[str, Any] = rec["source"] if isinstance(rec.get("source"), dict) else {}
            log.append(f"# ablate resume: restored durable copy {copy.seq} ({len(files)} file(s)"
                       f"{f', step {step}' if step is not None else ''}, {_age(age)} old, made on "
                       f"{src.get('host', '?')}) into {ckpt_dir}")
            written = max((int(f.get("mtime_ns") or 0) for f in rec.get("files") or []), default=0) / 1e9
            event = {"from": "copy", "seq": copy.seq, "step": step, "age": round(age, 1),
                     "made_on": src.get("host"), "written": round(written, 3) or None, "skipped": tried}
            resume = "1"
            break
        else:  # said when it matters: a re-entered cell, or copies that did not verify
            if tried or walk_resume == "1":
                log.append("# ablate resume: from scratch: nothing durable to resume from"
                           + (f" ({'; '.join(tried)})" if tried else ""))
                event = {"from": "none", "skipped": tried}
    ev = json.dumps(event)[1:-1] if event is not None else OFF
    head = (f"resume={resume} attempt={attempt} run_id={run_id(place.root, cell)} "
            f"step={'' if step is None else step} ev={ev}")
    return [head, *log], event


def _few(seen: copies.Look) -> str:
    names = [f[0] for f in seen.files]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


class Keeper:
    """One running cell's copies: a thread that looks every `period` seconds and commits each new
    complete checkpoint (see the module's docstring), while `still_ours` says the claim is this
    run's. `stop` ends it; `flush` takes one last look without waiting for it to settle."""

    def __init__(self, where: str | Place, cell: str, ckpt_dir: str, entries: str, pick: str,
                 source: dict[str, str], still_ours: Callable[[], bool] = lambda: True,
                 period: float = LOOK_SECS, say: Callable[[str], None] | None = None) -> None:
        self.place = place_of(where)
        self.cell, self.ckpt_dir, self.entries, self.pick = cell, ckpt_dir, entries, pick
        self.source, self.still_ours, self.period = source, still_ours, period
        self.say = say or (lambda s: print(s, file=sys.stderr, flush=True))
        self.lock = threading.Lock()  # one copy at a time: the thread's and a flush
        self.done = threading.Event()  # no more looks
        self.cancelled = threading.Event()  # and no commit: the cell succeeded (its copies go)
        last = self.place.committed(cell)
        rec = self.place.record(last[0]) if last else None
        self.saved = _look_of(rec)  # what the newest committed copy holds: not copied again
        self.prev: copies.Look | None = None
        self.thread = threading.Thread(target=self._run, name=f"resume-{cell}", daemon=True)

    def start(self) -> Keeper:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.done.wait(self.period):
            try:
                self.once(settle=True)
            except Exception as e:  # a look that fails copies nothing; the next one tries again
                self.say(f"ablate resume: {self.cell}: {e}")

    def once(self, settle: bool) -> copies.Copy | None:
        """One look; a commit when it finds a new complete checkpoint."""
        with self.lock:
            seen = current(self.ckpt_dir, self.entries, self.pick)
            if seen.empty or seen == self.saved:
                return None
            if settle:
                stable = seen == self.prev and time.time_ns() - seen.newest_ns >= self.period * 1e9
                self.prev = seen
                if not stable:
                    return None
            if self.place.published(self.cell):  # a result stands: nothing resumes from a copy
                return None
            try:
                got = self.place.commit(self.cell, self.ckpt_dir, seen, self.source,
                                        lambda: not self.cancelled.is_set() and self.still_ours()
                                        and not self.place.published(self.cell))
            except copies.CopyFailed as e:
                self.say(f"ablate resume: {self.cell}: not copied: {e}")
                self.prev = None
                return None
            self.saved = seen
            return got

    def stop(self, cancel: bool = False) -> None:
        """No more looks; with `cancel` (the cell succeeded) a copy in flight is not committed and
        this does not wait for it, else it waits for that copy."""
        self.done.set()
        if cancel:
            self.cancelled.set()
        elif self.thread.is_alive():
            self.thread.join(timeout=self.period * 2 + 600)

    def flush(self) -> copies.Copy | None:
        return self.once(settle=False)


def _look_of(rec: dict[str, Any] | None) -> copies.Look | None:
    """What a copy's RESUME.json says it holds, as a look of its source would see it."""
    if rec is None:
        return None
    try:
        files = tuple(sorted((str(f["path"]), int(f["size"]), int(f["mtime_ns"])) for f in rec["files"]))
        links = tuple(sorted((str(ln["path"]), str(ln["target"])) for ln in rec.get("links", [])))
    except (KeyError, TypeError, ValueError):
        return None
    return copies.Look(files, links)


class Keepers:
    """The runner's keepers, one per running cell (a queue runs one cell at a time), and where the
    sweep keeps its copies. `served`: in the queue's runner process, which keeps a cell's keeper
    running between its verbs; else a Python start of run_one's own (one verb, no thread)."""

    def __init__(self, base: Sequence[str], still_ours: Callable[[str], bool] | None = None,
                 place: Place | None = None, served: bool = True) -> None:
        self.base = base
        self.place = place if place is not None else place_for(base[0])
        self.still_ours = still_ours or (lambda cell: _holds(self.place, base[1], base[2], cell))
        self.served = served
        self.running: dict[str, Keeper] = {}

    def end_all(self) -> None:
        """The queue's cell has ended: its keeper stops, a copy in flight not committed (a cut
        cell's last look was run_one's `resume-end`)."""
        for k in self.running.values():
            k.stop(cancel=True)
        self.running.clear()

    def keeper(self, name: str, ckpt_dir: str, entries: str, pick: str) -> Keeper:
        host, queue = self.base[1], self.base[2]
        return Keeper(self.place, name, ckpt_dir, entries, pick, _source(host, queue),
                      lambda: self.still_ours(name))

    def verb(self, args: Sequence[str], out: Callable[[str], None]) -> int:
        return verb(args, out, self)


def place_for(root: str, store: Store | None = None) -> Place:
    """The sweep's copies: in its object store when the run spec names one (ABLATE_STORE; `store`,
    the queue's own client, when there is one), else under its root on the shared FS."""
    url = os.environ.get("ABLATE_STORE", "")
    if store is None and url:
        from ablate.remote.store.client import Store

        store = Store(url, os.environ.get("ABLATE_STORE_ENDPOINT") or None)
    return StorePlace(store, root) if store is not None else copies.FsPlace(root)


def _holds(place: Place, host: str, queue: str, name: str) -> bool:
    """Read now (a process of its own, without the served fence): the cell's claim is not
    another run's (a paused box's run_one, stopped as it thawed, never commits over the new owner)."""
    from ablate.remote.queue import fence

    seen = (fence.read_store(place.store, name) if isinstance(place, StorePlace)
            else fence.read_fs(place.root, name))
    return not fence.judge(None, (host, queue), seen, 0.0, 1.0).superseded


def _source(host: str, queue: str) -> dict[str, str]:
    """Where a copy was made: the host, queue, machine (a Slurm host's node) and the job's attempt."""
    return {"host": host, "queue": queue, "node": socket.gethostname(),
            "attempt": os.environ.get("ABLATE_JOB_ATTEMPT", "")}


def _on(entries: str) -> bool:
    return entries != OFF and bool(entries.strip())


def verb(args: Sequence[str], out: Callable[[str], None], keepers: Keepers) -> int:
    """The three verbs (see the module's docstring); rc 2 for bad arguments, 3 when the store
    could not be reached (run_one then starts the trainer as the walk said: nothing restored)."""
    try:
        return _verb(args, out, keepers)
    except StoreError as e:
        print(f"runner: {args[0]}: the store could not be reached: {e}", file=sys.stderr)
        return 3


def _verb(args: Sequence[str], out: Callable[[str], None], keepers: Keepers) -> int:
    from ablate.remote.queue.grammar import SAFE_NAME

    host, queue = keepers.base[1], keepers.base[2]
    name = args[1] if len(args) > 1 else ""
    if not SAFE_NAME.fullmatch(name):
        print(f"runner: {args[0] if args else 'resume'}: a cell name, got {name!r}", file=sys.stderr)
        return 2
    if args[0] == "resume-prep":
        if len(args) != 6 or not os.path.isabs(args[2]) or os.path.basename(args[2].rstrip("/")) != name:
            print("runner: resume-prep NAME CKPT_DIR RESUME ENTRIES PICK", file=sys.stderr)
            return 2
        _, _, ckpt_dir, walk_resume, entries, pick = args
        lines, _event = prep(keepers.place, name, ckpt_dir, walk_resume, entries, pick, f"{host} {queue}")
        for line in lines:
            out(line)
        if keepers.served and _on(entries):
            old = keepers.running.pop(name, None)
            if old is not None:
                old.stop()
            keepers.running[name] = keepers.keeper(name, ckpt_dir, entries, pick).start()
        return 0
    if args[0] == "resume-end":
        if len(args) != 6 or not args[2].isdigit() or not os.path.isabs(args[3]):
            print("runner: resume-end NAME RC CKPT_DIR ENTRIES PICK", file=sys.stderr)
            return 2
        _, _, rc, ckpt_dir, entries, pick = args
        k = keepers.running.pop(name, None)
        if k is not None:
            k.stop(cancel=rc == "0")
        if rc != "0" and _on(entries):
            got = (k or keepers.keeper(name, ckpt_dir, entries, pick)).flush()
            if got is not None:
                out(f"# ablate resume: its last checkpoint made durable as copy {got.seq}")
        return 0
    if args[0] == "resume-drop":
        keepers.place.drop(name)
        return 0
    return 2
