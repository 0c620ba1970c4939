"""`ablate stop QUEUE --host H [--after-current]`: end a queue's whole process group now, or let
its current cell finish first (`control/<host>.<queue>.stop`, honoured by run_queue before each next
line). The cut cell keeps its claim and is classified `interrupted`, never counted done.
"""

from __future__ import annotations

import json
import math
import posixpath
import time
from dataclasses import dataclass
from typing import Any

from ablate.config.project import Host, Project
from ablate.remote.layout import SweepLayout, session_name
from ablate.sweep.cells import check_queue_name
from ablate.sweep.lock import controller_lock, whoami
from ablate.sweep.snapshot import Heartbeat
from ablate.transport import HostTransport, SharedFS, host_transport, shared_fs

KILL_WAIT = 5.0  # seconds a KILLed group may take to be gone


@dataclass(frozen=True)
class StopResult:
    queue: str
    host: str
    session: str
    was_live: bool
    pgid: int | None
    signal: str | None  # TERM, KILL, or None when no process group was signalled
    after_current: bool = False  # --after-current: a request was left for run_queue, nothing killed
    cell: str | None = None  # with after_current: the cell that is let finish (None between cells)
    request: str | None = None  # with after_current: the control file written
    via: str = "tmux"  # what runs the queue: "tmux" (a session) or "Slurm job" (scancel'd)

    def to_json(self) -> dict[str, Any]:
        return {"queue": self.queue, "host": self.host, "session": self.session, "was_live": self.was_live,
                "pgid": self.pgid, "signal": self.signal, "after_current": self.after_current,
                "cell": self.cell, "request": self.request}

    def lines(self) -> list[str]:
        if not self.was_live:
            return [f"{self.queue} is not running on {self.host} (no {self.via} {self.session}); "
                    "nothing to stop"]
        if self.after_current:
            when = f"after its current cell {self.cell}" if self.cell else "before its next cell"
            return [f"{self.queue} on {self.host} will stop {when}; it starts nothing more "
                    f"(`ablate launch {self.queue} --host {self.host}` clears the request)"]
        group = f"process group {self.pgid} ({self.signal})" if self.pgid else "no recorded process group"
        if self.via != "tmux":
            return [f"stopped {self.queue} on {self.host}: {self.via} {self.session} cancelled (scancel)"]
        return [f"stopped {self.queue} on {self.host}: {group}, tmux {self.session} killed"]



# DIR FILE JSON PGID: the reason written (tmp + rename), then the group's TERM, in one command.
_NOTE_THEN_TERM = ('mkdir -p -- "$1" 2>/dev/null; printf "%s\\n" "$3" >"$2.tmp" 2>/dev/null '
                   '&& mv -f -- "$2.tmp" "$2" 2>/dev/null; kill -TERM -"$4"')


def stop_note(h: Host, queue: str, reason: str, grace: float) -> tuple[str, str, str, str]:
    """The command (and its arguments but the group) that writes run_queue's ABLATE_STOP_FILE for
    the running cell, then sends the group its TERM."""
    folder = posixpath.join(h.ckpt_root, ".ablate-stop")
    record = json.dumps({"reason": reason, "t": round(time.time(), 6), "kill_after": math.ceil(grace)})
    return _NOTE_THEN_TERM, folder, posixpath.join(folder, f"{h.name}.{queue}"), record


def _via(h: Host) -> str:
    return "Slurm job" if h.transport == "slurm" else "tmux"


# `kill -SIG -PGID` in a shell: the one form every shell's builtin kill and procps' kill take (dash,
# which the host agent runs commands with, refuses `--`; procps' kill without it takes -PGID for a
# signal number). PGID is a number the caller checked.
_KILL_GROUP = 'kill -"$1" -"$2"'


def _signal_group(ht: HostTransport, sig: str, pgid: int) -> int:
    return ht.run(["sh", "-c", _KILL_GROUP, "sh", sig, str(pgid)]).rc


def _group_alive(ht: HostTransport, pgid: int) -> bool:
    return _signal_group(ht, "0", pgid) == 0


def _recorded_group(ht: HostTransport, hb: Heartbeat) -> int | None:
    """The heartbeat's process group, if its pid is still a run_queue leading that group: a pgid
    recycled since must never be signalled."""
    pid, pgid = hb.pid, hb.pgid
    if pid is None or pgid is None or pgid <= 1:
        return None
    r = ht.run(["ps", "-ww", "-o", "pgid=", "-o", "args=", "-p", str(pid)])  # -ww: never truncate
    parts = r.stdout.split(None, 1)
    if r.rc != 0 or len(parts) < 2 or parts[0] != str(pgid) or "run_queue" not in parts[1]:
        return None
    return pgid


def _service_groups(ht: HostTransport, hb: Heartbeat | None) -> list[int]:
    """The process groups of the queue's services (each leads its own: pid = pgid) that are still
    the services run_queue started (`ablate-service` in their command line)."""
    out = []
    for _, svc in hb.services if hb is not None else ():
        pid = svc.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1:
            continue
        r = ht.run(["ps", "-ww", "-o", "pgid=", "-o", "args=", "-p", str(pid)])
        parts = r.stdout.split(None, 1)
        if r.rc == 0 and len(parts) == 2 and parts[0] == str(pid) and "ablate-service" in parts[1]:
            out.append(pid)
    return out


def _heartbeat_stopped(fs: SharedFS, path: str) -> None:
    """The group is gone; its heartbeat says `stopped` as run_queue's own last beat does. That beat
    is written in run_queue's TERM trap once its cell has ended, and a cell that takes the whole
    stop_grace (a trainer saving, its last resume copy) meets the KILL first: the file would go on
    saying `running` (with a cell) for a queue that no longer exists."""
    try:
        d = json.loads(fs.read_bytes(path) or b"")
    except ValueError:
        return
    if not isinstance(d, dict) or d.get("state") == "stopped":
        return
    d.update(t=round(time.time(), 6), state="stopped", cell_started=None, log_mtime=None, log_size=None)
    services = d.get("services")
    for svc in services.values() if isinstance(services, dict) else ():
        if isinstance(svc, dict):
            svc["state"] = "stopped"
    fs.write_atomic(path, (json.dumps(d) + "\n").encode())


def stop(project: Project, queue: str, host: str, after_current: bool = False) -> StopResult:
    """Kill the queue's process group now, or (`after_current`) ask run_queue to end once its
    current cell is done: `control/<host>.<queue>.stop`, which it checks before each next line."""
    project.host(host)
    check_queue_name(queue)
    op = f"stop {queue} --host {host}" + (" --after-current" if after_current else "")
    with controller_lock(project, op):
        return _stop_after_current(project, queue, host) if after_current else _stop(project, queue, host)


def _stop_after_current(project: Project, queue: str, host: str) -> StopResult:
    ht = host_transport(project, project.host(host))
    fs = shared_fs(project)
    layout = SweepLayout(fs.root)
    session = session_name(project.sweep, host, queue)
    if session not in ht.tmux_sessions():
        return StopResult(queue, host, session, False, None, None, True)
    path = layout.stop_request(host, queue)
    fs.write_atomic(path, (json.dumps({"t": time.time(), "by": whoami()}) + "\n").encode())
    hb = Heartbeat.from_bytes(f"{host}.{queue}", fs.read_bytes(layout.heartbeat(host, queue)))
    cell = hb.cell if hb is not None and hb.state == "running" and hb.cell_started is not None else None
    return StopResult(queue, host, session, True, None, None, True, cell, path)


def _stop(project: Project, queue: str, host: str) -> StopResult:
    h = project.host(host)
    ht = host_transport(project, h)
    fs = shared_fs(project)
    layout = SweepLayout(fs.root)
    session = session_name(project.sweep, host, queue)
    live = session in ht.tmux_sessions()
    if not live:
        return StopResult(queue, host, session, False, None, None, via=_via(h))
    hb = Heartbeat.from_bytes(f"{host}.{queue}", fs.read_bytes(layout.heartbeat(host, queue)))
    # On Slurm the job's processes are on a compute node: scancel (tmux_kill) ends them all.
    ours = h.transport != "slurm"
    pgid = _recorded_group(ht, hb) if hb is not None and ours else None
    services = _service_groups(ht, hb) if ours else []
    signal: str | None = None
    gone = False  # the group signalled is gone: its heartbeat may be written here
    if pgid is not None:
        # Never `pkill -f`: the pattern could match this very SSH session. The group is exact.
        # The running cell is told why before its TERM (ABLATE_STOP_FILE, run_queue's path), and
        # has stop_grace to save and exit before the KILL.
        grace = project.monitor.stop_grace
        note = stop_note(h, queue, "stop", grace) if hb is not None and hb.state == "running" else None
        for sig, wait in (("TERM", grace), ("KILL", KILL_WAIT)):
            if sig == "TERM" and note is not None:
                ht.run(["sh", "-c", note[0], "sh", *note[1:], str(pgid)])
            else:
                _signal_group(ht, sig, pgid)
            signal = sig
            deadline = time.monotonic() + wait
            while not (gone := not _group_alive(ht, pgid)) and time.monotonic() < deadline:
                time.sleep(0.05)
            if gone:  # the wait's last look (after its last sleep) said so: not asked twice
                break
    # run_queue stops its services itself (TERM, grace, KILL); one it could not finish is killed here.
    for g in services:
        if _group_alive(ht, g):
            _signal_group(ht, "KILL", g)
    ht.tmux_kill(session)
    if gone:
        _heartbeat_stopped(fs, layout.heartbeat(host, queue))
    # run_queue, the events file's writer, is gone now: this line cannot interleave with it.
    fs.append_line(layout.events_file(host, queue), json.dumps(
        {"t": time.time(), "ev": "stopped", "host": host, "queue": queue, "pgid": pgid, "signal": signal,
         "by": "ablate stop"}))
    return StopResult(queue, host, session, True, pgid, signal, via=_via(h))
