"""The paramiko fallback: hosts reached with Fabric/Paramiko where no OpenSSH client exists.

The default transport is OpenSSH's own client (`ssh.py`), which reads the user's config exactly.
This one serves where there is none (or when `ABLATE_SSH=paramiko`). Paramiko cannot do all that
OpenSSH does, so what it cannot honour is refused loudly instead of half-done: `Include`, `Match`,
`HostKeyAlias`, `CertificateFile`, security keys, and `@cert-authority` / `@revoked` known_hosts
lines (see `unsupported`). What it honours: HostName, Port, User, IdentityFile, IdentitiesOnly,
ProxyJump (each hop checked like the target), ProxyCommand, ConnectTimeout, UserKnownHostsFile,
GlobalKnownHostsFile, StrictHostKeyChecking. An unknown key is refused unless accept-new; a changed
key always.

One connection per host, opened on first use and shared by every operation (and thread) of a
command; a host that cannot be reached fails fast for `retry_after` seconds.
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
from collections.abc import Mapping
from typing import Any

import fabric
import paramiko

from ablate.errors import RemoteError
from ablate.transport.shellhost import (
    AuthFailed,
    HostKeyError,
    HostUnreachable,
    ShellHost,
    Sink,
    SSHConfigError,
)

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts ~/.ssh/known_hosts2"
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"
_KNOWN_HOSTS_LOCK = threading.Lock()


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


# Keywords paramiko would silently ignore, so a connection would not be the one OpenSSH makes.
UNSUPPORTED = ("include", "hostkeyalias", "certificatefile", "securitykeyprovider",
               "knownhostscommand", "canonicalizehostname", "pkcs11provider")
_NO_OPENSSH = "install OpenSSH's client: ablate uses it whenever `ssh` is on PATH"


def load_ssh_config(path: str | None) -> paramiko.SSHConfig:
    """The user's ssh config: `path` (must exist) or ~/.ssh/config (may be absent). A keyword the
    fallback cannot honour is refused (SSHConfigError), never ignored."""
    explicit = path is not None
    full = os.path.expanduser(path or "~/.ssh/config")
    if not os.path.exists(full):
        if explicit:
            raise SSHConfigError(f"ssh config {path} not found (ssh_config in ablate.yaml)")
        return paramiko.SSHConfig()
    try:
        with open(full, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for n, line in enumerate(text.splitlines(), 1):
            word = re.split(r"[\s=]+", line.strip(), maxsplit=1)[0].lower()
            if word in UNSUPPORTED:
                raise SSHConfigError(f"ssh config {full}:{n}: `{line.strip()}` is not understood by the "
                                     f"paramiko fallback and would be ignored; {_NO_OPENSSH}")
        return paramiko.SSHConfig.from_text(text)
    except (OSError, ValueError, paramiko.SSHException) as e:
        raise SSHConfigError(f"ssh config {full}: cannot parse: {e}") from e


def load_known_hosts(keys: paramiko.HostKeys, path: str) -> None:
    """Add `path`'s entries to `keys`. `@cert-authority` lines are skipped (host certificates
    need OpenSSH); an `@revoked` line is refused: the fallback cannot honour a revocation."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("@revoked"):
                raise HostKeyError(f"{path}:{n} revokes a host key, which the paramiko fallback "
                                   f"cannot check; {_NO_OPENSSH}")
            if line.startswith("@"):
                continue
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, n)
            if entry is not None:
                for name in entry.hostnames:
                    keys.add(name, entry.key.get_name(), entry.key)


class ParamikoHost(ShellHost):
    """One instance over SSH through paramiko (HostTransport)."""

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

    def __enter__(self) -> ParamikoHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ParamikoHost({self.name!r}, alias={self.alias!r})"

    # ------------------------------------------------------------------ connection

    def target(self) -> str:
        return str(self._sshconf.lookup(self.alias).get("hostname", self.alias.rpartition("@")[2]))

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
        # OpenSSH skips an IdentityFile that does not exist (a `Host *` default); paramiko aborts.
        conn.connect_kwargs["key_filename"] = [
            k for k in conn.connect_kwargs.get("key_filename", []) if os.path.exists(os.path.expanduser(k))]
        client = conn.client
        for f in opts.get("globalknownhostsfile", GLOBAL_KNOWN_HOSTS).split():
            if os.path.isfile(f):
                load_known_hosts(client.get_host_keys(), f)
        for f in user_files:
            if os.path.isfile(f):
                load_known_hosts(client.get_host_keys(), f)
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
            files = os.path.expanduser(opts.get("userknownhostsfile", "~/.ssh/known_hosts").split()[0])
            port = int(opts.get("port", 22))
            entry = e.hostname if port == 22 or e.hostname.startswith("[") else f"[{e.hostname}]:{port}"
            fix = shlex.join(["ssh-keygen", "-f", files, "-R", entry])
            return HostKeyError(
                f"{self.name}: the host key of {e.hostname} CHANGED (now {fingerprint(e.key)}, "
                f"known_hosts has {fingerprint(e.expected_key)}); refusing to connect. If the "
                f"instance was re-created, remove the old key with `{fix}`, then run "
                f"`ssh {self.alias}` once and check the fingerprint")
        if isinstance(e, paramiko.AuthenticationException):
            return AuthFailed(f"{where}: authentication failed ({e}); check IdentityFile / "
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
             sink: Sink | None = None, py: Mapping[str, Any] | None = None) -> tuple[int, bytes, bytes]:
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

    def open_live(self, command: str, *, timeout: float = 60.0) -> ChannelLive:
        """Start one remote shell command line and hand back its channel, still open: the
        command lives until the channel closes (or the connection drops)."""
        transport = self._transport()
        try:
            chan = transport.open_session(timeout=timeout)
            chan.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as e:
            self.close()
            raise HostUnreachable(f"{self.name}: the open connection did not answer within "
                                  f"{timeout:g}s ({e or type(e).__name__}); nothing was run") from e
        return ChannelLive(chan, self)


class ChannelLive:
    """A running command on a paramiko channel (`Live`)."""

    def __init__(self, chan: paramiko.Channel, host: ParamikoHost) -> None:
        self.chan, self.host = chan, host

    def read(self, timeout: float) -> tuple[bytes, bytes]:
        chan = self.chan
        if not (chan.recv_ready() or chan.recv_stderr_ready() or chan.closed or chan.eof_received):
            select.select([chan], [], [], max(0.0, timeout))
        out = chan.recv(1 << 16) if chan.recv_ready() else b""
        err = chan.recv_stderr(1 << 16) if chan.recv_stderr_ready() else b""
        transport = chan.get_transport()
        if not out and not err and not chan.exit_status_ready() and not (transport and transport.is_active()):
            self.host.close()
            raise RemoteError(f"{self.host.name}: the connection dropped while a command ran")
        return out, err

    def exit_status(self) -> int | None:
        chan = self.chan
        if ((chan.eof_received or chan.closed) and chan.exit_status_ready() and not chan.recv_ready()
                and not chan.recv_stderr_ready()):
            rc = chan.recv_exit_status()
            return 255 if rc < 0 else rc
        return None

    def shutdown_write(self) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self.chan.shutdown_write()

    def close(self) -> None:
        self.chan.close()
