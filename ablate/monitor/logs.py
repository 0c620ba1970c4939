"""`ablate logs CELL [-f] [-n N]`: a cell's log wherever it is, without the user naming a host.

Where, from one FS snapshot (heartbeats, claims, events, published results):
  running   a fresh heartbeat names the cell as its current one: the instance-local log
            `<ckpt_root of that host>/<name>.log`, tailed on that host (`-f`: followed until the
            log's `# ablate end` line, the queue moving on or stopping, or Ctrl-C);
  durable   `final_ckpts/<name>/<name>.log` on the shared FS (`-f` prints it and exits: it is done);
  instance  a cell that ran and has no durable copy (failed, interrupted): its instance-local log on
            the host that ran it (the claim's owner, else its last `start` event), when reachable;
  tail      else the last lines run_queue kept of a failed cell in `tails/<name>.log` on the FS.
An unknown name is bad input (exit 2, with the closest names); a roster cell that never ran is a
check that failed (exit 1) saying which queue has yet to reach it.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ablate.config.project import Project
from ablate.errors import AblateError, CheckFailed, RemoteError
from ablate.remote.layout import SweepLayout
from ablate.sweep.classify import warn
from ablate.sweep.snapshot import Heartbeat, SweepState, load
from ablate.transport import SharedFS, host_transport, shared_fs
from ablate.util.fmt import Log

Out = Callable[[bytes], None]
END_MARK = b"# ablate end "
HEARTBEAT_EVERY = 2.0  # seconds between heartbeat reads while following
END_GRACE = 1.0  # seconds to keep reading after the end line (a sync failure note follows it)


@dataclass(frozen=True)
class LogSource:
    cell: str
    where: str  # running | durable | instance | tail
    path: str
    host: str | None = None  # the host whose disk holds it; None: the shared FS
    queue: str | None = None

    def describe(self) -> str:
        what = {"running": f"running on {self.host} (queue {self.queue}); live log",
                "durable": "finished; durable copy on the shared FS",
                "instance": f"not running, no durable copy; instance log on {self.host}",
                "tail": "not running, no durable copy; last lines kept on the shared FS"}[self.where]
        return f"{self.cell}: {what}: {self.path}"


def locate(project: Project, cell: str, log: Log | None = None) -> LogSource:
    fs = shared_fs(project)
    state = load(project, fs)
    warn(log, state.warnings)
    return source_of(project, state, SweepLayout(fs.root), cell)


def source_of(project: Project, state: SweepState, layout: SweepLayout, cell: str) -> LogSource:
    """Where the cell's log is, in this state of the sweep."""
    snap = state.snap
    # The roster as the state has it: the local queue files and the FS copies this laptop lacks.
    roster = {ln.cell.name for q in state.queues.values() for ln in q.cells if ln.cell is not None}
    seen = {e.cell for evs in snap.events.values() for e in evs if e.cell is not None}
    known = roster | set(snap.results) | set(snap.claims) | seen
    if cell not in known:
        import difflib  # an error's hint only

        close = difflib.get_close_matches(cell, sorted(known), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `ablate status` lists the queues"
        raise AblateError(f"no cell named {cell!r} in this sweep's queues or on the shared FS{hint}")

    # A published result first: run_one publishes it before its queue's heartbeat moves on, so a
    # heartbeat still on the cell then is a finished run, and its durable log is the whole one.
    result = snap.results.get(cell)
    if result is not None and result.valid:
        return LogSource(cell, "durable", posixpath.join(layout.final_dir(cell), f"{cell}.log"))
    hb = state.running_cell(cell)  # a live queue (the one liveness rule) whose heartbeat is on it
    if hb is not None and hb.host is not None and hb.host in project.hosts:
        return LogSource(cell, "running", _instance_path(project, hb.host, cell), hb.host, hb.queue)
    if result is not None:
        return LogSource(cell, "durable", posixpath.join(layout.final_dir(cell), f"{cell}.log"))
    host, queue = _ran_on(state, cell)
    if host is None:
        raise CheckFailed(f"cell {cell} has not run yet: {_waiting(state, cell)}")
    return LogSource(cell, "instance", _instance_path(project, host, cell) if host in project.hosts
                     else "", host, queue)


def _instance_path(project: Project, host: str, cell: str) -> str:
    return posixpath.join(project.hosts[host].ckpt_root, f"{cell}.log")


def _ran_on(state: SweepState, cell: str) -> tuple[str | None, str | None]:
    """The host (and queue) that last ran the cell: its claim's owner, else its last start event."""
    claim = state.snap.claims.get(cell)
    if claim is not None and claim.host is not None:
        return claim.host, claim.queue
    starts = [e for _, _, e in state.cell_events(cell) if e.ev == "start"]
    last = max(starts, key=lambda e: e.t or 0.0, default=None)
    return (None, None) if last is None else (last.host, last.queue)


def _waiting(state: SweepState, cell: str) -> str:
    for q in state.queues.values():
        if any(ln.cell is not None and ln.cell.name == cell for ln in q.cells):
            view = state.queue(q.name)
            if view.state == "not_launched":
                return f"its queue {q.name} is not launched (`ablate launch {q.name} --host H`)"
            return f"queue {q.name} on {view.host} ({view.state}) has not reached it yet"
    return "no queue has reached it"


# --------------------------------------------------------------------------- reading


def last_lines(data: bytes, n: int) -> bytes:
    if n <= 0:
        return b""
    lines = data.splitlines(keepends=True)
    return b"".join(lines[-n:])


def _tail_on(project: Project, host: str, path: str, n: int) -> bytes | None:
    """`tail -n N` of an instance-local file; None when the file is not there."""
    r = host_transport(project, project.hosts[host]).run(["tail", "-n", str(n), "--", path], timeout=60)
    if r.rc != 0:
        if "No such file" in r.stderr or "cannot open" in r.stderr:
            return None
        r.check()
    return r.stdout.encode()


def _fs_tail(project: Project, fs: SharedFS, path: str, n: int) -> bytes | None:
    """The last n lines of a shared-FS file, without copying a long log over SSH: `tail` runs on a
    host that mounts the FS (the first that answers); locally the file is read from its end."""
    if project.profile.transport == "local":
        return _local_tail(path, n)
    if project.sweep_store() is not None:  # an object store: read here (no host mounts it)
        data = fs.read_bytes(path)
        return None if data is None else last_lines(data, n)
    hosts = [h for h in project.hosts.values() if h.profile.name == project.profile.name
             and h.transport == "ssh"]
    last: Exception | None = None
    for h in hosts:
        try:
            return _tail_on(project, h.name, path, n)
        except RemoteError as e:  # unreachable: the next host that mounts the FS
            last = e
    if last is not None:
        raise last
    data = fs.read_bytes(path)
    return None if data is None else last_lines(data, n)


def _local_tail(path: str, n: int, block: int = 1 << 16) -> bytes | None:
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            end = f.tell()
            data = b""
            while end > 0 and data.count(b"\n") <= n:
                step = min(block, end)
                end -= step
                f.seek(end)
                data = f.read(step) + data
            return last_lines(data, n)
    except FileNotFoundError:
        return None


def read(project: Project, src: LogSource, n: int) -> tuple[LogSource, bytes]:
    """The last n lines of the log (an `instance` source falls back to `tail` when its host does
    not answer or the log is gone from it)."""
    fs = shared_fs(project)
    if src.where == "durable":
        data = _fs_tail(project, fs, src.path, n)
        if data is None:
            raise CheckFailed(f"{src.cell}: the durable copy has no log {src.path}; "
                              "run `ablate reconcile --fs`")
        return src, data
    if src.where == "running":
        data = _tail_on(project, str(src.host), src.path, n)
        return src, data or b""
    why = "it ran on a host ablate.yaml no longer has"
    if src.host is not None and src.host in project.hosts:
        try:
            data = _tail_on(project, src.host, src.path, n)
        except RemoteError as e:
            data, why = None, f"{src.host} does not answer ({e.message})"
        else:
            why = f"the log is gone from {src.host}"
        if data is not None:
            return src, data
    tail_path = SweepLayout(fs.root).tail(src.cell)
    data = _fs_tail(project, fs, tail_path, n)
    if data is None:
        raise CheckFailed(f"{src.cell}: ran on {src.host} (queue {src.queue}) but its log cannot be "
                          f"read: {why}, and the shared FS has no tails/{src.cell}.log")
    return LogSource(src.cell, "tail", tail_path, src.host, src.queue), data


def follow(project: Project, src: LogSource, n: int, out: Out) -> str:
    """Stream a running cell's log until it ends, its queue moves on or stops; how it ended."""
    assert src.where == "running" and src.host and src.queue
    fs = shared_fs(project)
    hb_path = SweepLayout(fs.root).heartbeat(src.host, src.queue)
    state: dict[str, Any] = {"ended": None, "gone": None, "asked": 0.0, "partial": b"", "why": ""}

    def on_out(data: bytes) -> None:
        out(data)
        lines = (state["partial"] + data).split(b"\n")
        state["partial"] = lines.pop()
        for line in lines:
            if line.startswith(END_MARK):
                state["ended"] = time.monotonic()
                state["why"] = f"the cell ended ({line.decode(errors='replace').split()[-1]})"
            elif line.startswith(b"# ablate ") and not line.startswith(b"# ablate cmd:") \
                    and not line.startswith(b"# ablate sync"):
                state["ended"] = None  # a later attempt (resume) started after that end line

    def stop() -> bool:
        t = time.monotonic()
        if state["ended"] is not None:  # the log said so: no need to ask the heartbeat
            return bool(t - state["ended"] >= END_GRACE)
        if state["gone"] is not None:
            return bool(t - state["gone"] >= END_GRACE + 1.0)  # the end line had its chance
        if t - state["asked"] >= HEARTBEAT_EVERY:
            state["asked"] = t
            hb = Heartbeat.from_bytes(posixpath.basename(hb_path), fs.read_bytes(hb_path))
            if hb is None or hb.cell != src.cell or hb.state != "running":
                state["gone"] = t
                state["why"] = (f"queue {src.queue} is {(hb.state if hb else '') or 'gone'}"
                                if hb is None or hb.state != "running" else
                                f"queue {src.queue} moved on to {hb.cell}")
        return False

    ht = host_transport(project, project.hosts[src.host])
    rc = ht.stream(["tail", "-n", str(n), "-F", "--", src.path], on_out, stop=stop, poll=0.25)
    if rc is not None:
        return f"tail on {src.host} exited {rc}"
    return str(state["why"])


@dataclass(frozen=True)
class LogsResult:
    source: LogSource
    ended: str | None  # -f on a running cell: how following ended

    def to_json(self) -> dict[str, Any]:
        s = self.source
        return {"cell": s.cell, "where": s.where, "host": s.host, "queue": s.queue, "path": s.path,
                "ended": self.ended}


def logs(project: Project, cell: str, *, lines: int = 50, follow_: bool = False, out: Out,
         log: Log | None = None) -> LogsResult:
    """Print the cell's log through `out` (bytes, as written); say where it is through `log`."""
    say = log or (lambda _m: None)
    src = locate(project, cell, log)
    if follow_ and src.where == "running":
        say(src.describe())
        why = follow(project, src, lines, out)
        say(f"{cell}: {why}")
        return LogsResult(src, why)
    src, data = read(project, src, lines)
    say(src.describe())
    out(data)
    return LogsResult(src, None)
