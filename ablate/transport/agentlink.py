"""The controller's side of the host agent (`ablate.remote.host.agent`): how it is started on a host
and how one command goes to it through the ControlMaster's forwarded socket.

`request` sends the command only after the agent's hello came back (before it, only a blank line
that the agent skips), so "no agent answered" (the socket is not there, the master is gone, the
host's sshd refused the forward, the agent exited) is always "nothing was sent": the caller then
runs the command the usual way. Once the request is out, nothing is ever sent twice: a connection
lost after it is the command's failure.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import hashlib
import json
import os
import re
import select
import shlex
import socket
import struct
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ablate import resources as packaged
from ablate.errors import AblateError
from ablate.remote.host.agent import HELLO, frame, read_exact
from ablate.transport.shellhost import Sink

DEFAULT_IDLE = 3600
# A silent agent (its host's sessions start, it does not say hello) is gone around this long, not
# an idle time: a stall may pass (a host too busy for a while), a missing Python does not.
SILENT_RETRY = 300
SAFE_USER = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]{0,63}$")


class AgentSilent(Exception):
    """The forwarded socket took the connection but no hello came within the wait: the link (or
    the host) does not answer. Nothing was sent."""


class AgentLost(Exception):
    """The connection to the agent ended after the request was sent: the command may have run."""


@dataclass(frozen=True)
class AgentCode:
    version: str  # sha12 of the agent's source: a changed agent is a new socket, never an old one
    bootstrap_src: str  # a `python -c` program that runs it

    @classmethod
    def load(cls) -> AgentCode:
        src = packaged.module("ablate.remote.host.agent")
        version = hashlib.sha256(src).hexdigest()[:12]
        packed = base64.b64encode(zlib.compress(src, 9)).decode()
        return cls(version, _BOOT.replace("VERSION", version).replace("PACKED", packed))


# The bootstrap: the agent's code object, compiled once per host and interpreter (a third of an
# agent's start, ~13 ms of CPU), kept where Python keeps the probe's bytecode (the user's cache dir,
# ablate.transport.sshfs.PYC), under the agent's version: `sys.version`, the crc32 of the marshalled
# code, the code. Anything else found there is compiled again and written atomically (a temp name
# of its own: a home shared by several hosts is written by all of them). Without HOME, nothing is
# kept. The `ablate_agent` in it is how `pkill -f` finds an agent.
_BOOT = """import base64,marshal,os,sys,zlib
g={'__name__':'ablate_agent'};t=sys.version.encode()+b'\\0';k=len(t)+8;c=None
d=os.environ.get('XDG_CACHE_HOME') or (os.environ.get('HOME') or '/nonexistent')+'/.cache'
p=d+'/ablate/agent/VERSION-'+str(sys.implementation.cache_tag)+'.bin'
try:
 b=open(p,'rb').read()
 if b[:k]==t+b'%08x'%zlib.crc32(b[k:]):c=marshal.loads(b[k:])
except Exception:pass
if c is None:
 c=compile(zlib.decompress(base64.b64decode('PACKED')),'ablate_agent','exec')
 try:
  os.makedirs(os.path.dirname(p),0o700,exist_ok=True);n=p+'.%d.%s'%(os.getpid(),os.urandom(6).hex())
  m=marshal.dumps(c)
  with open(n,'wb') as f:f.write(t+b'%08x'%zlib.crc32(m)+m)
  os.replace(n,p)
 except Exception:pass
exec(c,g);sys.exit(g['main'](sys.argv[1:]))"""


_CODE: AgentCode | None = None


def agent_code() -> AgentCode:
    global _CODE
    if _CODE is None:
        _CODE = AgentCode.load()
    return _CODE


def agent_idle_seconds() -> int:
    """How long an agent stays after its last request (`ABLATE_SSH_AGENT_IDLE`, default an hour):
    longer than a ControlMaster, so the first command over a new connection finds it too."""
    raw = os.environ.get("ABLATE_SSH_AGENT_IDLE", str(DEFAULT_IDLE))
    try:
        return max(1, int(raw))
    except ValueError:
        raise AblateError(f"ABLATE_SSH_AGENT_IDLE={raw!r}: give whole seconds") from None


def remote_socket(user: str, session: str = "") -> str | None:
    """Where the agent of this ablate listens on a host, for the login user `user` and the session
    settings `session` (`session_key`; None: a user name that is no safe path component, no agent
    then)."""
    if not SAFE_USER.match(user) or not re.fullmatch(r"[0-9a-f]{0,64}", session):
        return None
    return f"/tmp/ablate-agent-{user}/{agent_code().version}{'.' + session if session else ''}.sock"


# What makes a session on a host what it is, as OpenSSH resolved it for an alias (`ssh -G`): which
# sshd (the address, the port, the hops to it), as whom (the user, the keys: authorized_keys'
# `environment=` is per key) and what the client sets or sends (SetEnv; SendEnv, with the values this
# machine would send). An agent runs every later command in the environment of the session that
# started it, so one is only ever asked through connections that agree on all of these: two aliases
# reaching one machine through two sshds, or with other keys or SetEnv, each get their own.
SESSION_SETTINGS = ("hostname", "port", "user", "proxycommand", "proxyjump", "identityfile",
                    "certificatefile", "identitiesonly", "setenv", "sendenv")


def session_key(resolved: str, environ: Mapping[str, str]) -> str:
    """A short digest of the session settings in `ssh -G`'s output `resolved`, with the values of the
    variables its SendEnv patterns send from `environ`."""
    rows = sorted(line.strip() for line in resolved.splitlines()
                  if line.partition(" ")[0].lower() in SESSION_SETTINGS)
    patterns = [p for row in rows if row.lower().startswith("sendenv ") for p in row.split()[1:]
                if not p.startswith("-")]
    sent = sorted(f"{k}={v}" for k, v in environ.items()
                  if any(fnmatch.fnmatchcase(k, p) for p in patterns))
    return hashlib.sha256("\n".join([*rows, "", *sent]).encode()).hexdigest()[:12]


def bootstrap(python: str, path: str, idle: int) -> str:
    """A shell prefix that starts the agent and returns once it listens, its one line of news on
    stderr before the command's start marker (`started`, `ablate-agent: up|busy|refused ...`),
    never on the command's own streams; nothing at all when `python` is missing there."""
    argv = shlex.join([python, "-I", "-S", "-c", agent_code().bootstrap_src, path, str(idle)])
    return f"{argv} </dev/null 1>&2 2>/dev/null; "


def started(preamble: bytes) -> bool:
    """Whether the bootstrap's line says an agent listens now."""
    return re.search(rb"^ablate-agent: (up|busy)$", preamble, re.M) is not None


class Marks:
    """What this machine remembers about the agent behind one forward (`<local socket>.seen`,
    `.refused`), across ablate processes and connections: the agent outlives both."""

    def __init__(self, local: str) -> None:
        self.seen_path, self.refused_path = f"{local}.seen", f"{local}.refused"

    def seen(self) -> bool:
        """An agent answered (or started) here recently enough to be there still (half its idle
        time): worth trying before a login shell, over a new connection too."""
        return _fresh(self.seen_path, agent_idle_seconds() / 2)

    def refused(self) -> bool:
        """None can serve here (no Python there, a foreign directory, sshd refuses the forward):
        no bootstrap again for an idle time; an agent that was silent (`silent`): for SILENT_RETRY
        seconds at most."""
        try:
            age = time.time() - os.stat(self.refused_path).st_mtime
        except OSError:
            return False
        if age >= agent_idle_seconds():
            return False
        return age < SILENT_RETRY or _read(self.refused_path) != "silent"

    def silent(self) -> None:
        """The agent said no hello where a session started: the usual way for a while."""
        with contextlib.suppress(OSError):
            _write(self.refused_path, "silent")
            os.unlink(self.seen_path)

    def started(self, up: bool) -> None:
        """What a bootstrap said."""
        with contextlib.suppress(OSError):
            _write(self.seen_path if up else self.refused_path, "started")
            os.unlink(self.refused_path if up else self.seen_path)

    def answered(self, yes: bool) -> None:
        """Whether an agent said hello through the forward."""
        with contextlib.suppress(OSError):
            if yes:
                if not self.seen() or _read(self.seen_path) != "answered":
                    _write(self.seen_path, "answered")
                return
            if _read(self.seen_path) == "started":  # it listens, but the forward never reached it:
                _write(self.refused_path, "")  # sshd refuses the forward
            os.unlink(self.seen_path)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _fresh(path: str, seconds: float) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime < seconds
    except OSError:
        return False


def _connect(local_socket: str, hello_within: float,
             on_hello: Callable[[], None] | None = None) -> socket.socket | None:
    """A connection the agent said hello on (`on_hello` called then: the link carries); None when
    none answered (nothing was sent)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(local_socket)
        # A blank line, which the agent skips, and no request: it goes as soon as sshd confirmed the
        # forward, and carries the ACK of that confirmation. Without it the agent's hello, a small
        # write right after the confirmation, waited for that ACK, which the ssh client delays
        # (~40 ms) when it has nothing to send (Nagle meets delayed ACK, once per request).
        s.sendall(b"\n")
        s.settimeout(hello_within)
        if read_exact(s, len(HELLO)) == HELLO:
            if on_hello is not None:
                on_hello()
            return s
    except TimeoutError:
        s.close()
        raise AgentSilent() from None
    except (OSError, EOFError):  # no forward (no master), or nothing behind it (none runs,
        pass  # or sshd refused the forward)
    s.close()
    return None


def _send(s: socket.socket, data: bytes) -> None:
    try:
        s.sendall(data)
    except OSError as e:
        raise AgentLost(str(e)) from None


def request(local_socket: str, command: str, *, timeout: float, hello_within: float,
            stdin: bytes | None = None, sink: Sink | None = None, py: Mapping[str, Any] | None = None,
            on_hello: Callable[[], None] | None = None) -> tuple[int, bytes, bytes] | None:
    """Run `command` through the agent behind `local_socket`: (rc, stdout, stderr), rc 124 when it
    outlived `timeout` (ended on the host); None when no agent answered (nothing sent). With a
    sink, stdout goes there and each chunk restarts the time-out. `py`: the Python entry `command`
    starts, for the agent to run itself when it can (`ablate.remote.host.agent`). Raises AgentSilent,
    AgentLost."""
    s = _connect(local_socket, hello_within, on_hello)
    if s is None:
        return None
    try:
        s.settimeout(timeout)
        header: dict[str, Any] = {"cmd": command, "stdin": None if stdin is None else len(stdin)}
        if py is not None and os.environ.get("ABLATE_SSH_AGENT_PY") != "0":
            header["py"] = dict(py)
        _send(s, (json.dumps(header) + "\n").encode() + (stdin or b""))
        return _replies(s, timeout, sink)
    finally:
        s.close()


def open_live(local_socket: str, command: str, *, hello_within: float,
              on_hello: Callable[[], None] | None = None) -> AgentLive | None:
    """Start `command` through the agent, its stdin open (a `Live`); None when no agent answered."""
    s = _connect(local_socket, hello_within, on_hello)
    if s is None:
        return None
    try:
        _send(s, (json.dumps({"cmd": command, "stdin": "stream"}) + "\n").encode())
    except AgentLost:
        s.close()
        raise
    return AgentLive(s)


class AgentLive:
    """A command the agent runs with its stdin open (`shellhost.Live`): closing it ends the
    command (its stdin first, as a closed ssh session does)."""

    def __init__(self, s: socket.socket) -> None:
        self.s = s
        self.buf = b""
        self.rc: int | None = None
        self.eof = False
        self.held = (b"", b"")  # read by `exit_status`, not handed out yet

    def read(self, timeout: float) -> tuple[bytes, bytes]:
        out: list[bytes] = [self.held[0]]
        err: list[bytes] = [self.held[1]]
        self.held = (b"", b"")
        if out[0] or err[0]:
            timeout = 0.0
        if self.rc is None and not self.eof:
            ready, _, _ = select.select([self.s], [], [], max(0.0, timeout))
            if ready:
                try:
                    got = self.s.recv(1 << 16)
                except OSError:
                    got = b""
                self.buf += got
                self.eof = not got
        while len(self.buf) >= 5:
            n = struct.unpack(">I", self.buf[1:5])[0]
            if len(self.buf) < 5 + n:
                break
            kind, data, self.buf = self.buf[:1], self.buf[5:5 + n], self.buf[5 + n:]
            if kind == b"x":
                self.rc = int(data)
            elif kind == b"o":
                out.append(data)
            elif kind == b"e":
                err.append(data)
        if self.eof and self.rc is None:
            self.rc = 255  # the connection ended without an exit code: the command's end is unknown
        return b"".join(out), b"".join(err)

    def exit_status(self) -> int | None:
        """Its rc once the agent sent it and every output before it was handed out by `read`:
        what arrived meanwhile waits for the next `read`, and until then the command is not over
        (a caller that stops at the rc would lose the command's last lines)."""
        if self.rc is None:
            out, err = self.read(0.0)
            self.held = (self.held[0] + out, self.held[1] + err)
        return self.rc if not self.buf and not any(self.held) else None

    def shutdown_write(self) -> None:
        _send(self.s, frame(b"I", b""))

    def close(self) -> None:
        self.s.close()


def _replies(s: socket.socket, timeout: float, sink: Sink | None) -> tuple[int, bytes, bytes]:
    out: list[bytes] = []
    err: list[bytes] = []
    deadline = time.monotonic() + timeout
    while True:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            head = read_exact(s, 5)
            kind, n = head[:1], struct.unpack(">I", head[1:])[0]
            data = read_exact(s, n)
        except TimeoutError:
            # closing the connection ends the command's process group on the host
            return 124, b"".join(out), b"".join(err) + f"timed out after {timeout}s".encode()
        except (EOFError, OSError) as e:
            raise AgentLost(str(e) or "the connection closed") from None
        if kind == b"x":
            return int(data), b"".join(out), b"".join(err)
        if kind == b"o":
            if sink is not None:
                sink.write(data)
                deadline = time.monotonic() + timeout
            else:
                out.append(data)
        elif kind == b"e":
            err.append(data)


def forward_args(local_socket: str, remote: str) -> list[str]:
    """What a ControlMaster is started with so that `local_socket` reaches the agent (a stale
    local socket file is replaced)."""
    return ["-o", "StreamLocalBindUnlink=yes", "-L", f"{local_socket}:{remote}"]

