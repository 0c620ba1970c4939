"""A Slurm cluster as a host: each queue is one batch job running the same `run_queue` wrapper.

Commands run where Slurm's client is: on the login node (the profile's `slurm.login`, an ssh
alias, through the ssh transport) or on this machine (no `login`). The queue verbs every other
command uses for tmux (`list-sessions`, `new-session`, `kill-session`) are answered by a small
adapter script (`SESSIONS`) in one round trip, so launch, status, stop and the host views work
unchanged over it:

- `list-sessions` also gives each job's id, state, nodes and pending reason (`!job` lines) and
  each node Slurm has out of service (`!node NAME STATE`), never session names: `status` shows the
  jobs, and a cut cell whose node is down is `lost`, by Slurm's word, not by SSH's, all from the
  one query every command makes anyway;
- a queue's session name is its job name (`--job-name`); live = listed by `squeue` for this user
  (pending, running, requeued, completing): a job Slurm is requeueing is live, so nothing else
  starts or re-queues its cells (one owner of retries);
- `new-session` is `sbatch` of `exec <run_queue command>`, refused ("duplicate session") while a
  job of that name is live; its output goes to `<sweep root>/slurm/<job name>.out`, appended
  across requeues (the `logs` of a queue);
- `new-array` (a profile's `array: true`, when a launch starts several queues here) submits them
  as one job array (`--array=0-K%T`, split by the cluster's MaxArraySize, the throttle shared
  among the parts): task i runs queue i; its session is line i of `<array job>.tasks` beside the
  output, written before the submit, and Slurm's output of task i goes to its queue's log (a link);
- `kill-session` is `scancel` of the session's job (or array task), then waits (at most
  `KILL_WAIT` s) until squeue no longer lists it, so `stop` appends its event after run_queue has gone;
  a queue left waiting has its waiting entry removed.

Slurm is asked politely (the admins' rule): each verb runs one `squeue`, filtered to this user and
this sweep's job names (those with a record beside the output: `<session>.jobs`, the ids the
sweep submitted); `sacct -j` only the last recorded job of a session squeue no longer lists, once
(a terminal state is kept in `<session>.done`); `sinfo -p` only the sweep's partitions. Under
`polite_polling()` (`status --watch`) a `list-sessions` answer younger than `slurm.poll` seconds
is given again from the output dir instead of asking Slurm.

The adapter keeps the processes' life (Slurm's commands, renames, writes, waits); what to ask and
what each answer means is decided by its co-process, ablate/remote/slurm/adapter_serve.py with the
decisions of ablate/remote/slurm/adapter.py, shipped as a zipapp beside it and run with the
profile's python (and its `env`).

Submit limits: at most the cluster's MaxSubmitJobs (sacctmgr's association and QOS limits where
Slurm enforces them, else learned from sbatch's refusal) of this sweep's jobs are in Slurm; a
queue past it is left WAITING (`<out>/waiting/<session>/`: its job script and sbatch options) and
is submitted by a finishing job's on-exit hook (`ABLATE_SLURM_ON_EXIT`, exported by its script and
run by run_queue) or by the next `status`/`launch`; `status` shows it (`!job SESSION|-|WAITING||why`,
REFUSED when sbatch refused it for good) in Slurm's words. Each sbatch has its own time-out; a
transient error is retried with backoff, and a queue it still fails is left waiting.

squeue forgets finished jobs after MinJobAge: a job not listed is not live, never "done" — the
events and results on the shared FS say what happened.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence

from ablate import resources as packaged
from ablate.config.slurm import SlurmSettings
from ablate.errors import RemoteError
from ablate.remote.slurm.adapter import KILL_WAIT
from ablate.transport.base import CommandResult, HostTransport
from ablate.transport.shellhost import BASH_C, env_command

# The adapter's bash is a file of its own (wrappers/slurm_sessions.sh: shellcheck reads it), shipped
# in the package and placed once beside the jobs' output, content-addressed and read-only
# (`<out>/.adapter.<sha12>.sh`), with its decisions' zipapp (`.adapter.<sha12>.pyz`: one sha12 for
# the pair, so a change in either is a new pair); each verb runs `BOOT`, which sources it. Passing
# its text instead would put it into every section of a launch's one command line: 40 queues' worth
# is past Linux's 128 KiB limit of one argument.
SESSIONS = packaged.read("ablate.wrappers", "slurm_sessions.sh").decode()
DECISIONS = ("ablate.remote.slurm.adapter", "ablate.remote.slurm.adapter_serve")  # stdlib only
_MAIN = b"from ablate.remote.slurm.adapter_serve import main\n\nraise SystemExit(main())\n"


def decisions_pyz() -> bytes:
    """The zipapp the adapter starts for its decisions (`python -S .adapter.<sha12>.pyz serve ...`):
    the modules under their package names, stored (no zlib: byte-for-byte the same for the same
    sources on every controller)."""
    return packaged.zipapp(_MAIN, DECISIONS, deflate=False)


PYZ = decisions_pyz()
SESSIONS_SHA = hashlib.sha256(SESSIONS.encode() + b"\0" + PYZ).hexdigest()[:12]
BOOT = ('adapter=$1; shift; if [ -r "$adapter" ]; then . "$adapter"; else '
        'echo "ablate-slurm: the adapter $adapter is not there" >&2; exit 97; fi')
# Both files in one command, written only when not there: $1 their path without the suffix; stdin
# a script of here-documents (the zipapp in base64), each file written aside, made read-only, then
# renamed into place, the zipapp first (a readable .sh has its .pyz beside it).
_PLACE = ('f=$1; [ -r "$f.sh" ] && [ -r "$f.pyz" ] && exit 0; mkdir -p -- "${f%/*}" || exit 1\n'
          'put() { cat >"$f$1.$$" && chmod 444 "$f$1.$$" && mv -f -- "$f$1.$$" "$f$1"; }\n'
          'eval "$(cat)"')
_EOF = "ABLATE_ADAPTER_EOF"
assert _EOF not in SESSIONS and SESSIONS.endswith("\n"), "a here-document carries the adapter"
_PLACE_STDIN = (f"base64 -d <<'{_EOF}' | put .pyz || exit 1\n{base64.encodebytes(PYZ).decode()}{_EOF}\n"
                f"put .sh <<'{_EOF}' || exit 1\n{SESSIONS}{_EOF}\n:\n").encode()
_PLACED: set[tuple[str, str]] = set()  # (login or "", path) placed or seen by this process
_PLACED_LOCK = threading.Lock()
_POLITE = threading.Event()  # set: list-sessions may answer from an answer up to slurm.poll s old


@contextlib.contextmanager
def polite_polling() -> Iterator[None]:
    """Within it (`status --watch`), a Slurm host's sessions are asked of Slurm at most every
    `slurm.poll` seconds; in between the adapter gives its last answer again."""
    _POLITE.set()
    try:
        yield
    finally:
        _POLITE.clear()

class SlurmHost:
    """`HostTransport` of a Slurm host: `inner` runs the commands (this machine or the login
    node); the queue verbs go to Slurm (module doc)."""

    def __init__(self, name: str, inner: HostTransport, settings: SlurmSettings, out_dir: str,
                 prefix: str = "ablate-", *, python: str = "python3", env: str | None = None) -> None:
        self.name = name
        self.prefix = prefix  # this sweep's session names on this host begin so
        self.inner = inner
        self.settings = settings
        self.out_dir = out_dir
        self.python = python  # the profile's: where the Slurm commands run, it runs the decisions
        self.env = env or ""  # the profile's env, activated before it (only for it)

    def run(self, argv: Sequence[str], *, timeout: float = 60.0,
            stdin: bytes | None = None) -> CommandResult:
        return self.inner.run(argv, timeout=timeout, stdin=stdin)

    def stream(self, argv: Sequence[str], on_stdout: Callable[[bytes], None], *,
               stop: Callable[[], bool] | None = None, poll: float = 0.5) -> int | None:
        return self.inner.stream(argv, on_stdout, stop=stop, poll=poll)

    @property
    def adapter_path(self) -> str:
        return f"{self.out_dir}/.adapter.{SESSIONS_SHA}.sh"

    def place_adapter(self) -> None:
        """The adapter at `adapter_path` and its decisions' zipapp beside it, once per process: one
        command where the Slurm commands run (this machine or the login node) that writes them only
        when they are not there."""
        key = (self.settings.login or "", self.adapter_path)
        with _PLACED_LOCK:
            if key in _PLACED:
                return
            r = self.inner.run(["sh", "-c", _PLACE, "sh", self.adapter_path.removesuffix(".sh")],
                               stdin=_PLACE_STDIN, timeout=60.0)
            if r.rc != 0:
                why = (r.stderr or r.stdout).strip()[-300:]
                raise RemoteError(f"{self.name}: could not place the Slurm adapter at "
                                  f"{self.adapter_path} (rc {r.rc}): {why!r}")
            _PLACED.add(key)

    def tmux_argv(self) -> list[str]:
        self.place_adapter()
        opts = self.settings.sbatch_options()
        max_age = self.settings.poll if _POLITE.is_set() else 0
        return [*BASH_C, BOOT, "ablate-slurm", self.adapter_path, self.out_dir, self.prefix, str(max_age),
                self.python, self.env, str(len(opts)), *opts]

    def array_argv(self, queues: Sequence[tuple[str, str]]) -> list[str] | None:
        """The command submitting `queues` (session name, shell command) as job arrays (one per
        MaxArraySize tasks, throttled together to `throttle`), or None when this host submits one
        job per queue. It prints `started SESSION JOBID` or `duplicate session: SESSION` per queue."""
        if not self.settings.array or len(queues) < 2:
            return None
        return [*self.tmux_argv(), "new-array", str(self.settings.throttle or 0),
                *(w for pair in queues for w in pair)]

    def tmux_start(self, session: str, argv: Sequence[str], env: Mapping[str, str],
                   cwd: str | None = None) -> None:
        command = env_command(self.name, env, argv)
        r = self.run([*self.tmux_argv(), "new-session", "-d", "-s", session,
                      *(["-c", cwd] if cwd else []), command], timeout=120.0)
        if r.rc != 0:
            raise RemoteError(f"{self.name}: sbatch of {session} failed (rc {r.rc}): "
                              f"{(r.stderr or r.stdout).strip()[-300:]!r}")

    def tmux_sessions(self) -> set[str]:
        r = self.run([*self.tmux_argv(), "list-sessions"])
        if r.rc != 0:
            raise RemoteError(f"{self.name}: squeue failed (rc {r.rc}): "
                              f"{(r.stderr or r.stdout).strip()[-300:]!r}")
        return {line.strip() for line in r.stdout.splitlines() if line.strip() and not line.startswith("!")}

    def tmux_kill(self, session: str) -> None:
        r = self.run([*self.tmux_argv(), "kill-session", "-t", f"={session}"], timeout=KILL_WAIT + 30)
        if r.rc != 0:
            raise RemoteError(f"{self.name}: scancel of {session} failed (rc {r.rc}): "
                              f"{(r.stderr or r.stdout).strip()[-300:]!r}")

    def close(self) -> None:
        self.inner.close()
