"""The runner's rules, pure functions over numbers: what run_queue's decisions
(`ablate/remote/queue/runner.py`) and the simulations (`scripts/bench_balance.py`, `scripts/bench_gate.py`)
both run, so that the simulated rule is the one that runs. Stdlib only (part of the runner's zipapp).

docs/ARCHITECTURE.md, "Stealing" and "The shared head". In integer milliseconds and speeds x 1000 as the
bash before them, so that every runner, whatever its Python, agrees:
- estimates: `estimates.tsv` (the controller's) or the figures `learn.py` fits on this sweep's ended
  cells (a steal only; the deal uses the declared costs over the measured speeds).
- the steal pick (`pick_steal`), min-max: victims by expected remaining time, largest first; a line
  qualifies when it would end here no later than at its place there; the highest priority that
  qualifies anywhere, then from the first victim with such a line the one minimising the later of
  the victim's new finish and this runner's (ties: the later line). scripts/bench_balance.py runs
  this very function.
- the head deal (`deal_first`): the unclaimed cells of at least half the largest estimate, in every
  running queue from its next line on (and the lines it deferred), largest first, each to the runner
  that would end it earliest (ties: the line's owner, then the lower runner), each runner free once
  its current cell is expected to end; the first one dealt to this runner is its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple, TypeVar

from ablate.remote.queue import grammar

SILENT_REM = 1 << 50  # ms: a silent victim's remaining time (it never finishes)
_DIGITS = re.compile(r"[0-9]{1,9}")
_MS = re.compile(r"([0-9]{1,12})(?:\.([0-9]*))?")
N = TypeVar("N", int, float)


def secs_of(ms: int) -> str:
    """Whole ms as seconds to the millisecond, the text of a JSON number (`ms_of`'s inverse)."""
    return f"{ms // 1000}.{ms % 1000:03d}"


def ms_of(raw: object) -> int | None:
    """Integer ms of a JSON number kept as its text ("1700000000.123456"), as the bash read it."""
    m = _MS.fullmatch(raw) if isinstance(raw, str) else None
    if m is None:
        return None
    return int(m.group(1)) * 1000 + int(((m.group(2) or "") + "000")[:3])


# --------------------------------------------------------------------------- estimates

class Estimates(NamedTuple):
    """`host H SLOT|- SPEED_MILLI`, `over H SLOT|- MS`, `cell NAME MS` (estimates.tsv's rows, or the
    learned ones); a cell without an estimate counts as an average one."""
    speed: Mapping[tuple[str, str], int]
    over: Mapping[tuple[str, str], int]
    cell: Mapping[str, int]
    default: int

    def speed_of(self, host: str, slot: str) -> int:
        return self.speed.get((host, slot or "-")) or self.speed.get((host, "-")) or 1000

    def over_of(self, host: str, slot: str) -> int:
        v = self.over.get((host, slot or "-"))
        return v if v is not None else self.over.get((host, "-"), 0)

    def est_of(self, name: str) -> int:
        return self.cell.get(name, self.default)


def read_estimates(text: str) -> Estimates:
    speed: dict[tuple[str, str], int] = {}
    over: dict[tuple[str, str], int] = {}
    cell: dict[str, int] = {}
    for row in text.splitlines():
        f = row.split()
        if len(f) == 4 and f[0] in ("host", "over") and grammar.SAFE_NAME.fullmatch(f[1]) \
                and (f[2] == "-" or re.fullmatch(r"[0-9]{1,6}", f[2])) and _DIGITS.fullmatch(f[3]):
            if f[0] == "host" and int(f[3]) > 0:
                speed[(f[1], f[2])] = int(f[3])
            elif f[0] == "over":
                over[(f[1], f[2])] = int(f[3])
        elif len(f) == 3 and f[0] == "cell" and grammar.SAFE_NAME.fullmatch(f[1]) \
                and re.fullmatch(r"[0-9]{1,12}", f[2]):
            cell[f[1]] = int(f[2])
    default = sum(cell.values()) // len(cell) if cell else 0
    return Estimates(speed, over, cell, default)



# --------------------------------------------------------------------------- the steal

class Candidate(NamedTuple):
    """A victim's not-started line: its expected time here, when it would end there at its place,
    and its own time there."""
    idx: int
    name: str
    priority: int
    here: float
    there: float
    cost: float


class Victim(NamedTuple):
    queue: str
    host: str
    rem: float  # its expected remaining time (SILENT_REM when silent)
    cands: tuple[Candidate, ...]


def pick_steal(victims: Sequence[Victim]) -> tuple[int, int] | None:
    """The min-max steal rule: (victim, candidate) positions, or None when nothing is worth it.
    Generic over the unit: run_queue's integer ms and bench_balance's float seconds."""
    order = sorted(range(len(victims)), key=lambda k: (-victims[k].rem, victims[k].queue, k))
    best: tuple[int, int] | None = None
    best_prio, best_obj = 0, 0.0
    for k in order:
        v = victims[k]
        if v.rem <= 0:
            break
        for c_pos, c in enumerate(v.cands):
            # <=: a tie happens only when the victim's cell is overdue (its remaining time clamped
            # to 0): slower than estimated, or gone; taking the line costs nothing if it is not.
            if not c.here <= c.there:
                continue
            obj = max(v.rem - c.cost, c.here)
            if (best is None or c.priority > best_prio
                    or (c.priority == best_prio and k == best[0] and obj <= best_obj)):
                best, best_prio, best_obj = (k, c_pos), c.priority, obj
    return best



# --------------------------------------------------------------------------- the head deal

class HeadCell(NamedTuple):
    est: int  # ms on a speed-1.0 host
    name: str
    owner: int  # the runner whose file holds the line
    idx: int
    priority: int


def deal_out(cells: Sequence[HeadCell], free: Sequence[N], t: Callable[[int, int], N],
             me: int = 0, gate: float = 1.0) -> Iterator[tuple[int, int]]:
    """Deal `cells` (in deal order) out, each to the runner that would end it earliest, `free[r]`
    when runner r is free and `t(cell, r)` its time there (ties: the cell's owner, then the lower
    runner; an owner < 0 has none: then `me`): (position, runner) of each cell in turn.
    `gate` (bench_gate's variants; run_queue deals with 1): another runner's time counts gate x."""
    at = list(free)
    for pos, c in enumerate(cells):
        times = [t(pos, r) for r in range(len(at))]
        ends = [at[r] + (times[r] if r == me or gate == 1 else times[r] * gate) for r in range(len(at))]
        best = c.owner if c.owner >= 0 else me
        for r in range(len(at)):
            if ends[r] < ends[best]:
                best = r
        yield pos, best
        at[best] += times[best]


def deal_first(cells: Sequence[HeadCell], free: Sequence[N], t: Callable[[int, int], N],
               me: int = 0, gate: float = 1.0) -> int | None:
    """`deal_out`'s position of the first cell dealt to `me` (None: none is)."""
    return next((pos for pos, r in deal_out(cells, free, t, me, gate) if r == me), None)


# --------------------------------------------------------------------------- re-entries

def reentries(events: Iterable[str]) -> list[tuple[str, str, int]]:
    """(cell, from_queue, idx) of the cells this queue took from others whose `end` never came."""
    pending: dict[str, tuple[str, int]] = {}
    order: list[str] = []
    for line in events:
        if '"from_queue": "' not in line:
            continue
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if not isinstance(e, dict):
            continue
        c, frm, i = e.get("cell"), e.get("from_queue"), e.get("idx")
        if not (isinstance(c, str) and grammar.SAFE_NAME.fullmatch(c) and isinstance(frm, str)
                and grammar.SAFE_NAME.fullmatch(frm) and isinstance(i, int) and 0 <= i < 10**9):
            continue
        if e.get("ev") in ("steal", "start"):
            pending[c] = (frm, i)
            order.append(c)
        elif e.get("ev") == "end":
            pending.pop(c, None)
    out = []
    for c in order:
        if c in pending:
            out.append((c, *pending.pop(c)))
    return out
