"""The runner's decisions: what `run_queue.sh` asks, answered by one long-lived process per queue.

Stdlib only. `ablate deploy` ships this module with the others it imports as one zipapp,
`wrappers/runner.<sha12>.pyz` (content-addressed like the wrappers); run_queue starts it once, as
its co-process (`ablate/remote/queue/serve.py`), with the profile's env activated and its python
(`ABLATE_PYTHON`):

and asks it its decisions over a pipe (and its walk: `ablate/remote/queue/walk.py`). The same verbs run
alone too, for tests and by hand:

    python3 runner.<sha12>.pyz VERB ROOT HOST QUEUE SLOT|- [options]

with the spec's `ABLATE_TASK_EPOCHS` and `ABLATE_HEARTBEAT_SECS` in its environment. Verbs (their
output is lines of space-separated words, every word a safe name or a number):

- `line --from K`: this queue's line K by the one queue-line grammar (`ablate/remote/queue/grammar.py`):
  `cell NAME CFG TASK EPOCHS CAT PRIORITY`, `skip` (blank or comment), `invalid`, or `none` (not
  written yet). The file is opened each time (on NFS an open revalidates the client's cache, so an
  append is seen) and parsed again only when it changed.
- `lines --from K`: every line from K on: `K cell ...`, `K skip`, `K invalid`; then `n N`, the
  number of lines, and `size BYTES`, the file's size as read.
- `reentries` (also `lines --reentries`): the cells this queue took from others and that were cut
  before their `end` (its events, written by earlier runs of it): `reenter FROM_QUEUE IDX NAME CFG
  TASK EPOCHS CAT` each, oldest first.
- `deal --next K [--deferred "I J"]`: the shared head's deal (below); `head_on 0|1`, `head NAME...`,
  and `take deal QUEUE HOST IDX NAME CFG TASK EPOCHS CAT HERE_MS deal` when a head cell is dealt
  to this runner.
- `drained --next K [--deferred ..] [--head 0|1] [--steal 0|1] [--skip "Q:I ..."]`: what a runner
  whose own lines are done does: the deal (with --head 1), else the steal pick (with --steal 1);
  the same lines, the steal's `take steal ... BY` (BY: `learned` or `estimates`).
- `calibrate --secs S --stop FILE` (a process of its own, in the background: it runs the user's
  benchmark): this host and slot's measurement (`calibrate:`; kept from an earlier sweep on this
  machine, else the user's benchmark timed now: `ablate/remote/queue/calibrate.py`), `event , "rc": ...`
  the `calibrate` event's fields when it measured or took a kept figure; then the wait, at most S
  seconds, until every other running queue has measured or started a cell: `waiting HOST/QUEUE...`
  when it gave up. The spec's ABLATE_CALIBRATE* values, ABLATE_ENV, ABLATE_WORKDIR,
  ABLATE_CKPT_ROOT, ABLATE_PIN_GPU and ABLATE_GPU come in its environment.

- `cut --cell NAME --attempt A --ckpt-dir DIR --checkpoint "ENTRY ..."`: a cell cut at the time
  limit, recorded in its claim: `stuck EARLIER FP` when its checkpoint is as an earlier attempt's
  time-limit cut left it, else `resumable FP` (`time_limit_cuts.py`).

RC 0 with the answer; 1 when there is nothing to take; 2 bad arguments; 3 the FS could not be
read (run_queue waits for it and asks again); 4 the decision failed (a bug: its traceback is on
stderr, in the queue's pane).

The rules themselves are `ablate/remote/queue/rules.py`; this module reads the files they need.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from ablate.remote.queue import grammar
from ablate.remote.queue.defaults import HEARTBEAT_SECS
from ablate.remote.queue.rules import (
    SILENT_REM,
    Candidate,
    Estimates,
    HeadCell,
    Victim,
    deal_out,
    ms_of,
    pick_steal,
    read_estimates,
    reentries,
)

_DIGITS = re.compile(r"[0-9]{1,9}")
_SLOT = re.compile(r"[0-9]{0,6}")


class FsDown(Exception):
    """The shared FS could not be read: the caller waits for it and asks again."""


# --------------------------------------------------------------------------- the runners

class Runner(NamedTuple):
    """Another running queue as its heartbeat shows it, ages on the FS's own clock."""
    queue: str
    host: str
    slot: str  # "" without one
    idx: int  # its current (or last) line: of from_queue's file while on a taken line
    from_queue: str  # the queue its current cell was taken from ("" for its own)
    cell: str  # its current cell ("" between cells)
    ran: int  # ms its current cell has run; -1: none is running
    silent: bool  # no beat for `fresh`: cut off or dead, it finishes nothing
    next: int  # its own next line (-1: a runner before the shared head)
    deferred: tuple[int, ...]  # own lines it left to the head deal

    @property
    def key(self) -> tuple[str, str]:
        return self.host, self.slot or "-"

    @property
    def own_from(self) -> int:
        """Where its own not-started lines begin."""
        return self.next if self.from_queue else self.idx


def _mtime_ms(path: str) -> int:
    return os.stat(path).st_mtime_ns // 1_000_000


def scan_runners(root: str, host: str, queue: str, hb_secs: int) -> list[Runner]:
    """The other running queues of the sweep (FsDown when the FS's clock cannot be read)."""
    clock = os.path.join(root, f".clock.{host}.{queue}")
    try:
        with open(clock, "w") as f:
            f.write(f"{time.time()}\n")
        fs_now = _mtime_ms(clock)
    except OSError as e:
        raise FsDown(str(e)) from None
    fresh = max(3 * hb_secs, 30) * 1000
    mine = f"{host}.{queue}"
    hb_dir = os.path.join(root, "heartbeats")
    try:
        names = sorted(os.listdir(hb_dir))
    except OSError:
        return []
    out = []
    for name in names:
        if name.startswith(".") or name == mine:
            continue
        path = os.path.join(hb_dir, name)
        try:
            mt = _mtime_ms(path)
            with open(path, encoding="utf-8", errors="replace") as f:
                hb = json.loads(f.readline(), parse_float=str, parse_int=str)
        except (OSError, ValueError):
            continue
        r = runner_of(hb, queue, mt, fs_now, fresh)
        if r is not None:
            out.append(r)
    return out


def unstarted(root: str, host: str, queue: str, running: Sequence[Runner], hb_secs: int) -> list[Runner]:
    """Launched queues that have not started: a ledger whose last launch is older than a fresh
    heartbeat's age and no heartbeat at all (a Slurm job still pending; a start that failed). Each
    is a silent runner at its launch's start index: it finishes nothing, so a drained runner may
    steal its lines (its claims make each run once: the queue skips them when it starts)."""
    try:  # the FS's clock (scan_runners wrote this file just before) and the launched queues
        fs_now = _mtime_ms(os.path.join(root, f".clock.{host}.{queue}"))
        names = sorted(n[:-7] for n in os.listdir(os.path.join(root, "queues")) if n.endswith(".ledger"))
    except OSError:
        return []
    seen = {queue, *(r.queue for r in running)}
    out = []
    for q in (n for n in names if n not in seen and grammar.SAFE_NAME.fullmatch(n)):
        path = os.path.join(root, "queues", f"{q}.ledger")
        try:
            if fs_now - _mtime_ms(path) < max(3 * hb_secs, 30) * 1000:
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                entries = [json.loads(line) for line in f if line.startswith("{")]
        except (OSError, ValueError):
            continue
        launch = next((e for e in reversed(entries) if isinstance(e, dict)
                       and e.get("op", "launch") == "launch"), {})
        h, slot, start = launch.get("host"), launch.get("slot"), launch.get("start_index")
        if (isinstance(h, str) and grammar.SAFE_NAME.fullmatch(h) and isinstance(start, int) and start >= 0
                and not os.path.exists(os.path.join(root, "heartbeats", f"{h}.{q}"))):
            out.append(Runner(q, h, str(slot) if isinstance(slot, int) and slot >= 0 else "", start, "", "",
                              -1, True, -1, ()))
    return out


def runner_of(hb: object, my_queue: str, mt: int, fs_now: int, fresh: int) -> Runner | None:
    """One heartbeat (numbers kept as their text), or None when it is not a running runner."""
    if not isinstance(hb, dict) or hb.get("state") != "running":
        return None
    q, h, s, i = hb.get("queue"), hb.get("host"), hb.get("slot") or "", hb.get("idx")
    if not (isinstance(q, str) and grammar.SAFE_NAME.fullmatch(q) and q != my_queue
            and isinstance(h, str) and grammar.SAFE_NAME.fullmatch(h)
            and isinstance(s, str) and _SLOT.fullmatch(s) and isinstance(i, str) and _DIGITS.fullmatch(i)):
        return None
    cell = hb.get("cell")
    cell = cell if isinstance(cell, str) and grammar.SAFE_NAME.fullmatch(cell) else ""
    ran = -1
    started, beat = ms_of(hb.get("cell_started")), ms_of(hb.get("t"))
    if cell and started is not None:
        # its own clock from the cell's start to the beat, the FS's since the beat
        ran = max(0, beat - started + fs_now - mt) if beat is not None else 0
    nx = hb.get("next")
    deferred = hb.get("deferred")
    frm = hb.get("from_queue")
    return Runner(q, h, s, int(i), frm if isinstance(frm, str) else "", cell, ran, fs_now - mt >= fresh,
                  int(nx) if isinstance(nx, str) and _DIGITS.fullmatch(nx) else -1,
                  tuple(int(d) for d in deferred if isinstance(d, str) and _DIGITS.fullmatch(d))
                  if isinstance(deferred, list) else ())


# --------------------------------------------------------------------------- queue files

class Sweep:
    """What a decision reads of the sweep root: queue files (each parsed once), claims, results."""

    def __init__(self, root: str, tasks: Mapping[str, int]) -> None:
        self.root, self.tasks = root, tasks
        self._lines: dict[str, list[tuple[str, grammar.Parsed | None]]] = {}

    def lines(self, queue: str) -> list[tuple[str, grammar.Parsed | None]]:
        """(verdict, fields) per line: `cell`, `skip` or `invalid`. Unreadable: none."""
        if queue not in self._lines:
            try:
                with open(os.path.join(self.root, "queues", f"{queue}.txt"), encoding="utf-8",
                          errors="replace") as f:
                    text = f.read()
            except OSError:
                text = ""
            self._lines[queue] = [verdict(row, self.tasks) for row in grammar.split_lines(text)]
        return self._lines[queue]

    def cell_at(self, queue: str, idx: int) -> grammar.Parsed | None:
        rows = self.lines(queue)
        return rows[idx][1] if 0 <= idx < len(rows) else None

    def taken(self, name: str) -> bool:
        """Claimed by someone, or published."""
        return (os.path.exists(os.path.join(self.root, "claims", name))
                or os.path.exists(os.path.join(self.root, "final_ckpts", name, "MANIFEST.json")))


Rows = list[tuple[str, grammar.Parsed | None]]
# path -> (what the file was when parsed, its bytes, its rows): a served runner parses its own queue
# file again only when it changed (append-only: it grows), not at each line it asks for.
_OWN: dict[str, tuple[tuple[int, int, int, tuple[tuple[str, int], ...]], int, Rows]] = {}


def own_rows(path: str, tasks: Mapping[str, int]) -> tuple[Rows, int]:
    """This queue's rows and the file's size as read; none when it does not exist; FsDown when it
    cannot be read. Opened each time (an NFS open revalidates the client's cached attributes, so an
    append is seen at once), read and parsed only when its size, mtime or inode changed."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            key = (st.st_size, st.st_mtime_ns, st.st_ino, tuple(sorted(tasks.items())))
            hit = _OWN.get(path)
            if hit is not None and hit[0] == key:
                return hit[2], hit[1]
            data = f.read()
    except FileNotFoundError:
        return [], 0
    except OSError as e:
        raise FsDown(str(e)) from None
    rows = [verdict(row, tasks) for row in grammar.split_lines(data.decode("utf-8", "replace"))]
    _OWN[path] = (key, len(data), rows)
    return rows, len(data)


def verdict(row: str, tasks: Mapping[str, int]) -> tuple[str, grammar.Parsed | None]:
    try:
        p = grammar.parse(row, tasks, "")
    except grammar.LineError:
        return "invalid", None
    return ("skip", None) if p is None else ("cell", p)


def fields(p: grammar.Parsed) -> str:
    return f"{p.name} {p.cfg} {p.task} {p.epochs} {p.cat}"


# --------------------------------------------------------------------------- the steal

def victims_of(sweep: Sweep, runners: Sequence[Runner], est: Estimates, here: Callable[[int], int],
               skip: set[str], head: set[str]) -> list[Victim]:
    """Each other runner as a victim: its remaining time by `est`, its not-started lines."""
    out = []
    for r in runners:
        spd, ov = est.speed_of(r.host, r.slot), est.over_of(r.host, r.slot)
        rem = max(0, ov + est.est_of(r.cell) * 1000 // spd - r.ran) if r.ran >= 0 else 0
        cands = []
        start = r.own_from
        rows = sweep.lines(r.queue) if start >= 0 else []
        for j in range(max(start, 0), len(rows)):
            p = rows[j][1]
            if p is None or sweep.taken(p.name) or p.name in head:
                continue
            e = est.est_of(p.name)
            cost = ov + e * 1000 // spd
            rem += cost
            if f"{r.queue}:{j}" not in skip:
                there = SILENT_REM if r.silent else rem
                cands.append(Candidate(j, p.name, p.priority, here(e), there, cost))
        out.append(Victim(r.queue, r.host, SILENT_REM if r.silent else rem, tuple(cands)))
    return out


# --------------------------------------------------------------------------- the head deal

class Deal(NamedTuple):
    head: tuple[str, ...]  # the head's cells of the highest priority left (a steal takes none)
    on: bool  # False once no head cell is left unclaimed
    take: str  # the `take deal ...` line, or ""
    wait: bool = False  # a line `me` deferred is dealt to a runner free now: its claim is a decision away


def deal(sweep: Sweep, runners: Sequence[Runner], est: Estimates, me: tuple[str, str, str],
         next_idx: int, deferred: Sequence[int]) -> Deal | None:
    """The shared head's deal for runner `me` (host, slot, queue); None: no estimates to deal by."""
    big = max(est.cell.values(), default=0)
    if big <= 0:
        return None
    live = [r for r in runners if not r.silent]  # a silent one would never take a cell dealt to it
    host, slot, queue = me
    keys = [(host, slot or "-"), *(r.key for r in live)]
    queues = [queue, *(r.queue for r in live)]
    hosts = [host, *(r.host for r in live)]
    starts = [next_idx, *(r.own_from for r in live)]
    rests = [list(deferred), *(list(r.deferred) for r in live)]
    spd = deal_speeds(sweep.root, keys, est)
    free = [0, *(max(0, est.est_of(r.cell) * 1000 // spd[k + 1] - r.ran) if r.ran >= 0 else 0
                 for k, r in enumerate(live))]
    seen: set[str] = set()
    cells: list[HeadCell] = []
    for k, q in enumerate(queues):
        rows = sweep.lines(q)
        at = [*rests[k], *range(starts[k], len(rows))] if starts[k] >= 0 else []
        for j in at:
            p = rows[j][1] if j < len(rows) else None
            if p is None or p.name in seen:
                continue
            seen.add(p.name)
            e = est.est_of(p.name)
            if 2 * e < big or sweep.taken(p.name):
                continue
            cells.append(HeadCell(e, p.name, k, j, p.priority))
    if not cells:
        return Deal((), False, "")
    top = max(c.priority for c in cells)
    order = sorted((c for c in cells if c.priority == top), key=lambda c: (-c.est, c.name))
    dealt = list(deal_out(order, free, lambda i, r: order[i].est * 1000 // spd[r]))  # runner 0: me
    pos = next((i for i, r in dealt if r == 0), None)
    head = tuple(c.name for c in cells if c.priority == top)
    if pos is None:  # none for me: wait when a line I deferred goes to a runner free now
        mine = set(rests[0])
        wait = any(free[r] == 0 for i, r in dealt if order[i].owner == 0 and order[i].idx in mine)
        return Deal(head, True, "", wait)
    c = order[pos]
    p = sweep.cell_at(queues[c.owner], c.idx)
    assert p is not None
    return Deal(head, True, f"take deal {queues[c.owner]} {hosts[c.owner]} {c.idx} {fields(p)} "
                            f"{c.est * 1000 // spd[0]} deal")


def deal_speeds(root: str, keys: Sequence[tuple[str, str]], est: Estimates) -> list[int]:
    """Speeds x1000 per runner key: measured (calib/<host>.<slot|->, ms of the benchmark), scaled to
    the sum of the same runners' declared speeds; declared where not measured."""
    spd = [est.speed_of(h, s if s != "-" else "") for h, s in keys]
    raw = [0] * len(keys)
    sum_d = sum_r = 0
    for k, (h, s) in enumerate(keys):
        ms = _calibrate().calib_ms(root, h, s)
        if ms is not None:
            raw[k] = 1_000_000_000 // ms + 1
            sum_d += spd[k]
            sum_r += raw[k]
    if not sum_r:
        return spd
    return [max(1, raw[k] * sum_d // sum_r if raw[k] else spd[k]) for k in range(len(keys))]


# --------------------------------------------------------------------------- the command line

def _args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="runner")
    ap.add_argument("verb", choices=("line", "lines", "reentries", "deal", "drained", "calibrate", "cut"))
    ap.add_argument("root")
    ap.add_argument("host")
    ap.add_argument("queue")
    ap.add_argument("slot")
    ap.add_argument("--from", dest="start", type=int, default=0)
    ap.add_argument("--reentries", action="store_true")
    ap.add_argument("--next", type=int, default=0)
    ap.add_argument("--deferred", default="")
    ap.add_argument("--skip", default="")
    ap.add_argument("--head", type=int, default=1)
    ap.add_argument("--steal", type=int, default=1)
    ap.add_argument("--secs", type=float, default=600.0)
    ap.add_argument("--stop", default="")
    ap.add_argument("--cell", default="")
    ap.add_argument("--attempt", default="")
    ap.add_argument("--ckpt-dir", default="")
    ap.add_argument("--checkpoint", default="")
    return ap.parse_args(argv)


def _read(path: str, missing: str | None = None) -> str:
    """A file's text; `missing` when it does not exist (when given); FsDown when it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError as e:
        if missing is not None:
            return missing
        raise FsDown(str(e)) from None
    except OSError as e:
        raise FsDown(str(e)) from None


def _read_bytes(path: str) -> bytes:
    """A file's bytes; none when it does not exist; FsDown when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""
    except OSError as e:
        raise FsDown(str(e)) from None


def run(argv: Sequence[str], out: Callable[[str], None]) -> int:
    a = _args(argv)
    slot = "" if a.slot == "-" else a.slot
    if not (grammar.SAFE_NAME.fullmatch(a.host) and grammar.SAFE_NAME.fullmatch(a.queue)
            and _SLOT.fullmatch(slot)):
        print(f"runner: bad host/queue/slot {a.host!r} {a.queue!r} {a.slot!r}", file=sys.stderr)
        return 2
    hb = os.environ.get("ABLATE_HEARTBEAT_SECS", "")
    hb_secs = int(hb) if re.fullmatch(r"[0-9]{1,6}", hb) else HEARTBEAT_SECS
    sweep = Sweep(a.root, grammar.task_epochs(os.environ.get("ABLATE_TASK_EPOCHS", "")))
    if a.verb in ("line", "lines"):
        rows, size = own_rows(os.path.join(a.root, "queues", f"{a.queue}.txt"), sweep.tasks)
        if a.verb == "line":
            kind, p = rows[a.start] if 0 <= a.start < len(rows) else ("none", None)
            out(f"cell {fields(p)} {p.priority}" if p is not None else kind)
            return 0
        for i in range(max(a.start, 0), len(rows)):
            kind, p = rows[i]
            out(f"{i} cell {fields(p)} {p.priority}" if p is not None else f"{i} {kind}")
        out(f"n {len(rows)}")
        out(f"size {size}")
    if a.verb == "reentries" or a.reentries:
        text = _read(os.path.join(a.root, "events", f"{a.host}.{a.queue}.jsonl"), "")
        for c, frm, i in reentries(text.splitlines()):
            p = sweep.cell_at(frm, i)
            if p is not None and p.name == c:
                out(f"reenter {frm} {i} {fields(p)}")
    if a.verb in ("lines", "reentries"):
        return 0
    if a.verb == "calibrate":
        return calibration(a, slot, hb_secs, out)
    if a.verb == "cut":  # a cell cut at the time limit: did it move since its last cut?
        from ablate.remote.slurm import time_limit_cuts

        return time_limit_cuts.verb(a.root, a.cell, a.attempt, a.ckpt_dir, a.checkpoint, out)
    runners = scan_runners(a.root, a.host, a.queue, hb_secs)
    deferred = [int(x) for x in a.deferred.split() if x.isdigit()]
    estimates = _read(os.path.join(a.root, "estimates.tsv"), "")  # one read for the deal and the steal
    head: tuple[str, ...] = ()
    if a.head:
        d = deal(sweep, runners, read_estimates(estimates),
                 (a.host, slot, a.queue), a.next, deferred)
        if d is not None:
            out(f"head_on {int(d.on)}")
            out(" ".join(("head", *d.head)))
            if d.wait:
                out("head_wait")
            if d.take:
                out(d.take)
                return 0
            head = d.head
    if a.verb == "deal" or not a.steal:
        return 1
    return steal(a, sweep, [*runners, *unstarted(a.root, a.host, a.queue, runners, hb_secs)], slot,
                 set(head), estimates, out)


def _calibrate() -> types.ModuleType:
    """ablate.remote.queue.calibrate, imported where used (its imports cost the decisions that need none)."""
    from ablate.remote.queue import calibrate

    return calibrate


def calibration(a: argparse.Namespace, slot: str, hb_secs: int, out: Callable[[str], None]) -> int:
    """This runner's measurement, then the wait for the others' (`calibrate.verb`)."""
    def scan() -> list[Runner] | None:
        try:
            return scan_runners(a.root, a.host, a.queue, hb_secs)
        except FsDown:
            return None

    rc: int = _calibrate().verb(a.root, a.host, a.queue, slot, a.secs, a.stop, scan, os.environ, out)
    return rc


def steal(a: argparse.Namespace, sweep: Sweep, runners: Sequence[Runner], slot: str, head: set[str],
          text: str, out: Callable[[str], None]) -> int:
    """The steal pick by the learned figures of this sweep's ended cells, else the controller's
    (`text`, estimates.tsv)."""
    if not text:
        return 1  # no estimates: nothing to steal by
    from ablate.remote.queue import learn  # imported where used: a lone decision (tests, by hand) needs less

    learned = learn.learned_text(text, learn.read_events(a.root), time.time())
    est = read_estimates(learned if learned is not None else text)
    my_speed, my_over = est.speed_of(a.host, slot), est.over_of(a.host, slot)
    victims = victims_of(sweep, runners, est, lambda e: my_over + e * 1000 // my_speed,
                         set(a.skip.split()), head)
    pick = pick_steal(victims)
    if pick is None:
        return 1
    v = victims[pick[0]]
    c = v.cands[pick[1]]
    p = sweep.cell_at(v.queue, c.idx)
    assert p is not None
    out(f"take steal {v.queue} {v.host} {c.idx} {fields(p)} {int(c.here)} "
        f"{'learned' if learned is not None else 'estimates'}")
    return 0
