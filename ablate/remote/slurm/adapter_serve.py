"""The Slurm batch adapter's co-process: one verb's view and the questions its bash asks.

ablate/transport/slurm.py places it beside the adapter (wrappers/slurm_sessions.sh) as a zipapp,
`<out>/.adapter.<sha12>.pyz` (this module and the decisions it asks, ablate/remote/slurm/adapter.py,
under their package names; one sha12 for the pair), and the adapter starts it once per verb with the
profile's python, without site:

    python -S .adapter.<sha12>.pyz serve OUT PREFIX [SBATCH_OPTION]...

It first writes `:`; then, for each question (its words NUL-terminated, the first their count), it
answers shell code, NUL-terminated, which the adapter evaluates: assignments (each `Verb.q_*` says
which), `puts` (files to write whole: path, line), the verb's stdout lines, or its end (`exit N`,
the message on stderr, written here; `return RC` when Slurm failed: the verb decides). An answer
that needs Slurm's word first is `need=WHAT arg=ARG secs=S`: the adapter's `fact` runs that command
for at most S s and sends `fact RC STDOUT STDERR` back (`need=sleep arg=S` between tries). The view
lives as long as the verb: one squeue's jobs, the submit limit once known, what was taken.

A Slurm command that failed for a reason that passes (slurmctld busy or out of reach) is tried again
after a pause: squeue and the others after 1 s, then 2 s; sbatch after 2 s, then 4 s. Those seconds
are multiples of `ABLATE_SLURM_RETRY_PAUSE` (in the login node's environment; default 1, a cluster
whose controller takes long to come back may want more).
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from ablate.remote.slurm.adapter import (
    HOOK_PATIENCE,
    KILL_PAUSES,
    KILL_WAIT,
    LOOK_SECS,
    NOACCT_AGE,
    SBATCH_TIMEOUT,
    STALE_AGE,
    ArrayPlan,
    Fact,
    Limit,
    Need,
    Row,
    array_job,
    array_most,
    array_plan,
    array_script,
    busy_why,
    cached_limit,
    default_partition,
    ended_rows,
    hold_on,
    job_lines,
    learned,
    limits_line,
    next_take,
    number,
    one_line,
    option,
    out_of_service,
    read_sbatch,
    reserve,
    retryable,
    session_why,
    submit_limit,
    sweep_names,
    task_rows,
)

if TYPE_CHECKING:  # annotations only: it runs on Pythons from 3.8
    Reply = dict[str, str | int | list[str]]
    Step = Generator[Need, Fact, Reply]

_JOB_NAME = re.compile(r"[A-Za-z0-9_+-]+")


def _retry_pause() -> float:
    """The unit of the pauses before a Slurm command that failed transiently is tried again."""
    try:
        v = float(os.environ.get("ABLATE_SLURM_RETRY_PAUSE") or 1.0)
    except ValueError:
        return 1.0
    return v if 0 < v <= 600 else 1.0


RETRY_PAUSE = _retry_pause()

# the command each need runs, as a failure names it
_COMMAND = {"squeue": "squeue", "look": "squeue", "config": "scontrol", "scancel": "scancel",
            "acct": "sacct", "partition": "sinfo", "nodes": "sinfo"}


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _say(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


class Verb:
    """One verb's view, kept while its adapter runs: the sweep's jobs (squeue), the submit limit,
    what it took; its `q_*` methods answer the adapter's questions."""

    def __init__(self, out: str, prefix: str, opts: Sequence[str], now: float | None = None) -> None:
        self.out, self.prefix, self.opts = out, prefix, list(opts)
        self.wd = os.path.join(out, "waiting")
        self.now = now  # a fixed clock (tests), else the time of each look
        self.rows: list[Row] = []
        self.live = 0
        self.facts: dict[str, Fact] = {}
        self.limit: Limit | None = None
        self.reserved: int | None = None
        self.tried: set[str] = set()
        self.taking, self.took, self.waits, self.kills = "", False, 0, 0
        self.queues: list[tuple[str, str]] = []
        self.plan: ArrayPlan | None = None
        self.hook = ""
        self.puts: list[str] = []

    def clock(self) -> float:
        return time.time() if self.now is None else self.now

    def path(self, name: str) -> str:
        return os.path.join(self.out, name)

    def files(self, d: str) -> list[str]:
        try:
            return sorted(os.listdir(d))
        except OSError:
            return []

    def waiting(self) -> list[tuple[str, bool]]:
        """The waiting queues, oldest name first, and whether sbatch refused each for good."""
        return [(n, os.path.exists(os.path.join(self.wd, n, "refused"))) for n in self.files(self.wd)
                if not n.startswith(".") and os.path.isdir(os.path.join(self.wd, n))]

    def put(self, name: str, line: str) -> None:
        self.puts += [self.path(name), line]

    # -------------------------------------------------------------------- asking Slurm

    def ask(self, need: Need, tries: int = 1, loud: bool = False) -> Generator[Need, Fact, Fact]:
        """Slurm's answer to `need`, asked again after 1 and 2 RETRY_PAUSEs (`tries` 3) while it
        fails for a reason that passes; `loud`: a failure is told on stderr."""
        fact = Fact(1, "")
        for attempt in range(1, tries + 1):
            fact = yield need
            if fact.rc == 0 or attempt == tries or not retryable(fact.rc, one_line(fact.err)):
                break
            yield Need("sleep", f"{attempt * RETRY_PAUSE:g}")
        if fact.rc != 0 and loud:
            _say(f"{_COMMAND.get(need.what, need.what)}: {one_line(fact.err).strip() or f'exit {fact.rc}'}")
        return fact

    def squeue(self) -> Generator[Need, Fact, int]:
        """The sweep's live jobs into the view (one squeue); its rc."""
        names = sweep_names(self.files(self.out))
        fact = (yield from self.ask(Need("squeue", ",".join(names)), 3, loud=True)) if names else Fact(0, "")
        if fact.rc == 0:
            tasks = {n: _read(self.path(f"{n}.tasks")).splitlines() for n in names if array_job(n)}
            self.rows = task_rows(fact.out, tasks)
            self.live = len(self.rows)
        return fact.rc

    def submit_limit(self) -> Generator[Need, Fact, Limit]:
        """This sweep's submit limit: kept, else asked (and kept LIMITS_AGE s)."""
        if self.limit is None:
            self.limit = cached_limit(_read(self.path(f".limits.{self.prefix}")), self.clock())
        while self.limit is None:
            step = submit_limit(self.opts, self.facts)
            if isinstance(step, Limit):
                self.limit = step
                self.put(f".limits.{self.prefix}", limits_line(step, self.clock()))
            else:
                self.facts[step.what] = yield from self.ask(step)
        return self.limit

    def busy(self) -> str | None:
        return busy_why(_read(self.path(".busy")), self.clock())

    # -------------------------------------------------------------------- the questions

    def q_jobs(self) -> Step:
        """The sweep's live jobs into the view; `return RC` when squeue failed."""
        rc = yield from self.squeue()
        return {"return": rc} if rc else {}

    def q_fresh(self, many: str, *words: str) -> Step:
        """Sessions to start (`one NAME` or `many NAME CMD...`): a bad job name ends the verb (2);
        `one` that is live or waits ends it (1); of `many`, the live ones are printed and `fresh`
        gives the others' indexes."""
        pairs = [(words[i], words[i + 1]) for i in range(0, len(words) - 1, 2)]
        names = [n for n, _ in pairs] if many == "many" else list(words[:1])
        bad = next((n for n in names if not _JOB_NAME.fullmatch(n)), None)
        if bad is not None:
            _say(f"ablate-slurm: bad job name '{bad}'")
            return {"exit": 2}
        rc = yield from self.squeue()
        if rc:
            return {"return": rc}
        waiting = {n for n, _ in self.waiting()}
        live = {r.session for r in self.rows} | waiting
        dup = "duplicate session: {} (a Slurm job of that name is pending or running, or waits)"
        if many != "many":
            if names[0] in live:
                _say(dup.format(names[0]))
                return {"exit": 1}
            return {}
        self.queues = [(n, c) for n, c in pairs if n not in live]
        return {"say": [dup.format(n) for n in names if n in live],
                "fresh": [str(i) for i, n in enumerate(names) if n not in live]}

    def q_session(self) -> Step:
        """`why` a new session waits ("": submit it now)."""
        limit = yield from self.submit_limit()
        return {"why": session_why(limit, self.live, self.busy())}

    def q_submit(self, name: str, entry: str) -> Step:
        """sbatch of the waiting entry `entry` (job name `name`): `id`, else `kind` and `why`."""
        t0 = time.monotonic()
        tries = 1
        while True:
            fact = yield Need("sbatch", entry, SBATCH_TIMEOUT)
            if fact.rc == 0:
                return self.submitted(name, fact.out.strip().split(";")[0])
            v = read_sbatch(fact.rc, fact.err, tries, time.monotonic() - t0)
            if v.look:  # it may have submitted it: never twice
                seen = yield Need("look", name, LOOK_SECS)
                got = (seen.out.split() or [""])[0]
                if got:
                    return self.submitted(name, got)
            if v.pause is None:
                break
            yield Need("sleep", f"{v.pause * RETRY_PAUSE:g}")
            tries += 1
        if v.kind == "limit":
            self.limit, line = learned(self.live, self.clock())
            self.put(f".limits.{self.prefix}", line)
        elif v.kind == "transient":
            self.put(".busy", f"{int(self.clock())} {v.why}")
        return {"id": "", "kind": v.kind, "why": v.why}

    def submitted(self, name: str, job: str) -> Reply:
        if name == self.taking:  # a waiting queue taken: it counts, and status lists it
            self.took, self.live = True, self.live + 1
            self.rows.append(Row(name, job, "PENDING", "", "None"))
        return {"id": job, "kind": "", "why": ""}

    def q_take(self, who: str, elapsed: str, mine: str) -> Step:
        """The take loop's next step (`next`: take `entry` | wait `pause` s | leave | none), as
        `status` (keeps a place for the hooks; not while slurmctld is busy) or `hook`."""
        if who == "status" and self.busy() is not None:
            return {"next": "leave", "entry": "", "pause": 0}
        candidates = [n for n, refused in self.waiting() if not refused and n not in self.tried]
        if not candidates:
            return {"next": "none", "entry": "", "pause": 0}
        limit = yield from self.submit_limit()
        if self.reserved is None:
            self.reserved = reserve(limit) if who == "status" else 0
        hooks = [n[len(".hook."):] for n in self.files(self.wd) if n.startswith(".hook.")]
        step = next_take(candidates, limit, self.reserved, self.live, self.took, float(elapsed),
                         self.waits, HOOK_PATIENCE if who == "hook" else 0,
                         hold_on((r.id for r in self.rows), mine, hooks))
        self.taking = step.entry
        if step.entry:
            self.tried.add(step.entry)
        self.waits += step.next == "wait"
        return {"next": step.next, "entry": step.entry, "pause": step.pause}

    def q_recover(self) -> Reply:
        """Entries whose owner is gone (older than STALE_AGE s): `drop` (a `.new` or `.hook`, or a
        `.taking` whose job squeue lists), `back` (a `.taking` to wait again: path, name pairs)."""
        drop: list[str] = []
        back: list[str] = []
        live = {r.session for r in self.rows}
        for n in self.files(self.wd):
            p = os.path.join(self.wd, n)
            try:
                stale = self.clock() - os.stat(p).st_mtime > STALE_AGE
            except OSError:
                continue
            if stale and n.startswith(".taking.") and os.path.isdir(p):
                name = n[len(".taking."):].split(".")[0]
                (drop.append(p) if name in live else back.extend([p, name]))
            elif stale and n.startswith((".new.", ".hook.")):
                drop.append(p)
        return {"drop": drop, "back": back}

    def q_listing(self) -> Step:
        """list-sessions' answer (`listing`): each live or waiting queue's session, then its `!job
        SESSION|ID|STATE|NODES|REASON` (waiting: ID `-`, STATE WAITING or REFUSED, REASON why);
        `!done SESSION|ID|STATE|NODES|EXIT` of each session whose last job squeue no longer lists
        (its `.done`, else sacct: a terminal state is kept there); `!node NAME STATE` of each node
        of the sweep's partitions (`--partition`, else the cluster's default, kept in `.partition`)
        Slurm has out of service."""
        lines = job_lines(self.rows, [(n, "REFUSED" if refused else "WAITING",
                                       one_line(_read(os.path.join(self.wd, n, "why"))[:400]))
                                      for n, refused in self.waiting()])
        live = {r.session for r in self.rows} | {n for n, _ in self.waiting()}
        who: dict[str, str] = {}
        for f in self.files(self.out):
            session = f[:-len(".jobs")]
            if not (f.startswith(self.prefix) and f.endswith(".jobs")) or session in live:
                continue
            ids = _read(self.path(f)).split("\n")
            last = ids[-2] if len(ids) > 1 and ids[-1] == "" else ids[-1]
            kept = _read(self.path(f"{session}.done")).split("\n")[0]
            if last and "|" in kept and kept.split("|")[1] == last:
                lines.append(f"!done {kept}")
            elif last:
                who[last] = session
        noacct = number(_read(self.path(".noacct")).strip())
        if who and not (noacct is not None and self.clock() - noacct < NOACCT_AGE):
            fact = yield from self.ask(Need("acct", ",".join(who)), 3)
            if fact.rc != 0:
                self.put(".noacct", str(int(self.clock())))
            for line, done in ended_rows(fact.out if fact.rc == 0 else "", who):
                lines.append(f"!done {line}")
                if done:
                    self.put(f"{line.split('|')[0]}.done", line)
        parts = option(self.opts, "partition") or _read(self.path(".partition")).split("\n")[0].strip()
        if not parts:
            fact = yield from self.ask(Need("partition"), 3)
            parts = (default_partition(fact.out) if fact.rc == 0 else None) or ""
            if parts:
                self.put(".partition", parts)
        if parts:
            lines += out_of_service((yield from self.ask(Need("nodes", parts), 3)).out)
        return {"listing": "\n".join(lines)}

    def q_array(self, throttle: str, hook: str) -> Step:
        """The fresh queues as arrays: `room`, `parts`, `why` the rest wait; the verb ends when the
        cluster has arrays off or the throttle cannot cover the parts (2), or scontrol failed (1)."""
        config = yield from self.ask(Need("config"), 3, loud=True)
        if config.rc != 0:
            return {"exit": 1}
        self.facts["config"] = config
        most = array_most(config.out)
        if most < 1:
            _say("ablate-slurm: this cluster has job arrays off (MaxArraySize 0): set array: false")
            return {"exit": 2}
        limit = yield from self.submit_limit()
        plan = array_plan(most, limit, self.live, len(self.queues), int(throttle), self.busy())
        if isinstance(plan, str):
            _say(f"ablate-slurm: {plan}")
            return {"exit": 2}
        self.plan, self.hook = plan, hook
        return {"room": plan.room, "parts": len(plan.slices), "why": plan.why}

    def q_part(self, part: str) -> Reply:
        """Array `part`: its `job` name, `first` queue, `tasks` (sessions), `script`, `sopts`."""
        assert self.plan is not None
        first, k = self.plan.slices[int(part)]
        names = [n for n, _ in self.queues[first:first + k]]
        commands = [c for _, c in self.queues[first:first + k]]
        job = f"{names[0]}.a{str(time.time_ns())[-8:]}{part}"
        return {"job": job, "first": first, "tasks": list(names),
                "script": array_script(self.hook, names, commands),
                "sopts": [f"--job-name={job}", f"--array=0-{k - 1}{self.plan.share}",
                          f"--output={self.out}/{job}.%a.out", "--open-mode=append",
                          f"--chdir={self.out}", *self.opts]}

    def q_kill(self, session: str) -> Step:
        """scancel of `session`'s jobs; the verb ends when it has none (0) or scancel failed (1)."""
        rc = yield from self.squeue()
        if rc:
            return {"return": rc}
        ids = [r.id for r in self.rows if r.session == session]
        if not ids or (yield from self.ask(Need("scancel", " ".join(ids)), 3, loud=True)).rc != 0:
            return {"exit": 1 if ids else 0}
        return {}

    def q_gone(self, session: str, elapsed: str) -> Step:
        """After scancel: `pause` before looking again while squeue lists `session` ("": gone, or
        squeue failed), and its end after KILL_WAIT s (1)."""
        rc = yield from self.squeue()
        if rc or all(r.session != session for r in self.rows):
            return {"pause": ""}
        if float(elapsed) > KILL_WAIT:
            _say(f"ablate-slurm: job {session} still listed")
            return {"exit": 1}
        self.kills += 1
        return {"pause": str(KILL_PAUSES[min(self.kills, len(KILL_PAUSES)) - 1])}

    def answer(self, words: Sequence[str]) -> Step:
        handler = getattr(self, f"q_{words[0]}", None) if words else None
        if handler is None:
            raise ValueError(f"no question {words[:1]}")
        self.puts = []
        got = handler(*words[1:])  # a Reply, or a Step when it may need Slurm's word first
        reply: Reply = got if isinstance(got, dict) else (yield from got)
        return {**reply, "puts": self.puts} if self.puts else reply


# ----------------------------------------------------------------------------- the co-process

def shell(reply: Mapping[str, str | int | list[str]]) -> str:
    """An answer as the shell code the adapter evaluates."""
    out = []
    for k, v in reply.items():
        if k in ("say", "exit", "return"):
            continue
        out.append(f"{k}=({' '.join(shlex.quote(w) for w in v)})" if isinstance(v, list)
                   else f"{k}={shlex.quote(str(v))}")
    say = reply.get("say")
    if isinstance(say, list) and say:
        out.append("printf '%s\\n' " + " ".join(shlex.quote(s) for s in say))
    for k in ("exit", "return"):
        if k in reply:
            out.append(f"{k} {reply[k]}")
    return "; ".join(out) or ":"


def requests(fd: int) -> Iterator[list[str]]:
    """The adapter's messages: `N\\0` then N words, each NUL-terminated, until EOF."""
    buf = b""

    def word() -> str | None:
        nonlocal buf
        while b"\0" not in buf:
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            buf += chunk
        w, _, buf = buf.partition(b"\0")
        return w.decode("utf-8", "replace")

    while True:
        n = word()
        words = [word() for _ in range(int(n or 0))]
        if n is None or None in words:
            return
        yield [w for w in words if w is not None]


def serve(argv: Sequence[str], fin: int = 0, fout: int = 1) -> int:
    """Answer the adapter's questions until it ends (EOF); a failing question answers its error."""
    out, prefix, *opts = argv
    verb = Verb(out, prefix, opts)
    msgs = requests(fin)

    def send(text: str) -> None:
        data = memoryview(text.encode() + b"\0")
        while data:
            data = data[os.write(fout, data):]

    send(":")
    for words in msgs:
        step = verb.answer(words)
        try:
            need = next(step)
            while True:
                send(shell({"need": need.what, "arg": need.arg, "secs": need.secs}))
                fact = next(msgs, None)
                if fact is None:
                    return 0
                need = step.send(Fact(int(fact[1]), fact[2], fact[3]))
        except StopIteration as done:
            send(shell(done.value))
        except Exception as e:  # a bug: the adapter says which question, and the verb fails
            _say(f"ablate-slurm: the decisions failed on {words[:1]}: {type(e).__name__}: {e}")
            send("return 3")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["serve"] or len(args) < 3:
        sys.stderr.write("usage: python -S .adapter.<sha12>.pyz serve OUT PREFIX [SBATCH_OPTION]...\n")
        return 2
    return serve(args[1:])


if __name__ == "__main__":
    sys.exit(main())
