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
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import math
import os
import re
import select
import shlex
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, Protocol, TypeVar

import fabric
import paramiko

from ablate.errors import RemoteError
from ablate.transport.base import CommandResult

DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts ~/.ssh/known_hosts2"
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KNOWN_HOSTS_LOCK = threading.Lock()


class Sink(Protocol):
    """Where a streamed stdout goes (a binary file, or one that also counts)."""

    def write(self, data: bytes, /) -> int: ...


class _Counted:
    """A binary file that reports each chunk written (pull's progress bar)."""

    def __init__(self, f: BinaryIO, on_bytes: Callable[[int], None]) -> None:
        self.f, self.on_bytes = f, on_bytes

    def write(self, data: bytes, /) -> int:
        n = self.f.write(data)
        self.on_bytes(len(data))
        return n


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
               stop: Callable[[], bool] | None = None, poll: float = 0.5) -> int | None:
        from ablate.transport.streaming import stream

        return stream(self, argv, on_stdout, stop=stop, poll=poll)

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


K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


class FanOut(dict[K, R | Exception]):
    """Per-host results of a parallel call; a failure on one host keeps the others' results."""

    @property
    def succeeded(self) -> dict[K, R]:
        return {k: v for k, v in self.items() if not isinstance(v, Exception)}

    @property
    def failed(self) -> dict[K, Exception]:
        return {k: v for k, v in self.items() if isinstance(v, Exception)}


def fan_out(hosts: Iterable[K], fn: Callable[[K], R], *, max_workers: int = 32) -> FanOut[K, R]:
    """Call `fn(host)` for every host in parallel; each value is its result or its exception."""
    items = list(dict.fromkeys(hosts))
    out: FanOut[K, R] = FanOut()
    if not items:
        return out
    with ThreadPoolExecutor(max_workers=min(max_workers, len(items))) as pool:
        futures = {h: pool.submit(fn, h) for h in items}
        for h, fut in futures.items():
            try:
                out[h] = fut.result()
            except Exception as e:
                out[h] = e
    return out


# --------------------------------------------------------------------------- the shared FS

_READ = '[ -e "$1" ] || exit 3; exec cat -- "$1"'
_TEMP = 'd=$(dirname -- "$1"); mkdir -p -- "$d"; t=$(mktemp "$d/.$(basename -- "$1").tmp.XXXXXXXX"); ' \
        "trap 'rm -f -- \"$t\"' EXIT; cat > \"$t\"; sync -- \"$t\" 2>/dev/null || true; "
_WRITE = "set -e; " + _TEMP + 'chmod "$2" "$t"; mv -f -- "$t" "$1"'
# link() fails when the name exists, so two deployers racing can never overwrite each other.
_IMMUTABLE = ('same() { [ "$(sha256sum < "$1" | cut -d" " -f1)" = "$2" ]; }\n'
              'if [ -e "$1" ]; then if same "$1" "$2"; then echo same; exit 0; fi; exit 4; fi\n'
              "set -e; " + _TEMP + 'same "$t" "$2" || exit 5; chmod 444 "$t"\n'
              'if ln -- "$t" "$1" 2>/dev/null; then echo created; exit 0; fi\n'
              'if same "$1" "$2"; then echo same; exit 0; fi; exit 4')
_APPEND = 'mkdir -p -- "$(dirname -- "$1")" && printf "%s\\n" "$2" >> "$1"'
_LISTDIR = '[ -d "$1" ] || exit 0; exec find "$1" -mindepth 1 -maxdepth 1 -printf "%f\\0"'
_REMOVE = '[ -d "$1" ] && exit 4; [ -e "$1" ] || [ -L "$1" ] || exit 3; rm -f -- "$1"'
# mv -T -n: never into or over an existing dst (renameat2 NOREPLACE where the FS has it); src
# still there afterwards means it did not happen.
_RENAME = ('there() { [ -e "$1" ] || [ -L "$1" ]; }; there "$1" || exit 3; there "$2" && exit 4\n'
           'mkdir -p -- "$(dirname -- "$2")" || exit 5\n'
           'err=$(mv -T -n -- "$1" "$2" 2>&1)\n'
           'if there "$1"; then there "$2" && exit 4; printf "%s\\n" "$err" >&2; exit 6; fi')
# The lock is held by flock(1) for as long as `cat` reads the channel: the controller's exit, death
# or lost connection closes it, cat sees EOF, the holder record ($3, content $4) is removed while
# the lock is still held, and the lock is free. -E 75: still busy when -w ran out.
_FLOCKED = ('r=$1; if [ -n "$r" ]; then t="$r.tmp.$$"; printf "%s\\n" "$2" > "$t" && mv -f -- "$t" "$r" '
            '|| exit 94; fi\necho ACQUIRED; cat >/dev/null; [ -z "$r" ] || rm -f -- "$r"')
_FLOCK = ('mkdir -p -- "$(dirname -- "$1")" || exit 96; command -v flock >/dev/null || exit 95\n'
          'exec flock -E 75 -w "$2" "$1" bash -c "$5" bash "$3" "$4"')
_PROBE = ('d=$1; e=$2; py=$3; shift 3; [ -r "$d/ablate/remote/probe.py" ] || exit 97\n'
          'if [ -n "$e" ]; then eval "$e" >&2 || exit 98; fi\n'
          'cd "$d" && PYTHONPATH="$d" PYTHONDONTWRITEBYTECODE=1 exec "$py" -m ablate.remote.probe "$@"')


def probe_lib() -> dict[str, bytes]:
    """The files a host runs for `probe`: the stdlib-only package `ablate.remote` (probe, verify,
    the path layout), as installed here, under a stub `ablate/__init__.py`."""
    from ablate import resources as packaged

    files = {"ablate/__init__.py": b'"""ablate host-side probe, shipped by the ssh transport."""\n'}
    remote = packaged.listing("ablate.remote", ".py")
    files.update({f"ablate/remote/{name}": data for name, data in remote.items()})
    return files


class RemoteFlock:
    """A flock(2) on a shared-FS file held by `flock … cat` on a host for as long as `chan` is open."""

    def __init__(self, chan: paramiko.Channel, host: str, path: str) -> None:
        self.chan, self.host, self.path = chan, host, path

    @classmethod
    def wait(cls, chan: paramiko.Channel, host: str, path: str, deadline_s: float) -> RemoteFlock | None:
        """Read the channel until flock says ACQUIRED (held) or exits (75: busy -> None)."""
        out, err = b"", b""
        deadline = time.monotonic() + deadline_s
        while True:
            while chan.recv_ready():
                out += chan.recv(4096)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(4096)
            if b"ACQUIRED\n" in out:
                return cls(chan, host, path)
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                rc = chan.recv_exit_status()
                chan.close()
                if rc == 75:
                    return None
                why = {94: "cannot write the holder record",
                       95: "`flock` (util-linux) is not installed there",
                       96: "cannot create the lock's directory"}.get(rc, f"rc {rc}")
                raise RemoteError(f"{host}: locking {path} failed ({why}): "
                                  f"{err.decode(errors='replace').strip()[-300:]!r}")
            left = deadline - time.monotonic()
            if left <= 0 or chan.closed:
                chan.close()
                raise RemoteError(f"{host}: no answer while locking {path} within {deadline_s:g}s")
            select.select([chan], [], [], min(0.1, left))

    def release(self) -> None:
        """EOF to `cat`: it exits, flock exits, the lock is free (waited for, briefly)."""
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self.chan.shutdown_write()
            deadline = time.monotonic() + 10.0
            while not self.chan.exit_status_ready() and time.monotonic() < deadline:
                select.select([self.chan], [], [], 0.1)
                while self.chan.recv_ready():
                    self.chan.recv(4096)
        self.chan.close()


class SSHFS:
    """The shared FS through a host that mounts it (SharedFS). With several hosts, a host that
    cannot be reached is skipped for the next one; nothing is ever retried after it started."""

    def __init__(self, hosts: SSHHost | Sequence[SSHHost], root: str, *, python: str = "python3",
                 env: str | None = None, timeout: float = 120.0, probe_timeout: float = 900.0) -> None:
        self.hosts = [hosts] if isinstance(hosts, SSHHost) else list(hosts)
        if not self.hosts:
            raise ValueError("SSHFS needs at least one host")
        self.root = root.rstrip("/") or "/"
        self.python = python
        self.env = env or ""
        self.timeout = timeout
        self.probe_timeout = probe_timeout
        self.via = self.hosts[0].name  # the host the last operation went through
        self._lib_ready = False
        lib = probe_lib()
        digest = hashlib.sha256()
        for rel in sorted(lib):
            digest.update(rel.encode() + b"\0" + hashlib.sha256(lib[rel]).digest())
        self.lib_dir = f"{self.root}/lib/{digest.hexdigest()[:12]}"
        self._lib = lib

    def _sh(self, script: str, *args: str, stdin: bytes | None = None, timeout: float | None = None,
            sink: Sink | None = None) -> tuple[int, bytes, bytes]:
        # bash, not sh: a profile's `env` (`source …/activate`) is bash; dash has no `source`.
        argv = ["bash", "-c", script, "bash", *args]
        last: HostUnreachable | None = None
        for host in self.hosts:
            try:
                rc, out, err = host.exec(shlex.join(argv), timeout=timeout or self.timeout,
                                         stdin=stdin, sink=sink)
            except HostUnreachable as e:
                last = e
                continue
            self.via = host.name
            return rc, out, err
        assert last is not None
        if len(self.hosts) == 1:
            raise last
        raise HostUnreachable(f"shared FS {self.root}: no host that mounts it answers "
                              f"({', '.join(h.name for h in self.hosts)}); last: {last.message}")

    def _fail(self, what: str, path: str, rc: int, err: bytes) -> RemoteError:
        return RemoteError(f"{self.via}: {what} {path} failed (rc {rc}): "
                           f"{err.decode(errors='replace').strip()[-300:]!r}")

    def read_bytes(self, path: str) -> bytes | None:
        rc, out, err = self._sh(_READ, path)
        if rc == 3:
            return None
        if rc != 0:
            raise self._fail("reading", path, rc, err)
        return out

    def write_atomic(self, path: str, data: bytes, mode: int = 0o644) -> None:
        rc, _, err = self._sh(_WRITE, path, format(mode, "o"), stdin=data)
        if rc != 0:
            raise self._fail("writing", path, rc, err)

    def create_immutable(self, path: str, data: bytes) -> bool:
        rc, out, err = self._sh(_IMMUTABLE, path, hashlib.sha256(data).hexdigest(), stdin=data)
        if rc == 4:
            raise RemoteError(f"{self.via}: {path} exists with other content; refusing to overwrite "
                              "an immutable file")
        if rc != 0:
            raise self._fail("creating", path, rc, err)
        return out.strip() == b"created"

    def append_line(self, path: str, line: str) -> None:
        rc, _, err = self._sh(_APPEND, path, line.rstrip("\n"))
        if rc != 0:
            raise self._fail("appending to", path, rc, err)

    def exists(self, path: str) -> bool:
        rc, _, _ = self._sh('[ -e "$1" ]', path)
        return rc == 0

    def listdir(self, path: str) -> list[str]:
        rc, out, err = self._sh(_LISTDIR, path)
        if rc != 0:
            raise self._fail("listing", path, rc, err)
        return sorted(n for n in out.decode(errors="replace").split("\0") if n)

    def remove(self, path: str) -> bool:
        rc, _, err = self._sh(_REMOVE, path)
        if rc == 3:
            return False
        if rc != 0:
            raise self._fail("removing", path, rc, err)
        return True

    def rename_noreplace(self, src: str, dst: str) -> bool:
        rc, _, err = self._sh(_RENAME, src, dst)
        if rc == 3:
            return False
        if rc == 4:
            raise RemoteError(f"{self.via}: {dst} exists; {src} is not renamed over it")
        if rc != 0:
            raise self._fail(f"renaming to {dst}:", src, rc, err)
        return True

    def lock(self, path: str, timeout: float, record: tuple[str, bytes] | None = None) -> RemoteFlock | None:
        """flock(2) on `path` through the first host that answers, held by a long-lived channel.
        `record` is one line of text (its bytes without the newline)."""
        rec_path, rec = (record[0], record[1].decode().rstrip("\n")) if record else ("", "")
        script = shlex.join(["bash", "-c", _FLOCK, "bash", path, format(max(0.0, timeout), "g"),
                             rec_path, rec, _FLOCKED])
        last: HostUnreachable | None = None
        for host in self.hosts:
            try:
                chan = host.open_channel(script, timeout=self.timeout)
            except HostUnreachable as e:
                last = e
                continue
            self.via = host.name
            return RemoteFlock.wait(chan, host.name, path, timeout + self.timeout)
        assert last is not None
        raise last

    def fetch(self, path: str, local_path: str,
              on_bytes: Callable[[int], None] | None = None) -> int:
        """Stream `path` to `local_path` (created or truncated); the bytes written. The caller
        checks size and sha256 before publishing the copy."""
        with open(local_path, "wb") as f:
            rc, _, err = self._sh(_READ, path, sink=_Counted(f, on_bytes) if on_bytes else f)
            f.flush()
            os.fsync(f.fileno())
            size = f.tell()
        if rc == 3:
            raise FileNotFoundError(errno.ENOENT, f"{self.via}: no such file on the shared FS", path)
        if rc != 0:
            raise OSError(errno.EIO, f"{self.via}: reading failed (rc {rc}): "
                                     f"{err.decode(errors='replace').strip()[-300:]}", path)
        return size

    def ship_probe(self) -> None:
        """Place the probe's files content-addressed under <root>/lib/<sha12>/ (0444, never
        overwritten): a changed ablate is a new directory, a running probe keeps its files."""
        for rel, data in sorted(self._lib.items()):
            self.create_immutable(f"{self.lib_dir}/{rel}", data)
        self._lib_ready = True

    def probe(self, op: str, args: Mapping[str, Any]) -> Any:
        import json

        payload = json.dumps(dict(args))
        for _ in range(2):
            rc, out, err = self._sh(_PROBE, self.lib_dir, self.env, self.python, op, payload,
                                          timeout=self.probe_timeout)
            if rc == 97 and not self._lib_ready:
                self.ship_probe()
                continue
            break
        command = shlex.join([self.python, "-m", "ablate.remote.probe", op, payload[:200]])
        stderr = err.decode(errors="replace").strip()[-300:]
        if rc == 98:
            raise RemoteError(f"{self.via}: the profile's env `{self.env}` failed before "
                              f"`{command}`: {stderr!r}")
        if rc != 0:
            raise RemoteError(f"{self.via}: `{command}` exited {rc}; stderr: {stderr!r}")
        try:
            return json.loads(out)
        except ValueError:
            raise RemoteError(
                f"{self.via}: `{command}` did not print exactly one JSON document (does the "
                f"profile's env print to stdout?); stdout: {out.decode(errors='replace')[:300]!r}; "
                f"stderr: {stderr!r}") from None
