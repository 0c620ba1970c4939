"""What the OpenSSH transport runs its `ssh` processes with: the private directory of the
ControlMaster sockets, how long a master is kept, the start marker every command prints first, and
`ProcLive`, a running `ssh` process (a `Live`)."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import selectors
import shutil
import subprocess
import tempfile
import threading

from ablate.errors import AblateError, RemoteError
from ablate.transport.shellhost import AuthFailed, HostKeyError, HostUnreachable, SSHConfigError

DEFAULT_PERSIST = 120
MARK = b"\x1e@ablate\x1e"
TIMED_OUT = -1  # _wait: the command outlived its time-out
MARK_CMD = r"printf '\036@ablate\036' >&2; "
# a mux client's words when its master could not carry the session request
MASTER_FAILED = re.compile(r"read from master failed|master hello exchange failed|mux_client_\w+|"
                            r"Control socket connect|Connection to .* closed|Broken pipe|Connection reset")
# ssh's own words when a connection that was running a command went away
DROPPED = re.compile(r"closed by remote host|Broken pipe|not responding|Connection reset|"
                      r"mux_client_\w+: read from master failed|client_loop: send disconnect")


def which(name: str) -> str | None:
    """`shutil.which`, once per name and PATH in a process: a status asks for `ssh` once per host
    (~0.4 ms each: a stat per PATH entry)."""
    return _which(name, os.environ.get("PATH"))


@functools.lru_cache(maxsize=16)
def _which(name: str, path: str | None) -> str | None:
    return shutil.which(name, path=path)


def control_dir() -> str:
    """The private directory of the ControlMaster sockets (created 0700; refused when another
    user owns it or can write to it: a socket there would carry our sessions)."""
    path = os.environ.get("ABLATE_SSH_CONTROL_DIR")
    if not path:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        path = (os.path.join(runtime, "ablate-ssh") if runtime and os.path.isdir(runtime)
                else os.path.join(tempfile.gettempdir(), f"ablate-ssh-{os.getuid()}"))
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise AblateError(f"{path}: the SSH control socket directory must be owned by you and "
                          "private (mode 0700); fix it or set ABLATE_SSH_CONTROL_DIR")
    return path


def persist_seconds() -> int:
    raw = os.environ.get("ABLATE_SSH_PERSIST", str(DEFAULT_PERSIST))
    try:
        return max(0, int(raw))
    except ValueError:
        raise AblateError(f"ABLATE_SSH_PERSIST={raw!r}: give whole seconds (0: no reuse across "
                          "commands)") from None


class ProcLive:
    """A running `ssh … command` process (`Live`), with the start marker taken out of stderr."""

    def __init__(self, proc: subprocess.Popen[bytes], stdin: bytes | None = None) -> None:
        self.proc = proc
        self.started = False
        self.early = b""  # stderr before the marker: ssh's own messages (or login-shell noise)
        self.pending = b""  # stdout read while waiting for the start, handed out by the next read
        self.preamble = b""  # stderr before the marker, once started (ssh's warnings, shell noise)
        self._sel = selectors.DefaultSelector()
        for f in (proc.stdout, proc.stderr):
            assert f is not None
            os.set_blocking(f.fileno(), False)
            self._sel.register(f, selectors.EVENT_READ)
        self._writer: threading.Thread | None = None
        if stdin is not None:
            self._writer = threading.Thread(target=self._feed, args=(stdin,), daemon=True)
            self._writer.start()

    def _feed(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        # the command may exit without reading all of it; its rc tells
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write(data)
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()

    def read(self, timeout: float) -> tuple[bytes, bytes]:
        out, err = self.pending, b""
        self.pending = b""
        if out:
            timeout = 0.0
        if not self._sel.get_map():
            return out, err
        for key, _ in self._sel.select(max(0.0, timeout)):
            f = key.fileobj
            try:
                chunk = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                self._sel.unregister(f)
            elif f is self.proc.stdout:
                out += chunk
            else:
                err += chunk
        if err and not self.started:
            self.early += err
            err = b""
            i = self.early.find(MARK)
            if i >= 0:  # what came before is ssh's and the login shell's, not the command's
                self.started = True
                self.preamble, err = self.early[:i], self.early[i + len(MARK):]
                self.early = b""
        return out, err

    def exit_status(self) -> int | None:
        if self._sel.get_map() or self.pending:  # not over until `read` handed out all it said
            return None
        rc = self.proc.wait()
        return 255 if rc < 0 else rc

    def shutdown_write(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self.proc.stdin.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._sel.close()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


def last_lines(text: str, n: int = 2) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("@@@")]
    return " / ".join(lines[-n:])[-400:] or "(no message)"


def explain(err: str, name: str, where: str, hint: str, hint_ask: str, connect_timeout: float) -> RemoteError:
    """Classify a connection failure to host `name` (`where`: user@host:port) from ssh's own words;
    `hint`/`hint_ask`: the `ssh` command to paste (the second asks to trust an unknown key)."""
    text = err.replace(MARK.decode(), "").strip()
    tail = last_lines(text)
    if "REVOKED" in text or "revoked" in text:
        return HostKeyError(f"{name}: the host key of {where} is marked @revoked in "
                            f"known_hosts; refusing to connect, whatever the config says: {tail}")
    if "IDENTIFICATION HAS CHANGED" in text or "has changed and you have requested" in text:
        fix = re.search(r"^\s*(ssh-keygen -f .+ -R .+?)\s*$", text, re.M)
        how = (f"`{fix.group(1)}`" if fix else f"`ssh-keygen -R` on the entry ssh names ({tail})")
        return HostKeyError(
            f"{name}: the host key of {where} CHANGED; refusing to connect. If the "
            f"instance was re-created, remove the old key with {how}, then run "
            f"`{hint}` once and check the fingerprint")
    if "host key is known for" in text or "Host key verification failed" in text:
        return HostKeyError(
            f"{name}: unknown host key for {where}; refusing to connect. To trust "
            f"it, run `{hint_ask}` once and check the fingerprint, or pass "
            f"--accept-new-host-keys ({tail})")
    if "Permission denied" in text or "Too many authentication failures" in text:
        return AuthFailed(f"{where}: authentication failed: {tail}; check IdentityFile, "
                          f"the ssh agent and CertificateFile for this host (`{hint} "
                          "-v` shows what was offered)")
    if re.search(r"Bad configuration option|bad configuration options|Unsupported option|"
                 r"Can't open user config|garbage at end of line|no argument after keyword", text):
        return SSHConfigError(f"{name}: ssh config rejected by OpenSSH: {tail}")
    if re.search(r"timed out|Operation timed out", text):
        return HostUnreachable(f"{where}: no answer within the {connect_timeout:g}s "
                               f"connect time-out (host down or network unreachable): {tail}")
    return HostUnreachable(f"{where}: cannot connect: {tail}")
