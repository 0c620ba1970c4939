"""The controller lock: two controllers (two laptops, two shells) acting on one sweep are serialised.

Every command that changes shared state (plan when it writes, deploy, launch, launch --all, append,
stop, remediate, release) runs inside `controller_lock(project, op)`; read-only ones (status,
reconcile, pull, logs, report, doctor) never take it.

The lock is an exclusive flock(2) on `<root>/locks/controller.lock` on the shared FS, taken through
the `SharedFS` itself: the local transport holds it with `filelock.FileLock`; over SSH a `flock -w T
<lock> -c 'echo ACQUIRED; exec cat >/dev/null'` holds it on the host the FS is read through for as
long as this controller's channel stays open (util-linux flock and filelock both use flock(2), so
they exclude each other on one file). Either way the lock dies with the process that holds it: a
killed controller never leaves a stale lock behind, and there is nothing to break by hand.

A sweep kept in an object store has no flock: its lock is a lease in the store
(ablate/transport/storelock.py), renewed while held and taken over once unrenewed for its length by
the store's clock: a killed controller's lock outlives it by up to that length (60 s), and a command
that could not renew it for that long is told so when it lets go.

Once the lock is held, `<root>/locks/controller.holder` is replaced with `{"by": user@hostname,
"pid", "op", "t"}` (by `SharedFS.lock` itself: no extra round trip), so a controller that gives up
after the timeout can say who is in the way; it is removed just before the lock is let go. A
SIGKILLed local holder leaves it behind, harmlessly: it is only read when the lock is found held,
and by then the new holder has rewritten it. Over SSH the host removes it even then.

Re-entrant within one process (any thread): `remediate --launch` and `append` call `launch`; each
takes the lock, only the outermost one acquires and releases it.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import math
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ablate.config.project import Project
from ablate.errors import AblateError, Busy
from ablate.remote.layout import SweepLayout
from ablate.transport import shared_fs
from ablate.transport.base import HeldLock, SharedFS
from ablate.util.fmt import Log, age
from ablate.util.fs import read_json_object

ENV = "ABLATE_LOCK_TIMEOUT"
DEFAULT_TIMEOUT = 120.0

_override: float | None = None  # --lock-timeout, set once by the CLI


@dataclass
class _Held:
    lock: HeldLock
    op: str
    depth: int


_HELD: dict[str, _Held] = {}
# Held while acquiring and around the depth count: a second thread of this process waits here
# rather than contending with its own process on a second descriptor.
_MUTEX = threading.RLock()


def lock_path(root: str) -> str:
    return SweepLayout(root).lock_file


def holder_path(root: str) -> str:
    return SweepLayout(root).lock_holder


def set_lock_timeout(seconds: float | None) -> None:
    """Process-wide default (`--lock-timeout`); None falls back to $ABLATE_LOCK_TIMEOUT, then 120."""
    global _override
    _override = seconds


def lock_timeout(explicit: float | None = None) -> float:
    if explicit is not None:
        return explicit
    if _override is not None:
        return _override
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise AblateError(f"{ENV}={raw!r} is not a number of seconds ≥ 0; set it like "
                          f"{ENV}=300, or pass --lock-timeout SECONDS")
    return value


def whoami() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def held_here(project: Project) -> str | None:
    """The op of this process's hold on the sweep's lock, or None (for tests and diagnostics)."""
    with _MUTEX:
        held = _HELD.get(_key(project))
        return held.op if held else None


def busy_message(sweep: str, holder: Mapping[str, Any] | None, waited: float) -> str:
    if not holder:
        who = "another controller (no holder record)"
    else:
        by, pid, their_op, t = holder.get("by"), holder.get("pid"), holder.get("op"), holder.get("t")
        who = f"`ablate {their_op}` held by {by or 'unknown'}"
        if isinstance(pid, int):
            who += f" (pid {pid})"
        if isinstance(t, (int, float)):
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
            who += f" since {since} ({age(time.time() - t)} ago)"
    return (f"sweep {sweep} is busy: {who}; waited {waited:g}s; wait for it to finish or retry with "
            "a longer --lock-timeout")



def _key(project: Project) -> str:
    return f"{project.profile.transport}:{project.sweep_root()}"


def _acquire(fs: SharedFS, sweep: str, op: str, timeout: float, log: Log | None) -> HeldLock:
    path, rec_path = lock_path(fs.root), holder_path(fs.root)

    def record() -> tuple[str, bytes]:  # its time is when the lock was asked for, near enough
        return rec_path, json.dumps({"by": whoami(), "pid": os.getpid(), "op": op, "t": time.time()}).encode()

    held = fs.lock(path, 0.0, record())
    if held is None and timeout > 0:
        if log:
            holder = read_json_object(fs.read_bytes(rec_path))
            who = f"`ablate {holder.get('op')}` by {holder.get('by')}" if holder else "another controller"
            log(f"sweep {sweep}: waiting up to {timeout:g}s for {who} to finish")
        held = fs.lock(path, timeout, record())
    if held is None:
        raise Busy(busy_message(sweep, read_json_object(fs.read_bytes(rec_path)), timeout))
    return held


@contextlib.contextmanager
def controller_lock(project: Project, op: str, timeout: float | None = None,
                    log: Log | None = None, fs: SharedFS | None = None) -> Iterator[None]:
    """Hold the sweep's controller lock for the block; `Busy` (exit 1) after `timeout` seconds
    (default: --lock-timeout, $ABLATE_LOCK_TIMEOUT, 120). Re-entrant within the process. `fs`: the
    shared FS the caller already built for its own work (else one is built here)."""
    key = _key(project)
    with _MUTEX:
        outer = key not in _HELD
        if outer:
            fs = fs or shared_fs(project)
            _HELD[key] = _Held(_acquire(fs, project.sweep, op, lock_timeout(timeout), log), op, 0)
        _HELD[key].depth += 1
    try:
        yield
    finally:
        with _MUTEX:
            held = _HELD[key]
            held.depth -= 1
            if held.depth == 0:
                del _HELD[key]
                held.lock.release()  # removes the holder record first, still holding the lock
                if getattr(held.lock, "lost", False) and log is not None:  # a store's lease
                    log(f"warning: sweep {project.sweep}: this `ablate {op}` could not renew the "
                        f"controller lock's lease and another controller took it over meanwhile; "
                        f"look at `ablate status` before going on")
