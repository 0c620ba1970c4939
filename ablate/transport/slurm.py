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
  `KILL_WAIT` s) until squeue no longer lists it, so `stop` appends its event after run_queue has gone.

squeue forgets finished jobs after MinJobAge: a job not listed is not live, never "done" — the
events and results on the shared FS say what happened.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from ablate import resources as packaged
from ablate.config.slurm import SlurmSettings
from ablate.errors import RemoteError
from ablate.transport.base import CommandResult, HostTransport
from ablate.transport.shellhost import BASH_C, env_command

# The adapter's bash is a file of its own (wrappers/slurm_sessions.sh: shellcheck reads it), shipped
# in the package and passed to `bash -c`.
SESSIONS = packaged.read("ablate.wrappers", "slurm_sessions.sh").decode()
_KILL_WAIT = re.search(r"^kill_wait=([0-9]+)", SESSIONS, re.M)
assert _KILL_WAIT is not None, "wrappers/slurm_sessions.sh sets kill_wait"
KILL_WAIT = int(_KILL_WAIT.group(1))  # seconds `kill-session` waits for scancel's job to leave squeue



class SlurmHost:
    """`HostTransport` of a Slurm host: `inner` runs the commands (this machine or the login
    node); the queue verbs go to Slurm (module doc)."""

    def __init__(self, name: str, inner: HostTransport, settings: SlurmSettings, out_dir: str,
                 prefix: str = "ablate-") -> None:
        self.name = name
        self.prefix = prefix  # this sweep's session names on this host begin so
        self.inner = inner
        self.settings = settings
        self.out_dir = out_dir

    def run(self, argv: Sequence[str], *, timeout: float = 60.0,
            stdin: bytes | None = None) -> CommandResult:
        return self.inner.run(argv, timeout=timeout, stdin=stdin)

    def stream(self, argv: Sequence[str], on_stdout: Callable[[bytes], None], *,
               stop: Callable[[], bool] | None = None, poll: float = 0.5) -> int | None:
        return self.inner.stream(argv, on_stdout, stop=stop, poll=poll)

    def tmux_argv(self) -> list[str]:
        opts = self.settings.sbatch_options()
        return [*BASH_C, SESSIONS, "ablate-slurm", self.out_dir, self.prefix, str(len(opts)), *opts]

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
