"""The runner's process: run_queue's co-process for a queue's life, and the zipapp's command line.

    python3 runner.<sha12>.pyz serve ROOT HOST QUEUE SLOT|-

answers one request per line of its stdin, `ID<TAB>VERB<TAB>OPTION<TAB>...`, by the verb's lines and
`.done RC ID`, until EOF (its queue's shell has ended: only it holds the pipe). Verbs: the decisions of
`ablate/remote/queue/runner.py` (run with ROOT HOST QUEUE SLOT), `next` (the walk's step,
`ablate/remote/queue/walk.py`), `publish` (run_one's, asked over the fds run_queue gives it:
`ablate/remote/queue/publish.py`), the fence's `watch` and `fence` (`ablate/remote/queue/fence.py`), the
resume copies' `resume-prep`, `resume-end` and `resume-drop` (`ablate/remote/resume/keeper.py`), the
stop path's `attempt` and `stop-plan`
(`ablate/remote/slurm/stop_plan.py`) and the store's `pull`, `push`, `claim` and `commit`
(`ablate/remote/store/queue_side.py`, whose thread sends what the queue writes as it writes it; without a
store `pull` and `push` do nothing and `claim` answers `fs`, so run_queue asks them alike). So no decision
and no publish costs a Python start. A reader skips answers with another ID: those of a run_one killed while
it waited.

    python3 runner.<sha12>.pyz VERB ROOT HOST QUEUE SLOT|- [options]

runs one decision alone (tests, by hand, and the calibration, which runs the user's benchmark in a
process of its own). RC 0 with the answer; 1 when there is nothing to take; 2 bad arguments; 3 the
FS could not be read (run_queue waits for it and asks again); 4 it failed (a bug: its traceback is
on stderr, in the queue's pane).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, BinaryIO, TextIO

from ablate.remote.queue import fence
from ablate.remote.queue.defaults import CLAIM_WAIT, HEARTBEAT_SECS
from ablate.remote.queue.grammar import SAFE_NAME
from ablate.remote.queue.runner import FsDown, run
from ablate.remote.resume import keeper as resume_keeper
from ablate.remote.slurm import stop_plan

if TYPE_CHECKING:
    from ablate.remote.queue.walk import Walk
    from ablate.remote.store.queue_side import Agent


def _next_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="runner next")
    ap.add_argument("verb")
    for opt in ("--at", "--head", "--steal"):
        ap.add_argument(opt, type=int, default=0)
    for opt in ("--deferred", "--ahead"):
        ap.add_argument(opt, default="")
    ap.add_argument("--outcome", default="-")
    return ap


_NEXT = _next_parser()  # built once: a step per cell asks it


def serve(base: Sequence[str], inp: BinaryIO, out: TextIO) -> int:
    """run_queue's co-process: one request per line of `inp` (`ID<TAB>VERB<TAB>OPTION<TAB>...`,
    run with `base` = ROOT HOST QUEUE SLOT; `publish` with its own arguments, asked by the running
    cell's run_one), each answered on `out` by its lines and `.done RC ID`, until EOF (its queue's
    shell has ended: only it holds the pipe). A reader skips answers with another ID: those of a
    run_one killed while it waited."""
    # The TERM that stops a cell goes to the queue's whole process group, and so do a stop's TERM,
    # tmux's HUP and a Ctrl-C: this process is not the cell's, it must answer the next step, and it
    # ends with its queue's shell (EOF), or by KILL.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    walk: list[Walk] = []  # the queue's walk, made at its first step
    agent = store_agent(base)
    if agent is not None:
        agent.start()
    autostop(base, agent)
    watcher = fence.Watcher((base[1], base[2]), claim_reader(base, agent),
                            env_secs("ABLATE_HEARTBEAT_SECS", HEARTBEAT_SECS),
                            env_secs("ABLATE_CLAIM_WAIT", CLAIM_WAIT))
    keepers = resume_keeper.Keepers(base, lambda name: not _superseded(watcher.check_now(name)),
                                    resume_keeper.place_for(base[0], agent.store if agent else None))
    for raw in iter(inp.readline, b""):
        rid, *args = raw.decode("utf-8", "replace").rstrip("\n").split("\t")
        rows: list[str] = []
        if args[:1] == ["publish"]:
            rc = answer(args, rows.append, publish=True)
        elif args[:1] and args[0] in STORE_VERBS:
            rc = store_verb(agent, args, rows.append)
        elif args[:1] and args[0] in FENCE_VERBS:
            if args[:2] == ["watch", "-"]:  # the cell has ended: its keeper too (run_one's own
                keepers.end_all()           # resume-end may have come from a process of its own)
            rc = fence_verb(base, watcher, claim_reader(base, agent), args, rows.append)
        elif args[:1] and args[0] in stop_plan.VERBS:
            rc = answer(args, rows.append, step=stop_verb)
        elif args[:1] and args[0] in resume_keeper.VERBS:
            rc = answer(args, rows.append, step=keepers.verb)
        elif args[:1] == ["next"]:
            if agent is not None and store_verb(agent, ["pull", "1"], rows.append) != 0:
                rc = 3
            else:
                rc = answer(args, rows.append, step=lambda argv, out: step(base, walk, argv, out))
        else:
            rc = answer([*args[:1], *base, *args[1:]], rows.append)
        out.write("".join(r + "\n" for r in rows) + f".done {rc} {rid}\n")
        out.flush()
    if agent is not None:  # the queue's end: its last heartbeat and events to the store
        with contextlib.suppress(Exception):
            agent.close()
    return 0


def autostop(base: Sequence[str], agent: Agent | None = None) -> None:
    """The instance's autostop watcher (`ablate/remote/host/autostop_watch.py`), started by the first
    queue when the launch turned it on for this host (its settings file), unless it runs. A storage
    host's launch wrote the settings into the store: they are brought into its copy first."""
    root, host = base[0], base[1]
    if agent is not None:
        try:
            agent.autostop_settings()
        except Exception as e:  # the queue goes on; the copy keeps the settings it had
            print(f"runner: autostop's settings could not be read from the store: {e}", file=sys.stderr)
    if os.path.exists(os.path.join(root, "autostop", f"{host}.settings.json")):
        from ablate.remote.host import autostop_watch

        autostop_watch.ensure(root, host)


# A sweep kept in an object store (ABLATE_STORE): what run_queue and run_one ask of the queue's store
# side (`ablate/remote/store/queue_side.py`) — `pull` [FRESH], `push`, `claim` NAME IDX, `commit` NAME STAGING
# STARTED, `config` CFG WORKDIR. rc 0 done, 1 refused (claimed by another; not published: its reason;
# no such config in the store), 2 no store (`commit`, `config`), 3 the store could not be reached
# (waited out). Without a store `pull` and `push` have nothing to do (rc 0) and `claim` answers `fs`
# (rc 0: run_queue claims on the shared FS), so run_queue asks them whatever the spec says.
STORE_VERBS = ("pull", "push", "claim", "commit", "config")


def store_agent(base: Sequence[str]) -> Agent | None:
    from ablate.remote.store import queue_side

    root, host, queue, _slot = base
    return queue_side.from_env(root, host, queue)


def store_verb(agent: Agent | None, args: Sequence[str], out: Callable[[str], None]) -> int:
    if agent is None:
        if args[0] in ("pull", "push"):
            return 0
        if args[0] == "claim":
            out("fs")
            return 0
        print(f"runner: {args[0]}: the run spec names no store (ABLATE_STORE)", file=sys.stderr)
        return 2
    from ablate.remote.store.client import StoreError

    try:
        if args[0] == "push":
            agent.push()
            return 0
        if args[0] == "pull":
            agent.pull(fresh=float(args[1]) if len(args) > 1 else 0.0)
            return 0
        if args[0] == "claim" and len(args) == 3 and args[2].isdigit():
            won = agent.claim(args[1], int(args[2]), attempt(), socket.gethostname())
            return 0 if won else 1
        if args[0] == "config" and len(args) == 3:
            return 0 if agent.fetch_config(args[1], args[2]) else 1
        if args[0] == "commit" and len(args) == 4:
            return agent.commit(args[1], args[2], args[3], attempt(), out)
    except StoreError as e:
        print(f"runner: the store could not be reached: {e}", file=sys.stderr)
        return 3
    except OSError as e:
        print(f"runner: {args[0]}: {e}", file=sys.stderr)
        return 3
    print(f"runner: bad store request {list(args)!r}", file=sys.stderr)
    return 2


# The fence (`ablate/remote/queue/fence.py`): `watch NAME FILE PID` as a cell starts (its claim's
# owner line read now is the lease, answered `lease LINE`; the verdict goes to FILE, and PID,
# run_queue's shell, is rung with SIGUSR1; a claim not this queue's is superseded at the first
# check); `watch - FILE RC` when it has ended with RC (answered: its `end` event's fields when it
# was superseded); `fence NAME` (run_one, before it publishes): rc 1 when the run is superseded
# (its reason on one line), 0 when it holds or nothing can be concluded.
FENCE_VERBS = ("watch", "fence")


def _superseded(v: fence.Verdict | None) -> bool:
    return v is not None and v.superseded


def env_secs(name: str, default: float) -> float:
    v = os.environ.get(name, "")
    return float(v) if v.isdigit() and len(v) <= 7 else float(default)


def claim_reader(base: Sequence[str], agent: Agent | None) -> Callable[[str], fence.Seen]:
    root = base[0]
    if agent is not None:
        store = agent.store
        return lambda name: fence.read_store(store, name)
    return lambda name: fence.read_fs(root, name)


def fence_verb(base: Sequence[str], watcher: fence.Watcher | None, read: Callable[[str], fence.Seen],
               args: Sequence[str], out: Callable[[str], None]) -> int:
    _root, host, queue, _slot = base
    name = args[1] if len(args) > 1 else ""
    if not (name == "-" or SAFE_NAME.fullmatch(name)):
        print(f"runner: {args[0]}: a cell name, got {name!r}", file=sys.stderr)
        return 2
    if args[0] == "watch":
        if watcher is None:
            return 1
        if name == "-":  # `watch - FILE RC`: the cell ended with RC; its `end` fields, if superseded
            watcher.disarm()
            if len(args) == 4 and os.path.isabs(args[2]) and args[3].isdigit():
                fields = fence.end_fields(args[2], int(args[3]))
                if fields:
                    out(fields)
            return 0
        if len(args) not in (3, 4) or not os.path.isabs(args[2]) or not all(d.isdigit() for d in args[3:]):
            print("runner: watch NAME FILE [PID] (an absolute path, the shell to ring)", file=sys.stderr)
            return 2
        seen = read(name)
        lease = seen.owner if seen.answered and fence.ours(seen.owner, host, queue) else None
        watcher.arm(name, args[2], lease, int(args[3]) if len(args) == 4 else 0)
        out(f"lease {lease}" if lease else f"watched, with no lease yet: the claim of {name} is "
            f"{(seen.owner or 'gone') if seen.answered else 'unreadable (the storage did not answer)'}")
        return 0
    # fence NAME: the armed cell's check now; else (a Python start of run_one's own) by host/queue
    v = watcher.check_now(name) if watcher is not None else None
    if v is None:
        v = fence.judge(None, (host, queue), read(name), 0.0, 1.0)
    if v.superseded:
        out(f"superseded: {v.text(name)}; it does not publish")
        return 1
    return 0


def attempt() -> str:
    """This Slurm job's attempt, as run_queue's (`stop_plan.job_of`): "" outside a job. From the
    job's own variables: this process may start before run_queue exports ABLATE_JOB_ATTEMPT."""
    job = stop_plan.job_of(os.environ)
    return job.attempt if job is not None else ""


def stop_verb(argv: Sequence[str], out: Callable[[str], None]) -> int:
    """`attempt` and `stop-plan` (`slurm/stop_plan.py`), over this process's environment: the job's."""
    return stop_plan.verb(argv, os.environ, out)


def step(base: Sequence[str], walk: list[Walk], argv: Sequence[str], out: Callable[[str], None]) -> int:
    """`next --at K --deferred "I ..." --ahead "I ..." --head 0|1 --steal 0|1 --outcome O`: the
    walk's step from the position run_queue holds; its script on `out`."""
    from ablate.remote.queue.walk import Walk

    a = _NEXT.parse_args(argv)
    root, host, queue, _slot = base

    def decide(words: Sequence[str]) -> tuple[int, list[str]]:
        """One decision of the walk's; a bug in the deal or the steal takes nothing (the walk goes
        on), one in reading the lines fails the step."""
        rows: list[str] = []
        try:
            return run([words[0], *base, *words[1:]], rows.append), rows
        except (FsDown, SystemExit):
            raise
        except Exception:
            if words[0] not in ("deal", "drained"):
                raise
            traceback.print_exc()
            return 4, []

    if not walk:
        walk.append(Walk(root, queue, decide, bool(a.head), bool(a.steal)))
    w = walk[0]
    w.idx = a.at
    w.deferred = [int(x) for x in a.deferred.split() if x.isdigit()]
    w.ahead = {int(x) for x in a.ahead.split() if x.isdigit()}
    for op in w.step(host, a.outcome):
        out(op)
    return 0


def answer(argv: Sequence[str], out: Callable[[str], None], publish: bool = False,
           step: Callable[[Sequence[str], Callable[[str], None]], int] | None = None) -> int:
    """One decision's rc (with `publish`, run_one's publish: argv its arguments; with `step`, a verb
    of its own: the walk's step, the stop path's): run()'s, 2 for bad arguments, 3 when the FS could
    not be read, 4 when it failed (its traceback on stderr)."""
    try:
        if step is not None:
            return step(argv, out)
        if publish:
            from ablate.remote.queue import publish as pub  # the first cell's, once per queue

            return pub.main(argv[1:], out)
        return run(argv, out)
    except FsDown as e:
        print(f"runner: the shared FS could not be read: {e}", file=sys.stderr)
        return 3
    except SystemExit as e:  # argparse's refusal (its message is on stderr)
        return e.code if isinstance(e.code, int) else 2
    except Exception:  # a served runner outlives a bug in one decision
        traceback.print_exc()
        return 4


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:
        if len(args) != 5:
            print("usage: runner serve ROOT HOST QUEUE SLOT|-", file=sys.stderr)
            return 2
        return serve(args[1:], sys.stdin.buffer, sys.stdout)
    rows: list[str] = []
    if args[:1] and args[0] in STORE_VERBS and len(args) >= 5:  # VERB ROOT HOST QUEUE SLOT ARGS...
        agent = store_agent(args[1:5])
        rc = store_verb(agent, [args[0], *args[5:]], rows.append)
        if agent is not None:
            agent.push()
    elif args[:1] and args[0] in FENCE_VERBS and len(args) >= 5:  # VERB ROOT HOST QUEUE SLOT ARGS...
        agent = store_agent(args[1:5])
        rc = fence_verb(args[1:5], None, claim_reader(args[1:5], agent), [args[0], *args[5:]], rows.append)
    elif args[:1] and args[0] in stop_plan.VERBS and len(args) >= 5:  # VERB ROOT HOST QUEUE SLOT ARGS...
        rc = answer([args[0], *args[5:]], rows.append, step=stop_verb)
    elif args[:1] and args[0] in resume_keeper.VERBS and len(args) >= 5:  # VERB ROOT HOST QUEUE SLOT ARGS...
        alone = resume_keeper.Keepers(args[1:5], served=False)
        rc = answer([args[0], *args[5:]], rows.append, step=alone.verb)
    else:
        rc = answer(args, rows.append)
    sys.stdout.write("".join(r + "\n" for r in rows))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
