"""A profile's `slurm:` mapping (`transport: slurm`): how each queue becomes one batch job.

    transport: slurm
    shared_fs: /shared/ablate          # as the compute nodes (and the login node) mount it
    ckpt_root: /scratch/ablate-ckpt    # where a running cell writes; shared scratch survives a requeue
    slurm:
      login: hpc-login                 # the login node's ssh alias; absent: this machine has sbatch
      partition: gpu                   # or a list: [gpu, gpu-long] (the first that can start it)
      account: mylab
      qos: normal
      time: "1-00:00:00"               # each job's time limit (--time)
      gpus: 1                          # per queue: --gres=gpu:1 (Slurm sets CUDA_VISIBLE_DEVICES)
      extra: ["--constraint=a100|h100"]  # further sbatch options, one --opt=value each (any value:
                                       # it reaches sbatch as one argument, quoted)
      requeue: true                    # --requeue (Slurm restarts the job after a node failure or
                                       # preemption; run_queue re-enters it); false: --no-requeue
      grace: 120                       # seconds before the time limit the queue is told (USR2)
      resubmit: true                   # at that signal: the cell is cut resumable and the job
                                       # requeued, its queue going on where it was
      array: false                     # true: the queues a launch starts go as one job array
                                       # (one sbatch; split by the cluster's MaxArraySize)
      throttle: 8                      # with array: at most 8 of its queues run at once (%8),
                                       # the others pending until one finishes
      max_restarts: 10                 # restarts of one queue's job (requeue, preemption, node
                                       # failure, its own resubmit at the time limit) after which
                                       # it ends; its cut cells wait for `ablate remediate`
      poll: 30                         # `status --watch` asks Slurm at most every 30 s

Options ablate sets itself (`--job-name`, `--output`, `--requeue`, `--signal`, ...), sbatch's
abbreviations of them (`--part=gpu`) and those that break what ablate relies on (`--wait`,
`--test-only`, `--clusters`) are refused in `extra`: two owners of one option is how duplicate
runs happen.
Without a `slurm:` mapping every key has its default: the cluster's own partition, account, QOS
and time limit, no `--gres`, `--requeue`, grace 120 s, resubmit, one job per queue (no array), at most
10 restarts per queue, `--watch` asking Slurm every 30 s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ablate.config.reader import Reader
from ablate.remote.slurm.signal_window import time_seconds

SLURM_KEYS = {"login", "partition", "account", "qos", "time", "gpus", "extra", "requeue", "grace", "resubmit",
              "array", "throttle", "max_restarts", "poll"}
DEFAULT_GRACE = 120  # seconds before the time limit Slurm's USR2 tells the queue
DEFAULT_MAX_RESTARTS = 10  # a day's sweep cut at a 4 h limit needs 6; a runaway stops within a 10th
DEFAULT_POLL = 30  # seconds between `status --watch`'s questions to Slurm (what admins tolerate)
# sbatch options ablate owns (the job's identity, output, requeue policy, signal, the script itself).
OWNED = ("--job-name", "-J", "--output", "-o", "--error", "-e", "--open-mode", "--requeue",
         "--no-requeue", "--signal", "--wrap", "--array", "-a", "--parsable", "--chdir", "-D",
         "--dependency", "-d", "--gres", "--time", "-t", "--partition", "-p", "--account", "-A",
         "--qos", "-q", "--export")
# sbatch options that break what ablate relies on, and why.
_WAITS = "makes sbatch wait for the whole job"
_ELSEWHERE = "puts the job on a cluster ablate's squeue and scancel do not look at"
BREAKING = {"--wait": _WAITS, "-W": _WAITS, "--test-only": "makes sbatch submit nothing",
            "--clusters": _ELSEWHERE, "-M": _ELSEWHERE}
# An option word: `--name`, `--name=VALUE` (any value: it goes to sbatch as one argument, quoted
# for every shell on the way), or a short `-x` with its value glued (`-C a100` as two list items is
# refused: say `--constraint=a100`). No control character anywhere (a newline would end a line of
# the job's script header on some sites' filters; nothing real needs one).
_WORD = re.compile(r"^(?:--[A-Za-z][A-Za-z0-9-]*(?:=.*)?|-[A-Za-z].*)$", re.S)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_ALIAS = re.compile(r"^([A-Za-z0-9_.-]+@)?[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class SlurmSettings:
    login: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    gpus: int = 0
    extra: tuple[str, ...] = ()
    requeue: bool = True
    grace: int = DEFAULT_GRACE
    resubmit: bool = True
    array: bool = False
    throttle: int | None = None
    max_restarts: int = DEFAULT_MAX_RESTARTS
    poll: int = DEFAULT_POLL

    @property
    def time_seconds(self) -> int | None:
        return None if self.time is None else time_seconds(self.time)

    def sbatch_options(self) -> list[str]:
        """Every option of each queue's `sbatch` but its name and output (the session adapter's)."""
        out = [f"--{k}={v}" for k, v in (("partition", self.partition), ("account", self.account),
                                          ("qos", self.qos), ("time", self.time)) if v]
        if self.gpus:
            out.append(f"--gres=gpu:{self.gpus}")
        # Always explicit: the site's JobRequeue default must never decide who owns retries.
        out.append("--requeue" if self.requeue else "--no-requeue")
        # B: the batch shell (run_queue) gets it, not only job steps; never USR1 (NCCL's).
        out.append(f"--signal=B:USR2@{self.grace}")
        return [*out, *self.extra]


def parse_slurm(r: Reader, transport: str) -> SlurmSettings | None:
    """The profile's `slurm:` mapping: optional with `transport: slurm` (all defaults without it),
    refused without that transport."""
    if transport != "slurm":
        if r.has("slurm"):
            raise r.err("slurm", "only a `transport: slurm` profile takes a slurm: mapping")
        return None
    s = r.sub("slurm", SLURM_KEYS)
    login = s.text("login")
    if login is not None and (not _ALIAS.match(login) or login.startswith("-")):
        raise s.err("login", f"{login!r} must be an ssh alias (or user@host) of the login node")
    names = {"partition": _partitions(s)}
    for key in ("account", "qos"):
        v = s.text(key)
        if v is not None and not _NAME.match(v):
            raise s.err(key, f"{v!r} must be a plain Slurm name (letters, digits, . _ -)")
        names[key] = v
    raw_time = s.data.get("time")
    if isinstance(raw_time, (int, float)) and not isinstance(raw_time, bool):
        # YAML reads an unquoted 4:00:00 as the base-60 number 14400, and 60 as a number too.
        raise s.err("time", f"must be quoted, got the number {raw_time} (YAML reads an unquoted "
                            "4:00:00 as 14400); write e.g. time: \"4:00:00\"")
    limit = s.text("time")
    if limit is not None:
        try:
            zero = time_seconds(limit) <= 0
        except ValueError:
            raise s.err("time", f"{limit!r} is not a Slurm time limit; write e.g. \"4:00:00\" "
                                "(H:M:S) or \"1-12:00:00\" (D-H:M:S), quoted in YAML") from None
        if zero:
            raise s.err("time", f"{limit!r} is Slurm's \"no limit\"; give a limit like \"4:00:00\", "
                                "or leave time out for the partition's default")
    gpus = _value(s, "gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise s.err("gpus", f"must be the GPUs each queue's job takes (0 or more), got {gpus!r}")
    extra = s.data.get("extra") or []
    if not isinstance(extra, list) or not all(isinstance(x, str) for x in extra):
        raise s.err("extra", f"must be a list of sbatch options like [--constraint=a100], got {extra!r}")
    for x in extra:
        if _CONTROL.search(x):
            raise s.err("extra", f"{x!r} holds a control character (a newline?); give the option on "
                                 "one line")
        if not _WORD.match(x):
            raise s.err("extra", f"{x!r} is not one sbatch option word (like --constraint=a100; "
                                 "give an option and its value as --opt=value)")
        opt = x.split("=", 1)[0]
        # sbatch takes any unambiguous abbreviation of a long option (`--part` is --partition), and
        # a short one's value glued to it (`-pgpu`).
        hits = [o for o in (*OWNED, *BREAKING) if o.startswith("--") == opt.startswith("--")
                and (o.startswith(opt) if opt.startswith("--") else x.startswith(o))]
        if hits and all(o in BREAKING for o in hits):
            raise s.err("extra", f"{x!r}: {hits[0]} {BREAKING[hits[0]]}; remove it")
        if hits:
            raise s.err("extra", f"{x!r}: ablate sets {' / '.join(hits)} itself (use the slurm: keys "
                                 "partition, account, qos, time, gpus, requeue)")
    grace = _value(s, "grace", DEFAULT_GRACE)
    if isinstance(grace, bool) or not isinstance(grace, int) or grace < 10:
        raise s.err("grace", f"must be at least 10 seconds (the queue needs time to cut its cell "
                             f"resumable), got {grace!r}")
    secs = time_seconds(limit) if limit else None
    if secs is not None and grace >= secs:
        raise s.err("grace", f"{grace} s is not less than the time limit {limit} ({secs} s); "
                             "give a smaller grace or a longer time")
    array = _flag(s, "array", False)
    throttle = s.data.get("throttle")
    if throttle is not None:
        if isinstance(throttle, bool) or not isinstance(throttle, int) or throttle < 1:
            raise s.err("throttle", f"must be how many of the array's queues may run at once "
                                    f"(1 or more), got {throttle!r}")
        if not array:
            raise s.err("throttle", "throttles a job array: add array: true, or remove throttle")
    max_restarts = _value(s, "max_restarts", DEFAULT_MAX_RESTARTS)
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise s.err("max_restarts", f"must be how many times a queue's job may restart (0 or more), "
                                    f"got {max_restarts!r}")
    poll = _value(s, "poll", DEFAULT_POLL)
    if isinstance(poll, bool) or not isinstance(poll, int) or poll < 10:
        raise s.err("poll", f"must be the seconds between status --watch's questions to Slurm (10 or "
                            f"more: every query is an RPC to slurmctld), got {poll!r}")
    return SlurmSettings(login=login, partition=names["partition"], account=names["account"],
                         qos=names["qos"], time=limit, gpus=gpus, extra=tuple(extra),
                         requeue=_flag(s, "requeue"), grace=grace, resubmit=_flag(s, "resubmit"),
                         array=array, throttle=throttle, max_restarts=max_restarts, poll=poll)


def _partitions(s: Reader) -> str | None:
    """`partition`: one name, a list of names or Slurm's comma list (the job starts in the first
    that can run it), as sbatch takes it: `gpu,gpu-long`."""
    raw = s.data.get("partition")
    if raw is None:
        return None
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items or not all(isinstance(p, str) for p in items):
        raise s.err("partition", f"must be a partition name or a list of them, got {raw!r}")
    for p in items:
        if not _NAME.match(p.strip()):
            raise s.err("partition", f"{p!r} must be a plain Slurm name (letters, digits, . _ -)")
    return ",".join(p.strip() for p in items)


def _value(s: Reader, key: str, default: object) -> object:
    """The key's value; absent or null: `default` (as for the other keys)."""
    v = s.data.get(key)
    return default if v is None else v


def _flag(s: Reader, key: str, default: bool = True) -> bool:
    v = _value(s, key, default)
    if not isinstance(v, bool):
        raise s.err(key, f"must be true or false, got {v!r}")
    return v
