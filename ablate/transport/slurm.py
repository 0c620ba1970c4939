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
- `kill-session` is `scancel --name`, then waits (at most `KILL_WAIT` s) until squeue no longer
  lists it, so `stop` appends its event after run_queue has gone.

squeue forgets finished jobs after MinJobAge: a job not listed is not live, never "done" — the
events and results on the shared FS say what happened.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ablate.config.slurm import SlurmSettings
from ablate.errors import RemoteError
from ablate.transport.base import CommandResult, HostTransport
from ablate.transport.shellhost import env_command

KILL_WAIT = 60  # seconds `kill-session` waits for scancel's job to leave squeue

# $1 the output dir, $2 the number of sbatch options, then those options, then the verb and its
# arguments as tmux takes them.
SESSIONS = r"""out=$1 n=$2; shift 2
opts=("${@:1:$n}"); shift "$n"
me=${USER:-$(id -un)}
names() { squeue -h -u "$me" -o '%j'; }
verb=$1; shift
case $verb in
  list-sessions)  # each live job's name and `!job NAME|ID|STATE|NODES|REASON`, then each node
    # Slurm has out of service: `!node NAME STATE`
    jobs=$(squeue -h -u "$me" -o '%j|%i|%T|%N|%r') || exit
    printf '%s\n' "$jobs" | while IFS='|' read -r name rest; do
      [ -n "$name" ] && printf '%s\n!job %s|%s\n' "$name" "$name" "$rest"
    done
    sinfo -h -N -o '%N %T' 2>/dev/null | while read -r node st; do
      case ${st,,} in
        *'*'|down*|drain*|fail*|maint*|unknown*|no_respond*) printf '!node %s %s\n' "$node" "$st" ;;
      esac
    done ;;
  new-session)
    name= dir= cmd=
    while [ $# -gt 0 ]; do
      case $1 in
        -d) shift ;;
        -s) name=$2; shift 2 ;;
        -c) dir=$2; shift 2 ;;
        *) cmd=$1; shift ;;
      esac
    done
    case $name in ''|*[!A-Za-z0-9._+-]*) echo "ablate-slurm: bad job name '$name'" >&2; exit 2 ;; esac
    live=$(names) || exit
    if printf '%s\n' "$live" | grep -qxF -- "$name"; then
      echo "duplicate session: $name (a Slurm job of that name is pending or running)" >&2
      exit 1
    fi
    mkdir -p -- "$out" || exit
    script="#!/bin/bash
# ablate queue $name
"
    [ -n "$dir" ] && script+="cd $(printf '%q' "$dir") || exit 1
"
    script+="exec $cmd
"
    printf '%s' "$script" | sbatch --parsable --job-name="$name" --output="$out/$name.out" \
          --open-mode=append --chdir="$out" "${opts[@]}"
    ;;
  kill-session)
    [ "$1" = -t ] && shift
    name=${1#=}
    scancel -u "$me" --name="$name" || exit
    i=0
    while names | grep -qxF -- "$name"; do
      i=$((i + 1))
      [ "$i" -le $((KILL_WAIT * 5)) ] || { echo "ablate-slurm: job $name still listed" >&2; exit 1; }
      sleep 0.2
    done ;;
  *) echo "ablate-slurm: unknown verb $verb" >&2; exit 2 ;;
esac
""".replace("KILL_WAIT", str(KILL_WAIT))


class SlurmHost:
    """`HostTransport` of a Slurm host: `inner` runs the commands (this machine or the login
    node); the queue verbs go to Slurm (module doc)."""

    def __init__(self, name: str, inner: HostTransport, settings: SlurmSettings, out_dir: str) -> None:
        self.name = name
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
        return ["bash", "-c", SESSIONS, "ablate-slurm", self.out_dir, str(len(opts)), *opts]

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
