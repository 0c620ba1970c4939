"""When Slurm stops a queue's job, what run_queue does: the stop path's decisions. Stdlib only.

A queue's batch job gets Slurm's USR2 `grace` seconds before its time limit (`--signal=B:USR2@grace`)
or, where the site preempts with a user signal (`send_user_signal`), at once; Slurm's TERM comes
with `scancel` and a preemption without one. run_queue's handlers ask the queue's runner process
(`queue/serve.py`) what to do, and do it: TERM the cell, wait, write the events, `scontrol requeue`.

- `attempt --max-restarts N`, once at the queue's start: `attempt=JOB.RESTARTS self=SELF
  restarts=R stop=0|1` in a Slurm job; rc 1 outside one. The attempt fences a result (only the
  current attempt publishes: docs/ARCHITECTURE.md, "Attempts and fencing"); SELF is how Slurm's
  verbs name this job (`A_i` in an array: a bare A names every task); stop=1 when the job has
  restarted more than `slurm.max_restarts` times (its cut cells then wait for `ablate remediate`).
- `stop-plan --signal usr2|term --grace G --max-restarts N --resubmit 0|1 --running 0|1`: `why=R
  requeue=0|1 wait=S cut=0|1 capped=0|1`, the `queue_stop` reason, whether to ask Slurm for a
  requeue, the seconds the cut cell has from its TERM to its KILL, whether to record the cut
  (`time_limit_cuts.py`, once the cell has exited) and whether max_restarts refused a requeue. It asks
  `squeue -h -j SELF -o %L` (USR2 in a job) and, for a preemption or a TERM, Slurm's window
  (`signal_window.py`) itself.

The job comes from the runner's environment: run_queue's own, a Slurm job's `SLURM_*`.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from ablate.remote.slurm import signal_window

# Slurm sends the time limit's USR2 at most 60 s before `grace` (its signal timer's resolution):
# with more time left than grace + this, the site's preemption sent it.
PREEMPT_SLACK = 90
STOP_MARGIN = 10  # seconds of Slurm's window kept for the shell's own ending (events, heartbeat)
# What a cut cell has when the runner's process cannot answer (run_queue's fallback, in the spec):
# Slurm's default KillWait less the margin.
FALLBACK_WAIT = max(1, signal_window.KILL_WAIT - STOP_MARGIN)

VERBS = ("attempt", "stop-plan")
_JOB_ID = re.compile(r"[0-9_]+")
_NUMBER = re.compile(r"[0-9]+")


class Job(NamedTuple):
    """A queue's Slurm job as its environment says."""
    attempt: str  # SLURM_JOB_ID.SLURM_RESTART_COUNT
    self: str  # the name Slurm's verbs take for this job alone
    restarts: int  # how often Slurm has restarted it (requeue, preemption, node failure)


def job_of(env: Mapping[str, str]) -> Job | None:
    """This job's attempt, name and restarts from Slurm's variables; None outside a job. The first
    run of a job has no SLURM_RESTART_COUNT (0); an array task is `ARRAY_JOB_ID_TASK_ID`."""
    job = env.get("SLURM_JOB_ID", "")
    if not _JOB_ID.fullmatch(job):
        return None
    count = env.get("SLURM_RESTART_COUNT", "") or "0"
    restarts = int(count) if _NUMBER.fullmatch(count) else 0
    array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    self = f"{array}_{task}" if _NUMBER.fullmatch(array) and _NUMBER.fullmatch(task) else job
    return Job(f"{job}.{restarts}", self, restarts)


def restarted_too_often(restarts: int, max_restarts: int) -> bool:
    """At an attempt's start: Slurm restarted the job more than `max_restarts` times (the queue
    then ends at once)."""
    return restarts > max_restarts


def requeue_refused(restarts: int, max_restarts: int) -> bool:
    """At the time limit: a requeue now would make a restart past `max_restarts`."""
    return restarts >= max_restarts


def time_left(squeue: str | None) -> int | None:
    """Seconds `squeue -h -j SELF -o %L` says the job has left (`1-02:03:04`, `2:03:04`, `5:00`);
    None when it could not say (no answer, `INVALID`, `UNLIMITED`, `NOT_SET`, several lines)."""
    if squeue is None:
        return None
    try:
        return signal_window.time_seconds(squeue.strip())
    except ValueError:
        return None


def cell_wait(seconds: int) -> int:
    """What a cut cell gets of the `seconds` Slurm leaves the job: all but STOP_MARGIN, at least 1."""
    return max(1, seconds - STOP_MARGIN)


class Plan(NamedTuple):
    """What run_queue does on Slurm's signal."""
    why: str  # the queue_stop's reason: time_limit, preempted or slurm_signal
    requeue: bool  # ask Slurm to requeue this job (`scontrol requeue SELF`)
    wait: int  # seconds the cut cell has from its TERM to its KILL
    cut: bool  # record the cut once the cell has exited (`time_limit_cuts.py`: no_progress?)
    capped: bool  # max_restarts refused the requeue (said on the pane)

    def line(self) -> str:
        return (f"why={self.why} requeue={int(self.requeue)} wait={self.wait} cut={int(self.cut)} "
                f"capped={int(self.capped)}")


def on_usr2(job: Job | None, left: int | None, grace: int, max_restarts: int, resubmit: bool,
            running: bool, window: Callable[[], int]) -> Plan:
    """USR2: a preemption when the job has more than grace + PREEMPT_SLACK left (`left`, squeue's;
    Slurm's preemption then decides what becomes of the job, one owner of retries: no requeue of
    ours, and the cell has the preemption's window); else the time limit: the cell has until a
    margin before the job's end (`left`, or `grace` when unknown), the job is requeued when the
    profile resubmits and max_restarts allows, and the cut is recorded."""
    if job is not None and left is not None and left > grace + PREEMPT_SLACK:
        return Plan("preempted", False, cell_wait(window()), False, False)
    wait = cell_wait(left if job is not None and left is not None else grace)
    capped = job is not None and resubmit and requeue_refused(job.restarts, max_restarts)
    return Plan("time_limit", job is not None and resubmit and not capped, wait, job is not None and running,
                capped)


def on_term(window: Callable[[], int]) -> Plan:
    """Slurm's TERM (scancel, a preemption without a user signal) to the whole job: the cell has
    the site's window, less the margin; the job ends with the queue's shell."""
    return Plan("slurm_signal", False, cell_wait(window()), False, False)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="runner")
    ap.add_argument("verb", choices=VERBS)
    ap.add_argument("--signal", choices=("usr2", "term"), default="usr2")
    for opt in ("--grace", "--max-restarts", "--resubmit", "--running"):
        ap.add_argument(opt, type=int, default=0)
    return ap


_ARGS = _parser()


def verb(argv: Sequence[str], env: Mapping[str, str], out: Callable[[str], None],
         run: signal_window.Run = signal_window.ask) -> int:
    """`attempt` and `stop-plan` (the module's docstring); rc 1: `attempt` outside a Slurm job."""
    a = _ARGS.parse_args(argv)
    job = job_of(env)
    if a.verb == "attempt":
        if job is None:
            return 1
        out(f"attempt={job.attempt} self={job.self} restarts={job.restarts} "
            f"stop={int(restarted_too_often(job.restarts, a.max_restarts))}")
        return 0

    def window() -> int:
        return signal_window.window(env, run)

    if a.signal == "term":
        out(on_term(window).line())
        return 0
    left = time_left(run(["squeue", "-h", "-j", job.self, "-o", "%L"])) if job is not None else None
    out(on_usr2(job, left, a.grace, a.max_restarts, bool(a.resubmit), bool(a.running), window).line())
    return 0
