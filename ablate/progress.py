"""Progress of a transfer (`ablate pull`): a rich bar on a terminal, one plain line per cell otherwise.

Both go to stderr (the bar) or through the command's `log` (which writes stderr): stdout stays data.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

Log = Callable[[str], None]


def human(n: float) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


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

    def __init__(self, log: Log) -> None:
        self.log = log

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
        self.log(f"[{index}/{total}] {name}: {note}")


class BarProgress:
    """A rich progress bar on stderr: bytes and files done, rate, time left."""

    def __init__(self, total_bytes: int, total_files: int) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.files_total = total_files
        self.files = 0
        self._bar = Progress(
            TextColumn("[bold]pull[/]"), BarColumn(), DownloadColumn(), TextColumn("{task.fields[files]}"),
            TransferSpeedColumn(), TimeRemainingColumn(), TextColumn("{task.description}"),
            console=Console(stderr=True), transient=False)
        self._task = self._bar.add_task("", total=max(total_bytes, 1), files=self._files())

    def _files(self) -> str:
        return f"{self.files}/{self.files_total} files"

    def __enter__(self) -> BarProgress:
        self._bar.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._bar.stop()  # leaves the terminal clean, on Ctrl-C too

    def advance(self, nbytes: int) -> None:
        self._bar.advance(self._task, nbytes)

    def file_done(self) -> None:
        self.files += 1
        self._bar.update(self._task, files=self._files())

    def cell_done(self, index: int, total: int, name: str, note: str) -> None:
        self._bar.update(self._task, description=f"{index}/{total} {name}")


def transfer_progress(log: Log | None, total_bytes: int, total_files: int,
                      bar: bool | None = None) -> TransferProgress:
    """The bar when `bar` (default: stderr is a terminal and there is a log to speak through),
    plain lines through `log` otherwise; nothing at all without a log."""
    if bar is None:
        bar = log is not None and sys.stderr.isatty()
    if bar:
        return BarProgress(total_bytes, total_files)
    return PlainProgress(log or (lambda _m: None))
