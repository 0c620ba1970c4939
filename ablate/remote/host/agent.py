"""The host agent: runs the controller's commands on a host without a login shell per command.

Through sshd every command starts the user's login shell, and its rc file with it (`conda init`,
`pyenv init`: 0.1-0.5 s of CPU each time, more than the command). The controller starts this agent
once per host, just before its first command there (`main` returns once it listens); it listens on a Unix
socket in a private directory (`/tmp/ablate-agent-<user>/<version>.<session>.sock`, the directory 0700 and
ours, else no agent), and the controller's ControlMaster forwards a local socket to it (`ssh -L`), so a
later command is one request over the connection already open: no new session, no login shell.

One connection, one command: the agent says hello first (so the controller knows the request will
reach it before sending it: no hello, nothing was sent, and the command goes the usual way), reads a
JSON header line and the command's stdin, runs `/bin/sh -c CMD` in the user's home in a process
group of its own, and streams frames back (`o`/`e` + length + bytes, then `x` + the exit code). A
header may also carry `py`: the stdlib-only Python entry that CMD would start (`dir` put first on
sys.path and made the working directory, `entry` run as `-c` with `argv`, `needs` a file that must be
readable under `dir`, `min` the Python it needs). When this interpreter can run it, a forked child of
the agent does, with the same pipes, process group and exit code: no shell, no interpreter start,
the common stdlib already imported (~30 ms less per probe); else CMD runs as usual. A
controller that goes away (time-out, Ctrl-C, lost link) ends the command's process group. Only the
agent's own user may connect; it exits after `idle` seconds without a request, or when its socket
is taken from it. Stdlib only, Python >= 3.7: it runs on the host's interpreter.

Usage on a host: `python3 -I -S agent.py SOCKET_PATH IDLE_SECONDS` (returns once the agent
listens, saying so on stdout; the agent lives on, detached).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time

TYPE_CHECKING = False  # typing costs the agent's start ~5 ms: never imported on a host
if TYPE_CHECKING:
    from typing import Any

# What a probe imports of the stdlib, imported once here: a forked child finds it loaded.
PRELOAD = ("base64", "hashlib", "posixpath", "re")
HELLO = b"ablate-agent 1\n"
MAX_HEADER = 1 << 20
CHUNK = 1 << 16
HOLD = 0.2  # seconds a reply's output may wait to go with what follows (`_Outbox`)


def frame(kind: bytes, data: bytes) -> bytes:
    return kind + struct.pack(">I", len(data)) + data


def read_exact(conn: socket.socket, n: int) -> bytes:
    """Exactly `n` bytes of `conn` (EOFError when it closes first); both ends use it."""
    buf = bytearray()
    while len(buf) < n:
        got = conn.recv(min(CHUNK, n - len(buf)))
        if not got:
            raise EOFError("the connection closed")
        buf += got
    return bytes(buf)


def _read_line(conn: socket.socket) -> bytes:
    """One line of `conn`, nothing after it (that is the command's stdin): what is there is
    peeked at, and only the line taken (not one recv per byte: a header is a few KB)."""
    buf = bytearray()
    while True:
        seen = conn.recv(CHUNK, socket.MSG_PEEK)
        if not seen or len(buf) > MAX_HEADER:
            raise EOFError("no request")
        end = seen.find(b"\n") + 1
        buf += read_exact(conn, end or len(seen))
        if end:
            return bytes(buf)


def _header(conn: socket.socket) -> dict[str, Any]:
    """The request's header line; the blank lines before it are skipped (the controller sends one
    as it connects: see agentlink._connect)."""
    line = b""
    while not line.strip():
        line = _read_line(conn)
    return dict(json.loads(line.decode()))


def _same_user(conn: socket.socket) -> bool:
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:  # not Linux: the 0700 directory alone keeps others out
        return True
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i")))
    return bool(uid == os.getuid())


def _end(proc: Forked | subprocess.Popen[bytes], stream: bool = False) -> None:
    """The controller went away mid-command: TERM the command's group, KILL it 3 s later. A
    command reading a streamed stdin first gets its EOF, and 3 s to end on it (as when an ssh
    session closes: a held lock's holder cleans up and lets go)."""
    if stream and proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        deadline = time.monotonic() + 3.0
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 0.0)):
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + grace
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is not None:
            return


def _feed(proc: Forked | subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.write(data)
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.close()


def _exit_code(status: int) -> int:
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)


def _servable(py: object) -> bool:
    """Whether this interpreter can run a request's `py` entry itself (the handle doc)."""
    if not isinstance(py, dict) or not hasattr(os, "fork"):
        return False
    try:
        return bool(sys.version_info[:2] >= tuple(py["min"]) and isinstance(py["entry"], str)
                    and all(isinstance(a, str) for a in py["argv"])
                    and os.access(os.path.join(py["dir"], py["needs"]), os.R_OK))
    except (KeyError, TypeError, ValueError):
        return False


class Forked:
    """`py`'s entry in a forked child (`_run_entry`), with what `handle` uses of a Popen: pid (its
    own process group), stdin/stdout/stderr pipes, poll, wait."""

    def __init__(self, py: dict[str, Any], with_stdin: bool) -> None:
        (r0, w0), (r1, w1), (r2, w2) = os.pipe(), os.pipe(), os.pipe()
        self.returncode: int | None = None
        self.pid = os.fork()
        if self.pid == 0:
            _run_entry(py, r0 if with_stdin else os.open(os.devnull, os.O_RDONLY), w1, w2)
        for fd in (r0, w1, w2):
            os.close(fd)
        self.stdin = open(w0, "wb") if with_stdin else None  # noqa: SIM115 (closed by handle)
        if not with_stdin:
            os.close(w0)
        self.stdout, self.stderr = open(r1, "rb"), open(r2, "rb")  # noqa: SIM115

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = _exit_code(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = _exit_code(os.waitpid(self.pid, 0)[1])
        return self.returncode


def _run_entry(py: dict[str, Any], stdin: int, stdout: int, stderr: int) -> None:
    """In the child: what `cd DIR && PYTHONPATH=DIR python -S -c ENTRY ARGV...` would do, then exit
    with its code (an uncaught exception: the traceback on stderr, 1). Never returns."""
    rc = 1
    try:
        os.setsid()
        for fd, to in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(fd, to)
        os.closerange(3, 1 << 16)  # the listener and the other requests' connections
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        sys.stdin, sys.stdout, sys.stderr = open(0), open(1, "w"), open(2, "w")  # noqa: SIM115
        os.chdir(py["dir"])
        sys.path.insert(0, py["dir"])
        user_home = os.environ.get("HOME")
        cache = os.environ.get("XDG_CACHE_HOME") or (user_home + "/.cache" if user_home else "")
        if cache:  # as the shell form's PYTHONPYCACHEPREFIX (ablate.transport.sshfs.PYC)
            sys.pycache_prefix = os.path.join(cache, "ablate", "pyc")
        else:
            sys.dont_write_bytecode = True
        sys.argv = ["-c", *py["argv"]]
        exec(compile(py["entry"], "<string>", "exec"), {"__name__": "__main__"})
        rc = 0
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for f in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                f.flush()
        os._exit(rc & 0xFF)


def handle(conn: socket.socket, home: str) -> None:
    """One request: hello, header + stdin, run, frames, exit code. `"stdin": "stream"` in the
    header: the stdin comes as `i` frames while the command runs, `I` ends it (a held lock)."""
    if not _same_user(conn):
        return
    conn.sendall(HELLO)
    req = _header(conn)
    n = req.get("stdin")
    stream = n == "stream"
    data = None if n is None or stream else read_exact(conn, int(n))
    proc: Forked | subprocess.Popen[bytes]
    if not stream and _servable(req.get("py")):
        proc = Forked(req["py"], n is not None)
    else:
        proc = subprocess.Popen(["/bin/sh", "-c", str(req["cmd"])], cwd=home, start_new_session=True,
                                stdin=subprocess.PIPE if n is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if data is not None:
        threading.Thread(target=_feed, args=(proc, data), daemon=True).start()
    sel = selectors.DefaultSelector()
    kinds = {}
    for f, kind in ((proc.stdout, b"o"), (proc.stderr, b"e")):
        assert f is not None
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
        kinds[f.fileno()] = kind
    sel.register(conn, selectors.EVENT_READ)
    open_pipes = 2
    box = _Outbox(conn, stream)
    try:
        while open_pipes:
            for key, _ in sel.select(box.wait()):
                if key.fileobj is conn:
                    if not _from_controller(conn, proc, stream):  # it closed: nobody waits for this
                        _end(proc, stream)
                        return
                    continue
                chunk = os.read(key.fd, CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_pipes -= 1
                    continue
                box.add(frame(kinds[key.fd], chunk))
            box.due()
        box.send(frame(b"x", str(proc.wait()).encode()))
    except (OSError, EOFError):
        _end(proc, stream)
    finally:
        sel.close()
        for f in (proc.stdout, proc.stderr, proc.stdin):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


class _Outbox:
    """A reply's frames, sent together: a command's output goes with its exit code, in one write.
    Over ssh, a small write right after another waits for the peer's ACK of the first (Nagle), and
    the controller, which has nothing to send, delays that ACK (~40 ms): two per request, before.
    A frame waits here at most HOLD seconds, or until CHUNK bytes are due; a stream's go at once
    (a held lock's holder says ACQUIRED)."""

    def __init__(self, conn: socket.socket, at_once: bool) -> None:
        self.conn, self.at_once = conn, at_once
        self.buf = bytearray()
        self.since = 0.0

    def add(self, data: bytes) -> None:
        if not self.buf:
            self.since = time.monotonic()
        self.buf += data

    def wait(self) -> float:
        """How long the loop may wait for more before what is held is due."""
        return 1.0 if not self.buf else max(0.0, self.since + HOLD - time.monotonic())

    def due(self) -> None:
        if self.buf and (self.at_once or len(self.buf) >= CHUNK or time.monotonic() - self.since >= HOLD):
            self.send()

    def send(self, last: bytes = b"") -> None:
        self.conn.sendall(bytes(self.buf) + last)
        self.buf.clear()


def _from_controller(conn: socket.socket, proc: Forked | subprocess.Popen[bytes], stream: bool) -> bool:
    """One frame of the controller's (stdin, or its end); False when it closed the connection."""
    kind = conn.recv(1)
    if not kind:
        return False
    if not stream:
        return True  # nothing more is expected of it: ignored
    n = struct.unpack(">I", read_exact(conn, 4))[0]
    data = read_exact(conn, n) if n else b""
    assert proc.stdin is not None
    if kind == b"i" and data:
        with contextlib.suppress(OSError):
            proc.stdin.write(data)
            proc.stdin.flush()
    elif kind == b"I":
        with contextlib.suppress(OSError):
            proc.stdin.close()
    return True


class Agent:
    def __init__(self, path: str, idle: float) -> None:
        self.path, self.idle = path, idle
        self.log_path = path + ".log"  # why a request or the agent ended: for the one who asks
        self.home = os.path.expanduser("~")
        if not os.path.isdir(self.home):
            self.home = "/"
        self.active = 0
        self.last = time.monotonic()
        self.lock = threading.Lock()

    def log(self, what: str) -> None:
        with contextlib.suppress(OSError):
            mode = "a" if os.path.exists(self.log_path) and os.path.getsize(self.log_path) < 1 << 20 else "w"
            with open(self.log_path, mode) as f:
                f.write(time.strftime("%Y-%m-%dT%H:%M:%S ") + "pid " + str(os.getpid()) + ": " + what + "\n")

    def _one(self, conn: socket.socket) -> None:
        try:
            handle(conn, self.home)
        except EOFError:
            pass  # the controller went away before its request was complete
        except Exception as e:
            self.log("request failed: " + type(e).__name__ + ": " + str(e))
        finally:
            conn.close()
            with self.lock:
                self.active -= 1
                self.last = time.monotonic()

    def serve(self, listener: socket.socket) -> None:
        ino = os.stat(self.path).st_ino
        listener.settimeout(1.0)
        self.log("serving " + self.path)
        while True:
            try:
                conn, _ = listener.accept()
            except OSError as e:
                if not isinstance(e, socket.timeout):
                    self.log("accept failed: " + str(e))  # out of file descriptors: wait, go on
                    time.sleep(0.5)
                    continue
                with self.lock:
                    busy = self.active > 0
                    idle = not busy and time.monotonic() - self.last > self.idle
                try:
                    taken = os.stat(self.path).st_ino != ino
                except OSError:
                    taken = True
                if idle or (taken and not busy):  # requests under way are answered first
                    self.log("exit: " + ("idle" if idle else "the socket was removed or replaced"))
                    if not taken:
                        with contextlib.suppress(OSError):
                            os.unlink(self.path)
                    return
                continue
            conn.settimeout(None)
            with self.lock:
                self.active += 1
            try:
                threading.Thread(target=self._one, args=(conn,), daemon=True).start()
            except RuntimeError as e:  # no thread to spare: this request is refused, unread
                self.log("cannot start a thread: " + str(e))
                conn.close()
                with self.lock:
                    self.active -= 1


def _private_dir(d: str) -> bool:
    with contextlib.suppress(FileExistsError):
        os.mkdir(d, 0o700)
    st = os.lstat(d)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def main(argv: list[str]) -> int:
    """Start an agent on `argv[0]` and return once it listens (or why none will), saying which on
    stdout: `ablate-agent: up`, `ablate-agent: busy` (another one of this version holds the
    socket: it serves, or is starting) or `ablate-agent: refused <why>`."""
    path, idle = argv[0], float(argv[1])
    if not os.path.isabs(path) or not _private_dir(os.path.dirname(path)):
        print("ablate-agent: refused " + os.path.dirname(path) + " is not a private directory of ours")
        return 2  # someone else's (or a shared) directory: no agent, commands go the usual way
    lockf = open(path + ".lock", "a")  # noqa: SIM115 (held, and so the lock, while the agent lives)
    try:
        fcntl.flock(lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("ablate-agent: busy")
        return 0
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)  # listening before the caller hears "up": its next connection is served
    sys.stdout.write("ablate-agent: up\n")
    sys.stdout.flush()
    if os.fork():  # the caller's shell goes on; the agent leaves its session
        os._exit(0)
    os.setsid()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # Commands see the environment of the login shell that started the agent, at the level of
    # that shell's commands: a `bash -c` of theirs is then no top-level shell run by sshd, and
    # does not read ~/.bashrc again (as under sshd, where the login shell is level 1).
    os.environ["SHLVL"] = "1"
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # hold no pipe of the caller's open
        os.dup2(null, fd)
    Agent(path, idle).serve(listener)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
