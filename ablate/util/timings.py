"""Where a command's wall time goes, for `scripts/bench_fanout.py` (and anyone asking why a command
is slow): with `ABLATE_TIMINGS=FILE` in its environment, a command appends one JSON line to FILE as
it exits:

    {"argv": [...], "marks": {"main": T, "project": T, "output": T, "exit": T},
     "trips": [[host, what, start, end], ...], "spans": [[name, start, end], ...]}

Times are `time.time()` (the caller subtracts its own clock at the process's spawn: the interpreter's
start and the imports before `main`). `marks`: `main` the CLI's entry (after its imports), `project`
the config and profiles loaded, `output` the result printed. `trips`: every command a host ran for
this one (an SSH host's `exec`: through its agent or a new ssh session), `what` the command's first
words. `spans`: repeated steps (`refresh`: one `status --watch` fetch). Without the variable, each
call is one dictionary lookup.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time

_FILE: str | None = None
_registered = False
_marks: dict[str, float] = {}
_trips: list[list[object]] = []
_spans: list[list[object]] = []
_lock = threading.Lock()


def enabled() -> bool:
    return _FILE is not None


def mark(name: str) -> None:
    """The first time `name` is reached."""
    if _FILE is not None:
        _marks.setdefault(name, time.time())


def trip(host: str, what: str, start: float) -> None:
    """One command `host` ran, from `start` (time.time()) to now."""
    if _FILE is not None:
        with _lock:
            _trips.append([host, " ".join(what.split())[:80], start, time.time()])


def span(name: str, start: float) -> None:
    """One step `name`, from `start` (time.time()) to now."""
    if _FILE is not None:
        with _lock:
            _spans.append([name, start, time.time()])


def _write() -> None:
    if _FILE is None:
        return
    _marks.setdefault("exit", time.time())
    line = json.dumps({"argv": sys.argv[1:], "marks": _marks, "trips": _trips, "spans": _spans}) + "\n"
    try:
        with open(_FILE, "a", encoding="utf-8") as f:
            f.write(line)
    except OSError as e:  # a measurement never fails the command
        print(f"ablate: could not write ABLATE_TIMINGS to {_FILE}: {e}", file=sys.stderr)


def from_env() -> None:
    """Read ABLATE_TIMINGS: at import, and again in a command server's child (ablate.cmdserver),
    whose environment is its client's, not the server's."""
    global _FILE, _registered
    _FILE = os.environ.get("ABLATE_TIMINGS") or None
    _marks.clear()
    _trips.clear()
    _spans.clear()
    if _FILE is not None and not _registered:
        atexit.register(_write)
        _registered = True


from_env()
