"""Progress of long operations: a rich bar on stderr when stderr is a terminal, one plain line per
step through the command's `log` otherwise. Never stdout: that stays data (and `--json`'s one object).

Core functions take `log` (a `Callable[[str], None]`); whether a bar may be drawn is a property of
that log: the CLI's `StderrLog` says so (`.bar`: stderr is a terminal and not `-q`); a plain function
(a test's `lines.append`) never gets a bar. While a bar is live, messages logged through a
`StderrLog` are printed above it, so the two never tear each other.

Two shapes:
  `transfer_progress(log, total_bytes, total_files, label=...)`: bytes and files, rate, time left
      (pull; deploy's copies).
  `steps(log, total, label, unit=...)`: k/n items (reconcile's cells, launch --all's queues,
      remediate's planning), rate per second and time left; `total=None` for one step of unknown
      length (a spinner and the elapsed time).
"""

from __future__ import annotations

import os
import sys
import threading
from types import TracebackType
from typing import Any, Protocol

from ablate.util.fmt import Log

_ACTIVE: Any = None  # the live rich Progress, if any (log lines print above it)
_ACTIVE_LOCK = threading.Lock()




def stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # a closed or replaced stderr
        return False


class StderrLog:
    """The CLI's log: human messages on stderr (none under -q), above a live bar when one runs."""

    def __init__(self, verbosity: int = 0) -> None:
        self.verbosity = verbosity

    @property
    def bar(self) -> bool:
        """May a progress bar be drawn (stderr is a terminal, not quiet)?"""
        return self.verbosity >= 0 and stderr_is_terminal()

    def __call__(self, message: str) -> None:
        if self.verbosity < 0:
            return
        with _ACTIVE_LOCK:
            live = _ACTIVE
        if live is not None:
            live.console.print(message, markup=False, highlight=False, soft_wrap=True)
            return
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


def bar_wanted(log: Log | None, bar: bool | None = None) -> bool:
    if bar is not None:
        return bar
    return bool(getattr(log, "bar", False))


def no_color() -> bool:
    """NO_COLOR (https://no-color.org): present and not empty."""
    return bool(os.environ.get("NO_COLOR"))


def console(stderr: bool = True) -> Any:
    """A rich Console; under NO_COLOR it emits no SGR codes at all (rich alone would keep bold)."""
    from rich.console import Console

    if no_color():
        return Console(stderr=stderr, color_system=None, no_color=True, highlight=False)
    return Console(stderr=stderr, highlight=False)


def _console() -> Any:
    return console(stderr=True)


class _Live:
    """Start/stop one rich Progress and register it so `StderrLog` prints above it."""

    def __init__(self, columns: tuple[Any, ...]) -> None:
        from rich.progress import Progress

        self._bar = Progress(*columns, console=_console(), transient=False)

    def _start(self) -> None:
        global _ACTIVE
        self._bar.start()
        with _ACTIVE_LOCK:
            _ACTIVE = self._bar

    def _stop(self) -> None:
        global _ACTIVE
        with _ACTIVE_LOCK:
            if _ACTIVE is self._bar:
                _ACTIVE = None
        self._bar.stop()  # leaves the terminal clean, on Ctrl-C too


# --------------------------------------------------------------------------- transfers


class TransferProgress(Protocol):
    def __enter__(self) -> TransferProgress: ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

    def advance(self, nbytes: int) -> None:
        """Bytes that landed (copied, or found already in place)."""
        ...

    def file_done(self) -> None:
        ...

    def cell_done(self, index: int, total: int, name: str, note: str) -> None:
        ...


class PlainProgress:
    """One line per cell through `log`, for logs and pipes."""

    def __init__(self, log: Log, label: str = "pull") -> None:
        self.log = log
        self.label = label

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def file_done(self) -> None:
        pass

    def cell_done(self, index: int, total: int, name: str, note: str) -> None:
        self.log(f"{self.label} [{index}/{total}] {name}: {note}")


class BarProgress(_Live):
    """A rich progress bar on stderr: bytes and files done, rate, time left."""

    def __init__(self, total_bytes: int, total_files: int, label: str = "pull") -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        super().__init__((
            TextColumn(f"[bold]{label}[/]"), BarColumn(), DownloadColumn(),
            TextColumn("{task.fields[files]}"), TransferSpeedColumn(), TimeRemainingColumn(),
            TextColumn("{task.description}")))
        self.files_total = total_files
        self.files = 0
        self._task = self._bar.add_task("", total=max(total_bytes, 1), files=self._files())

    def _files(self) -> str:
        return f"{self.files}/{self.files_total} files"

    def __enter__(self) -> BarProgress:
        self._start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop()

    def advance(self, nbytes: int) -> None:
        self._bar.advance(self._task, nbytes)

    def file_done(self) -> None:
        self.files += 1
        self._bar.update(self._task, files=self._files())

    def cell_done(self, index: int, total: int, name: str, note: str) -> None:
        self._bar.update(self._task, description=f"{index}/{total} {name}")


def transfer_progress(log: Log | None, total_bytes: int, total_files: int,
                      bar: bool | None = None, label: str = "pull") -> TransferProgress:
    """The bar when `bar` (default: the log says stderr is a terminal), plain lines through `log`
    otherwise; nothing at all without a log."""
    if bar_wanted(log, bar):
        return BarProgress(total_bytes, total_files, label)
    return PlainProgress(log or (lambda _m: None), label)


# --------------------------------------------------------------------------- counted steps


class Steps(Protocol):
    def __enter__(self) -> Steps: ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...

    def advance(self, note: str = "", n: int = 1) -> None:
        """`n` more items done; `note` says which (shown beside the bar, or on the plain line)."""
        ...

    def set_total(self, total: int | None) -> None:
        """The total became known (or changed)."""
        ...

    def step(self, done: int, total: int | None, note: str = "") -> None:
        """Absolute progress: `done` of `total` (a callback shape: `verify_tree(progress=bar.step)`)."""
        ...


class PlainSteps:
    """`<label> [k/n] <note>`, one line per step."""

    def __init__(self, log: Log, total: int | None, label: str, unit: str) -> None:
        self.log, self.total, self.label, self.unit = log, total, label, unit
        self.done = 0
        self._lock = threading.Lock()  # steps may finish on several threads (launch --all's hosts)

    def __enter__(self) -> PlainSteps:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        pass

    def advance(self, note: str = "", n: int = 1) -> None:
        with self._lock:
            self.done += n
            self._say(note)

    def set_total(self, total: int | None) -> None:
        self.total = total

    def step(self, done: int, total: int | None, note: str = "") -> None:
        with self._lock:
            self.done, self.total = done, total
            self._say(note)

    def _say(self, note: str) -> None:
        of = f"{self.done}/{self.total}" if self.total is not None else f"{self.done}"
        self.log(f"{self.label} [{of} {self.unit}]{' ' + note if note else ''}")


class BarSteps(_Live):
    """A rich bar: k/n items, items per second, elapsed and time left, the last item's note."""

    def __init__(self, total: int | None, label: str, unit: str) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        super().__init__((
            SpinnerColumn(), TextColumn(f"[bold]{label}[/]"), BarColumn(), MofNCompleteColumn(),
            TextColumn(unit), _rate_column(unit), TimeElapsedColumn(), TimeRemainingColumn(),
            TextColumn("{task.description}")))
        self._task = self._bar.add_task("", total=total)

    def __enter__(self) -> BarSteps:
        self._start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop()

    def advance(self, note: str = "", n: int = 1) -> None:
        self._bar.update(self._task, advance=n, description=note)

    def set_total(self, total: int | None) -> None:
        self._bar.update(self._task, total=total)

    def step(self, done: int, total: int | None, note: str = "") -> None:
        self._bar.update(self._task, completed=done, total=total, description=note)


def _rate_column(unit: str) -> Any:
    """Items per second (rich has one for bytes only); built here so rich loads on use."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class RateColumn(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            if not speed:
                return Text("", style="progress.data.speed")
            per = f"{speed:.1f}" if speed < 10 else f"{speed:.0f}"
            return Text(f"{per} {unit}/s", style="progress.data.speed")

    return RateColumn()


def steps(log: Log | None, total: int | None, label: str, *, unit: str = "cells",
          bar: bool | None = None) -> Steps:
    """Progress over `total` items (None: unknown). A bar when the log allows one, else one line per
    step through `log`, else nothing."""
    if bar_wanted(log, bar):
        return BarSteps(total, label, unit)
    return PlainSteps(log or (lambda _m: None), total, label, unit)
