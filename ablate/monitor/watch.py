"""`ablate status --watch`: a live dashboard, refreshed every interval, left with q or Ctrl-C.

A row per queue (host, slot): a bar k/n, the current cell, its elapsed time, the queue's ETA, the
heartbeat's age, the epoch and main metric parsed from the running cell's log; a row per host:
GPU utilisation and memory (where nvidia-smi exists), idle-and-costing-money, unreachable, what
its autostop waits for (or that it stopped itself); and the cells that need attention (hung, lost,
oom, crashed, ...). States are coloured (none under NO_COLOR).

The data is fetched on a background thread, so keys are answered at once even while a slow host
is asked; times tick between fetches. On a terminal the dashboard uses the alternate screen and
cbreak mode, both restored on every way out (q: exit 0; Ctrl-C: exit 130). Without a terminal on
stdout it prints the plain `status` table every interval.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable, Iterator
from typing import Any

from ablate.monitor.hostinfo import gpu_text, progress_text
from ablate.monitor.slurm_pending import job_text
from ablate.util.fmt import duration
from ablate.util.progress import console as make_console

STATE_STYLE = {
    "running": "green", "hung": "bold yellow", "lost": "bold red", "stale": "red", "stopped": "red",
    "drained": "blue", "done_unverified": "cyan", "verified": "bold green", "not_launched": "dim",
    "idle_costing_money": "bold magenta", "unreachable": "bold red", "busy": "green",
    "released": "bold green", "release_approved": "bold cyan", "stopped (autostop)": "bold green",
}
STOPPED = "stopped (autostop)"  # a host that stopped itself (its autostop)
ATTENTION = ("hung", "lost", "oom", "crashed", "service_down", "sync_failed", "too_long", "corrupt",
             "stale", "interrupted")


def row_state(report: Any, row: Any) -> str:
    """What the dashboard calls the queue: the cell classification refines `running` into hung or
    lost, and `drained` into verified or done_unverified (every cell synced, not yet verified)."""
    cells = getattr(report, "cells", None) or {}
    if row.current and row.current in cells and cells[row.current].state in ("hung", "lost"):
        return str(cells[row.current].state)
    if row.state == "drained" and row.total:
        states = [cells[n].state for n in row.cells if n in cells]
        if len(states) == row.total:
            if all(s == "verified" for s in states):
                return "verified"
            if all(s in ("verified", "synced") for s in states):
                return "done_unverified"
        elif row.synced == row.total:
            return "verified" if report.verified == report.roster else "done_unverified"
    return str(row.state)


def _styled(text: str, state: str) -> str:
    style = STATE_STYLE.get(state, "")
    return f"[{style}]{text}[/]" if style else text


def _bar(k: int, n: int, width: int = 12) -> str:
    filled = int(width * k / n) if n else width
    return f"[green]{'█' * filled}[/][dim]{'░' * (width - filled)}[/]"


def render(report: Any, *, age: float = 0.0, error: str | None = None, interval: float = 2.0) -> Any:
    """The dashboard for one report; `age`: seconds since it was fetched (times tick on)."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    def tick(v: float | None) -> float | None:
        return None if v is None else v + age

    queues = Table(expand=False, box=None, pad_edge=False, header_style="bold")
    for col, right in (("queue", False), ("host", False), ("state", False), ("progress", False),
                       ("k/n", True), ("current", False), ("elapsed", True), ("eta", True),
                       ("hb", True), ("epoch / metric", False), ("fail", True)):
        queues.add_column(col, justify="right" if right else "left", no_wrap=True)
    for r in report.rows:
        state = row_state(report, r)
        host = f"{r.host or '-'}" + (f":{r.slot}" if r.slot is not None else "")
        eta = getattr(r, "eta", None)
        hb = tick(r.heartbeat_age) if r.state in ("running", "stale") else r.heartbeat_age
        queues.add_row(
            escape(r.queue), escape(host), _styled(state, state), _bar(r.index, r.total),
            f"{r.index}/{r.total}", escape(r.current or "-"),
            duration(tick(r.elapsed)),
            duration(eta if eta is None or state != "running" else max(0.0, eta - age)),
            duration(hb), escape(progress_text(getattr(r, "progress", None)) or "-"),
            _styled(str(r.failed), "lost") if r.failed else "0")

    parts: list[Any] = [_title(report, age, interval), queues]
    for r in report.rows:
        for name, s in (getattr(r, "services", None) or {}).items():
            st = str(s.get("state", "?"))
            look = {"ready": "running", "starting": "queued", "down": "lost", "failed": "lost"}.get(st, st)
            gpus = f" gpu {escape(str(s['gpus']))}" if s.get("gpus") else ""
            n = s.get("starts")
            again = f" (started {n}x)" if isinstance(n, int) and n > 1 else ""
            parts.append(f"  service {escape(name)} of {escape(r.queue)}: {_styled(st, look)} "
                         f":{s.get('port', '?')}{gpus}{again}")
    for r in report.rows:  # a Slurm queue not in Slurm yet (its submit limit) or refused by sbatch
        job = getattr(r, "job", None) or {}
        if job.get("state") in ("WAITING", "REFUSED"):
            parts.append(f"  job of {escape(r.queue)}: {_styled(escape(job_text(job)), 'stale')}")
    hosts = _hosts_table(report)
    if hosts is not None:
        parts += [Text(""), hosts]
    attention = [c for c in (getattr(report, "cells", None) or {}).values() if c.state in ATTENTION]
    if attention:
        parts.append(Text(""))
        for c in attention[:8]:
            parts.append(f"{_styled(f'{c.state:<12}', c.state)} {escape(c.name)}  "
                         f"{escape((c.host or '-') + '/' + (c.queue or '-'))}  {escape(c.reason)}")
        if len(attention) > 8:
            parts.append(f"[dim]… and {len(attention) - 8} more: ablate status[/]")
    if error:
        parts.append(f"[bold red]refresh failed:[/] {escape(error)}")
    parts.append("[dim]q or Ctrl-C to leave[/]")
    return Group(*parts)


def _title(report: Any, age: float, interval: float) -> str:
    from rich.markup import escape

    verified = "not reconciled" if report.verified is None else f"{report.verified} verified"
    eta = getattr(report, "eta", None)
    eta_text = f" · sweep ETA {duration(max(0.0, eta - age))}" if eta else ""
    when = time.strftime("%H:%M:%S", time.localtime(time.time() - age))
    return (f"[bold]ablate · sweep {escape(report.sweep)}[/] · {report.synced}/{report.roster} synced · "
            f"{verified}{eta_text} · updated {when} (every {interval:g}s)")


def _hosts_table(report: Any) -> Any:
    from rich.markup import escape
    from rich.table import Table

    hosts: dict[str, dict[str, Any]] = dict(getattr(report, "hosts", None) or {})
    idle = {i.host: i for i in getattr(report, "idle", None) or []}
    unreachable: dict[str, str] = getattr(report, "unreachable", None) or {}
    autostop: dict[str, Any] = getattr(report, "autostop", None) or {}
    names = list(dict.fromkeys([*hosts, *idle, *unreachable, *autostop]))
    if not names:
        return None
    table = Table(expand=False, box=None, pad_edge=False, header_style="bold")
    for col in ("host", "state", "gpus"):
        table.add_column(col, no_wrap=col != "gpus")
    for h in names:
        info = hosts.get(h) or {}
        auto = autostop.get(h)
        if auto is not None and auto.stopped:
            state, note = STOPPED, auto.why()
        elif h in unreachable:
            state, note = "unreachable", unreachable[h]
        elif h in idle:
            alarm = idle[h]
            idle_for = f"idle {duration(alarm.idle_for)}: " if alarm.state == "idle_costing_money" else ""
            state, note = alarm.state, f"{idle_for}{alarm.next_step}"
        else:
            busy = any(r.host == h and r.state in ("running", "stale") for r in report.rows)
            state, note = ("busy" if busy else "-"), ""
        if auto is not None and state != STOPPED:
            note = " · ".join(t for t in (note, f"autostop: {auto.why()}") if t)
        gpus = info.get("gpus")
        if gpus:
            text = "  ".join(gpu_text(g) for g in gpus)
        elif info.get("gpu_error"):
            text = f"nvidia-smi: {info['gpu_error']}"
        elif state == STOPPED:
            text = ""
        elif info.get("error") and h not in unreachable:
            text = f"not asked: {info['error']}"
        else:
            text = "no nvidia-smi" if info else "-"
        table.add_row(escape(h), _styled(state, state), escape(" · ".join(t for t in (text, note) if t)))
    return table


# --------------------------------------------------------------------------- the loop


@contextlib.contextmanager
def _cbreak() -> Iterator[bool]:
    """Single-key reads from a TTY stdin; restores the terminal whatever happens."""
    try:
        is_tty = sys.stdin.isatty()
    except (AttributeError, ValueError):
        is_tty = False
    if not is_tty:
        yield False
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _key(timeout: float, keys: bool) -> str | None:
    """A key pressed within `timeout` (None when none, or stdin is no terminal)."""
    if not keys:
        time.sleep(timeout)
        return None
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    if not ready:
        return None
    data = os.read(sys.stdin.fileno(), 1)
    return data.decode(errors="replace") if data else "q"  # EOF: leave


class _Fetcher(threading.Thread):
    """Fetches a report every `interval` seconds (start to start) until stopped."""

    def __init__(self, fetch: Callable[[], Any], interval: float) -> None:
        super().__init__(name="ablate-watch-fetch", daemon=True)
        self.fetch, self.interval = fetch, interval
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.report: Any = None
        self.at = 0.0  # monotonic time of the last good fetch
        self.error: str | None = None
        self.version = 0

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                report = self.fetch()
            except Exception as e:  # shown on the dashboard; the next refresh may well work
                msg = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
                with self.lock:
                    self.error, self.version = " ".join(str(msg).split())[:300], self.version + 1
            else:
                with self.lock:
                    self.report, self.at, self.error = report, time.monotonic(), None
                    self.version += 1
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))


def run_watch(fetch: Callable[[], Any], interval: float) -> None:
    out = make_console(stderr=False)
    try:
        with _cbreak() as keys:
            if not out.is_terminal:
                _plain(fetch, interval, keys)
                return
            _live(out, fetch, interval, keys)
    except KeyboardInterrupt:
        raise SystemExit(130) from None  # the terminal is restored by now; no traceback, no message


def _plain(fetch: Callable[[], Any], interval: float, keys: bool) -> None:
    while True:
        for line in fetch().lines():
            print(line, flush=True)
        print(flush=True)
        deadline = time.monotonic() + interval
        while (left := deadline - time.monotonic()) > 0:
            if _key(min(left, 0.25), keys) in ("q", "Q"):
                return


def _live(out: Any, fetch: Callable[[], Any], interval: float, keys: bool) -> None:
    from rich.live import Live
    from rich.text import Text

    fetcher = _Fetcher(fetch, interval)
    fetcher.start()
    try:
        with Live(Text("ablate: reading the sweep …"), console=out, auto_refresh=False, screen=True,
                  redirect_stdout=False, redirect_stderr=False) as live:
            seen, drawn = -1, 0.0
            while True:
                if _key(0.1, keys) in ("q", "Q"):
                    return
                with fetcher.lock:
                    report, at, error, version = fetcher.report, fetcher.at, fetcher.error, fetcher.version
                now = time.monotonic()
                if version == seen and now - drawn < 1.0:
                    continue
                seen, drawn = version, now
                if report is None:
                    view: Any = Text(f"ablate: reading the sweep … {error or ''}")
                else:
                    view = render(report, age=now - at, error=error, interval=interval)
                live.update(view, refresh=True)
    finally:
        fetcher.stop.set()
