"""Autostop's decision: may this instance stop itself now? Stdlib only (it runs on the instance,
in the runner's zipapp, with the controller absent: ablate/remote/host/autostop_watch.py).

An instance stops itself only when all of these hold, checked in this order (the first that does
not hold is what it waits for, and what `status` says):

1. autostop is on for it and was not cancelled;
2. none of its queues runs (`running cells: q1 q2`): a queue runs its own lines and, drained, takes
   what a steal gives it; once it has ended, nothing on this instance takes any more work (only a
   launch, an `append` or `remediate --launch` puts a queue there again, and resets the idle time);
3. every result it published is durable and verified in place, the way `reconcile --fs` checks
   (never a pickle executed): while one is not, its own disk may hold the only good copy
   (`unverified result: c4 (hash mismatch)`);
4. it is not one of the `keep` instances kept up while cells of the sweep wait for `ablate
   remediate`: claimed with no result by a queue that no longer runs (failed, lost), or not claimed
   by anyone while no queue that lists them runs (a queue stopped, or its instance gone); who stays
   is decided once, on the sweep's storage, so that two instances never each count on the other
   (`kept for remediation`);
5. no other sweep's queue runs on the instance (`other_sweeps`: two sweeps on one box);
6. its idle time has passed since its last useful work (`stops in 6 min`); then `stop`.

Lines a live queue elsewhere has yet to reach keep no other instance up: that queue runs them.

`elect` picks the instances kept for remediation: the fastest by learned speed, ties by name.
`gather_fs` reads what an instance sees of the sweep on the shared FS: the launched queues and their
hosts (ledgers), their lines, claims and published results, the queues' heartbeats (one of its own
runs when its process is alive on this machine) and its last useful work (its events, a launch or
an append rewrite its queues' files); `unverified_of` checks the results it published, as
`reconcile --fs` does, once per manifest.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Settings:
    """`autostop: {idle, command, keep}` of one host (the profile's, else ablate.yaml's; parsed by
    ablate/config/settings.py, which calls it `Autostop`). None: off."""

    idle: float  # seconds since the instance's last useful work
    command: str  # run on the instance through `sh -c`: $VARs and $(...) are the shell's
    keep: int = 1  # instances kept up while cells of the sweep wait for remediate


@dataclass(frozen=True)
class Facts:
    """What the instance sees of the sweep at one check."""

    now: float
    host: str
    running: Sequence[str] = ()  # its queues that run
    unverified: Mapping[str, str] = field(default_factory=dict)  # cell -> why its result is not verified
    waiting: Sequence[str] = ()  # cells of the sweep that wait for remediate (4. of the docstring)
    keepers: Sequence[str] | None = None  # the instances kept for remediation, once elected
    last_work: float = 0.0  # when it last did useful work (a cell's end or sync, a launch, an append)
    cancelled: bool = False  # `ablate autostop --cancel`
    others: Sequence[str] = ()  # other sweeps whose queues run on this instance (their roots)


@dataclass(frozen=True)
class Verdict:
    kind: str  # off | running | unverified | kept | idle | stop
    why: str  # one line, as status shows it
    stop_at: float | None = None  # idle: when it stops if nothing changes

    @property
    def stop(self) -> bool:
        return self.kind == "stop"


def _names(xs: Sequence[str], most: int = 3) -> str:
    shown = " ".join(sorted(xs)[:most])
    return shown + (f" (+{len(xs) - most} more)" if len(xs) > most else "")


def _minutes(secs: float) -> str:
    return f"{math.ceil(secs / 60)} min" if secs >= 60 else f"{math.ceil(secs)} s"


def decide(s: Settings | None, f: Facts) -> Verdict:
    """The verdict of one check (the module's docstring)."""
    if s is None or f.cancelled:
        return Verdict("off", "autostop cancelled" if s is not None else "autostop is off")
    if f.running:
        return Verdict("running", f"running cells: {_names(f.running)}")
    bad = dict(f.unverified)
    if bad:
        name = sorted(bad)[0]
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        return Verdict("unverified", f"unverified result: {name} ({bad[name]}){more}: its disk may hold the "
                                     "only good copy")
    if f.waiting and (f.keepers is None or f.host in f.keepers):
        who = "who stays for remediation is not decided yet" if f.keepers is None else "kept for remediation"
        return Verdict("kept", f"{who}: {len(f.waiting)} cell(s) wait for `ablate remediate` "
                               f"({_names(f.waiting)})")
    if f.others:  # the instance is not this sweep's alone: never stopped under another's queue
        return Verdict("running", f"another sweep's queue runs on this instance ({_names(f.others, 2)})")
    stop_at = f.last_work + s.idle
    if f.now < stop_at:
        return Verdict("idle", f"stops in {_minutes(stop_at - f.now)}", stop_at)
    return Verdict("stop", f"idle since {_minutes(f.now - f.last_work)} ago: stopping", stop_at)


def other_sweeps(root: str, proc: str = "/proc") -> list[str]:
    """The sweep roots of run_queue processes on this instance other than `root`'s (their command
    line: `bash <root>/wrappers/run_queue.<sha12>.sh SPEC QUEUE START`). This instance's processes
    are those in this process's network namespace: a container's all share it, and on the test bed,
    where the instances share one PID namespace, each has its own."""
    mine = os.path.realpath(root)
    out = set()
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
        here = os.readlink(os.path.join(proc, "self", "ns", "net"))
    except OSError:
        return []
    for pid in pids:
        try:  # this instance's processes: its network namespace (a container's, a box's)
            if os.readlink(os.path.join(proc, pid, "ns", "net")) != here:
                continue
            with open(os.path.join(proc, pid, "cmdline"), "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        script = next((a.decode("utf-8", "replace") for a in argv[:3]
                       if b"/wrappers/run_queue." in a and a.endswith(b".sh")), None)
        if script is not None and os.path.realpath(os.path.dirname(os.path.dirname(script))) != mine:
            out.add(os.path.dirname(os.path.dirname(script)))
    return sorted(out)


def elect(speeds: Mapping[str, float], keep: int) -> tuple[str, ...]:
    """The `keep` instances kept up for remediation: the fastest by learned speed (a host with no
    figure counts as 1.0), ties by name."""
    order = sorted(speeds, key=lambda h: (-speeds[h], h))
    return tuple(order[:max(0, keep)])


def elect_once(path: str, speeds: Mapping[str, float], keep: int, host: str, now: float) -> tuple[str, ...]:
    """The election, decided once on the sweep's shared FS: the first instance to need it writes
    `path` (a temp file hard-linked into place: exclusive, on NFS and sshfs too); every instance
    then reads the same answer. A record that cannot be parsed counts as no keeper elected: every
    instance stays up (never a stranded sweep)."""
    try:
        with open(path, encoding="utf-8") as f:
            return _keepers(f.read(), speeds)
    except FileNotFoundError:
        pass
    chosen = elect(speeds, keep)
    tmp = f"{path}.{host}.{os.getpid()}.tmp"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"hosts": list(chosen), "keep": keep, "by": host, "t": now}) + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another instance decided first: its answer stands
    finally:
        os.unlink(tmp)
    with open(path, encoding="utf-8") as f:
        return _keepers(f.read(), speeds)


def _keepers(text: str, speeds: Mapping[str, float]) -> tuple[str, ...]:
    try:
        rec = json.loads(text)
        hosts = rec["hosts"] if isinstance(rec, dict) else None
    except (ValueError, KeyError):
        hosts = None
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        return tuple(speeds)  # unreadable: everyone is kept
    return tuple(hosts)


# ---------------------------------------------------------------- what an instance sees (shared FS)

STARTING = 600.0  # seconds a launched queue with no heartbeat yet counts as starting (then: failed)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:  # an open asks a network FS's server
            return f.read()
    except OSError:
        return None


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def queues_of(root: str) -> dict[str, str]:
    """Every launched queue of the sweep and its host, by the last launch in its ledger (Unsure
    when they cannot be listed)."""
    qdir = os.path.join(root, "queues")
    try:
        names = sorted(n[:-len(".ledger")] for n in os.listdir(qdir) if n.endswith(".ledger"))
    except OSError as err:
        raise Unsure(f"cannot list the sweep's queues: {err}") from None
    out = {}
    for q in names:
        host = None
        for line in (_read(os.path.join(qdir, f"{q}.ledger")) or "").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict) and e.get("op", "launch") == "launch" and isinstance(e.get("host"), str):
                host = e["host"]
        if host is not None:
            out[q] = host
    return out


def cells_of(text: str, tasks: Mapping[str, int]) -> list[str]:
    """The cells of a queue file's lines (blank, comment and invalid lines are none)."""
    from ablate.remote.queue import grammar

    out = []
    for i, line in enumerate(grammar.split_lines(text)):
        try:
            p = grammar.parse(line, tasks, f"line {i}")
        except grammar.LineError:
            continue
        if p is not None:
            out.append(p.name)
    return out


class Unsure(Exception):
    """The sweep could not be read: nothing is decided on what was not seen (never a stop)."""


def gather_fs(root: str, host: str, now: float, *, tasks: Mapping[str, int],
              unverified: Mapping[str, str] | None = None, keepers: Sequence[str] | None = None,
              cancelled: bool = False, fresh: float = 30.0) -> Facts:
    """What this instance sees of the sweep on the shared FS at `now` (the FS's clock: `now` and
    the files' mtimes come from the same server). A queue of its own runs when its heartbeat says
    running and its process is alive here (the same machine); another host's, when its heartbeat
    says running and beat within `fresh` seconds; any queue launched and not started yet, for
    `STARTING` seconds. `unverified`: its published results not verified in place (the caller's
    verification, cached by manifest); `keepers`: the election's answer, once made. Unsure when
    the sweep's queues cannot be listed."""
    queues = queues_of(root)
    exists = os.path.exists
    running: list[str] = []
    waiting: set[str] = set()
    unclaimed_live: set[str] = set()  # listed by a queue that runs: it takes them
    unclaimed_dead: set[str] = set()  # listed only by queues that do not run
    last = 0.0
    for q, h in sorted(queues.items()):
        cells = cells_of(_read(os.path.join(root, "queues", f"{q}.txt")) or "", tasks)
        hb_path = os.path.join(root, "heartbeats", f"{h}.{q}")
        try:
            hb = json.loads(_read(hb_path) or "null")
        except ValueError:
            hb = None
        ledger = os.path.join(root, "queues", f"{q}.ledger")
        starting = hb is None and now - _mtime(ledger) < STARTING  # launched, not started yet
        if h == host:
            alive = starting or (isinstance(hb, dict) and hb.get("state") == "running"
                                 and _pid_alive(hb.get("pid")))
            if alive:
                running.append(q)
            last = max(last, _mtime(os.path.join(root, "events", f"{h}.{q}.jsonl")),
                       _mtime(os.path.join(root, "queues", f"{q}.txt")),
                       _mtime(ledger))
        else:
            alive = starting or _running(root, h, q, now, fresh)
        for c in cells:
            if exists(os.path.join(root, "final_ckpts", c, "MANIFEST.json")):
                continue
            if not exists(os.path.join(root, "claims", c)):
                (unclaimed_live if alive else unclaimed_dead).add(c)
            else:
                owner = (_read(os.path.join(root, "claims", c, "owner")) or "").split()
                oq = owner[1] if len(owner) >= 2 else None
                if oq is None or not _running(root, owner[0], oq, now, fresh):
                    waiting.add(c)
    waiting |= unclaimed_dead - unclaimed_live
    return Facts(now=now, host=host, running=running, unverified=dict(unverified or {}),
                 waiting=sorted(waiting), keepers=keepers, last_work=last, cancelled=cancelled)


def _running(root: str, host: str, queue: str, now: float, fresh: float) -> bool:
    """A queue's heartbeat says running and beat within `fresh` (on another instance its process
    cannot be checked here)."""
    path = os.path.join(root, "heartbeats", f"{host}.{queue}")
    try:
        hb = json.loads(_read(path) or "null")
    except ValueError:
        return False
    return isinstance(hb, dict) and hb.get("state") == "running" and now - _mtime(path) < fresh


def unverified_of(root: str, host: str, artifacts: dict[str, object], cache: dict[str, str | None],
                  load: bool = True) -> dict[str, str]:
    """Its published results that are not verified in place, cell -> why: each result whose
    MANIFEST.json names this host, checked as `reconcile --fs` checks it (ablate/remote/checkpoints/
    verify.py: sizes, sha256 against the manifest, each file loaded or checked by its structure,
    never a pickle executed). `cache` (manifest sha256s of the results verified) keeps a verified
    result from being read again while its manifest is the same; one that failed is checked again
    at each call."""
    import hashlib

    from ablate.remote.checkpoints import verify

    out = {}
    final = os.path.join(root, "final_ckpts")
    try:
        names = sorted(n for n in os.listdir(final) if not n.startswith("."))
    except OSError:
        return {}
    for name in names:
        try:
            with open(os.path.join(final, name, "MANIFEST.json"), "rb") as f:
                data = f.read()
        except OSError:
            continue
        try:
            manifest = json.loads(data)
        except ValueError:
            manifest = None
        if not isinstance(manifest, dict) or manifest.get("host") != host:
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest in cache:
            continue
        problems = verify.verify_cell_dir(os.path.join(final, name), dict(artifacts), load=load)
        if problems:  # checked again next time: a result mended in place (or set aside) counts then
            out[name] = "; ".join(f"{p['file'] or name}: {p['error']}" for p in problems[:3])
        else:
            cache[digest] = None
    return out
