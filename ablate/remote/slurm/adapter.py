"""The Slurm batch adapter's decisions, over Slurm's own texts: wrappers/slurm_sessions.sh runs the
commands, renames, writes and waits; these functions say what to ask, what each answer means and
what to do next (ablate/remote/slurm/adapter_serve.py asks them for one verb, the adapter's co-process).

Stdlib only and nothing else of ablate: it runs on the login node inside the adapter's zipapp.
ablate/doctor/slurm.py reads the array limits through `array_most` (one parse of MaxArraySize),
ablate/transport/slurm.py the waits it defines (`KILL_WAIT`).

Slurm is asked politely (the admins' rule): one squeue per verb, of this user and this sweep's job
names (those with a record in the output dir: `<session>.jobs`, `.out`, an array's `.tasks`); sacct
only for the last recorded job of a session squeue no longer lists, once (a terminal state is kept
in `<session>.done`; a failed sacct is not asked again for NOACCT_AGE s); sinfo only for the sweep's
partitions; scontrol and sacctmgr for the submit limit every LIMITS_AGE s.

Submit limits: at most the least of the association's MaxSubmitJobs/GrpSubmitJobs and the QOS's
MaxSubmitJobsPerUser/-PerAccount/GrpSubmitJobs (sacctmgr, where AccountingStorageEnforce has
`limits` or `safe`; else learned from sbatch's refusal) of this sweep's jobs are in Slurm. A queue
past it waits (`<out>/waiting/<session>/`) and is taken, oldest name first, by `list-sessions` or
by a finishing job's on-exit hook (`submit-waiting`). Slurm counts a job until its last process
ends, the hook included, so the controller's submits keep one place free for it (`reserve`); a
hook that took nothing waits for a place up to HOOK_PATIENCE s, only while another job of the
sweep may end and free one (`hold_on`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

KILL_WAIT = 60  # seconds `kill-session` waits for scancel's job to leave squeue
SBATCH_TIMEOUT = 20  # seconds one sbatch may take (a timed-out one may have submitted: squeue tells)
LIMITS_AGE = 600  # seconds a known submit limit is trusted before sacctmgr is asked again
BUSY_AGE = 60  # seconds the submits wait after slurmctld failed one (a launch stays bounded)
NOACCT_AGE = 300  # seconds sacct is not asked again after it failed
STALE_AGE = 300  # seconds after which a `.taking`, `.new` or `.hook` entry's owner is gone
HOOK_PATIENCE = 90  # seconds a hook that took nothing waits for a place
ARRAY_SIZE = 1001  # Slurm's default MaxArraySize
QUERY_SECS, ACCOUNTING_SECS, LOOK_SECS = 30, 20, 10  # time-outs of squeue etc., sacctmgr, the look
KILL_PAUSES = (0.2, 0.5, 1, 2)  # between kill-session's looks at squeue (then 2 s each)
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                      "BOOT_FAIL", "DEADLINE", "PREEMPTED"})
_TRANSIENT = re.compile(r"Socket timed out|Resource temporarily unavailable|Unable to contact slurm "
                        r"controller|[Bb]usy|Connection refused|Zero Bytes were transmitted|try again")
_LIMIT = re.compile(r"SubmitJob|submit limit")
_OUT_OF_SERVICE = ("down", "drain", "fail", "maint", "unknown", "no_respond")
_NUMBER = re.compile(r"[0-9]+")  # what bash's arithmetic took (str.isdigit takes "²" too)


class Fact(NamedTuple):
    """A Slurm command's answer: its rc, stdout and stderr."""
    rc: int
    out: str
    err: str = ""


class Need(NamedTuple):
    """A Slurm command an answer needs first (the adapter's `fact` runs it), or a `sleep`."""
    what: str
    arg: str = ""
    secs: int = QUERY_SECS


class Limit(NamedTuple):
    """A submit limit (None: none known) and where it came from."""
    value: int | None
    source: str


class Row(NamedTuple):
    """One live job as squeue lists it, with its queue's session name."""
    session: str
    id: str
    state: str = ""
    nodes: str = ""
    reason: str = ""
    partition: str = ""


class Verdict(NamedTuple):
    """sbatch's failure, read: `kind` limit | transient | refused, `why` in Slurm's words, `look`:
    it may have submitted all the same (ask squeue first), `pause`: seconds before trying again."""
    kind: str
    why: str
    look: bool
    pause: int | None


class Take(NamedTuple):
    """The waiting queues' next step: take `entry`, wait `pause` s, leave, or none left (disarm)."""
    next: str
    entry: str = ""
    pause: int = 0


class ArrayPlan(NamedTuple):
    """The queues as arrays: the first `room` submitted as `slices` (first, tasks), each throttled
    to `share` (`%N` or empty); the rest wait, `why`."""
    room: int
    slices: list[tuple[int, int]]
    share: str
    why: str


# ----------------------------------------------------------------------------- Slurm's texts

def number(text: str) -> int | None:
    """A whole number written in ASCII digits, else None."""
    return int(text) if _NUMBER.fullmatch(text) else None


def config_value(config: str, key: str) -> str | None:
    """`Key = value` of `scontrol show config`."""
    m = re.search(rf"^{re.escape(key)} *= *(.*)$", config, re.M)
    return m.group(1).strip() if m else None


def array_most(config: str | None) -> int:
    """The most tasks one job array may have: its ids are below MaxArraySize (default 1001), and
    `SchedulerParameters=...max_array_tasks=N` caps their number."""
    size = re.search(r"^MaxArraySize\s*=\s*(\d+)", config or "", re.M)
    tasks = re.search(r"^SchedulerParameters\s*=.*\bmax_array_tasks=(\d+)", config or "", re.M)
    return min(int(size.group(1)) if size else ARRAY_SIZE, int(tasks.group(1)) if tasks else 1 << 62)


def option(opts: Sequence[str], name: str) -> str | None:
    """The value of sbatch option `--name=` (the last one given)."""
    return next((o.split("=", 1)[1] for o in reversed(opts) if o.startswith(f"--{name}=")), None)


def least(limit: Limit, value: str, source: str) -> Limit:
    """The lesser of a known limit and a sacctmgr value (a number; anything else is no limit)."""
    n = number(value)
    if n is None or (limit.value is not None and limit.value <= n):
        return limit
    return Limit(n, source)


def assoc_limit(rows: str, opts: Sequence[str], limit: Limit) -> tuple[Limit, str | None]:
    """The least MaxSubmit/GrpSubmit of the user's associations the job's account and partitions
    match (`sacctmgr -P show assoc format=Account,Partition,MaxSubmit,GrpSubmit,DefaultQOS,QOS`),
    and the QOS it runs in: `--qos`, else the first match's default QOS or first QOS."""
    account, parts = option(opts, "account"), option(opts, "partition")
    qos = option(opts, "qos")
    for line in rows.splitlines():
        a, p, ms, gs, dq, q = (line.split("|", 5) + [""] * 6)[:6]
        if not a or (account and a != account) or (p and parts and p not in parts.split(",")):
            continue
        for v in (*ms.split(), *gs.split()):
            limit = least(limit, v, "sacctmgr-assoc")
        qos = qos or dq or q.split(",")[0]
    return limit, qos or None


def qos_limit(row: str, qos: str, limit: Limit) -> Limit:
    """The least of `limit` and the QOS's MaxSubmitPU/MaxSubmitPA/GrpSubmit (its first row)."""
    for v in (row.split("\n", 1)[0].split("|", 2) + [""] * 3)[:3]:
        for w in v.split():
            limit = least(limit, w, f"sacctmgr-qos-{qos}")
    return limit


def submit_limit(opts: Sequence[str], facts: Mapping[str, Fact]) -> Need | Limit:
    """The submit limit by what Slurm said so far, or the command to ask next: `scontrol show
    config` (is it enforced, which cluster), sacctmgr's associations, then their QOS."""
    config = facts.get("config")
    if config is None:
        return Need("config", "", ACCOUNTING_SECS)
    cluster = None
    if config.rc == 0:
        if not re.search(r"limits|safe", config_value(config.out, "AccountingStorageEnforce") or ""):
            return Limit(None, "not-enforced")
        cluster = config_value(config.out, "ClusterName")
    assoc = facts.get("assoc")
    if assoc is None:
        return Need("assoc", cluster or "", ACCOUNTING_SECS)
    if assoc.rc != 0:
        return Limit(None, "none")
    limit, qos = assoc_limit(assoc.out, opts, Limit(None, "none"))
    if qos is None:
        return limit
    row = facts.get("qos")
    if row is None:
        return Need("qos", qos, ACCOUNTING_SECS)
    return qos_limit(row.out, qos, limit) if row.rc == 0 else limit


def cached_limit(line: str, now: float) -> Limit | None:
    """The limit kept in `.limits.<prefix>` (`SINCE VALUE|- SOURCE`) while younger than LIMITS_AGE."""
    t, v, s = [*line.split(None, 2), "", "", ""][:3]
    since = number(t)
    if since is None or now - since >= LIMITS_AGE:
        return None
    return Limit(number(v), s.strip())


def limits_line(limit: Limit, now: float) -> str:
    return f"{int(now)} {'-' if limit.value is None else limit.value} {limit.source}"


def learned(live: int, now: float) -> tuple[Limit, str]:
    """sbatch refused a submit for a limit with `live` of this sweep's jobs in Slurm: that is the
    limit (at 0 of ours, the user's other jobs fill it: try one), trusted half as long."""
    limit = Limit(max(live, 1), "learned")
    return limit, limits_line(limit, now - LIMITS_AGE // 2)


def reserve(limit: Limit) -> int:
    """The places the controller's submits leave for the finishing jobs' hooks (module doc)."""
    return 1 if limit.value is not None and limit.value >= 2 else 0


def busy_why(line: str, now: float) -> str | None:
    """`.busy` (`SINCE WHY`): slurmctld failed a submit within BUSY_AGE s, in its words."""
    t, _, why = line.partition(" ")
    since = number(t)
    return why.strip() if since is not None and now - since < BUSY_AGE else None


def session_why(limit: Limit, live: int, busy: str | None) -> str:
    """Why a new session waits instead of being submitted now ("" : submit it)."""
    if busy is not None:
        return f"slurmctld did not take a job a moment ago: {busy}"
    if limit.value is not None and live >= limit.value - reserve(limit):
        return (f"submit limit {limit.value} ({limit.source}): {live} of this sweep's jobs are in "
                "Slurm; submitted as one ends")
    return ""


def one_line(text: str) -> str:
    """A command's stderr on one line (`|` is the adapter's field separator)."""
    return text.replace("\n", " ").replace("|", "/")


def transient(text: str) -> bool:
    """Slurm's error is one that passes (slurmctld busy or briefly unreachable)."""
    return _TRANSIENT.search(text) is not None


def retryable(rc: int, err: str) -> bool:
    """A failed query is asked again: a transient error, or its time-out (rc 124)."""
    return rc == 124 or transient(err)


def read_sbatch(rc: int, err: str, tries: int, elapsed: float) -> Verdict:
    """sbatch's failure (rc, stderr) at its `tries`-th try, `elapsed` s after the first began: a
    submit limit; transient (tried again after 2 and 4 s within SBATCH_TIMEOUT s; never after its
    own time-out: slurmctld does not answer, the queue waits); else refused for good."""
    why = " ".join(line for line in err.split("\n") if line).replace("|", "/")
    if rc == 124:
        why = f"sbatch did not answer within {SBATCH_TIMEOUT}s"
    if rc == 127:  # no sbatch here (a node without the client)
        return Verdict("transient", why, False, None)
    if _LIMIT.search(why):
        return Verdict("limit", why, False, None)
    if rc == 124 or transient(why):
        again = rc != 124 and tries < 3 and elapsed < SBATCH_TIMEOUT
        return Verdict("transient", why, True, tries * 2 if again else None)
    return Verdict("refused", why, False, None)


def task_rows(text: str, tasks: Mapping[str, Sequence[str]]) -> list[Row]:
    """squeue's `%j|%i|%T|%N|%r|%P` rows; an array task's (ID `J_K`, its job name holding `.a`, which
    no session name does) session is line K of its job's `.tasks` (`tasks`: job name -> lines)."""
    rows = []
    for line in text.splitlines():
        f = line.split("|", 5)
        if not f[0]:
            continue
        m = re.search(r"_([0-9]+)$", f[1]) if len(f) > 1 and array_job(f[0]) else None
        lines = tasks.get(f[0], ()) if m else ()
        if m and int(m.group(1)) < len(lines):
            f[0] = lines[int(m.group(1))]
        rows.append(Row(*(f + [""] * 6)[:6]))
    return rows


def array_job(name: str) -> bool:
    """A job name of an array (`<first session>.a<stamp><part>`): its `.tasks` names its tasks."""
    return ".a" in name


def sweep_names(files: Iterable[str]) -> list[str]:
    """This sweep's job names in OUT (all hosts'): a session's `.jobs` or `.out`, an array's
    `.tasks`; not an array task's output link (`<array job>.<i>.out`: its `.tasks` names it)."""
    names = set()
    for f in files:
        stem, dot, ext = f.rpartition(".")
        if dot and ext in ("jobs", "tasks", "out") and stem and not f.startswith(".") \
                and not re.search(r"\.a.*\.", stem):
            names.add(stem)
    return sorted(names)


def _job_key(job: str) -> tuple[int, int]:
    """A job id `J` or `A_i` as (J or A, i), -1 for a part that is not there (or not a number)."""
    j, _, t = job.partition("_")
    jn, tn = number(j), number(t)
    return (-1 if jn is None else jn, -1 if tn is None else tn)


def above(a: str, b: str) -> bool:
    """Job id `a` (`J` or `A_i`) is above `b`: a later job, or a later task of the same array."""
    (ja, ta), (jb, tb) = _job_key(a), _job_key(b)
    return ja > jb if ja != jb else ta >= 0 and tb >= 0 and ta > tb


def hold_on(ids: Iterable[str], mine: str, hooks: Iterable[str]) -> bool:
    """Whether a hook with no place waits for one: only while another job of the sweep may end and
    free one. A waiting hook holds its job's place (marked `.hook.<job id>`): when every other job
    is a waiting hook too, the one of the highest id leaves (its end is the others' place), and
    with no other job at all, it leaves (the next status or launch submits what still waits)."""
    if not mine:
        return False
    others = [i for i in ids if i != mine]
    marked = set(hooks)
    waiting = [i for i in others if i in marked]
    if not others:
        return False
    if len(waiting) < len(others):
        return True
    top = waiting[0]
    for i in waiting[1:]:
        top = i if above(i, top) else top
    return not above(mine, top)


def next_take(candidates: Sequence[str], limit: Limit, reserved: int, live: int, took: bool,
              elapsed: float, waits: int, patience: int, holding: bool) -> Take:
    """The take loop's next step: the first candidate (oldest name, not tried, not refused) while
    fewer than the limit minus `reserved` of the sweep's jobs are in Slurm; else wait (2, 4, 8,
    16 s) within `patience` while nothing was taken and `holding` (hold_on), else leave."""
    if not candidates:
        return Take("none")
    if limit.value is not None and live >= limit.value - reserved:
        pause = min(2 << waits, 16)
        if not took and elapsed + pause <= patience and holding:
            return Take("wait", pause=pause)
        return Take("leave")
    return Take("take", candidates[0])


def terminal(state: str) -> bool:
    """sacct's State (`CANCELLED by 0`: its first word) is one a job never leaves."""
    return (state.split() or [""])[0] in TERMINAL


def ended_rows(text: str, who: Mapping[str, str]) -> list[tuple[str, bool]]:
    """`sacct -X -n -P -o JobID,State,NodeList,ExitCode` rows of the asked ids as `SESSION|ID|STATE|
    NODES|EXIT` lines, and whether each state is terminal (kept in `<session>.done`)."""
    out = []
    for row in text.splitlines():
        f = (row.split("|", 3) + [""] * 4)[:4]
        if f[0] and f[0] in who:
            out.append(("|".join([who[f[0]], *f]), terminal(f[1])))
    return out


def out_of_service(text: str) -> list[str]:
    """`!node NAME STATE` of each node of `sinfo -h -N -o '%N %T'` Slurm has out of service
    (down, drained, failing, in maintenance, unknown, not responding: `*`)."""
    out = []
    for line in text.splitlines():
        node, state = [*line.split(None, 1), "", ""][:2]
        low = state.strip().lower()
        if node and (low.endswith("*") or low.startswith(_OUT_OF_SERVICE)):
            out.append(f"!node {node} {state.strip()}")
    return out


def default_partition(text: str) -> str | None:
    """The cluster's default partition (`sinfo -h -o %P` marks it `*`)."""
    return next((p[:-1] for p in text.split() if p.endswith("*")), None)


def array_plan(most: int, limit: Limit, live: int, total: int, throttle: int,
               busy: str | None) -> ArrayPlan | str:
    """How `total` queues go as job arrays of at most `most` tasks: as many as the submit limit
    leaves room for, in parts sharing the throttle; or why they cannot (the fix in its words)."""
    room, why = total, ""
    if busy is not None:
        room, why = 0, f"slurmctld did not take a job a moment ago: {busy}"
    elif limit.value is not None:
        room = max(limit.value - reserve(limit) - live, 0)
        if room < total:
            why = f"submit limit {limit.value} ({limit.source}): this sweep's jobs in Slurm would be more"
        room = min(room, total)
    parts = -(-room // most)
    if throttle > 0 and parts > throttle:
        return (f"{total} queues need {parts} arrays (MaxArraySize {most}) but throttle is "
                f"{throttle}: raise throttle to at least {parts}")
    slices = [(p * most, min(most, room - p * most)) for p in range(parts)]
    return ArrayPlan(room, slices, f"%{throttle // parts}" if throttle > 0 and parts else "", why)


def array_script(hook: str, sessions: Sequence[str], commands: Sequence[str]) -> str:
    """The job script of one array: task i runs queue i's command."""
    cases = "".join(f"{i}) exec {c} ;;\n" for i, c in enumerate(commands))
    return (f"#!/bin/bash\n# ablate queues {' '.join(sessions)}\n"
            f"export ABLATE_SLURM_ON_EXIT={shlex.quote(hook)}\ncase ${{SLURM_ARRAY_TASK_ID:-}} in\n"
            f"{cases}esac\necho \"ablate: no queue for array task ${{SLURM_ARRAY_TASK_ID:-}}\" >&2; exit 2\n")


def job_lines(rows: Sequence[Row], waiting: Sequence[tuple[str, str, str]]) -> list[str]:
    """list-sessions' sessions: each live job's and each waiting queue's (`SESSION|-|WAITING||why`,
    REFUSED when sbatch refused it for good), its name, then its `!job` line."""
    out = []
    for r in rows:
        out += [r.session, f"!job {r.session}|{r.id}|{r.state}|{r.nodes}|{r.reason}"]
    for name, state, why in waiting:
        out += [name, f"!job {name}|-|{state}||{why or 'submit limit'}"]
    return out
