"""`ablate append`: add one cell at the end of a queue, mid-flight if need be.

The line is validated and the whole roster checked for a name collision before anything is
written. A launched queue gets the line in its FS copy too (what `run_queue` re-reads) and a ledger
entry; a queue that has drained (no live tmux session) is restarted at the new line's index.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ablate.config.project import Project
from ablate.errors import QueueError
from ablate.plan.cost import refresh_estimates
from ablate.remote.layout import SweepLayout
from ablate.run.pipeline import LaunchResult, is_live, launch
from ablate.run.store_launch import configs_to_store
from ablate.sweep.cells import (
    Cell,
    QueueFile,
    build_roster,
    check_queue_name,
    parse_line,
    parse_queue_text,
    read_all_queues,
    read_queue,
)
from ablate.sweep.ledger import check_prefix, entry_line, new_entry, parse_ledger
from ablate.sweep.lock import controller_lock
from ablate.sweep.snapshot import Heartbeat
from ablate.transport import SharedFS, shared_fs
from ablate.util.fmt import Log
from ablate.util.fs import atomic_write

DRAIN_WAIT = 15.0  # seconds to wait for a queue that has decided it is drained to exit


@dataclass(frozen=True)
class AppendResult:
    queue: str
    index: int  # 0-based line index of the new cell
    cell: str
    line: str
    host: str | None  # where the queue was launched last, None when never launched
    live: bool  # the queue was running: it reaches the new line by itself
    restarted: LaunchResult | None  # the relaunch of a drained queue

    def to_json(self) -> dict[str, Any]:
        return {"queue": self.queue, "index": self.index, "line_no": self.index + 1, "cell": self.cell,
                "line": self.line, "host": self.host, "live": self.live,
                "restarted": self.restarted.to_json() if self.restarted else None}

    def lines(self) -> list[str]:
        out = [f"appended queues/{self.queue}.txt:{self.index + 1}: {self.line} (cell {self.cell})"]
        if self.host is None:
            out.append(f"{self.queue} was never launched; `ablate launch {self.queue} --host H` runs it")
        elif self.live:
            out.append(f"{self.queue} is running on {self.host}; it reaches the new line by itself")
        elif self.restarted:
            out += self.restarted.lines()
        return out


def append(project: Project, queue: str, cfg: str, task: str, epochs: int | None = None,
           log: Log | None = None) -> AppendResult:
    _grown(project, queue, cfg, task, epochs)  # a bad line refuses before the lock is taken
    with controller_lock(project, f"append {queue}", log=log):
        return _append(project, queue, cfg, task, epochs, log)


def _grown(project: Project, queue: str, cfg: str, task: str,
           epochs: int | None) -> tuple[QueueFile, str, Cell, QueueFile]:
    """The queue file, the new line, its cell and the grown queue, checked against the roster."""
    qf = read_queue(project, check_queue_name(queue))
    index = len(qf.lines)
    text = f"{cfg} {task}" if epochs is None else f"{cfg} {task} {epochs}"
    cell = parse_line(text, project.tasks, f"queues/{queue}.txt:{index + 1}")
    if cell is None or cfg.startswith("#"):
        raise QueueError(f"`{text}` is not a cell; expected `ablate append QUEUE CFG TASK [EPOCHS]`")
    grown = parse_queue_text(queue, qf.normalized_text() + text + "\n", project.tasks, qf.path)
    build_roster([grown if q.name == queue else q for q in read_all_queues(project)])  # collisions
    return qf, text, cell, grown


def _append(project: Project, queue: str, cfg: str, task: str, epochs: int | None,
            log: Log | None) -> AppendResult:
    qf, text, cell, grown = _grown(project, queue, cfg, task, epochs)
    index = len(qf.lines)

    fs = shared_fs(project)
    layout = SweepLayout(fs.root)
    ledger = parse_ledger(fs.read_bytes(layout.ledger(queue)))
    host = ledger[-1].host if ledger else None
    h = None
    if ledger:
        check_prefix(qf, ledger, fs.read_bytes(layout.queue_file(queue)))
        if not isinstance(host, str):
            raise QueueError(f"queues/{queue}.ledger: its last entry names no host; relaunch with --host")
        h = project.host(host)  # refuses a host no longer in ablate.yaml before anything is written

    raw = qf.path.read_bytes()
    eol = b"\r\n" if b"\r\n" in raw else b"\n"
    if raw and not raw.endswith((b"\n", b"\r")):
        raw += eol
    atomic_write(qf.path, raw + text.encode() + eol, qf.path.stat().st_mode & 0o777)
    if log:
        log(f"appended queues/{queue}.txt:{index + 1}: {text}")
    if h is None:
        return AppendResult(queue, index, cell.name, text, None, False, None)

    # Launched: the FS copy first (run_queue re-reads it), then look at the queue. In a store, the
    # cell's config before it, for an instance whose clone lacks it.
    configs_to_store(project, fs, [cell.cfg])
    fs.write_atomic(layout.queue_file(queue), grown.normalized_text().encode())
    if _running(project, fs, layout, queue, h.name):
        last = ledger[-1]
        fs.append_line(layout.ledger(queue), entry_line(new_entry(
            grown, h.name, last.slot, None, last.spec, last.run_queue, "append")))
        refresh_estimates(project, fs, None, log)  # the new cell's estimate (a relaunch writes its own)
        return AppendResult(queue, index, cell.name, text, h.name, True, None)
    restarted = launch(project, queue, h.name, start_index=index, slot=ledger[-1].slot, log=log)
    return AppendResult(queue, index, cell.name, text, h.name, False, restarted)


def _running(project: Project, fs: SharedFS, layout: SweepLayout, queue: str, host: str) -> bool:
    """Whether the live queue will still read the new line. run_queue writes heartbeat state
    `drained`, then re-reads the queue file once more before exiting: a heartbeat that still says
    `running` after our write means the line will be seen; `drained` means wait for it to exit."""
    h = project.host(host)
    deadline = time.monotonic() + DRAIN_WAIT
    while is_live(project, h, queue):
        hb = Heartbeat.from_bytes(f"{host}.{queue}", fs.read_bytes(layout.heartbeat(host, queue)))
        if hb is not None and hb.state == "running":
            return True
        if time.monotonic() > deadline:
            return True  # neither running nor gone: leave it be, `ablate status` shows it
        time.sleep(0.05)
    return False
