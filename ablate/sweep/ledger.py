"""The ledger of a queue: `queues/<queue>.ledger` on the shared FS, one JSON line per launch or
append (docs/ARCHITECTURE.md). It records how many lines of the queue file were launched and the
sha256 of that prefix, so an edit of a launched line is detected and refused (rule 3).

Pure parsing and checking here; the commands that write entries (launch, append) and read them
(stop, doctor, classification through the snapshot) all use this module.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ablate.errors import QueueError
from ablate.sweep.cells import QueueFile
from ablate.util.jsonv import as_int, as_num, as_str


@dataclass(frozen=True)
class LedgerEntry:
    t: float | None
    host: str | None
    slot: int | None
    start_index: int | None  # None: an `append` to a live queue
    lines: int  # the launched prefix: this many lines of the queue file
    prefix_sha256: str
    spec: str | None  # file names under specs/ and wrappers/
    run_queue: str | None
    op: str  # launch | append
    cleared_stop: bool = False

    @classmethod
    def parse(cls, obj: Any) -> LedgerEntry | None:
        """One ledger line's object; None when it is not an entry (no launched prefix)."""
        if not isinstance(obj, dict):
            return None
        lines, sha = as_int(obj.get("lines")), obj.get("prefix_sha256")
        if lines is None or not isinstance(sha, str):
            return None
        return cls(as_num(obj.get("t")), as_str(obj.get("host")), as_int(obj.get("slot")),
                   as_int(obj.get("start_index")), lines, sha, as_str(obj.get("spec")),
                   as_str(obj.get("run_queue")), str(obj.get("op") or "launch"),
                   obj.get("cleared_stop") is True)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": self.t, "host": self.host, "slot": self.slot,
                               "start_index": self.start_index, "lines": self.lines,
                               "prefix_sha256": self.prefix_sha256, "spec": self.spec,
                               "run_queue": self.run_queue, "op": self.op}
        if self.cleared_stop:  # this launch removed a pending `stop --after-current` request
            out["cleared_stop"] = True
        return out





def parse_entries(objs: Iterable[Any]) -> tuple[LedgerEntry, ...]:
    return tuple(e for e in (LedgerEntry.parse(o) for o in objs) if e is not None)


def parse_ledger(raw: bytes | None) -> tuple[LedgerEntry, ...]:
    """A ledger file's bytes (None: no ledger) → its entries; torn or foreign lines are skipped."""
    objs = []
    for line in (raw or b"").decode(errors="replace").splitlines():
        try:
            objs.append(json.loads(line))
        except ValueError:
            continue
    return parse_entries(objs)


def last_host(ledger: Sequence[LedgerEntry], *, op: str | None = None) -> str | None:
    """The host of the last entry (of kind `op` when given)."""
    for e in reversed(ledger):
        if op is None or e.op == op:
            return e.host
    return None


def prefix_sha256(lines: Sequence[str]) -> str:
    return hashlib.sha256("".join(line + "\n" for line in lines).encode()).hexdigest()


def check_prefix(qf: QueueFile, ledger: Sequence[LedgerEntry], launched_text: str | bytes | None) -> None:
    """Refuse when a line already launched was edited, deleted or moved (queue files are append-only).
    `launched_text`: the FS copy of the queue, to name the first differing line with both texts."""
    local = [ln.text for ln in qf.lines]
    if isinstance(launched_text, bytes):
        launched_text = launched_text.decode(errors="replace")
    launched = launched_text.split("\n")[:-1] if launched_text else None
    rel = f"queues/{qf.name}.txt"
    fix = "queue files are append-only: restore it, and add new cells at the end (`ablate append`)"
    for entry in ledger:
        n = entry.lines
        if len(local) >= n and prefix_sha256(local[:n]) == entry.prefix_sha256:
            continue
        if launched is not None:
            for i in range(min(n, len(launched))):
                if i >= len(local):
                    raise QueueError(f"{rel}:{i + 1} was launched as {launched[i]!r} and is gone now "
                                     f"(the file has {len(local)} lines); {fix}")
                if local[i] != launched[i]:
                    raise QueueError(f"{rel}:{i + 1} changed since it was launched: was {launched[i]!r}, "
                                     f"now {local[i]!r}; {fix}")
        raise QueueError(f"{rel}: its first {n} lines changed since they were launched; {fix}")


def new_entry(qf: QueueFile, host: str, slot: int | None, start: int | None, spec: str | None,
              run_queue: str | None, op: str, cleared_stop: bool = False) -> LedgerEntry:
    lines = [ln.text for ln in qf.lines]
    return LedgerEntry(time.time(), host, slot, start, len(lines), prefix_sha256(lines), spec, run_queue,
                       op, cleared_stop)


def entry_line(entry: LedgerEntry) -> str:
    return json.dumps(entry.to_json())
