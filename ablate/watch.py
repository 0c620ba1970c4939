"""`ablate status --watch`: a live rich table, refreshed every interval, left with q or Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import tty
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

STATE_STYLE = {"running": "green", "stale": "bold red", "stopped": "red", "drained": "cyan",
               "not_launched": "dim"}


def render(report: Any) -> Table:
    table = Table(title=f"ablate · sweep {report.sweep}", expand=False)
    numeric = ("k/n", "elapsed", "hb age", "done", "fail", "synced")
    for col in ("queue", "host", "state", "current", *numeric):
        table.add_column(col, justify="right" if col in numeric else "left")
    from ablate.status import _dur

    for r in report.rows:
        bar = _bar(r.index, r.total)
        table.add_row(r.queue, r.host or "-", f"[{STATE_STYLE.get(r.state, '')}]{r.state}[/]",
                      r.current or "-", f"{bar} {r.index}/{r.total}", _dur(r.elapsed),
                      _dur(r.heartbeat_age), str(r.done), str(r.failed), str(r.synced))
    verified = "not reconciled" if report.verified is None else f"{report.verified} verified"
    table.caption = f"{report.synced}/{report.roster} synced · {verified} · q or Ctrl-C to leave"
    return table


def _bar(k: int, n: int, width: int = 10) -> str:
    filled = int(width * k / n) if n else width
    return "█" * filled + "·" * (width - filled)


@contextlib.contextmanager
def _cbreak() -> Iterator[bool]:
    """Single-key reads from a TTY stdin; restores the terminal whatever happens."""
    if not sys.stdin.isatty():
        yield False
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _quit_pressed(timeout: float, keys: bool) -> bool:
    if not keys:
        select.select([], [], [], timeout)
        return False
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    return bool(ready) and os.read(sys.stdin.fileno(), 1) in (b"q", b"Q")


def run_watch(fetch: Callable[[], Any], interval: float) -> None:
    console = Console()
    try:
        with _cbreak() as keys:
            if not console.is_terminal:
                while True:
                    for line in fetch().lines():
                        console.print(line, markup=False, highlight=False)
                    if _quit_pressed(interval, keys):
                        return
            with Live(render(fetch()), console=console, auto_refresh=False, transient=False) as live:
                while not _quit_pressed(interval, keys):
                    live.update(render(fetch()), refresh=True)
    except KeyboardInterrupt:
        return
