"""The one queue-line grammar, for the controller (`ablate/sweep/cells.py`) and the runner alike
(`ablate/remote/queue/runner.py`, deployed with it): stdlib only.

A queue file is split into lines by `split_lines` (CRLF and a lone CR end a line, as a Windows or
old Mac editor writes them; a leading BOM is dropped), so both sides count the same indices. A line
is `<cfg_path> <task> [epochs] [priority=N]`, fields separated by spaces or tabs; blank lines and
`#` lines are no cell (`None`). Every other line is a cell, or refused with a `LineError` whose
message names the problem and the fix. Values that reach a shell (the cfg path, the task) are
restricted to characters no shell interprets; the cell name (the cfg's basename without extension)
is a safe path component; epochs are a positive whole number of at most 7 digits.
"""

from __future__ import annotations

import difflib
import posixpath
import re
from collections.abc import Collection, Mapping
from typing import NamedTuple

SAFE_CFG = re.compile(r"^[A-Za-z0-9._/+@,=-]+$")
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")
EPOCHS = re.compile(r"[1-9][0-9]{0,6}")
PRIORITY = re.compile(r"priority=(-?[0-9]{1,6})")
_FIELDS = re.compile(r"[ \t]+")
SAFE_CHARS = "letters, digits and . _ / + @ , = -"


class LineError(ValueError):
    """A queue line that is not a cell: the message says why and what to write instead."""


class Parsed(NamedTuple):
    cfg: str
    task: str
    epochs: int
    priority: int
    name: str
    cat: str


def split_lines(text: str) -> list[str]:
    """The lines of a queue file, as both sides index them (0-based), without their line ends."""
    if text.startswith("\ufeff"):
        text = text[1:]
    rows = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if rows and rows[-1] == "":
        rows.pop()  # the newline that ends the last line
    return rows


def cell_name(cfg: str) -> str:
    base = posixpath.basename(cfg)
    stem, dot, _ext = base.rpartition(".")
    return stem if dot and stem else base


def cell_cat(cfg: str) -> str:
    return posixpath.basename(posixpath.dirname(cfg)) or "default"


def _fields(text: str) -> list[str]:
    body = text.strip(" \t")
    return _FIELDS.split(body) if body else []


def parse(text: str, tasks: Mapping[str, int], where: str) -> Parsed | None:
    """One line: None for a blank or `#` line, the cell's fields, or LineError (`where` leads its
    message). `tasks` maps each known task to its default epochs."""
    parts = _fields(text)
    if not parts or parts[0].startswith("#"):
        return None
    priority = 0
    if len(parts) > 2 and parts[-1].startswith("priority="):
        m = PRIORITY.fullmatch(parts[-1])
        if m is None:
            raise LineError(f"{where}: {parts[-1]!r}: a priority is a whole number, e.g. priority=2")
        priority = int(m.group(1))
        parts.pop()
    spaced = next((k for k in range(2, len(parts)) if parts[1] not in tasks and parts[k] in tasks), None)
    if spaced is not None:
        raise LineError(f"{where}: cfg path {' '.join(parts[:spaced])!r} has a space (characters a "
                        f"shell would interpret); rename the file to {SAFE_CHARS}")
    if len(parts) not in (2, 3):
        got = text.strip(" \t")
        raise LineError(f"{where}: expected `<cfg_path> <task> [epochs] [priority=N]`, got {got!r}")
    cfg, task = parts[0], parts[1]
    if not SAFE_CFG.fullmatch(cfg):
        raise LineError(f"{where}: cfg path {cfg!r} has characters a shell would interpret; "
                        f"rename the file to {SAFE_CHARS}")
    if cfg.endswith("/"):
        raise LineError(f"{where}: cfg path {cfg!r} names a directory, not a config file")
    name = cell_name(cfg)
    if not SAFE_NAME.fullmatch(name):
        raise LineError(f"{where}: cell name {name!r} (from {cfg!r}) is not a safe path component; "
                        "rename the config to start with a letter or digit")
    if task not in tasks:
        raise LineError(f"{where}: task {task!r} is not in ablate.yaml tasks "
                        f"({_known(tasks)}){_hint(task, tasks)}")
    if len(parts) == 3:
        if not EPOCHS.fullmatch(parts[2]):
            raise LineError(f"{where}: epochs must be a positive whole number, got {parts[2]!r}")
        epochs = int(parts[2])
    else:
        epochs = tasks[task]
    return Parsed(cfg, task, epochs, priority, name, cell_cat(cfg))


def _known(tasks: Collection[str]) -> str:
    return ", ".join(sorted(tasks))


def _hint(task: str, tasks: Collection[str]) -> str:
    close = difflib.get_close_matches(task, list(tasks), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def task_epochs(spec_value: str) -> dict[str, int]:
    """The run spec's ABLATE_TASK_EPOCHS (`task=epochs ...`): each task's default epochs."""
    out: dict[str, int] = {}
    for item in spec_value.split():
        task, _, epochs = item.partition("=")
        if task and EPOCHS.fullmatch(epochs):
            out[task] = int(epochs)
    return out
