"""Cells, queue files and the roster.

A queue line is `<cfg_path> <task> [epochs] [priority=N]` (a higher priority runs earlier in its
queue and is stolen first; not part of the cell's identity); blank and `#` lines are skipped but
keep their index (indices count from 0). A cell's identity is `(cfg, task, epochs)`; its name is the
cfg basename without extension and must be a safe path component. The roster is every cell line of
every queue file in `queues/`; two *different* lines mapping to one name are a collision, refused
before launch.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ablate.config.project import SAFE_NAME, Project, Task
from ablate.errors import QueueError
from ablate.remote.queue import grammar

# Values that reach a shell (cfg path, task) are restricted to characters no shell interprets.
SAFE_CFG = grammar.SAFE_CFG
cell_name = grammar.cell_name
HEADER = re.compile(r"^#\s*ablate:\s*(.*)$")


@dataclass(frozen=True)
class Cell:
    cfg: str
    task: str
    epochs: int
    priority: int = field(default=0, compare=False)  # not part of the identity: the order it runs in

    @property
    def name(self) -> str:
        return cell_name(self.cfg)

    @property
    def cat(self) -> str:
        return grammar.cell_cat(self.cfg)

    @property
    def line(self) -> str:
        return f"{self.cfg} {self.task} {self.epochs}"

    @property
    def queue_line(self) -> str:
        """The line `plan` writes: with its priority when it has one."""
        return self.line + (f" priority={self.priority}" if self.priority else "")


@dataclass(frozen=True)
class QueueLine:
    queue: str
    index: int  # 0-based position in the file, comments and blanks included
    text: str  # the line as written, CR stripped
    cell: Cell | None  # None for blank / comment lines

    @property
    def where(self) -> str:
        return f"queues/{self.queue}.txt:{self.index + 1}"


@dataclass(frozen=True)
class QueueFile:
    name: str
    path: Path
    lines: tuple[QueueLine, ...]
    host: str | None  # from a `# ablate: host=H slot=N` header written by plan
    slot: int | None

    @property
    def cells(self) -> list[QueueLine]:
        return [ln for ln in self.lines if ln.cell is not None]

    def normalized_text(self) -> str:
        return "".join(ln.text + "\n" for ln in self.lines)


def check_queue_name(name: str) -> str:
    if not SAFE_NAME.match(name):
        raise QueueError(f"queue name {name!r} must be a plain name (letters, digits, . _ + -)")
    return name


def parse_line(text: str, tasks: Mapping[str, Task], where: str) -> Cell | None:
    """Parse one queue line (the grammar in `ablate/remote/queue/grammar.py`, the runner's too). Returns
    None for blank/comment lines; raises QueueError otherwise."""
    try:
        p = grammar.parse(text, {t.name: t.epochs for t in tasks.values()}, where)
    except grammar.LineError as e:
        raise QueueError(str(e)) from None
    return None if p is None else Cell(p.cfg, p.task, p.epochs, p.priority)


def parse_queue_text(queue: str, text: str, tasks: Mapping[str, Task], path: Path) -> QueueFile:
    check_queue_name(queue)
    if "\x00" in text:
        raise QueueError(f"{path}: contains a NUL byte; is this a text file?")
    host: str | None = None
    slot: int | None = None
    lines = []
    # CRLF and a leading BOM from Windows editors are normalised: `\r` never reaches a command.
    for i, raw in enumerate(grammar.split_lines(text)):
        where = f"queues/{queue}.txt:{i + 1}"
        m = HEADER.match(raw.strip())
        if m:
            host, slot = _header(m.group(1), where)
        lines.append(QueueLine(queue, i, raw.rstrip(), parse_line(raw, tasks, where)))
    return QueueFile(queue, path, tuple(lines), host, slot)


def _header(body: str, where: str) -> tuple[str | None, int | None]:
    host: str | None = None
    slot: int | None = None
    for item in body.split():
        key, _, val = item.partition("=")
        if key == "host" and SAFE_NAME.match(val):
            host = val
        elif key == "slot" and val.isdigit():
            slot = int(val)
        elif key not in ("host", "slot"):
            continue
        else:
            raise QueueError(f"{where}: bad header value {item!r}; expected host=NAME slot=N")
    return host, slot


def read_queue(project: Project, queue: str) -> QueueFile:
    check_queue_name(queue)
    path = project.queues_dir / f"{queue}.txt"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in project.queues_dir.glob("*.txt"))) or "none"
        raise QueueError(f"no queue file {path} (queues: {known}); run `ablate plan` or write one")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise QueueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    return parse_queue_text(queue, text, project.tasks, path)


def read_all_queues(project: Project) -> list[QueueFile]:
    if not project.queues_dir.is_dir():
        return []
    return [read_queue(project, p.stem) for p in sorted(project.queues_dir.glob("*.txt"))]


@dataclass(frozen=True)
class Roster:
    queues: tuple[QueueFile, ...]
    cells: Mapping[str, Cell]  # name -> cell, in first-seen order

    @property
    def names(self) -> list[str]:
        return list(self.cells)

    def digest(self) -> str:
        """A hash of the roster's identity: changes when a cell is added, removed or altered."""
        h = hashlib.sha256()
        for name in sorted(self.cells):
            h.update(f"{name}\t{self.cells[name].line}\n".encode())
        return h.hexdigest()


def build_roster(queues: Iterable[QueueFile]) -> Roster:
    qs = tuple(queues)
    seen: dict[str, tuple[Cell, QueueLine]] = {}
    for q in qs:
        for ln in q.cells:
            assert ln.cell is not None
            prev = seen.get(ln.cell.name)
            if prev is None:
                seen[ln.cell.name] = (ln.cell, ln)
            elif prev[0] != ln.cell:
                raise QueueError(
                    f"name collision: {prev[1].where} ({prev[1].text.strip()!r}) and {ln.where} "
                    f"({ln.text.strip()!r}) both map to cell {ln.cell.name!r}; rename one config"
                )
    return Roster(qs, {name: cell for name, (cell, _) in seen.items()})


def load_roster(project: Project) -> Roster:
    return build_roster(read_all_queues(project))
