"""How long Slurm lets a job's processes run after it first signals them. Stdlib only.

Asked by the stop path's plan (`stop_plan.py`, run_queue's runner verb `stop-plan`) when Slurm signals
its job, so that the trainer gets the site's whole window to save before anything is killed, and the
queue's shell (the batch step: its end kills what is left) outlives the trainer:

- `scancel` and a time limit: TERM, then KILL after `KillWait` (`scontrol show config`);
- a preemption: the job's end moves `GraceTime` ahead (the partition's, `scontrol show partition`,
  and the QOS's, `sacctmgr show qos`, where accounting answers), then TERM, `KillWait`, KILL.

The window is the larger of both: a shorter real one ends in Slurm's KILL, as it would anyway.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence

KILL_WAIT = 30  # Slurm's default KillWait, when the config cannot be read
_KILL_WAIT = re.compile(r"^KillWait\s*=\s*(\d+)", re.M)
_GRACE = re.compile(r"\bGraceTime=(\d+)")
# Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (parsed here alone: squeue's %L,
# sacctmgr's GraceTime, the profile's `slurm.time`).
_TIME = re.compile(r"^(?:(\d+)-(\d+)(?::(\d+)(?::(\d+))?)?|(\d+)(?::(\d+)(?::(\d+))?)?)$")

Run = Callable[[Sequence[str]], str | None]


def kill_wait(config: str | None) -> int:
    """`KillWait = 30 sec` of `scontrol show config`; the default when absent."""
    m = _KILL_WAIT.search(config or "")
    return int(m.group(1)) if m else KILL_WAIT


def partition_grace(text: str | None) -> int:
    """`GraceTime=N` of `scontrol -o show partition P` (seconds); 0 when absent."""
    m = _GRACE.search(text or "")
    return int(m.group(1)) if m else 0


def time_seconds(text: str) -> int:
    """Seconds of a Slurm time (`M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`); ValueError else."""
    m = _TIME.match(text)
    if not m:
        raise ValueError(text)
    d, dh, dm, ds, a, b, c = (int(g) if g else 0 for g in m.groups())
    if m.group(1) is not None:
        return ((d * 24 + dh) * 60 + dm) * 60 + ds
    if m.group(7) is not None:  # H:M:S
        return (a * 60 + b) * 60 + c
    if m.group(6) is not None:  # M:S
        return a * 60 + b
    return a * 60  # M


def qos_grace(text: str | None) -> int:
    """`sacctmgr -n -P show qos Q format=GraceTime`: `00:05:00` (or `1-00:00:00`); 0 when absent."""
    first = (text or "").strip().split("\n", 1)[0].strip()
    try:
        return time_seconds(first)
    except ValueError:
        return 0


def ask(argv: Sequence[str]) -> str | None:
    """A Slurm command's stdout; None when it failed, timed out or is not there."""
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=15, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def window(env: Mapping[str, str] | None = None, run: Run = ask) -> int:
    """Seconds from Slurm's first signal to its KILL, at most: the largest GraceTime that applies
    (partition, QOS) plus KillWait."""
    env = os.environ if env is None else env
    grace = 0
    partition = env.get("SLURM_JOB_PARTITION", "").split(",")[0]
    if re.fullmatch(r"[A-Za-z0-9._-]+", partition):
        grace = partition_grace(run(["scontrol", "-o", "show", "partition", partition]))
    qos = env.get("SLURM_JOB_QOS", "")
    if re.fullmatch(r"[A-Za-z0-9._-]+", qos):
        grace = max(grace, qos_grace(run(["sacctmgr", "-n", "-P", "show", "qos", qos, "format=GraceTime"])))
    return grace + kill_wait(run(["scontrol", "show", "config"]))

