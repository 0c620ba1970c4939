"""What both SSH clients share: a host reached through a remote login shell.

`ShellHost` turns the two primitives a client provides — `exec` (run one shell command line to its
end) and `open_live` (start one and hand back the running command) — into the `HostTransport`
operations: argv runs, streamed commands, tmux. The OpenSSH client (`ssh.py`, the default) and the
paramiko fallback (`paramiko_ssh.py`) implement only the primitives, so both quote, stream and
drive tmux the same way and raise the same errors.
"""

from __future__ import annotations

import re
import shlex
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ablate.errors import AblateError, RemoteError
from ablate.transport.base import CommandResult

# How our scripts run on a host: bash as an interpreter, never the user's rc file again. A login shell
# that ends its command line with `bash -c …` execs it with SHLVL lowered, and bash then takes itself
# for the top-level shell sshd ran and sources ~/.bashrc a second time (conda or pyenv init: 0.1-0.5 s
# of CPU each); the environment the login shell set up is inherited all the same.
BASH_C = ("bash", "--norc", "-c")
# fd 3 keeps the session's stdin for the watcher; the command itself reads /dev/null. Closing our
# end (EOF on fd 3) ends the command: a remote command gets no signal when its session closes.
GUARD = ('exec 3<&0 </dev/null; "$@" & p=$!; { read -r _ <&3; kill "$p" 2>/dev/null; } & w=$!; '
         'wait "$p"; rc=$?; kill "$w" 2>/dev/null; exit "$rc"')
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# what `tmux list-sessions` says when no tmux server runs there: nothing runs, not a failure
NO_TMUX_SERVER = re.compile(r"no server running|error connecting|No such file")
# `tmux list-sessions` ("$@": the host's tmux command line), output and errors on stdout, its rc;
# asked again once when the server was exiting as it answered (its last session had just ended:
# "server exited unexpectedly"), which the second asking finds gone, or a new one up
LIST_SESSIONS = ("o=$(\"$@\" list-sessions -F '#{session_name}' 2>&1); r=$?; "
                 "case $o in *'server exited unexpectedly'*) sleep 0.2; "
                 "o=$(\"$@\" list-sessions -F '#{session_name}' 2>&1); r=$? ;; esac; "
                 "[ -z \"$o\" ] || printf '%s\\n' \"$o\"; exit $r")


class HostUnreachable(RemoteError):
    """The connection could not be opened or did not answer: another host may serve instead."""


class HostKeyError(RemoteError):
    """The host's key is unknown, changed or revoked; never retried through another host silently."""


class AuthFailed(RemoteError):
    """The host answered but refused every credential offered (keys, agent, certificates)."""


class SSHConfigError(RemoteError):
    """The ssh client rejected the user's ssh config (a bad option, an unreadable Include)."""

    exit_code = AblateError.exit_code  # bad input: exit 2


class Sink(Protocol):
    """Where a streamed stdout goes (a binary file, or one that also counts)."""

    def write(self, data: bytes, /) -> int: ...


class Live(Protocol):
    """A command started on a host and still running: read it, end its stdin, wait for it."""

    def read(self, timeout: float) -> tuple[bytes, bytes]:
        """Whatever stdout and stderr produced within `timeout` seconds (both empty: nothing yet,
        or both streams at their end)."""
        ...

    def exit_status(self) -> int | None:
        """Its rc once it has exited and both streams are drained, else None."""
        ...

    def shutdown_write(self) -> None:
        """EOF on the command's stdin."""
        ...

    @abstractmethod
    def close(self) -> None:
        ...


def env_command(host: str, env: Mapping[str, str], argv: Sequence[str]) -> str:
    """One shell command string running argv with env (tmux and sbatch hand it to a shell: each
    word quoted); names that are not environment variable names are refused."""
    bad = [k for k in env if not _ENV_NAME.match(k)]
    if bad:
        raise RemoteError(f"{host}: invalid environment variable names {bad}")
    return shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else argv)


class ShellHost(ABC):
    """A host whose commands run through its user's login shell (HostTransport, minus the client)."""

    name: str
    tmux_socket: str | None

    # ------------------------------------------------------------------ the client's primitives

    @abstractmethod
    def exec(self, command: str, *, timeout: float = 60.0, stdin: bytes | None = None,
             sink: Sink | None = None, py: Mapping[str, Any] | None = None) -> tuple[int, bytes, bytes]:
        """Run one remote shell command line; (rc, stdout, stderr); rc 124 on time-out. With
        `sink`, stdout goes there as it arrives (returned empty) and `timeout` counts from the last
        data received, so a long transfer that keeps moving never times out. `py`: the stdlib-only
        Python entry `command` starts (`ablate.remote.host.agent`), which a host agent may run in its
        own interpreter instead, with the same output and exit code; other clients ignore it."""
        raise NotImplementedError

    @abstractmethod
    def open_live(self, command: str, *, timeout: float = 60.0) -> Live:
        """Start one remote shell command line and hand it back running (HostUnreachable when
        the host cannot be reached within `timeout`)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def agent_ready(self) -> bool:
        """Whether a command now would likely go to a host agent, not through a login shell (one
        answered or started recently): then two small commands cost less than one shell."""
        return False

    def agent_runs(self, python: str) -> bool:
        """Whether a request's `py` form for interpreter `python` would likely run inside a host
        agent now (`agent_ready`, and the agent runs on that interpreter)."""
        return False

    def agent_on_first(self) -> bool:
        """Whether this process's next command here starts the host agent (or waits for the one
        starting it), none being known to serve yet: after it, `agent_ready`."""
        return False

    @abstractmethod
    def target(self) -> str:
        """The host name the client connects to (HostName after the ssh config)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ HostTransport

    def run(self, argv: Sequence[str], *, timeout: float = 60.0,
            stdin: bytes | None = None) -> CommandResult:
        if not argv:
            raise ValueError("run: empty argv")
        # Every element is one literal word for the remote login shell, never interpreted.
        rc, out, err = self.exec(shlex.join(argv), timeout=timeout, stdin=stdin)
        return CommandResult(self.name, tuple(argv), rc,
                             out.decode(errors="replace"), err.decode(errors="replace"))

    def stream(self, argv: Sequence[str], on_stdout: Callable[[bytes], None], *,
               stop: Callable[[], bool] | None = None, poll: float = 0.5,
               open_timeout: float = 30.0) -> int | None:
        """A long-running remote command whose stdout is handed over as it arrives (`logs -f`).
        It runs under GUARD, which ends it when its stdin reaches EOF: when we stop and when the
        connection closes. stderr (tail's "file truncated" chatter) is not the log: dropped."""
        if not argv:
            raise ValueError("stream: empty argv")
        live = self.open_live(shlex.join([*BASH_C, GUARD, "bash", *argv]), timeout=open_timeout)
        asked = time.monotonic()
        try:
            while True:
                out, _ = live.read(min(0.1, poll))
                if out:
                    on_stdout(out)
                rc = live.exit_status()
                if rc is not None:
                    return rc
                if stop is not None and time.monotonic() - asked >= poll:
                    asked = time.monotonic()
                    if stop():
                        live.shutdown_write()  # EOF on the guard's fd 3: it kills the command
                        return None
        finally:
            live.close()

    def _tmux(self, *args: str) -> list[str]:
        return ["tmux", *(["-L", self.tmux_socket] if self.tmux_socket else []), *args]

    def tmux_argv(self) -> list[str]:
        return self._tmux()

    def tmux_start(self, session: str, argv: Sequence[str], env: Mapping[str, str],
                   cwd: str | None = None) -> None:
        command = env_command(self.name, env, argv)
        self.run(self._tmux("new-session", "-d", "-s", session,
                            *(["-c", cwd] if cwd else []), command)).check()

    def tmux_sessions(self) -> set[str]:
        r = self.run(["sh", "-c", LIST_SESSIONS, "sh", *self._tmux()])
        if r.rc != 0:
            if NO_TMUX_SERVER.search(r.stdout + r.stderr):
                return set()
            r.check()
        return {line for line in r.stdout.splitlines() if line}

    def tmux_kill(self, session: str) -> None:
        self.run(self._tmux("kill-session", "-t", f"={session}"))  # `=`: exact name, no prefix match
