"""The command server's process (see the package's docstring): it imports what the commands use,
listens on its socket, and forks one child per command, which becomes that command and runs
`ablate.cli.main`. One thread: a selector over the socket, each client's connection and a
wake-up pipe for SIGCHLD, so that nothing holds a lock when it forks."""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import os
import selectors
import signal
import socket
import struct
import sys
import time

from ablate.cmdserver.client import PROTOCOL, fingerprint
from ablate.remote.host.agent import read_exact

IDLE = 600.0  # seconds without a command before the server exits
MAX_HEADER = 16 << 20
# What the commands import, loaded once here (the rest loads in the child, as without a server).
PRELOAD = ("ablate.cli", "ablate.sweep.lock", "ablate.transport", "ablate.monitor.ahead",
           "ablate.monitor.status", "ablate.monitor.watch", "ablate.monitor.logs", "ablate.run.local_queues",
           "ablate.run.launch", "ablate.util.progress")


def main(path: str, key: str, idle: float = IDLE) -> None:
    """Serve at `path` the code whose fingerprint is `key`, until idle for `idle` seconds or the
    socket is another's. Returns at once when the code it loaded is not `key`'s."""
    os.umask(0o077)
    for name in PRELOAD:
        importlib.import_module(name)
    _warm()
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if fingerprint(package, list(sys.path)) != key:
        return  # the files changed as it loaded: the next command starts a server for them
    listener = _listen(path)
    gc.freeze()  # what is loaded stays shared with the children, untouched by their collections
    Server(listener, path, key, idle).serve()


def _warm() -> None:
    """What every process computes once from ablate's own files (the fingerprint covers them): the
    probe library and its digest, the host agent's code."""
    from ablate.transport.agentlink import agent_code
    from ablate.transport.sshfs import lib_digest, probe_lib

    probe_lib()
    lib_digest()
    agent_code()


def _listen(path: str) -> socket.socket:
    """Listening at `path`: bound under a name of its own, then renamed over `path` (a stale socket
    or another server's), so a client never meets a socket that does not listen yet."""
    tmp = f"{path}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(tmp)
    s.listen(64)
    os.rename(tmp, path)
    return s


class Server:
    def __init__(self, listener: socket.socket, path: str, key: str, idle: float) -> None:
        self.listener, self.path, self.idle = listener, path, idle
        self.hello = PROTOCOL + b" " + key.encode() + b"\n"
        self.inode = os.stat(path).st_ino
        self.children: dict[int, socket.socket] = {}  # pid -> its client's connection
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the wake-up fd says a child ended
        self.sel.register(listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")

    def serve(self) -> None:
        last = time.monotonic()
        while True:
            for sk, _ in self.sel.select(timeout=5.0):
                if sk.data == "accept":
                    self._accept()
                    last = time.monotonic()
                elif sk.data == "wake":
                    with contextlib.suppress(OSError):
                        os.read(self.wake_r, 512)
                else:
                    self._client_event(sk.data)
            self._reap()
            if not self.children and (time.monotonic() - last > self.idle or not self._still_ours()):
                if self._still_ours():
                    with contextlib.suppress(OSError):
                        os.unlink(self.path)
                return

    def _still_ours(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        try:
            conn.settimeout(10.0)
            if not _same_user(conn):
                conn.close()
                return
            conn.sendall(self.hello)
            req, fds = _request(conn)
        except (OSError, ValueError, EOFError):
            conn.close()
            return
        try:
            pid = os.fork()
        except OSError:
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        if pid == 0:  # the command: it never returns here
            _become(req, fds, [conn.fileno(), self.listener.fileno(), self.wake_r, self.wake_w,
                                  self.sel.fileno() if hasattr(self.sel, "fileno") else -1,
                                  *(c.fileno() for c in self.children.values())])
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):  # here too: the group exists before the client signals it
            os.setpgid(pid, pid)
        self.children[pid] = conn
        conn.setblocking(False)
        with contextlib.suppress(OSError):
            conn.send(b"p" + struct.pack(">i", pid))
        self.sel.register(conn, selectors.EVENT_READ, pid)

    def _client_event(self, pid: int) -> None:
        """The client's connection is readable: it sends nothing after its request, so it went away
        (killed): its command ends as it would have with it, killed."""
        conn = self.children.get(pid)
        if conn is None:
            return
        try:
            data = conn.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            self.sel.unregister(conn)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(conn)
            with contextlib.suppress(OSError):
                conn.setblocking(True)
                conn.settimeout(5.0)
                conn.sendall(b"x" + struct.pack(">i", code))
            conn.close()


def _same_user(conn: socket.socket) -> bool:
    cred = getattr(socket, "SO_PEERCRED", None)
    if cred is None:
        return True  # the socket's directory is private to this user (client.socket_dir)
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, cred, struct.calcsize("3i")))
    return bool(uid == os.getuid())


class Request:
    """What a client sent (client.request): where, with what, and its standard streams' settings."""

    def __init__(self, body: bytes) -> None:
        fields = body.decode("utf-8", "surrogateescape").split("\0")
        if len(fields) < 14 or fields[0] != PROTOCOL.decode():
            raise ValueError("not a request of this protocol")
        self.cwd, self.umask = fields[1], int(fields[2], 10)
        self.ignored = [int(x, 10) for x in fields[3].split(",") if x]
        self.stdio = [(fields[4 + 3 * i], fields[5 + 3 * i], fields[6 + 3 * i] == "1") for i in range(3)]
        n = int(fields[13], 10)
        self.argv = fields[14:14 + n]
        if len(self.argv) != n:
            raise ValueError("arguments cut short")
        self.env = dict(kv.split("=", 1) for kv in fields[14 + n:] if "=" in kv)


def _request(conn: socket.socket) -> tuple[Request, list[int]]:
    """The client's request and its three standard descriptors."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise ValueError("no standard descriptors")
    try:
        if len(data) < 4:
            data += read_exact(conn, 4 - len(data))
        size = struct.unpack(">I", data[:4])[0]
        if size > MAX_HEADER:
            raise ValueError("request too large")
        body = data[4:]
        if len(body) < size:
            body += read_exact(conn, size - len(body))
        return Request(body[:size]), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _become(req: Request, fds: list[int], close: list[int]) -> None:
    """In the forked child: become the client's command, run it, and exit as it ends."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                    signal.SIGUSR2, signal.SIGWINCH, signal.SIGTSTP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for num in req.ignored:  # as the client has them (nohup, a background job)
            signal.signal(num, signal.SIG_IGN)
        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        os.setpgid(0, 0)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            if fd > 2:
                os.close(fd)
        os.chdir(req.cwd)
        os.umask(req.umask)
        os.environ.clear()
        os.environ.update(req.env)
        time.tzset()  # local times in the client's TZ
        _streams(req.stdio)
        sys.argv = req.argv
        from ablate.util import timings

        timings.from_env()
        timings.mark("served")
        code = _run()
    except BaseException:  # the child never goes back to the server's loop
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        os._exit(code)


def _streams(stdio: list[tuple[str, str, bool]]) -> None:
    """sys.stdin, stdout and stderr on descriptors 0-2, with the client's encodings and buffering."""
    made = []
    for fd, (encoding, errors, line_buffering) in enumerate(stdio):
        raw = io.FileIO(fd, "rb" if fd == 0 else "wb", closefd=False)
        buf: io.BufferedReader | io.BufferedWriter = (io.BufferedReader(raw) if fd == 0
                                                     else io.BufferedWriter(raw))
        made.append(io.TextIOWrapper(buf, encoding=encoding, errors=errors, line_buffering=line_buffering,
                                     write_through=fd == 2))
    for name, stream in zip(("stdin", "stdout", "stderr"), made, strict=True):
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _run() -> int:
    """`ablate.cli.main` as the interpreter would run it: its exit code, the threads it left joined
    and the exit handlers run (as at an interpreter's exit), the streams flushed."""
    import atexit
    import threading

    from ablate.cli import main as cli_main

    code = 0
    try:
        cli_main()
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(BaseException):
            threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads joined, as at exit
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
    return code & 0xFF
