"""How long another host's write stays invisible through the shared FS: measured by `ablate doctor`.

A network FS caches on each client (sshfs's directory and attribute caches, ~20 s by default; NFS's
`actimeo` / `lookupcache`; FUSE's `attr_timeout` / `entry_timeout`): a file host A creates, or a line
it appends, may be invisible through host B for a while. Other code waits that long before it
trusts a host's view that something is absent, so doctor measures it, for every ordered pair of
hosts (writer A, reader B) and both kinds of write:

- **new file**: A writes a temp file and renames it into place (as our atomic writers do) in a
  directory B has already listed, under a name B has already looked up; B sees it when both a
  lookup and a listing of the directory show it;
- **append**: A appends a line to a file B has already stat'ed and read (its old size and content
  possibly cached on B); B sees it when both a stat of the path and a read show the line (sshfs
  keeps a path's attributes 20 s, while an open file's size refreshes after FUSE's 1 s).

Each writer writes in a directory of its own, which no reader writes to: a client's own write into
a directory refreshes its cache of that directory, which would hide the lag.

All pairs at once, so doctor waits about the largest lag, not the sum: per host one command prepares
its files; per reader one streamed command (`HostTransport.stream`) first reads every writer's
files (priming its caches), says `ready`, then polls them every `POLL` s and prints a line the
moment it sees each write; then per writer one command writes. No host's clock is trusted: a value
is the arrival of the reader's line minus the return of the writer's command, both on the
controller's monotonic clock, clipped at 0. The write happened before that return and after the
command was sent, and the line left the reader at most one turn of its loop (POLL plus its looks)
after the write became visible, so the true lag lies within [value - one turn - the reader's
delivery delay, value + the writer's round trip]: `resolution` (POLL + the slowest writer's round
trip) bounds both sides on a responsive FS.

A pair that does not see a write within the cap (`CAP`, env `ABLATE_FS_LAG_CAP`) is "> cap": the FS
is not shared between the two, or its lag is longer. The cap bounds only what the FS does: a reader
says `started` before it primes, and the wait for `ready` counts from the last reader's start; a
command's own start (a connection, a login shell, a busy machine) has `START` beside it.

Hosts with `transport: local` are this machine and its own directory: lag 0 between them, not
measured. The scratch files live under `<sweep root>/gate/.lag-<token>/` and are removed afterwards
(best effort, logged). The result is written atomically to `gate/fslag.json`
(`SweepLayout.fs_lag`); its `lag` is what readers use.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import posixpath
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ablate.config.project import Project
from ablate.errors import AblateError
from ablate.remote.layout import SweepLayout
from ablate.remote.queue.defaults import CLAIM_WAIT
from ablate.sweep.lock import whoami
from ablate.transport import HostTransport, SharedFS, fan_out, host_transport
from ablate.util.fmt import Log

# Seconds a reader waits for a write before the pair is "> cap" (env ABLATE_FS_LAG_CAP): above the
# longest cache a default mount keeps (NFS `acdirmax` / `acregmax` 60 s, sshfs or FUSE set to 60 s),
# with margin. Only a lagging pair waits it: a reader reports each write the moment it sees it.
CAP = float(CLAIM_WAIT)  # run_queue's wait for a claim's owner covers the same lag
CAP_ENV = "ABLATE_FS_LAG_CAP"
NEAR = 0.75  # a lag above this share of the cap warns: a slower moment would fail doctor
POLL = 0.05  # seconds between a reader's looks
LONG = 5.0  # a lag above this is worth a warning
START = 60.0  # seconds a command may take to start on a host (over SSH, on a busy machine), beside the cap
MOUNT_OPTIONS = ("sshfs `-o dcache_timeout=N` or `-o dir_cache=no` (sshfs 2.x: `-o cache_timeout=N`), "
                 "NFS `actimeo=N`, `lookupcache=positive` or `noac`, FUSE `attr_timeout=N,entry_timeout=N`")

# Each writer's files, by its index i among the hosts measured, in a directory of its own (a host's
# own write into a directory refreshes its cache of that directory: the readers must not write into
# the one they watch): `<i>/app` (prepared empty; the write appends the line "1") and `<i>/new`
# (created by the write, through `<i>/.new.tmp`).
_PREP = 'w=$1/$2\nmkdir -p -- "$w" && : >"$w/.app.tmp" && mv -f -- "$w/.app.tmp" "$w/app"\n'
_WRITE = ('w=$1/$2\nprintf "%s\\n" "$2" >"$w/.new.tmp" && mv -f -- "$w/.new.tmp" "$w/new" && '
          'printf "1\\n" >>"$w/app"\n')
# READER DIR POLL ITERATIONS WRITER_INDEX...: builtins only in the loop (a glob lists a directory,
# `[ -e ]` / `[ -s ]` stat a path, `read` opens and reads a file), one `sleep` per turn. `started`
# first (the cap for `ready` counts from it, not from the command's start over SSH); `ready i`
# once it has stat'ed and read <i>/app empty, and looked <i>/new up and listed <i>/ without it;
# then `new i` once both a lookup and a listing show <i>/new, `app i` once both a stat (size, by
# path: sshfs caches it apart from an open file's) and a read show the appended line.
_READER = r'''d=$1 poll=$2 left=$3
shift 3
prime=$* new= app=
printf 'started\n'
listed() {
  names=' '
  for f in "$d/$1"/*; do names="$names${f##*/} "; done
  case $names in *" new "*) return 0 ;; esac
  return 1
}
while [ -n "$prime$new$app" ] && [ "$left" -gt 0 ]; do
  left=$((left - 1))
  rest=
  for i in $new; do
    if [ -e "$d/$i/new" ] && listed "$i"; then printf 'new %s\n' "$i"; else rest="$rest $i"; fi
  done
  new=$rest rest=
  for i in $app; do
    l=
    [ -s "$d/$i/app" ] && { IFS= read -r l; } 2>/dev/null <"$d/$i/app"
    if [ "$l" = 1 ]; then printf 'app %s\n' "$i"; else rest="$rest $i"; fi
  done
  app=$rest rest=
  for i in $prime; do
    l=x
    [ -e "$d/$i/app" ] && [ ! -s "$d/$i/app" ] && { IFS= read -r l || :; } 2>/dev/null <"$d/$i/app"
    if [ -z "$l" ] && [ ! -e "$d/$i/new" ] && ! listed "$i"; then
      printf 'ready %s\n' "$i"
      new="$new $i" app="$app $i"
    else
      rest="$rest $i"
    fi
  done
  prime=$rest
  [ -n "$prime$new$app" ] && { sleep "$poll" 2>/dev/null || sleep 1; }
done
exit 0
'''
# AWAIT PATH WANT POLL ITERATIONS: exit 0 once the file's first line is WANT, 1 when it never was.
_AWAIT = r'''p=$1 want=$2 poll=$3 left=$4
while [ "$left" -gt 0 ]; do
  l=
  { IFS= read -r l || :; } 2>/dev/null <"$p"
  [ "$l" = "$want" ] && exit 0
  left=$((left - 1))
  sleep "$poll" 2>/dev/null || sleep 1
done
exit 1
'''


def cap_seconds() -> float:
    """The cap: env ABLATE_FS_LAG_CAP when it is a positive number, else `CAP`."""
    try:
        v = float(os.environ.get(CAP_ENV, ""))
    except ValueError:
        return CAP
    return v if math.isfinite(v) and v > 0 else CAP


def raise_cap(cap: float) -> str:
    """What raises the cap, pasteable."""
    return (f"wait longer: `{CAP_ENV}={max(300, math.ceil(2 * cap))} ablate doctor` (seconds; "
            f"the default is {CAP:.0f})")


def _turns(seconds: float) -> str:
    return str(math.ceil(seconds / POLL) + 10)


def _why(e: object) -> str:
    return e.message if isinstance(e, AblateError) else f"{type(e).__name__}: {e}"


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


@dataclass(frozen=True)
class Pair:
    writer: str
    reader: str
    new_file: float | None  # seconds; None: not seen within the cap (or not measured: `note`)
    append: float | None
    measured: bool = True  # False: both hosts are this machine (lag 0 by construction)
    note: str | None = None  # why a value is missing, or how a value was had without measuring

    @property
    def seen(self) -> bool:
        return self.new_file is not None and self.append is not None

    def to_json(self) -> dict[str, Any]:
        return {"writer": self.writer, "reader": self.reader, "new_file": self.new_file,
                "append": self.append, "measured": self.measured, "note": self.note}


@dataclass(frozen=True)
class LagResult:
    """The measurement, and what became of it (`recorded`: the record's path once written)."""

    hosts: tuple[str, ...]
    pairs: tuple[Pair, ...]
    cap: float
    resolution: float  # each measured value is within this many seconds of the true lag
    t: float  # controller epoch seconds
    by: str
    skipped: Mapping[str, str] = dataclasses.field(default_factory=dict)  # host -> why not measured
    recorded: str | None = None
    record_error: str | None = None

    @property
    def lag(self) -> float:
        """The largest value over every pair and both kinds; the cap when any pair was not seen."""
        if any(not p.seen for p in self.pairs):
            return self.cap
        return max((v for p in self.pairs for v in (p.new_file, p.append) if v is not None), default=0.0)

    @property
    def unseen(self) -> list[Pair]:
        return [p for p in self.pairs if not p.seen]

    @property
    def ok(self) -> bool:
        return not self.unseen and self.record_error is None

    @property
    def warning(self) -> str | None:
        if self.unseen or self.lag <= LONG:
            return None
        near = (f"; it is near the cap of {self.cap:.0f} s, so a slower moment would fail doctor: "
                f"{raise_cap(self.cap)}" if self.lag >= NEAR * self.cap else "")
        return (f"the shared FS shows one host's new file or appended line to another only after up to "
                f"{self.lag:.1f} s (client caches): every decision that something is absent (no end "
                f"event, no claim, no result yet) waits that long. Shorten it with the mount's options: "
                f"{MOUNT_OPTIONS}; then run `ablate doctor` again{near}")

    def record(self) -> dict[str, Any]:
        """The content of `gate/fslag.json`."""
        return {"t": self.t, "by": self.by, "hosts": list(self.hosts), "cap": self.cap,
                "pairs": [p.to_json() for p in self.pairs], "lag": self.lag,
                "resolution": self.resolution}

    def to_json(self) -> dict[str, Any]:
        """The record, and `ok`, `warning`, where it was recorded or why not, the hosts left out;
        `lag` is null when fewer than two hosts were measured (nothing recorded)."""
        rec = {**self.record(), "lag": self.lag if len(self.hosts) >= 2 else None}
        return {"ok": self.ok, **rec, "warning": self.warning, "recorded": self.recorded,
                "record_error": self.record_error, "skipped": dict(self.skipped)}

    def lines(self) -> list[str]:
        if len(self.hosts) < 2:
            why = "; ".join(f"{h}: {w}" for h, w in self.skipped.items()) or "one host checked"
            return [f"fs lag: not measured: it needs two hosts that share the FS ({why})"]
        measured = [p for p in self.pairs if p.measured]
        head = (f"fs lag: {'> ' if self.unseen else ''}{self.lag:.2f} s at most between "
                f"{len(self.hosts)} host(s)")
        if not measured:
            head += " (transport local: one directory on this machine, not measured)"
        else:
            head += f" (each value +- {self.resolution:.2f} s; cap {self.cap:.0f} s)"
        out = [head]
        if measured:
            wn = max(len(f"{p.writer} -> {p.reader}") for p in measured)
            out.append(f"  {'writer -> reader':<{wn}}  new file  append")
            for p in measured:
                out.append(f"  {p.writer + ' -> ' + p.reader:<{wn}}  {_secs(p.new_file):>8}  "
                           f"{_secs(p.append):>6}" + (f"  {p.note}" if p.note else ""))
        if measured and len(measured) < len(self.pairs):
            out.append("  pairs of local hosts: 0 s (this machine, one directory: not measured)")
        if self.skipped:
            out.append("  not measured: " + "; ".join(f"{h} ({w})" for h, w in self.skipped.items()))
        if self.unseen:
            p = self.unseen[0]
            out.append(f"fs lag FAIL: {len(self.unseen)} pair(s) never saw the write within {self.cap:.0f} s "
                       f"(first: {p.writer} -> {p.reader}: {p.note or 'not seen'}): the FS may not be shared "
                       f"between them, or its lag is longer; {self.cap:.0f} s recorded. If it is shared, "
                       f"shorten the lag with the mount's options ({MOUNT_OPTIONS}) or "
                       f"{raise_cap(self.cap)}")
        if self.record_error:
            out.append(f"fs lag FAIL: could not record the lag: {self.record_error}")
        elif self.recorded:
            out.append(f"  recorded in {self.recorded}")
        if self.warning:
            out.append(f"warning: {self.warning}")
        return out


# --------------------------------------------------------------------------- measuring


class _Watch:
    """What the readers print, stamped on arrival with the controller's monotonic clock."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        # (ready|new|app, reader, writer index) -> t; ("started", reader, -1): its command runs
        self.seen: dict[tuple[str, str, int], float] = {}
        self.ended: dict[str, str] = {}  # reader -> why its command ended ("" when it finished)
        self.stopped = False

    def feed(self, reader: str) -> Callable[[bytes], None]:
        buf = bytearray()

        def on(data: bytes) -> None:
            t = time.monotonic()
            buf.extend(data)
            *lines, rest = bytes(buf).split(b"\n")
            buf[:] = rest
            with self.cond:
                for line in lines:
                    parts = line.decode(errors="replace").split()
                    if parts == ["started"]:
                        self.seen.setdefault(("started", reader, -1), t)
                    elif len(parts) == 2 and parts[0] in ("ready", "new", "app") and parts[1].isdigit():
                        self.seen.setdefault((parts[0], reader, int(parts[1])), t)
                self.cond.notify_all()
        return on

    def end(self, reader: str, why: str) -> None:
        with self.cond:
            self.ended[reader] = why
            self.cond.notify_all()

    def wait(self, keys: Sequence[tuple[str, str, int]], deadline: float) -> None:
        """Until every key is seen or its reader has ended, or the deadline."""
        with self.cond:
            while any(k not in self.seen and k[1] not in self.ended for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.cond.wait(left)

    def get(self, key: tuple[str, str, int]) -> float | None:
        with self.cond:
            return self.seen.get(key)


def _read(t: HostTransport, reader: str, argv: Sequence[str], watch: _Watch) -> None:
    try:
        rc = t.stream(argv, watch.feed(reader), stop=lambda: watch.stopped, poll=POLL)
        watch.end(reader, "" if rc in (0, None) else f"its polling command exited {rc}")
    except Exception as e:  # reported with the pairs it leaves unmeasured, never raised
        watch.end(reader, f"its polling command failed: {_why(e)}")


def measure(project: Project, names: Sequence[str], *, cap: float | None = None,
            log: Log | None = None) -> LagResult:
    """Measure every ordered pair of `names` (hosts that reach the shared FS), as the module doc says."""
    cap = cap_seconds() if cap is None else cap
    hosts = {n: project.host(n) for n in dict.fromkeys(names)}
    local = {n for n, h in hosts.items() if h.transport == "local"}
    pairs = [(a, b) for a in hosts for b in hosts if a != b]
    todo = [(a, b) for a, b in pairs if not (a in local and b in local)]
    part = [n for n in hosts if any(n in p for p in todo)]
    token = secrets.token_hex(6)
    dirs = {n: posixpath.join(SweepLayout(project.sweep_root(hosts[n])).gate, f".lag-{token}") for n in part}
    got: dict[tuple[str, str], Pair] = {}
    resolution = 0.0
    if todo:
        if log:
            log(f"doctor: measuring the shared FS's visibility lag between {len(part)} host(s) "
                f"(up to {cap:.0f} s)")
        measured, resolution = measure_pairs({n: host_transport(project, hosts[n]) for n in part}, dirs,
                                             todo, cap, log)
        got = {(p.writer, p.reader): p for p in measured}
    out = [got.get((a, b)) or Pair(a, b, 0.0, 0.0, measured=False, note="same machine, one directory")
           for a, b in pairs]
    return LagResult(tuple(hosts), tuple(out), cap, resolution, time.time(), whoami())


def measure_pairs(ts: Mapping[str, HostTransport], dirs: Mapping[str, str], todo: Sequence[tuple[str, str]],
                  cap: float, log: Log | None = None) -> tuple[list[Pair], float]:
    """The ordered pairs `todo` of the hosts of `ts`, each host writing and reading under its own
    path `dirs[host]` of one scratch directory (removed afterwards): the pairs, and the resolution."""
    part = list(dict.fromkeys(n for p in todo for n in p))
    idx = {n: i for i, n in enumerate(part)}
    errors: dict[str, str] = {}
    try:
        pairs, rtt = _measure(ts, dirs, idx, todo, cap, errors)
    finally:
        _clean({n: ts[n] for n in part}, dirs, errors, log)
    return pairs, round(POLL + rtt, 3)


def _measure(ts: Mapping[str, HostTransport], dirs: Mapping[str, str], idx: Mapping[str, int],
             todo: Sequence[tuple[str, str]], cap: float, errors: dict[str, str],
             ) -> tuple[list[Pair], float]:
    """The pairs of `todo` (and `errors` per host); the slowest write's round trip."""
    part = list(idx)
    prep = fan_out(part, lambda n: ts[n].run(["sh", "-c", _PREP, "sh", dirs[n], str(idx[n])],
                                             timeout=cap + START).check())
    for n, e in prep.failed.items():
        errors[n] = f"could not write under {dirs[n]} on {n}: {_why(e)}"
    watch = _Watch()
    threads: list[threading.Thread] = []
    readers: list[str] = []
    for b in part:
        ws = [str(idx[a]) for a, r in todo if r == b and a not in errors]
        if ws:
            readers.append(b)
            argv = ["sh", "-c", _READER, "sh", dirs[b], str(POLL), _turns(3 * cap + START + 5), *ws]
            th = threading.Thread(target=_read, args=(ts[b], b, argv, watch), daemon=True)
            th.start()
            threads.append(th)
    sent: dict[str, float] = {}
    back: dict[str, float] = {}
    armed: list[tuple[str, str]] = []
    try:
        # The cap is the FS's: for `ready` it counts from the last reader's start (a command's start
        # over SSH on a busy machine is no lag), which may take up to START itself.
        watch.wait([("started", b, -1) for b in readers], time.monotonic() + cap + START)
        began = [t for b in readers if (t := watch.get(("started", b, -1))) is not None]
        watch.wait([("ready", b, idx[a]) for a, b in todo if a not in errors],
                   max(began, default=time.monotonic()) + cap)
        armed = [(a, b) for a, b in todo if a not in errors and watch.get(("ready", b, idx[a])) is not None]

        def write(a: str) -> None:
            sent[a] = time.monotonic()
            ts[a].run(["sh", "-c", _WRITE, "sh", dirs[a], str(idx[a])], timeout=cap + START).check()
            back[a] = time.monotonic()

        wrote = fan_out(list(dict.fromkeys(a for a, _ in armed)), write)
        for a, e in wrote.failed.items():
            errors[a] = f"could not write under {dirs[a]} on {a}: {_why(e)}"
        armed = [(a, b) for a, b in armed if a in back]
        keys = [(k, b, idx[a]) for a, b in armed for k in ("new", "app")]
        watch.wait(keys, max(back.values(), default=time.monotonic()) + cap)
    finally:
        with watch.cond:
            watch.stopped = True
        for th in threads:
            th.join(timeout=30)
    out: list[Pair] = []
    for a, b in todo:
        if (a, b) in armed:
            got = [watch.get((k, b, idx[a])) for k in ("new", "app")]
            new, app = (None if g is None else round(max(0.0, g - back[a]), 3) for g in got)
            note = None if new is not None and app is not None else (
                watch.ended.get(b) or (f"{b}'s polling command ended without reporting it"
                                       if b in watch.ended else f"not seen within {cap:.0f} s"))
        else:
            new = app = None
            note = errors.get(a) or errors.get(b) or watch.ended.get(b) or (
                f"{b} did not see {a}'s first file within {cap:.0f} s"
                if watch.get(("started", b, -1)) is not None else
                f"{b}'s polling command did not start within {cap + START:.0f} s")
        out.append(Pair(a, b, new, app, note=note))
    return out, max((back[a] - sent[a] for a in back), default=0.0)


def _clean(ts: Mapping[str, HostTransport], dirs: Mapping[str, str], errors: Mapping[str, str],
           log: Log | None) -> None:
    """Remove the scratch dir, once per distinct path, through the first host with that path that
    can (best effort, logged)."""
    for path in dict.fromkeys(dirs[n] for n in ts):
        why = "no host to remove it through"
        for n in sorted((n for n in ts if dirs[n] == path), key=lambda n: n in errors):
            try:
                ts[n].run(["rm", "-rf", "--", path], timeout=60).check()
                break
            except Exception as e:  # best effort: the next host, then a log line
                why = _why(e)
        else:
            if log:
                log(f"doctor: could not remove the lag measurement's scratch dir {path}: {why}")


def await_content(t: HostTransport, path: str, want: str, cap: float) -> float | None:
    """Poll on the host until `path`'s first line is `want`: seconds it took (controller clock), or
    None when it never was within `cap`. Raises the transport's error when the host fails."""
    start = time.monotonic()
    r = t.run(["sh", "-c", _AWAIT, "sh", path, want, str(POLL), _turns(cap)], timeout=cap + 30)
    return round(time.monotonic() - start, 3) if r.rc == 0 else None


# --------------------------------------------------------------------------- doctor's section


def survey(project: Project, names: Sequence[str], fs: SharedFS | None, skipped: Mapping[str, str], *,
           cap: float | None = None, log: Log | None = None) -> LagResult:
    """Measure between `names` (the hosts that passed doctor's checks) and record the result on the
    shared FS, when there are two or more; `skipped`: the other hosts, with why."""
    if len(names) < 2:
        return LagResult(tuple(names), (), cap_seconds() if cap is None else cap, 0.0, time.time(),
                         whoami(), skipped)
    result = dataclasses.replace(measure(project, names, cap=cap, log=log), skipped=dict(skipped))
    if fs is None:
        return dataclasses.replace(result, record_error="the shared FS could not be reached")
    path = SweepLayout(fs.root).fs_lag
    try:
        fs.write_atomic(path, (json.dumps(result.record(), indent=1) + "\n").encode())
    except AblateError as e:
        return dataclasses.replace(result, record_error=e.message)
    return dataclasses.replace(result, recorded=path)
