"""A queue runs in the environment of the connection that launched it, not its tmux server's.

A new tmux session starts from its server's global environment: the environment of whichever
client started the server, hours or weeks earlier, through whichever connection (another alias,
another sshd with its own `SetEnv`, a login node's PAM environment, an earlier `ablate` with other
settings). So a queue launched through one connection would run with another's. ablate passes the
launching command's whole environment instead, as `ssh ALIAS CMD` over that connection sees it
(sshd's `SetEnv`/`AcceptEnv`, `authorized_keys` `environment=`, PAM, the login shell's rc files; the
host agent's for a command it runs, which is the same session's: ablate/transport/agentlink.py):

1. the launching command writes it, `env -0`, to a file of its own in a private directory
   (`/tmp/ablate-env-<uid>/`, 0700, the file 0600, never on the shared FS), named by the controller;
2. the session's command is `bash -c LOAD ablate-env NAME COMMAND...`: it reads the file, removes
   it, unsets every variable the pane got from the server, exports exactly those of the file (whose
   names are shell identifiers: bash passes no other), keeps what tmux sets in every pane (`TMUX`,
   `TMUX_PANE`, `TERM`), and execs the queue. A file that is gone (the start raced a /tmp cleaner) starts
   nothing: the pane says why, exit 2, and `status` shows the queue not live.

Values never reach a command line (`ps` shows every process's argv to every user). Slurm's queues
do not need it: `sbatch` exports the submitting command's environment to the job itself.
Stdlib only: the store's instance boot ships it (ablate/remote/store/instance_boot.py).
"""

from __future__ import annotations

import os
import secrets
import shlex
from collections.abc import Mapping, Sequence

DIR_PREFIX = "/tmp/ablate-env-"  # + the uid on the host: one private directory per user

# sh -c CAPTURE sh NAME COMMAND...: write this command's environment to the user's private
# directory under NAME (refused when it exists), run COMMAND, remove the file when COMMAND fails.
CAPTURE = r'''f=$1; shift
d=/tmp/ablate-env-$(id -u)
umask 077
if ! { mkdir -p -- "$d" 2>/dev/null; [ -d "$d" ] && [ ! -h "$d" ] && [ -O "$d" ] && chmod 700 -- "$d"; }; then
  echo "ablate: $d is not a private directory of $(id -un): remove it and launch again" >&2
  exit 1
fi
f=$d/$f
( set -C; env -0 >"$f" ) || { echo "ablate: cannot write the queue's environment to $f" >&2; exit 1; }
"$@"
rc=$?
[ "$rc" = 0 ] || rm -f -- "$f"
exit "$rc"
'''

# bash -c LOAD ablate-env NAME COMMAND...: the session's first step (see the module's docstring).
# Not `env -i NAME=VALUE...`: that would put every value on a command line for a moment.
LOAD = r'''f=/tmp/ablate-env-$(id -u)/$1; shift
if ! mapfile -d '' -t e 2>/dev/null <"$f"; then
  echo "ablate: the launch's environment file $f is gone; nothing started: launch this queue again" >&2
  exit 2
fi
rm -f -- "$f"
pane=$(declare -p TMUX TMUX_PANE TERM 2>/dev/null)
for n in $(compgen -e); do unset -v "$n" 2>/dev/null; done
for kv in "${e[@]}"; do [[ ${kv%%=*} =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] && export "$kv"; done
eval "$pane"
exec "$@"
'''


def new_name(session: str) -> str:
    """The file's name for one start of `session` (a safe path component: checked by the caller's
    session names), unique to this start."""
    return f"{session}.{secrets.token_hex(8)}.env"


def session_command(name: str, argv: Sequence[str]) -> str:
    """The shell command tmux's new session runs: `argv` in the environment saved under `name`."""
    return shlex.join(["bash", "-c", LOAD, "ablate-env", name, *argv])


def captured(name: str, argv: Sequence[str]) -> list[str]:
    """`argv` (a tmux new-session) run on the host after it saved its environment under `name`."""
    return ["sh", "-c", CAPTURE, "sh", name, *argv]


def write_here(name: str, env: Mapping[bytes, bytes]) -> str:
    """Save `env` under `name` in this host's private directory, as CAPTURE does (the caller runs on
    the host: the store's boot program, with `os.environb`); the file's path."""
    d = f"{DIR_PREFIX}{os.getuid()}"
    os.makedirs(d, mode=0o700, exist_ok=True)
    st = os.lstat(d)
    if not os.path.isdir(d) or os.path.islink(d) or st.st_uid != os.getuid():
        raise OSError(f"{d} is not a private directory of this user: remove it and launch again")
    os.chmod(d, 0o700)
    path = os.path.join(d, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(b"".join(k + b"=" + v + b"\0" for k, v in env.items()))
    return path
