"""The queue's walk: what run_queue does next, one step per `next` request of its served runner.

run_queue's bash keeps the queue's life (claims, events, the heartbeat, services, signals, running a
cell); which line it takes is decided here, over the decisions of `runner.py` (the queue-line
grammar, the shared head's deal, the steal pick, re-entries). A step answers with a short script of
primitive operations, one per line, that run_queue performs in order:

    next N                  this queue's own next line (the heartbeat's `next`; a stop's `idx`)
    deferred I J ...        own lines left to the head deal (the heartbeat's `deferred`)
    ahead I J ...           own lines dealt to this runner before the walk got there (passed over)
    ev KIND , "k": v, ...   an event: its kind and its fields (JSON, written by this module)
    say TEXT                a line on the queue's pane
    claim NAME IDX          claim the cell; when the claim fails, the script ends there and the
                            next request says `--outcome lost` (else `won`)
    own NAME IDX            a Slurm attempt takes the claim over (run_queue does it only then)
    run IDX NAME CFG TASK EPOCHS CAT RESUME FROM|-   run the cell (FROM: the queue it was taken from)
    transition              the heartbeat rewritten and its ticker restarted
    drained                 the heartbeat says drained (the next request says `--outcome drained`)
    running                 an append came after all: the heartbeat says running again
    end                     the queue has ended (after its `queue_end`)

run_queue's bash holds the walk's position (`next`, `deferred`, `ahead`) and sends it with every
request, so a runner process that was killed and started again goes on where the queue is; what the
walk keeps itself (the head's state, lines it lost a race for, the pending claim) it can learn
again. The order of the checks is the one docs/ARCHITECTURE.md ("run_queue") describes.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from ablate.remote.queue import grammar
from ablate.remote.queue.rules import secs_of

# Seconds a line this runner deferred to the head deal is left to the runner it was dealt to before
# this one, drained, takes it back, while the deal still gives it to a runner that is free now
# (`head_wait`): that runner's claim is a decision away (both just measured, say), and taking it back
# at once would undo the deal. A line dealt to a runner busy with a cell is taken back at once.
TAKE_BACK_AFTER = 2.0
# (rc, rows) of one of runner.py's decisions: `line --from K`, `reentries`, `deal ...`, `drained ...`
Decide = Callable[[Sequence[str]], tuple[int, list[str]]]


class Cell(NamedTuple):
    name: str
    cfg: str
    task: str
    epochs: str
    cat: str

    @property
    def words(self) -> str:
        return f"{self.name} {self.cfg} {self.task} {self.epochs} {self.cat}"


class Take(NamedTuple):
    """A head cell dealt to this runner, or a line to steal (runner.py's `take` line)."""
    kind: str  # deal or steal
    queue: str
    host: str
    idx: int
    cell: Cell
    here_ms: int
    by: str


class Pending(NamedTuple):
    """The claim a step asked for: what its outcome means."""
    kind: str  # own, dealt, other, deferred
    idx: int
    cell: Cell
    queue: str = ""  # other: the queue it was taken from
    rest: tuple[int, ...] = ()  # dealt: the deferred lines without this one


def _cell(words: Sequence[str]) -> Cell | None:
    """Five fields of a decision, when they are what a cell must be (checked again in bash)."""
    if len(words) != 5:
        return None
    c = Cell(*words)
    ok = (grammar.SAFE_NAME.fullmatch(c.name) and grammar.EPOCHS.fullmatch(c.epochs)
          and all(grammar.SAFE_CFG.match(v) for v in (c.cfg, c.task, c.cat)))
    return c if ok else None


class _Number(str):
    """A JSON number written as its text (the steal's `est`, to the millisecond)."""


def _ev(kind: str, **fields: object) -> str:
    """An `ev` operation: the event's fields as JSON, in their order."""
    def value(v: object) -> str:
        return str(v) if isinstance(v, _Number) else json.dumps(v)

    return f"ev {kind} " + "".join(f", {json.dumps(k)}: {value(v)}" for k, v in fields.items())


class Walk:
    """One queue's walk, for its runner process's life."""

    def __init__(self, root: str, queue: str, decide: Decide, head: bool, steal: bool,
                 take_back_after: float = TAKE_BACK_AFTER) -> None:
        self.root, self.queue, self.decide = root, queue, decide
        self.take_back_after = take_back_after
        self.head_wait = False  # the last deal: a line we deferred goes to a runner free now
        self.deferred_at: dict[int, float] = {}  # own line -> when this walk deferred it (monotonic)
        self.head_on = head  # False once no head cell is left unclaimed (or no calibration / stealing)
        self.steal = steal
        self.head_cells: set[str] = set()
        self.steal_skip: set[str] = set()  # QUEUE:IDX of lines lost to another claimer
        self.reentry: list[tuple[str, int, Cell]] | None = None  # read at the first drain
        self.pending: Pending | None = None
        self.ev_pos = 0  # how far this queue's events file is read (`_ended`)
        self.ends: dict[str, str] = {}  # cell -> how its last run here ended, when it did
        # the position, as run_queue sends it
        self.idx = 0
        self.deferred: list[int] = []
        self.ahead: set[int] = set()

    # ---------------------------------------------------------------- files
    def _published(self, name: str) -> bool:
        """Its MANIFEST.json opens (an open asks a network FS's server; a stat may be its cache)."""
        try:
            with open(os.path.join(self.root, "final_ckpts", name, "MANIFEST.json"), "rb"):
                return True
        except OSError:
            return False

    def _owner(self, name: str) -> list[str] | None:
        try:
            with open(os.path.join(self.root, "claims", name, "owner"), encoding="utf-8",
                      errors="replace") as f:
                return f.readline().split()
        except OSError:
            return None

    def _ended(self, name: str, host: str) -> str | None:
        """How the cell's last run in this queue ended (`exit 1`, `no_progress (exit 124)`), or None
        when its last `start` has no `end` after it (cut: stopped, signalled, its job requeued, its
        node or attempt lost) or it never started. This queue's events file, read on from where the
        last call stopped (one writer: this queue; complete lines only)."""
        path = os.path.join(self.root, "events", f"{host}.{self.queue}.jsonl")
        try:
            with open(path, "rb") as f:
                f.seek(self.ev_pos)
                data = f.read()
        except OSError:
            data = b""
        whole = data[:data.rfind(b"\n") + 1]
        self.ev_pos += len(whole)
        for raw in whole.splitlines():
            if b'"cell"' not in raw:
                continue
            try:
                e = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(e, dict) or not isinstance(e.get("cell"), str):
                continue
            if e.get("ev") == "start":
                self.ends.pop(e["cell"], None)
            elif e.get("ev") == "end":
                rc, why = e.get("rc"), e.get("reason")
                self.ends[e["cell"]] = (f"{why} (exit {rc})" if isinstance(why, str) else f"with exit {rc}")
        return self.ends.get(name)

    def _ours(self, name: str, host: str) -> bool:
        owner = self._owner(name)
        return owner is not None and owner[:2] == [host, self.queue]

    # ---------------------------------------------------------------- decisions
    def _line(self, idx: int) -> tuple[str, Cell | None]:
        """(kind, cell) of own line idx: cell, skip, invalid or none."""
        rc, rows = self.decide(["line", "--from", str(idx)])
        if rc != 0 or not rows:
            raise RuntimeError(f"line --from {idx}: rc {rc}")
        words = rows[0].split()
        if words[0] == "cell":
            c = _cell(words[1:6])
            return ("cell", c) if c is not None else ("invalid", None)
        return (words[0], None) if words[0] in ("skip", "none") else ("invalid", None)

    def _took(self, rows: Sequence[str], out: list[str]) -> Take | None:
        """The deal's or the steal's answer: the head's state, and the cell to take if any."""
        take = None
        for row in rows:
            kind, _, rest = row.partition(" ")
            if kind == "head_on":
                if rest == "0" and self.head_on:
                    self.head_on = False  # every head cell is taken: lines and steals as before
                    out.append("say the shared head is dealt out")
            elif kind == "head":
                self.head_cells = set(rest.split())
                self.head_wait = False  # unless the deal says so next (`head_wait`)
            elif kind == "head_wait":
                self.head_wait = True
            elif kind == "take":
                w = rest.split()
                c = _cell(w[4:9]) if len(w) == 11 else None
                if (c is not None and grammar.SAFE_NAME.fullmatch(w[1]) and grammar.SAFE_NAME.fullmatch(w[2])
                        and w[3].isdigit() and w[9].isdigit()):
                    take = Take(w[0], w[1], w[2], int(w[3]), c, int(w[9]), w[10])
        return take

    @staticmethod
    def _words(ints: Sequence[int] | set[int]) -> str:
        return " ".join(map(str, ints))

    @classmethod
    def _listed(cls, op: str, ints: Sequence[int]) -> str:
        """A list operation (`deferred`, `ahead`): its name alone when the list is empty."""
        return f"{op} {cls._words(ints)}".rstrip()

    def _position(self) -> list[str]:
        return [f"next {self.idx}", self._listed("deferred", self.deferred),
                self._listed("ahead", sorted(self.ahead))]

    # ---------------------------------------------------------------- the step
    def step(self, host: str, outcome: str) -> list[str]:
        """The script of one step. `outcome`: that of the last step's claim (won, lost), or drained
        (its drained heartbeat is written), or `-`."""
        out: list[str] = []
        p, self.pending = self.pending, None
        if outcome == "drained":
            return self._after_drained(out)
        if p is not None and outcome == "lost":
            script = self._lost(p, host, out)
            if script is not None:
                return script
        return self._next(host, out)

    def _lost(self, p: Pending, host: str, out: list[str]) -> list[str] | None:
        if p.kind == "own":  # ours from an earlier run: re-entered when it was cut, never when it
            # ended (failed: remediate's, rule 8)
            if self._ours(p.cell.name, host):
                ended = self._ended(p.cell.name, host)
                if ended is None:
                    return [*out, f"own {p.cell.name} {p.idx}", f"run {p.idx} {p.cell.words} 1 -",
                            f"next {p.idx + 1}"]
                # its `end` is its outcome (status counts it): no event of ours after it
                out += [f"say line {p.idx}: {p.cell.name} ended {ended} in an earlier run of this queue; "
                        "not run again here: `ablate remediate` re-runs it", f"next {p.idx + 1}"]
            else:
                out += [_ev("skip", idx=p.idx, cell=p.cell.name, reason="claimed"), f"next {p.idx + 1}"]
            self.idx = p.idx + 1
            return None
        if p.kind == "dealt":  # someone's since the deal (then dropped), or the FS failed (kept)
            if self._owner(p.cell.name) is not None:
                self.deferred = list(p.rest)
                out.append(self._listed("deferred", p.rest))
            return None
        if p.kind == "other":
            self.steal_skip.add(f"{p.queue}:{p.idx}")
            out.append(f"say lost the claim of {p.cell.name} (line {p.idx} of {p.queue}); looking again")
            return None
        # deferred: each own line ends with its own outcome, then the next deferred one
        out.append(_ev("skip", idx=p.idx, cell=p.cell.name, reason="claimed"))
        return self._run_deferred(out)

    def _next(self, host: str, out: list[str]) -> list[str]:
        """Bash's main loop, one line: the first that yields a script."""
        while True:
            kind, c = self._line(self.idx)
            if kind == "none":
                return self._drained(host, out)
            i = self.idx
            if kind == "skip":
                self.idx += 1
                continue
            if c is None:
                out += [_ev("skip", idx=i, cell=None, reason="invalid"),
                        f"say line {i}: not <cfg> <task> [epochs] with a known task; skipped"]
                self.idx += 1
                continue
            if i in self.ahead:  # dealt to us before we got here: its events are written
                self.ahead.discard(i)
                self.idx += 1
                continue
            if self._published(c.name):
                out.append(_ev("skip", idx=i, cell=c.name, reason="done"))
                self.idx += 1
                continue
            if self.head_on and not os.path.exists(os.path.join(self.root, "claims", c.name)):
                # the head deal first (this line, if it is dealt to us)
                _, rows = self.decide(["deal", "--next", str(i), "--deferred", self._words(self.deferred)])
                take = self._took(rows, out)
                if take is not None:
                    return self._take(take, out)
                if c.name in self.head_cells:  # the deal gave it to another runner
                    self.deferred.append(i)
                    self.deferred_at[i] = time.monotonic()
                    self.idx += 1
                    return [*out, _ev("defer", idx=i, cell=c.name),
                            f"say line {i}: {c.name} dealt to a runner expected to end it earlier; deferred",
                            *self._position(), "transition"]
            self.pending = Pending("own", i, c)
            return [*out, *self._position(), f"claim {c.name} {i}", f"run {i} {c.words} 0 -", f"next {i + 1}"]

    def _take(self, t: Take, out: list[str]) -> list[str]:
        """Claim and run a dealt head cell or a stolen line (`out` so far first)."""
        if t.queue != self.queue or t.kind != "deal":
            if self._published(t.cell.name):
                self.steal_skip.add(f"{t.queue}:{t.idx}")
                return [*out, *self._position()]  # decide again, as bash's `continue`
            self.pending = Pending("other", t.idx, t.cell, t.queue)
            return [*out, *self._position(), f"claim {t.cell.name} {t.idx}",
                    _ev("steal", idx=t.idx, cell=t.cell.name, from_queue=t.queue, from_host=t.host,
                        est=_Number(secs_of(t.here_ms)), by=t.by),
                    f"say taking {t.cell.name} (line {t.idx} of {t.queue} on {t.host}, expected "
                    f"{secs_of(t.here_ms)}s here, by {t.by})",
                    f"run {t.idx} {t.cell.words} 0 {t.queue}"]
        rest = tuple(i for i in self.deferred if i != t.idx)
        self.pending = Pending("dealt", t.idx, t.cell, rest=rest)
        # after the claim: the deferred lines without it; a line ahead passed over when we get there
        after = [self._listed("deferred", rest)]
        if t.idx > self.idx:
            after.append(self._listed("ahead", sorted({*self.ahead, t.idx})))
        if t.idx == self.idx:
            after.append(f"next {self.idx + 1}")
        return [*out, *self._position(), f"claim {t.cell.name} {t.idx}", *after,
                f"run {t.idx} {t.cell.words} 0 -"]

    def _drained(self, host: str, out: list[str]) -> list[str]:
        """Own lines done: a re-entry, a dealt head cell or a steal, a deferred line, else drained."""
        if self.reentry is None:
            _, rows = self.decide(["reentries"])
            self.reentry = []
            for row in rows:
                w = row.split()
                c = _cell(w[3:8]) if len(w) == 8 and w[0] == "reenter" else None
                if c is not None and grammar.SAFE_NAME.fullmatch(w[1]) and w[2].isdigit():
                    self.reentry.append((w[1], int(w[2]), c))
        while self.reentry:
            frm, i, c = self.reentry.pop(0)
            if self._published(c.name) or not self._ours(c.name, host):
                continue  # published, released by remediate, or never ours
            return [*out, *self._position(),
                    f"say re-entering {c.name} (line {i} of {frm}), stolen by this queue and cut before "
                    "its end", f"own {c.name} {i}", f"run {i} {c.words} 1 {frm}"]
        steal = self.steal and os.path.exists(os.path.join(self.root, "estimates.tsv"))
        if self.head_on or steal:
            _, rows = self.decide(["drained", "--next", str(self.idx), "--deferred",
                                   self._words(self.deferred), "--head", str(int(self.head_on)),
                                   "--steal", str(int(steal)), "--skip", " ".join(sorted(self.steal_skip))])
            take = self._took(rows, out)
            if take is not None:
                return self._take(take, out)
        return self._run_deferred(out)

    def _run_deferred(self, out: list[str]) -> list[str]:
        while self.deferred:
            i = self.deferred[0]
            _, c = self._line(i)
            if c is None:
                self.deferred.pop(0)
                continue
            if self._published(c.name):
                self.deferred.pop(0)
                out.append(_ev("skip", idx=i, cell=c.name, reason="done"))
                continue
            # dealt a moment ago to a free runner: its claim may be a decision away (both just measured)
            left = self.deferred_at.get(i, -math.inf) + self.take_back_after - time.monotonic()
            if self.head_on and self.head_wait and left > 0:
                time.sleep(min(left, 0.25))
                return [*out, *self._position()]  # decide again (the deal first), as bash's `continue`
            self.deferred.pop(0)
            self.deferred_at.pop(i, None)
            self.pending = Pending("deferred", i, c)
            return [*out, *self._position(), f"claim {c.name} {i}",
                    f"say line {i}: taking back {c.name} (deferred to the head deal, still unclaimed)",
                    f"run {i} {c.words} 0 -"]
        return [*out, *self._position(), "drained"]

    def _after_drained(self, out: list[str]) -> list[str]:
        """`ablate append` writes the queue file, then reads the heartbeat: an append that raced the
        drain is seen by this second read, or append sees drained and restarts the queue."""
        kind, _ = self._line(self.idx)
        if kind != "none":
            return [*out, "running"]
        return [*out, _ev("queue_end", idx=self.idx), f"say drained at line {self.idx}", "end"]

