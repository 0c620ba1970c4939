"""`ablate`'s entry point: the command through a command server when one serves this code, else
here (`ablate.cli.main`). It runs before every command, so it imports only the interpreter's C
modules (`_socket`, `_signal`, `_struct`, `zlib`): `socket`, `signal` and `json` would cost it ~20 ms
of imports (see the package's docstring).

The request: 4 bytes of length, then NUL-separated fields (none can hold a NUL): the protocol,
the directory, the umask, the signals ignored (comma-separated numbers), each standard stream's
encoding, errors and line buffering, the number of arguments, the arguments, then the environment
as NAME=VALUE; the three descriptors go with its first bytes (SCM_RIGHTS). The server answers `p` +
the command's pid, then `x` + how it ended (4 bytes each, signed: a negative status is the signal
that ended it)."""

from __future__ import annotations

import _signal
import _socket
import os
import sys
from _struct import pack, unpack

ENV = "ABLATE_CMDSERVER"
PROTOCOL = b"ablate-cmdserver 1"
HELLO_WITHIN = 2.0  # seconds: a server that does not greet by then is passed over (nothing sent)
FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH", "SIGCONT")
EXIT_LOST = 3  # the contract's "unexpected internal error"


def main() -> None:
    """The command: served when a server answers, else run in this process (and a server started
    for the next one)."""
    if enabled(os.environ, sys.platform):
        code = _served()
        if code is not None:
            _exit_as(code)
    from ablate.cli import main as here

    here()


def enabled(env: dict[str, str] | os._Environ[str], platform: str) -> bool:
    """Whether commands go through a server: `ABLATE_CMDSERVER` says, else Linux only."""
    if not (hasattr(_socket, "SCM_RIGHTS") and hasattr(_socket.socket, "sendmsg") and hasattr(os, "fork")):
        return False
    value = env.get(ENV, "").strip().lower()
    if value in ("0", "no", "off", "false"):
        return False
    return value in ("1", "yes", "on", "true") or platform.startswith("linux")


def fingerprint(package_dir: str, path: list[str]) -> str:
    """What a server must have loaded to serve this process: the interpreter, its flags, `sys.path`
    (each entry's mtime after the first: a package installed or removed there; the first is the
    script's directory, or the working directory under `python -m`, which the user's own files
    change) and every file of `ablate` (name, size, mtime). 16 hex digits."""
    import zlib

    parts = [sys.executable, sys.version, repr(tuple(sys.flags)), repr(path), *_process_world()]
    for entry in path[1:]:
        try:
            parts.append(str(os.stat(entry or ".").st_mtime_ns))
        except OSError:
            parts.append("-")
    files = []
    dirs = [package_dir]
    while dirs:  # os.scandir's entries, not os.walk's lists and joins: ~1 ms, against ~6 ms
        with os.scandir(dirs.pop()) as entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    if e.name != "__pycache__":
                        dirs.append(e.path)
                else:
                    st = e.stat()
                    files.append(f"{e.path} {st.st_size} {st.st_mtime_ns}")
    parts += sorted(files)
    data = "\n".join(parts).encode("utf-8", "surrogateescape")
    return f"{zlib.crc32(data):08x}{zlib.adler32(data[::-1]):08x}"


def _process_world() -> list[str]:
    """What a forked child takes from the server, not from the client, and must be the client's:
    the user's groups, the locale, the namespaces (network, mounts: `ip netns exec`, a container),
    the cgroup (CPU and memory accounting), the open-files limit. A server serves only a world like
    its own."""
    out = [f"{os.getuid()} {os.getgid()} {sorted(os.getgroups())}"]
    # the locale the interpreter set itself up with (LC_CTYPE: `open`'s default encoding)
    out += [os.environ.get(name, "-") for name in ("LC_ALL", "LC_CTYPE", "LANG", "PYTHONIOENCODING")]
    for ns in ("net", "mnt", "pid", "user", "uts", "ipc", "cgroup"):
        try:
            out.append(os.readlink(f"/proc/self/ns/{ns}"))
        except OSError:
            out.append("-")
    try:
        with open("/proc/self/cgroup", "rb") as f:
            out.append(f.read().decode(errors="replace"))
    except OSError:
        out.append("-")
    try:
        import resource

        out.append(repr(resource.getrlimit(resource.RLIMIT_NOFILE)))
    except (ImportError, OSError, ValueError):
        out.append("-")
    return out


def socket_dir(env: dict[str, str] | os._Environ[str]) -> str | None:
    """This user's private directory for the servers' sockets (created 0700), or None when it is
    not ours or not private (no server then)."""
    base = env.get("XDG_RUNTIME_DIR") or ""
    uid = os.getuid()
    where = os.path.join(base, "ablate-cmdserver") if base.startswith("/") else f"/tmp/ablate-cmdserver-{uid}"
    try:
        os.mkdir(where, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(where)
    except OSError:
        return None
    # a directory (S_IFDIR), ours, private
    if st.st_mode & 0o170000 != 0o040000 or st.st_uid != uid or st.st_mode & 0o077:
        return None
    return where


def _served() -> int | None:
    """The command's exit status from a server (negative: the signal that ended it), or None when
    none answered: nothing was sent, and a server is started for the next command."""
    try:
        where = socket_dir(os.environ)
        if where is None:
            return None
        cwd = os.getcwd()
        # "" on sys.path (`python -c`) is the working directory: the server's is "/"
        search = [entry or cwd for entry in sys.path]
        key = fingerprint(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), search)
    except OSError:
        return None
    path = os.path.join(where, f"{key}.sock")
    if len(path.encode()) > 100:  # past a Unix socket's longest path (108 bytes on Linux)
        return None
    conn = greeted(path, key)
    if conn is None:
        start_server(path, key, search)
        return None
    return _session(conn, cwd)


def greeted(path: str, key: str) -> _socket.socket | None:
    """A connection to the server at `path` once it said hello for `key`; None otherwise."""
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        conn.settimeout(HELLO_WITHIN)
        conn.connect(path)
        want = PROTOCOL + b" " + key.encode() + b"\n"
        if _exact(conn, len(want)) == want:
            conn.settimeout(None)
            return conn
    except (OSError, EOFError):
        pass
    conn.close()
    return None


def request(cwd: str, umask: int, argv: list[str], env: dict[str, str],
            stdio: list[tuple[str, str, bool]], ignored: list[int]) -> bytes:
    """The request's bytes (the module's docstring)."""
    fields = [PROTOCOL.decode(), cwd, str(umask), ",".join(map(str, ignored))]
    for encoding, errors, line_buffering in stdio:
        fields += [encoding, errors, "1" if line_buffering else "0"]
    fields += [str(len(argv)), *argv, *(f"{k}={v}" for k, v in env.items())]
    body = "\0".join(fields).encode("utf-8", "surrogateescape")
    return pack(">I", len(body)) + body


def _stdio() -> list[tuple[str, str, bool]]:
    """Each standard stream's encoding, errors and line buffering, as this process has them: the
    served command's are made the same."""
    return [(getattr(s, "encoding", None) or "utf-8", getattr(s, "errors", None) or "strict",
             bool(getattr(s, "line_buffering", False))) for s in (sys.stdin, sys.stdout, sys.stderr)]


def _session(conn: _socket.socket, cwd: str) -> int | None:
    """Send the command (this process's argv, directory, environment, umask and standard
    descriptors), forward signals to it, and return how it ended; None when it could not be sent
    (a closed standard descriptor: EBADF): it runs here then."""
    umask = os.umask(0)
    os.umask(umask)
    skip = ignored()
    data = request(cwd, umask, sys.argv, dict(os.environ), _stdio(), skip)
    try:
        sent = conn.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, pack("3i", 0, 1, 2))])
    except OSError:  # a closed standard descriptor (EBADF), a server gone before it read: not sent
        conn.close()
        return None
    child = _Child()
    try:
        if sent < len(data):
            conn.sendall(data[sent:])
        child.forward_signals(skip)
        while True:
            kind = _exact(conn, 1)
            value = unpack(">i", _exact(conn, 4))[0]
            if kind == b"p":
                child.started(value)
            elif kind == b"x":
                return int(value)
    except (OSError, EOFError):
        print("ablate: error: the command server ended before the command did; it may have run "
              "in part: see `ablate status` (ABLATE_CMDSERVER=0 runs commands without it)", file=sys.stderr)
        return EXIT_LOST
    finally:
        conn.close()


def ignored() -> list[int]:
    """The signals this process ignores (`nohup`: SIGHUP; a shell's background job: SIGINT): the
    command ignores them too, and they are not forwarded."""
    sigs = (getattr(_signal, name, None) for name in (*FORWARDED, "SIGTSTP"))
    return [int(sig) for sig in sigs if sig is not None and _signal.getsignal(sig) == _signal.SIG_IGN]


class _Child:
    """The served command's process group: the signals this process gets go to it."""

    def __init__(self) -> None:
        self.pgid: int | None = None
        self.pending: list[int] = []

    def started(self, pid: int) -> None:
        self.pgid = pid
        for sig in self.pending:
            self._send(sig)
        self.pending.clear()

    def _send(self, sig: int) -> None:
        if self.pgid is None:
            self.pending.append(sig)
            return
        try:  # noqa: SIM105 (contextlib: ~2 ms of imports, on every command)
            os.killpg(self.pgid, sig)
        except OSError:
            pass

    def _on(self, sig: int, frame: object) -> None:
        self._send(sig)

    def _on_stop(self, sig: int, frame: object) -> None:
        self._send(_signal.SIGTSTP)  # the command stops, then this process, as a terminal stops both
        os.kill(os.getpid(), _signal.SIGSTOP)

    def forward_signals(self, skip: list[int]) -> None:
        """The signals not in `skip` (those this process ignores) go to the command from now on."""
        for name in FORWARDED:
            sig = getattr(_signal, name, None)
            if sig is not None and sig not in skip:
                _signal.signal(sig, self._on)
        if hasattr(_signal, "SIGTSTP") and _signal.SIGTSTP not in skip:
            _signal.signal(_signal.SIGTSTP, self._on_stop)


def _exact(conn: _socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = conn.recv(n - len(got))
        if not chunk:
            raise EOFError
        got += chunk
    return got


def _exit_as(status: int) -> None:
    """End as the served command did: its exit code, or the signal that ended it."""
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 (as above)
            stream.flush()
        except (OSError, ValueError):
            pass
    if status < 0:
        try:  # noqa: SIM105 (as above)
            _signal.signal(-status, _signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL's and SIGSTOP's are not ours to set
            pass
        os.kill(os.getpid(), -status)
        status = 128 - status
    os._exit(status)


def start_server(path: str, key: str, search: list[str]) -> None:
    """A server for this code at `path`, started in the background (its own session, no terminal,
    no descriptor of ours); this command does not wait for it."""
    import json
    import subprocess

    try:  # noqa: SIM105 (as above)
        subprocess.Popen(
            [sys.executable, *subprocess._args_from_interpreter_flags(), "-c",  # type: ignore[attr-defined]
             "import sys; sys.path[:] = __import__('json').loads(sys.argv[3]); "
             "from ablate.cmdserver.server import main; main(sys.argv[1], sys.argv[2])",
             path, key, json.dumps(search)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
            start_new_session=True, close_fds=True)
    except OSError:
        pass
