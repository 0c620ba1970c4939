"""Calibration's bookkeeping for the runner (`calibrate:`; docs/ARCHITECTURE.md, "Calibration"):
the measurement of this host and slot (kept from an earlier sweep on the same machine, or the
user's benchmark timed now), its files, and the wait for every running queue's measurement. Stdlib
only; part of the runner's zipapp, asked by run_queue as one decision (`runner.py calibrate`) in the
background, so that a signal reaches the queue at once.

Files: `<root>/calib/<host>.<slot|->` holds the milliseconds (or `failed <rc>`, so that nobody waits
for it); `<shared_fs>/ablate/.calib/<key>` keeps a measurement for the next sweeps on the same
machine, `key` = the first 16 hex of the sha256 of the benchmark, the env, the host, the slot, the
machine's node name, its machine-id and the slot's GPU UUIDs (one line each): a new instance under
an old host name is another machine, and is measured again.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol

from ablate.remote.queue.rules import ms_of, secs_of

_CALIB_MS = re.compile(r"[1-9][0-9]{0,9}")
_SECONDS = re.compile(r"\s*([0-9]{1,9}(?:\.[0-9]{1,6})?)\s*")


class Beat(Protocol):
    """What the wait reads of another runner (runner.Runner)."""
    @property
    def host(self) -> str: ...
    @property
    def slot(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def cell(self) -> str: ...
    @property
    def ran(self) -> int: ...
    @property
    def silent(self) -> bool: ...


def calib_file(root: str, host: str, slot: str) -> str:
    return os.path.join(root, "calib", f"{host}.{slot or '-'}")


def calib_ms(root: str, host: str, slot: str) -> int | None:
    """A runner's measured milliseconds; None when it has none (or failed)."""
    return read_ms(calib_file(root, host, slot))


def read_ms(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.readline().strip()
    except OSError:
        return None
    return int(text) if _CALIB_MS.fullmatch(text) else None


def put_line(path: str, text: str) -> bool:
    """`path` holds the line `text`, whole or not at all (tmp + rename)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text + "\n")
        os.replace(tmp, path)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False


# --------------------------------------------------------------------------- the kept measurement

def kept_key(command: str, env: str, host: str, slot: str, node: str, machine_id: str, gpus: str) -> str:
    """The kept measurement's file name (as run_queue.sh computed it: `printf '%s\\n' ... |
    sha256sum`, so that figures kept by earlier versions are found)."""
    import hashlib

    text = "".join(f"{v}\n" for v in (command, env, host, slot or "-", node, machine_id, gpus))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def machine_id() -> str:
    try:
        with open("/etc/machine-id") as f:
            return f.readline().strip(" \t\n")
    except OSError:
        return ""


def gpu_uuids(slot: str, pin: bool) -> str:
    """The GPUs themselves (a container's name can stay): the slot's, else every one the job has."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return ""
    only = ["-i", slot] if slot and pin else []
    try:
        p = subprocess.run(["timeout", "20", "nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader",
                            *only], capture_output=True, text=True, check=False)
    except OSError:
        return ""
    return p.stdout.rstrip("\n") if p.returncode == 0 else ""


# --------------------------------------------------------------------------- the benchmark

class Measured(NamedTuple):
    rc: int
    ms: int  # the number its last line prints (seconds), else its wall time; at least 1
    dur: float  # its wall seconds


def run_benchmark(command: str, workdir: str, log_path: str, timeout: int,
                  say: Callable[[str], None]) -> Measured:
    """Time the benchmark in `workdir` (the env is already active), under `timeout` (then KILL 10 s
    later); its output and errors are appended to `log_path`."""
    import subprocess

    say(f"calibrating: {command}")
    t0 = time.time()
    last = b""
    with open(log_path, "ab") as log:
        try:
            p = subprocess.Popen(["timeout", "-k", "10", str(timeout), "bash", "-c", command], cwd=workdir,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log)
        except OSError as e:  # the workdir is not there: as a `cd` that failed
            log.write(f"ablate: cannot run the benchmark in {workdir}: {e}\n".encode())
            return Measured(125, 1, time.time() - t0)
        assert p.stdout is not None
        for line in p.stdout:
            log.write(line)
            last = line
        rc = p.wait()
    dur = time.time() - t0
    ms = int(dur * 1000)
    m = _SECONDS.fullmatch(last.decode(errors="replace").rstrip("\n"))
    got = ms_of(m.group(1)) if m is not None else None
    if got is not None:
        ms = got
    if rc != 0:
        say(f"calibration exited {rc} (log {log_path}): the deal uses the declared speed of this host")
    return Measured(rc, max(1, ms), dur)


class Setting(NamedTuple):
    root: str
    host: str
    queue: str
    slot: str
    command: str  # with {gpu} filled in
    raw_command: str  # as the spec has it (the key's)
    env: str
    workdir: str
    ckpt_root: str
    timeout: int
    keep: bool
    pin: bool


def measure(s: Setting, say: Callable[[str], None]) -> str | None:
    """This runner's measurement, unless it has one: the `calibrate` event's fields (`, "rc": ...`),
    or None when nothing was done (measured before: a relaunch on the same host)."""
    mine = calib_file(s.root, s.host, s.slot)
    if read_ms(mine) is not None:
        return None
    try:
        os.makedirs(os.path.dirname(mine), exist_ok=True)
        os.makedirs(s.ckpt_root, exist_ok=True)
    except OSError:
        return None
    kept_dir = os.path.join(os.path.dirname(s.root.rstrip("/")), ".calib")
    kept = ""
    if s.keep:
        kept = os.path.join(kept_dir, kept_key(s.raw_command, s.env, s.host, s.slot, os.uname().nodename,
                                               machine_id(), gpu_uuids(s.slot, s.pin)))
        ms = read_ms(kept)
        if ms is not None:  # measured on this machine by an earlier sweep: nothing runs
            if not put_line(mine, str(ms)):
                return None
            say(f"calibrated on this machine before: {secs_of(ms)}s ({os.path.basename(kept)} in {kept_dir})")
            return f', "rc": 0, "dur": 0, "secs": {secs_of(ms)}, "kept": true'
    got = run_benchmark(s.command, s.workdir, os.path.join(s.ckpt_root, f".calibrate.{s.queue}.log"),
                        s.timeout, say)
    if got.rc != 0:  # marked, so that nobody waits for it; measured again on a relaunch
        put_line(mine, f"failed {got.rc}")
        return f', "rc": {got.rc}, "dur": {got.dur:.6f}'
    if not put_line(mine, str(got.ms)):
        return None
    if kept:
        with contextlib.suppress(OSError):
            os.makedirs(kept_dir, exist_ok=True)
            put_line(kept, str(got.ms))
    say(f"calibrated: {secs_of(got.ms)}s")
    return f', "rc": 0, "dur": {got.dur:.6f}, "secs": {secs_of(got.ms)}'


# --------------------------------------------------------------------------- the wait

def calib_waiting(root: str, runners: Sequence[Beat]) -> list[tuple[str, str]]:
    """(label, calib file) of the running queues that have neither measured nor started a cell."""
    out = []
    for r in runners:
        if r.silent or r.ran >= 0:
            continue
        f = calib_file(root, r.host, r.slot)
        if not r.cell and not _nonempty(f):
            out.append((f"{r.host}/{r.queue}", f))
    return out


def _nonempty(path: str) -> bool:
    try:
        return os.stat(path).st_size > 0
    except OSError:
        return False


def calib_wait(root: str, scan: Callable[[], Sequence[Beat] | None], secs: float, stop: str) -> list[str]:
    """Wait, at most `secs`, until every other running queue has measured (or started a cell): a
    full look at the runners (`scan`; None: the FS cannot be read, stop waiting) each second, in
    between only the awaited files every 0.1 s (a queue starts as soon as the last one is in). The
    labels still awaited when it gave up."""
    until = time.monotonic() + secs
    files: list[str] = []
    waiting: list[str] = []
    k = 0
    while True:
        if k % 10 == 0:
            runners = scan()
            left = calib_waiting(root, runners) if runners is not None else []
            if not left:
                return []
            waiting, files = [w for w, _ in left], [f for _, f in left]
        elif all(_nonempty(f) for f in files):
            k = 0  # confirmed by a full look at once
            continue
        k += 1
        if time.monotonic() >= until:
            return waiting
        if os.path.exists(stop):
            return []
        time.sleep(0.1)


def say_to(host: str, queue: str) -> Callable[[str], None]:
    """run_queue's `say`, from the decision (its stdout is the answer: the pane gets stderr)."""
    def say(text: str) -> None:
        print(f"[ablate {host}/{queue}] {text}", file=sys.stderr, flush=True)
    return say


def verb(root: str, host: str, queue: str, slot: str, secs: float, stop: str,
         scan: Callable[[], Sequence[Beat] | None], env: Mapping[str, str],
         out: Callable[[str], None]) -> int:
    """The runner's `calibrate`: this runner's measurement (the `calibrate` event's fields,
    `event ...`), then the wait for the others' (`waiting HOST/QUEUE...` when it gave up). The spec's
    values come in `env`."""
    timeout = env.get("ABLATE_CALIBRATE_TIMEOUT", "")
    raw = env.get("ABLATE_CALIBRATE", "")
    setting = Setting(
        root, host, queue, slot, raw.replace("{gpu}", env.get("ABLATE_GPU", "")), raw,
        env.get("ABLATE_ENV", ""), env.get("ABLATE_WORKDIR", "."), env.get("ABLATE_CKPT_ROOT", "."),
        int(timeout) if timeout.isdigit() else 600, env.get("ABLATE_CALIBRATE_KEEP", "1") != "0",
        env.get("ABLATE_PIN_GPU", "1") != "0")
    payload = measure(setting, say_to(host, queue))
    if payload is not None:
        out("event " + payload)
    waiting = calib_wait(root, scan, secs, stop)
    if waiting:
        out("waiting " + " ".join(waiting))
    return 0
