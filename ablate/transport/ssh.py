"""The ssh transport: OpenSSH's own client, so a host is reached exactly as `ssh -F <cfg> <alias>`
would reach it — Include, Match, ProxyJump, ProxyCommand, HostKeyAlias, certificates, security
keys, the agent, hashed and marked known_hosts are OpenSSH's to honour, not ours to re-implement.

What ablate adds on top, always on the command line (which wins over any config file):
- `BatchMode=yes` and no controlling terminal: nothing ever prompts.
- Host keys: `StrictHostKeyChecking=yes`, or `accept-new` when the user asked for it (the
  `--accept-new-host-keys` flag, or `accept-new` / `no` in their config). A changed key is refused
  whatever the config says; a `@revoked` key always is; a new key is recorded by OpenSSH itself
  (under HostKeyAlias, hashed when HashKnownHosts says so).
- One connection per host, shared by every command of this process and of the next ones: a
  ControlMaster socket (`ControlPersist`, `ABLATE_SSH_PERSIST` seconds, default 120) under a private
  directory (`ABLATE_SSH_CONTROL_DIR`, default `$XDG_RUNTIME_DIR/ablate-ssh` or
  `/tmp/ablate-ssh-<uid>`), one per alias and resolved config (`ssh -G`). A master this process
  did not start is not trusted until a command has started through it: if it cannot carry the
  request at all (its host rebooted: the request met a reset), it is replaced and the command sent
  again, once; if it stays silent for the connect time-out (at least 3 s; link dropped), the host is
  unreachable and the master ended: one time-out, never two. Its keep-alives end a master over a
  dead link on their own within about 15 s.
- Every command first prints a marker on stderr, so "the command started" is known: a failure
  before it is the connection's (classified from ssh's own message: host key, authentication,
  config, unreachable), and "nothing was run" is then true.
- A host that cannot be reached fails fast for `retry_after` seconds: one connect time-out per
  command, not one per operation.
- The host agent (`ablate.remote.host.agent`, `agentlink.py`): the first command of a process on a host
  where none is known to serve starts it there, just before the command; the master forwards a local
  socket beside its own to it, and later commands (of this process and the next ones) go to it as
  one request over the open connection, with no session and no login shell per command. Where it
  cannot run (no Python there, forwarding refused by sshd, `ABLATE_SSH_AGENT=0`,
  `ABLATE_SSH_PERSIST=0`) commands go the usual way; nothing is sent to it before it said hello, so
  nothing runs twice. One that takes the connection and never says hello (stopped, hung) while a
  session the usual way starts is gone around (`sshagent.py`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ablate.errors import AblateError, RemoteError
from ablate.transport.agentlink import (
    Marks,
    forward_args,
    open_live,
    request,
)
from ablate.transport.shellhost import (
    AuthFailed,
    HostKeyError,
    HostUnreachable,
    Live,
    ShellHost,
    Sink,
    SSHConfigError,
)
from ablate.transport.sshagent import AgentRoute
from ablate.transport.sshconfig import Resolved
from ablate.transport.sshproc import (
    DROPPED,
    MARK,
    MARK_CMD,
    MASTER_FAILED,
    TIMED_OUT,
    ProcLive,
    control_dir,
    explain,
    last_lines,
    persist_seconds,
    which,
)
from ablate.util import timings

__all__ = ["AuthFailed", "HostKeyError", "HostUnreachable", "SSHConfigError", "SSHHost", "Sink",
           "control_dir"]

R = TypeVar("R")


class SSHHost(Resolved, AgentRoute, ShellHost):
    """One instance through OpenSSH's client (HostTransport)."""

    def __init__(self, name: str, alias: str | None = None, *, ssh_config: str | None = None,
                 accept_new: bool = False, connect_timeout: float | None = None,
                 tmux_socket: str | None = None, retry_after: float = 30.0,
                 ssh: str | None = None, python: str = "python3") -> None:
        self.name = name
        self.alias = alias or name
        if self.alias.startswith("-") or not self.alias.strip() or any(c.isspace() for c in self.alias):
            raise AblateError(f"host {name}: ssh alias {self.alias!r} is not a host name; give the "
                              "alias of a Host entry in your ssh config")
        self.accept_new = accept_new
        self.tmux_socket = tmux_socket  # None: the host's default tmux server (`tmux attach` works)
        self.retry_after = retry_after
        self.ssh_config = os.path.expanduser(ssh_config) if ssh_config else None
        if self.ssh_config and not os.path.exists(self.ssh_config):
            raise SSHConfigError(f"ssh config {ssh_config} not found (ssh_config in ablate.yaml)")
        self.ssh = ssh or which("ssh") or "ssh"
        self._connect_timeout = connect_timeout
        self.multiplex = os.name != "nt"  # Windows' OpenSSH has no ControlMaster
        self._lock = threading.Lock()
        self._opts_lock = threading.Lock()
        self._opts: dict[str, str] | None = None
        self._ready = False  # the master (or a direct connection) answered in this process
        self._kept = False  # the master was left by an earlier command: trusted once a command starts
        self._failed: tuple[RemoteError, float] | None = None
        self._sock: str | None = None
        self._resolved = b""  # `ssh -G`'s output: what the connection is made of
        self.python = python  # the host's interpreter, for the agent
        self._agent_up = False  # the agent answered in this process
        self._agent_booted = False  # this process tried to start it (before one of its commands)
        self._booting = threading.Event()  # set once that command started (the agent's news is in)
        self._booting.set()
        self._closed = False  # its command ended: a thread left over (connect_ahead) ends no master
        self._warm_lock = threading.Lock()
        self._warming = False  # `warm_ahead` started its thread: a second call starts none

    def __enter__(self) -> SSHHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SSHHost({self.name!r}, alias={self.alias!r})"

    def _base(self) -> list[str]:
        """The ssh command line up to the options every use shares (config, batch, host keys)."""
        strict = self.options().get("stricthostkeychecking", "ask").lower()
        accept = self.accept_new or strict in ("accept-new", "false", "no", "off")
        if accept:  # OpenSSH records a new key in the first file, but creates no directory for it
            first = (self.options().get("userknownhostsfile") or "~/.ssh/known_hosts").split()[0]
            with contextlib.suppress(OSError):
                os.makedirs(os.path.dirname(os.path.expanduser(first)) or ".", mode=0o700, exist_ok=True)
        argv = [self.ssh, *self._config_args(), "-o", "BatchMode=yes",
                "-o", f"StrictHostKeyChecking={'accept-new' if accept else 'yes'}",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
        if self._connect_timeout is not None or self.options().get("connecttimeout", "none") == "none":
            argv += ["-o", f"ConnectTimeout={max(1, round(self.connect_timeout))}"]
        return argv

    def _socket(self) -> str:
        """One socket per alias and per everything OpenSSH resolved for it: a changed config
        (HostName, Port, ProxyCommand, keys...) is a new connection, never an old one reused."""
        if self._sock is None:
            self.options()
            tag = hashlib.sha256(self.alias.encode() + b"\0" + self._resolved).hexdigest()[:20]
            self._sock = os.path.join(control_dir(), tag)
        return self._sock

    # ------------------------------------------------------------------ the connection

    def _ensure(self) -> None:
        """A connection this process may use: a verified master, or (no multiplexing) the
        knowledge that the host answers. Raises the classified failure (cached for unreachable)."""
        with self._lock:
            if self._ready and (not self.multiplex or os.path.exists(self._socket())):
                return
            if self._failed and time.monotonic() < self._failed[1]:
                raise self._failed[0]
            try:
                if self.multiplex:
                    self._master()
                else:
                    self._probe_direct()
            except HostUnreachable as e:
                self._failed = (e, time.monotonic() + self.retry_after)
                raise
            self._failed = None
            self._ready = True

    def warm(self) -> None:
        """Connect now, ahead of the first command (`transport.connect_ahead`): the master, and the
        agent (a `true` to it, or, where this process would start it, the `true` that does: the one
        login shell the first command would take, which then goes to the agent). Nothing where a
        master's socket is there and an agent is known to serve behind it."""
        link = self._agent_link()
        if self.multiplex and os.path.exists(self._socket()) and (link is None or self.agent_ready()):
            return  # a master and an agent there already: the first command finds them
        if link is not None and not Marks(link[0]).refused():
            self.run(["true"], timeout=self.connect_timeout * 3 + 5)
        else:  # no agent can serve there: its first command is a login shell either way
            self._ensure()

    def warm_ahead(self) -> threading.Thread | None:
        """`warm` in a daemon thread, once per host object however often it is asked (`launch
        --all` asks as the project loads and again as its pipeline starts): the thread it started,
        or None. Its failure is left for the first command to meet and report."""
        with self._warm_lock:
            if self._warming:
                return None
            self._warming = True
        t = threading.Thread(target=self._warm_quietly, daemon=True)
        t.start()
        return t

    def _warm_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self.warm()

    def cold_check(self) -> None:
        """Connect as a command would with no kept master: a new connection of its own (no
        ControlMaster, no host agent), so OpenSSH checks the host key against known_hosts and the
        user authenticates now. Raises the classified failure (host key, authentication, config,
        unreachable); the master, if one lives, is left alone for the commands that reuse it."""
        argv = [*self._base(), "-T", "-o", "ControlMaster=no", "-o", "ControlPath=none", "--", self.alias,
                MARK_CMD + "true"]
        try:
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=self.connect_timeout * 3 + 5, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise HostUnreachable(f"{self._where()}: no answer within the {self.connect_timeout:g}s "
                                  "connect time-out (host down or network unreachable)") from None
        except OSError as e:
            raise RemoteError(f"{self.name}: cannot run the ssh client {self.ssh!r}: {e}") from e
        err = r.stderr.decode(errors="replace")
        early, marked, _ = err.partition(MARK.decode())
        if not marked:
            raise self._explain(early or f"ssh exited {r.returncode} without a word")
        if r.returncode != 0:
            raise HostUnreachable(f"{self._where()}: `true` did not succeed there (rc {r.returncode})")

    def _probe_direct(self) -> None:
        live = self._spawn([*self._base(), "-T", "-o", "ControlPath=none", "--", self.alias,
                            MARK_CMD + "true"])
        try:
            rc = self._wait(live, self.connect_timeout * 3 + 5, None, None)
        finally:
            live.close()
        if rc != 0:
            raise HostUnreachable(f"{self._where()}: `true` did not succeed there (rc {rc})")

    def _master(self) -> None:
        sock = self._socket()
        with open(f"{sock}.lock", "a") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)  # one master per socket, across ablate processes
            if os.path.exists(sock):  # a master left by an earlier command: its link is unproven
                self._kept = True
                return
            persist = persist_seconds()
            link = self._agent_link()
            argv = [*self._base(), "-o", "ControlMaster=yes", "-o", f"ControlPath={sock}",
                    "-o", f"ControlPersist={persist if persist else 'yes'}",
                    *(forward_args(*link) if link else []), "-N", "-f", "--", self.alias]
            with tempfile.TemporaryFile() as errf:
                try:
                    # -f: back to us once authenticated, the master in the background. stderr to
                    # a file: the master keeps no pipe of ours open.
                    rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=errf, timeout=self.connect_timeout * 3 + 5,
                                        start_new_session=True).returncode
                except subprocess.TimeoutExpired:
                    raise HostUnreachable(f"{self._where()}: no answer within the "
                                          f"{self.connect_timeout:g}s connect time-out (host down "
                                          "or network unreachable)") from None
                errf.seek(0)
                err = errf.read().decode(errors="replace")
            if rc != 0 or not os.path.exists(sock):
                raise self._explain(err or f"ssh exited {rc} without a word")
            self._kept = False

    def master_pid(self) -> int | None:
        """The pid of the ControlMaster this host's commands go through (None: none runs)."""
        r = self._ctl("check")
        got = re.search(rb"pid=(\d+)", r.stderr) if r is not None and r.returncode == 0 else None
        return int(got.group(1)) if got else None

    def _ctl(self, op: str) -> subprocess.CompletedProcess[bytes] | None:
        """`ssh -O op` on our socket (local to this machine: check, exit); None when ssh failed to run."""
        try:
            return subprocess.run([self.ssh, *self._config_args(), "-o", f"ControlPath={self._socket()}",
                                   "-O", op, "--", self.alias], capture_output=True, timeout=10,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
        except (OSError, subprocess.TimeoutExpired):
            return None

    def _explain(self, err: str) -> RemoteError:
        """Classify a connection failure from ssh's own words (`sshproc.explain`)."""
        return explain(err, self.name, self._where(), self._hint_ssh(), self._hint_ssh(ask=True),
                       self.connect_timeout)

    def _stale_socket(self) -> None:
        """A socket file with no master behind it (a master killed hard): removed, so that the
        next command of this process starts a master again."""
        with self._lock:
            self._ready = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._socket())

    def _forget_master(self) -> None:
        """A kept master failed at once (its host rebooted: the first packet met a reset, so the
        request reached no sshd): replace it; the command is then sent again, once."""
        with self._lock:
            self._drop_master()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._socket())

    def _drop_master(self) -> None:
        """The master stopped answering: end it so the next operation connects afresh. Not once this
        object is closed: what a thread of an ended command saw is no news for the next command,
        whose host object uses the same master."""
        self._ready = False
        if self.multiplex and not self._closed:
            self._ctl("exit")

    def disconnect(self) -> None:
        """End the shared connection (the ControlMaster) now, for every process that uses it. `-O
        exit` only asks: the master removes its socket a moment later, so this waits for that (at
        most 5 s), or the next connection would take the dying master for a kept one."""
        with self._lock:
            self._ready = False
            if self.multiplex:
                self._ctl("exit")
                deadline = time.monotonic() + 5.0
                while os.path.exists(self._socket()) and time.monotonic() < deadline:
                    time.sleep(0.02)

    def close(self) -> None:
        """End of a command: the master stays for the next one (unless ABLATE_SSH_PERSIST=0),
        which trusts it once a command has started through it."""
        with self._lock:
            if self.multiplex and self._ready and persist_seconds() == 0:
                self._ctl("exit")
            self._ready = False
            self._failed = None
            self._closed = True

    # ------------------------------------------------------------------ commands

    def _spawn(self, argv: list[str], stdin: bytes | None = None, keep_stdin: bool = False) -> ProcLive:
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE if stdin is not None or keep_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            raise RemoteError(f"{self.name}: cannot run the ssh client {self.ssh!r}: {e}") from e
        return ProcLive(proc, stdin)

    def _command(self, command: str, pre: str = "") -> list[str]:
        """`pre`: what runs before the start marker (its stderr is the preamble, never the command's)."""
        mux = (["-o", "ControlMaster=no", "-o", f"ControlPath={self._socket()}"] if self.multiplex
               else ["-o", "ControlPath=none"])
        return [*self._base(), "-T", *mux, "--", self.alias, pre + MARK_CMD + command]

    def _start(self, command: str, stdin: bytes | None = None, keep_stdin: bool = False,
               pre: str = "") -> ProcLive:
        self._ensure()
        return self._spawn(self._command(command, pre), stdin, keep_stdin)

    def _wait(self, live: ProcLive, timeout: float, sink: Sink | None,
              parts: tuple[list[bytes], list[bytes]] | None, *, start_only: bool = False,
              on_start: Callable[[bytes], None] | None = None) -> int | None:
        """Pump `live` until it exits (its rc, or `TIMED_OUT`), or until it has started when
        `start_only` (None; stdout read so far stays in `live.pending`). Raises the connection's
        failure when it ends, or does not start in time, before the command started. `on_start`
        gets the preamble once the command started."""
        t0 = time.monotonic()
        # through a live master a command starts within its own time-out (a loaded host may take
        # seconds; a dead link ends the master within ~15 s); a new connection adds the connect
        start_within = timeout if self._ready and self.multiplex else timeout + self.connect_timeout * 2
        kept = self._kept and self.multiplex
        if kept:  # unproven: silence for the connect time-out is the host's (one time-out, no more)
            start_within = min(timeout, max(self.connect_timeout, 3.0))
        deadline = t0 + timeout
        while True:
            out, err = live.read(0.05)
            if out:
                if start_only:
                    live.pending += out
                elif sink is not None:
                    sink.write(out)
                    deadline = time.monotonic() + timeout
                elif parts is not None:
                    parts[0].append(out)
            if err and parts is not None:
                parts[1].append(err)
            if live.started and on_start is not None:
                on_start(live.preamble)
                on_start = None
            if live.started and start_only:
                return None
            if live.started and kept:
                self._proven()  # the kept connection carried a command
                kept = False
                if b"Control socket connect" in live.preamble:  # no master behind the socket: ssh
                    self._stale_socket()  # went direct; the next command starts a new master
            rc = live.exit_status()
            if rc is not None:
                if not live.started:
                    early = live.early.decode(errors="replace")
                    if kept and MASTER_FAILED.search(early):
                        raise _StaleMaster(early)
                    raise self._explain(early or f"ssh exited {rc} before the command started")
                return rc
            now = time.monotonic()
            if not live.started and now - t0 > start_within and kept and not self._kept:
                # another command got through the kept master meanwhile: a busy host, not a dead
                # link; ending the master would cut that command. Wait as on a proven link.
                kept, start_within = False, timeout
            if not live.started and now - t0 > start_within:
                self._drop_master()
                if kept:
                    raise HostUnreachable(f"{self._where()}: no answer within {start_within:g}s on the "
                                          "kept connection (host down or network unreachable)")
                raise HostUnreachable(f"{self.name}: the open connection did not answer within "
                                      f"{start_within:g}s; nothing was run")
            if now > deadline:
                return TIMED_OUT

    def _session_starts(self, within: float) -> None:
        """A session the usual way (`true`) starts through the master within `within` s: its link
        carries. Else `_wait` ends the master and raises HostUnreachable."""
        live = self._start("true")
        try:
            self._wait(live, within, None, None, start_only=True)
        finally:
            live.close()

    def _attempts(self, command: str, stdin: bytes | None, keep_stdin: bool,
                  fn: Callable[[ProcLive], R], pre: str = "") -> R:
        """Start `command` and hand it to `fn` (which closes it or hands it on). A kept master that
        cannot carry the request is replaced and the command sent once more (`_forget_master`)."""
        for attempt in (1, 2):
            live = self._start(command, stdin, keep_stdin, pre)
            try:
                return fn(live)
            except _StaleMaster:
                live.close()
                if attempt == 2:
                    raise
                self._forget_master()
            except BaseException:
                live.close()
                raise
        raise AssertionError("unreachable")

    def exec(self, command: str, *, timeout: float = 60.0, stdin: bytes | None = None,
             sink: Sink | None = None, py: Mapping[str, Any] | None = None) -> tuple[int, bytes, bytes]:
        if py is not None and py.get("python") != self.python:  # not what the agent runs on: as asked
            py = None
        start = time.time()
        try:
            return self._exec(command, timeout, stdin, sink, py)
        finally:
            what = f"probe {py['argv'][0]}" if py is not None and py.get("argv") else command
            timings.trip(self.name, what, start)

    def _exec(self, command: str, timeout: float, stdin: bytes | None, sink: Sink | None,
              py: Mapping[str, Any] | None) -> tuple[int, bytes, bytes]:
        def via_agent() -> tuple[int, bytes, bytes] | None:
            return self._via_agent(command, timeout, lambda local, within, proven: request(
                local, command, timeout=timeout, hello_within=within, stdin=stdin, sink=sink, py=py,
                on_hello=proven))

        got = via_agent()
        if got is not None:
            return got
        boot, got = self._boot_or_wait(timeout, via_agent)
        if got is not None:
            return got
        out: list[bytes] = []
        err: list[bytes] = []

        def to_end(live: ProcLive) -> int | None:
            try:
                return self._wait(live, timeout, sink, (out, err), on_start=self._booted if boot else None)
            finally:
                live.close()

        try:
            rc = self._attempts(command, stdin, False, to_end, pre=boot)
        finally:
            if boot:
                self._booting.set()  # it never started: the others go the usual way
        assert rc is not None
        stderr = b"".join(err)
        if rc == TIMED_OUT:
            return 124, b"".join(out), stderr + f"timed out after {timeout}s".encode()
        if rc == 255 and DROPPED.search(stderr.decode(errors="replace")):
            self._drop_master()
            raise RemoteError(f"{self.name}: the connection dropped while running `{command[:200]}`: "
                              f"{last_lines(stderr.decode(errors='replace'))}")
        return rc, b"".join(out), stderr

    def open_live(self, command: str, *, timeout: float = 60.0) -> Live:
        def via_agent() -> Live | None:
            return self._via_agent(command, timeout, lambda local, within, proven: open_live(
                local, command, hello_within=within, on_hello=proven))

        agent = via_agent()
        if agent is not None:
            return agent
        boot, agent = self._boot_or_wait(timeout, via_agent)
        if agent is not None:
            return agent

        def started(live: ProcLive) -> ProcLive:
            self._wait(live, timeout, None, None, start_only=True, on_start=self._booted if boot else None)
            return live

        try:
            return self._attempts(command, None, True, started, pre=boot)
        finally:
            if boot:
                self._booting.set()


class _StaleMaster(HostUnreachable):
    """A kept ControlMaster that could not carry the request at all (see `_forget_master`)."""
