"""The ssh transport: hosts reached with Fabric/Paramiko, the shared FS through a host that mounts it.

Aliases resolve through the user's ssh config (`ssh_config:` in ablate.yaml, else ~/.ssh/config):
HostName, Port, User, IdentityFile, IdentitiesOnly, ProxyJump (each hop checked like the target),
ProxyCommand, ConnectTimeout, UserKnownHostsFile, GlobalKnownHostsFile, StrictHostKeyChecking.
Host keys are never trusted blindly: an unknown key is refused unless the user asked for
`accept-new` (the `--accept-new-host-keys` flag, or StrictHostKeyChecking accept-new/no in the ssh
config), which adds it to the known_hosts file like OpenSSH does; a changed key is always refused.

One connection per host, opened on first use and shared by every operation (and thread) of a
command; a host that cannot be reached fails fast for `retry_after` seconds instead of costing one
connect time-out per operation.

A failed operation on the shared FS (a script that exited non-zero on the host) raises `FSError`
naming the host it went through, the operation, the path, the rc and stderr's tail: the type the
local transport raises for the same failure. A host that cannot be reached is `HostUnreachable`.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import math
import os
import re
import select
import shlex
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import fabric
import paramiko

from ablate.errors import RemoteError
from ablate.transport.base import CommandResult

# fd 3 keeps the channel's stdin for the watcher; the command itself reads /dev/null.
GUARD = ('exec 3<&0 </dev/null; "$@" & p=$!; { read -r _ <&3; kill "$p" 2>/dev/null; } & w=$!; '
         'wait "$p"; rc=$?; kill "$w" 2>/dev/null; exit "$rc"')
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts ~/.ssh/known_hosts2"
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KNOWN_HOSTS_LOCK = threading.Lock()


class Sink(Protocol):
    """Where a streamed stdout goes (a binary file, or one that also counts)."""

    def write(self, data: bytes, /) -> int: ...


class HostUnreachable(RemoteError):
    """The connection could not be opened (nothing was run): another host may serve instead."""


class HostKeyError(RemoteError):
    """The host's key is unknown or changed; never retried through another host silently."""


def fingerprint(key: paramiko.PKey) -> str:
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


class _RefuseUnknown(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]  # paramiko is untyped
    def __init__(self, label: str, alias: str) -> None:
        self.label, self.alias = label, alias

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise HostKeyError(
            f"{self.label}: unknown host key for {hostname} ({fingerprint(key)}); refusing to "
            f"connect. To trust it, run `ssh {self.alias}` once and check the fingerprint, or "
            "pass --accept-new-host-keys")


class _AcceptNew(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]  # paramiko is untyped
    """OpenSSH `accept-new`: record an unknown key in known_hosts (a changed key never gets here)."""

    def __init__(self, known_hosts: str) -> None:
        self.path = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _KNOWN_HOSTS_LOCK:
            os.makedirs(os.path.dirname(self.path) or ".", mode=0o700, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        client.get_host_keys().add(hostname, key.get_name(), key)


def load_ssh_config(path: str | None) -> paramiko.SSHConfig:
    """The user's ssh config: `path` (must exist) or ~/.ssh/config (may be absent)."""
    explicit = path is not None
    full = os.path.expanduser(path or "~/.ssh/config")
    if not os.path.exists(full):
        if explicit:
            raise RemoteError(f"ssh config {path} not found (ssh_config in ablate.yaml)")
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(full)
    except (OSError, ValueError, paramiko.SSHException) as e:
        raise RemoteError(f"ssh config {full}: cannot parse: {e}") from e


class SSHHost:
    """One instance over SSH: runs commands and drives its tmux (HostTransport)."""

    def __init__(self, name: str, alias: str | None = None, *, ssh_config: str | None = None,
                 accept_new: bool = False, connect_timeout: float | None = None,
                 tmux_socket: str | None = None, retry_after: float = 30.0) -> None:
        self.name = name
        self.alias = alias or name
        self.accept_new = accept_new
        self.tmux_socket = tmux_socket  # None: the host's default tmux server (`tmux attach` works)
        self.retry_after = retry_after
        self._sshconf = load_ssh_config(ssh_config)
        self._fabric_config = fabric.Config(ssh_config=self._sshconf, lazy=True)
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._conns: list[fabric.Connection] = []  # the target last, its ProxyJump hops before
        self._failed: tuple[RemoteError, float] | None = None

    def __enter__(self) -> SSHHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SSHHost({self.name!r}, alias={self.alias!r})"

    # ------------------------------------------------------------------ connection

    @property
    def connect_timeout(self) -> float:
        if self._connect_timeout is not None:
            return self._connect_timeout
        return float(self._sshconf.lookup(self.alias).get("connecttimeout", DEFAULT_CONNECT_TIMEOUT))

    def _connection(self, alias: str, gateway: fabric.Connection | None, depth: int) -> fabric.Connection:
        """A fabric Connection for `alias` whose host keys are checked our way, hops included."""
        opts = self._sshconf.lookup(alias)
        gw: fabric.Connection | str | bool = False  # False: fabric must not build its own gateway
        jump = opts.get("proxyjump", "none")
        if gateway is not None:
            gw = gateway
        elif jump.lower() != "none" and depth < 8:
            prev: fabric.Connection | None = None
            for hop in jump.split(","):
                if hop.strip() != alias:  # `Host *` + ProxyJump would otherwise jump through itself
                    prev = self._connection(hop.strip(), prev, depth + 1)
            gw = prev if prev is not None else False
        elif "proxycommand" in opts and opts["proxycommand"].lower() != "none":
            gw = opts["proxycommand"]
        timeout = self.connect_timeout
        kwargs: dict[str, Any] = {"banner_timeout": timeout, "auth_timeout": timeout}
        if opts.get("identitiesonly", "no").lower() == "yes":
            kwargs.update(allow_agent=False, look_for_keys=False)
        conn = fabric.Connection(alias, config=self._fabric_config, gateway=gw,
                                 connect_timeout=max(1, math.ceil(timeout)), connect_kwargs=kwargs)
        user_files = [os.path.expanduser(f) for f in
                      opts.get("userknownhostsfile", DEFAULT_KNOWN_HOSTS).split()]
        client = conn.client
        for f in opts.get("globalknownhostsfile", GLOBAL_KNOWN_HOSTS).split():
            if os.path.isfile(f):
                client.load_system_host_keys(f)
        for f in user_files:
            if os.path.isfile(f):
                client.load_host_keys(f)
        strict = opts.get("stricthostkeychecking", "ask").lower()
        if self.accept_new or strict in ("accept-new", "no", "off"):
            client.set_missing_host_key_policy(_AcceptNew(user_files[0]))
        else:
            client.set_missing_host_key_policy(_RefuseUnknown(self.name, alias))
        self._conns.append(conn)
        return conn

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            if self._conns and self._conns[-1].is_connected:
                return self._conns[-1].client.get_transport()
            if self._failed and time.monotonic() < self._failed[1]:
                raise self._failed[0]
            self._close_conns()
            try:
                conn = self._connection(self.alias, None, 0)
                conn.open()
            except Exception as e:
                err = self._explain(e)
                self._close_conns()
                self._failed = (err, time.monotonic() + self.retry_after)
                raise err from e
            self._failed = None
            transport = conn.client.get_transport()
            transport.set_keepalive(15)
            return transport

    def _explain(self, e: Exception) -> RemoteError:
        if isinstance(e, RemoteError):
            return e
        opts = self._sshconf.lookup(self.alias)
        where = f"{self.name} ({opts.get('user', '')}@{opts.get('hostname', self.alias)}:" \
                f"{opts.get('port', 22)})".replace("(@", "(")
        if isinstance(e, paramiko.BadHostKeyException):
            files = opts.get("userknownhostsfile", "~/.ssh/known_hosts").split()[0]
            return HostKeyError(
                f"{self.name}: the host key of {e.hostname} CHANGED (now {fingerprint(e.key)}, "
                f"known_hosts has {fingerprint(e.expected_key)}); refusing to connect. If the "
                f"instance was re-created, remove the old key with `ssh-keygen -R {e.hostname} -f "
                f"{files}`, then run `ssh {self.alias}` once and check the fingerprint")
        if isinstance(e, paramiko.AuthenticationException):
            return HostUnreachable(f"{where}: authentication failed ({e}); check IdentityFile / "
                                   "the ssh agent for this host")
        if isinstance(e, TimeoutError):
            return HostUnreachable(f"{where}: no answer within the {self.connect_timeout:g}s "
                                   "connect time-out (host down or network unreachable)")
        return HostUnreachable(f"{where}: cannot connect: {type(e).__name__}: {e}".rstrip(": "))

    def _close_conns(self) -> None:
        for conn in reversed(self._conns):
            # closing a half-open connection may raise anything; it is gone either way
            with contextlib.suppress(Exception):
                conn.close()
        self._conns = []

    def close(self) -> None:
        with self._lock:
            self._close_conns()
            self._failed = None

    # ------------------------------------------------------------------ commands

    def exec(self, command: str, *, timeout: float = 60.0, stdin: bytes | None = None,
             sink: Sink | None = None) -> tuple[int, bytes, bytes]:
        """Run one remote shell command line; (rc, stdout, stderr). rc 124 on time-out.

        With `sink`, stdout is streamed into it (and returned empty) and `timeout` counts from the
        last data received, so a long transfer that keeps moving never times out."""
        transport = self._transport()
        deadline = time.monotonic() + timeout
        try:
            chan = transport.open_session(timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as e:
            self.close()  # the next operation reconnects (and fails fast if that fails)
            raise HostUnreachable(f"{self.name}: the open connection did not answer within "
                                  f"{timeout:g}s ({e or type(e).__name__}); nothing was run") from e
        out: list[bytes] = []
        err: list[bytes] = []
        with chan:
            chan.settimeout(max(0.1, timeout))
            chan.exec_command(command)
            if stdin:
                # the command may exit without reading all of it; its rc tells
                with contextlib.suppress(OSError, paramiko.SSHException):
                    chan.sendall(stdin)
            chan.shutdown_write()
            while True:
                got = False
                while chan.recv_ready():
                    chunk = chan.recv(1 << 16)
                    if sink is None:
                        out.append(chunk)
                    else:
                        sink.write(chunk)
                        deadline = time.monotonic() + timeout
                    got = True
                while chan.recv_stderr_ready():
                    err.append(chan.recv_stderr(1 << 16))
                    got = True
                # sshd may send the exit status before the last output: wait for EOF as well.
                if ((chan.eof_received or chan.closed) and chan.exit_status_ready() and not chan.recv_ready()
                        and not chan.recv_stderr_ready()):
                    break
                if not transport.is_active():
                    self.close()
                    raise RemoteError(f"{self.name}: the connection dropped while running "
                                      f"`{command[:200]}`")
                left = deadline - time.monotonic()
                if left <= 0:
                    return 124, b"".join(out), b"".join(err) + f"timed out after {timeout}s".encode()
                if not got:
                    select.select([chan], [], [], min(0.05, left))
            rc = chan.recv_exit_status()
        return (255 if rc < 0 else rc), b"".join(out), b"".join(err)

    def open_channel(self, command: str, *, timeout: float = 60.0) -> paramiko.Channel:
        """Start one remote shell command line and hand back its channel, still open: the
        command lives until the channel closes (or the connection drops). The caller reads it."""
        transport = self._transport()
        try:
            chan = transport.open_session(timeout=timeout)
            chan.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as e:
            self.close()
            raise HostUnreachable(f"{self.name}: the open connection did not answer within "
                                  f"{timeout:g}s ({e or type(e).__name__}); nothing was run") from e
        return chan

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
        Closing an SSH channel does not end the remote command (no pty, no signal): a `tail -F`
        would linger until it next wrote. So the command runs under GUARD, which ends it when the
        channel's stdin reaches EOF: when we stop (`shutdown_write`) and when the connection closes."""
        if not argv:
            raise ValueError("stream: empty argv")
        chan = self.open_channel(shlex.join(["bash", "-c", GUARD, "bash", *argv]), timeout=open_timeout)
        transport = chan.get_transport()
        asked = time.monotonic()
        with chan:
            chan.settimeout(max(0.1, poll))
            while True:
                got = False
                while chan.recv_ready():
                    on_stdout(chan.recv(1 << 16))
                    got = True
                while chan.recv_stderr_ready():
                    chan.recv_stderr(1 << 16)  # tail's "file truncated" chatter: not the log
                    got = True
                if ((chan.eof_received or chan.closed) and chan.exit_status_ready()
                        and not chan.recv_ready() and not chan.recv_stderr_ready()):
                    rc = chan.recv_exit_status()
                    return 255 if rc < 0 else rc
                if not transport.is_active():
                    self.close()
                    raise RemoteError(f"{self.name}: the connection dropped while running `{argv[0]} …`")
                if stop is not None and time.monotonic() - asked >= poll:
                    asked = time.monotonic()
                    if stop():
                        with contextlib.suppress(OSError, paramiko.SSHException):
                            chan.shutdown_write()  # EOF on the guard's fd 3: it kills the command
                        return None
                if not got:
                    select.select([chan], [], [], min(0.1, poll))

    # ------------------------------------------------------------------ tmux

    def _tmux(self, *args: str) -> list[str]:
        return ["tmux", *(["-L", self.tmux_socket] if self.tmux_socket else []), *args]

    def tmux_start(self, session: str, argv: Sequence[str], env: Mapping[str, str],
                   cwd: str | None = None) -> None:
        bad = [k for k in env if not _ENV_NAME.match(k)]
        if bad:
            raise RemoteError(f"{self.name}: invalid environment variable names {bad}")
        # tmux hands the command string to a shell: quote it as a whole too.
        command = shlex.join(["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else argv)
        self.run(self._tmux("new-session", "-d", "-s", session,
                            *(["-c", cwd] if cwd else []), command)).check()

    def tmux_sessions(self) -> set[str]:
        r = self.run(self._tmux("list-sessions", "-F", "#{session_name}"))
        if r.rc != 0:
            if re.search(r"no server running|error connecting|No such file", r.stderr):
                return set()
            r.check()
        return {line for line in r.stdout.splitlines() if line}

    def tmux_kill(self, session: str) -> None:
        self.run(self._tmux("kill-session", "-t", f"={session}"))  # `=`: exact name, no prefix match


# --------------------------------------------------------------------------- the shared FS
