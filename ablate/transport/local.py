"""The local transport: hosts are names on this machine, the shared FS is a local directory.

A failed operation on the shared FS raises `FSError` naming "local", the operation, the path and the
OS error, as the ssh transport does for the same failure: commands and users never see a raw
OSError from here (only `fetch` raises OSError, as `SharedFS.fetch` says).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import libtmux
from libtmux.exc import LibTmuxException

from ablate.errors import AblateError, FSError, RemoteError
from ablate.remote.host import probe
from ablate.transport.base import CommandResult, FSOp, OpResult, apply_each
from ablate.util.fs import atomic_write, create_immutable

# All local "hosts" share one private tmux server so a user's own sessions are never touched.
TMUX_SOCKET_ENV = "ABLATE_TMUX_SOCKET"
DEFAULT_SOCKET = "ablate"
VIA = "local"  # the "host" an FSError of this transport names


def tmux_socket() -> str:
    return os.environ.get(TMUX_SOCKET_ENV, DEFAULT_SOCKET)


class LocalHost:
    def __init__(self, name: str) -> None:
        self.name = name
        self._server = libtmux.Server(socket_name=tmux_socket())

    def run(self, argv: Sequence[str], *, timeout: float = 60.0,
            stdin: bytes | None = None) -> CommandResult:
        try:
            p = subprocess.run(list(argv), input=stdin, capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return CommandResult(self.name, tuple(argv), 124, "", f"timed out after {timeout}s")
        except OSError as e:
            return CommandResult(self.name, tuple(argv), 127, "", str(e))
        return CommandResult(self.name, tuple(argv), p.returncode,
                             p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))

    def stream(self, argv: Sequence[str], on_stdout: Callable[[bytes], None], *,
               stop: Callable[[], bool] | None = None, poll: float = 0.5) -> int | None:
        import select
        import signal
        import time

        # Its own session: ending it (stop, Ctrl-C) ends its children too.
        p = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        assert p.stdout is not None
        fd = p.stdout.fileno()
        asked = time.monotonic()
        try:
            while True:
                ready, _, _ = select.select([fd], [], [], poll)
                if ready:
                    data = os.read(fd, 1 << 16)
                    if not data:
                        return p.wait()
                    on_stdout(data)
                if stop is not None and time.monotonic() - asked >= poll:
                    asked = time.monotonic()
                    if stop():
                        return None
        finally:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
                p.wait()
            p.stdout.close()

    def tmux_start(self, session: str, argv: Sequence[str], env: Mapping[str, str],
                   cwd: str | None = None) -> None:
        import shlex

        try:
            self._server.new_session(session_name=session, window_command=shlex.join(argv),
                                     environment=dict(env), start_directory=cwd, detach=True)
        except LibTmuxException as e:
            raise RemoteError(f"{self.name}: tmux could not start session {session}: {e}") from e

    def tmux_argv(self) -> list[str]:
        return ["tmux", "-L", tmux_socket()]

    def tmux_sessions(self) -> set[str]:
        try:
            if not self._server.is_alive():
                return set()
            return {s.session_name for s in self._server.sessions if s.session_name}
        except LibTmuxException:
            return set()

    def tmux_kill(self, session: str) -> None:
        try:
            if self._server.has_session(session):
                self._server.kill_session(session)
        except LibTmuxException:
            pass

    def close(self) -> None:
        pass


def _reason(e: OSError, *named: str) -> str:
    """The OS's reason (`[Errno 20] Not a directory`), with the file it concerns when the message
    does not already name it."""
    if e.errno is None:
        return str(e) or type(e).__name__
    files = [f if isinstance(f, str) else os.fsdecode(f) if isinstance(f, bytes) else str(f)
             for f in (e.filename, e.filename2) if f is not None]
    known = {os.path.normpath(p) for p in named}
    other = [f for f in files if os.path.normpath(f) not in known]
    why = f"[Errno {e.errno}] {e.strerror or os.strerror(e.errno)}"
    return why + (": " + ", ".join(repr(f) for f in other) if other else "")


class _FSOp:
    """`with _FSOp("writing", path):` an OSError inside becomes the FSError the ssh transport
    raises for the same failure."""

    def __init__(self, op: str, path: str, dst: str | None = None) -> None:
        self.op, self.path, self.dst = op, path, dst

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(e, OSError):
            named = [self.path] if self.dst is None else [self.path, self.dst]
            raise FSError(VIA, self.op, self.path, _reason(e, *named), dst=self.dst) from e


class _FileLockHeld:
    def __init__(self, lk: Any, record: str | None) -> None:
        self._lk, self._record = lk, record

    def release(self) -> None:
        try:
            if self._record:
                with _FSOp("removing", self._record):
                    Path(self._record).unlink(missing_ok=True)
        finally:
            with _FSOp("unlocking", str(self._lk.lock_file)):
                self._lk.release(force=True)


class LocalFS:
    """The shared FS as a local directory (SharedFS); OS errors surface as `FSError`."""

    def __init__(self, root: str) -> None:
        self.root = root

    def read_bytes(self, path: str) -> bytes | None:
        with _FSOp("reading", path):
            try:
                return Path(path).read_bytes()
            except (FileNotFoundError, NotADirectoryError):  # not there (as `[ -e ]` says over ssh)
                return None

    def write_atomic(self, path: str, data: bytes, mode: int = 0o644) -> None:
        with _FSOp("writing", path):
            atomic_write(Path(path), data, mode)

    def create_immutable(self, path: str, data: bytes) -> bool:
        with _FSOp("creating", path):
            try:
                return create_immutable(Path(path), data)
            except AblateError as e:  # there with other content: a refusal, as over ssh
                raise FSError(VIA, "creating", path,
                              "it exists with other content; an immutable file is never overwritten") from e

    def append_line(self, path: str, line: str) -> None:
        with _FSOp("appending to", path):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            # O_APPEND writes of one short line are atomic with respect to other appenders.
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line.rstrip("\n") + "\n").encode())
            finally:
                os.close(fd)

    def apply(self, ops: Sequence[FSOp]) -> list[OpResult]:
        return apply_each(self, ops)  # in-process: one call per op costs nothing to batch away

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        with _FSOp("listing", path):
            try:
                return sorted(os.listdir(path))
            except (FileNotFoundError, NotADirectoryError):
                return []

    def remove(self, path: str) -> bool:
        with _FSOp("removing", path):
            try:
                os.unlink(path)  # a 0444 file in a writable directory unlinks like any other
            except (FileNotFoundError, NotADirectoryError):
                return False
        return True

    def rename_noreplace(self, src: str, dst: str) -> bool:
        if not os.path.lexists(src):
            return False
        if os.path.lexists(dst):
            raise FSError(VIA, "renaming", src, "the destination exists; a rename never replaces it",
                          dst=dst)
        with _FSOp("renaming", src, dst):
            Path(dst).parent.mkdir(parents=True, exist_ok=True)
            # The stdlib has no renameat2(NOREPLACE); the check above suffices because every renamer
            # of these paths holds the controller lock.
            os.rename(src, dst)
        return True

    def lock(self, path: str, timeout: float,
             record: tuple[str, bytes] | None = None) -> _FileLockHeld | None:
        import filelock

        with _FSOp("locking", path):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            lk = filelock.FileLock(path, thread_local=False)
            try:
                lk.acquire(timeout=max(0.0, timeout))
            except filelock.Timeout:  # an OSError too: caught before _FSOp sees it
                return None
        try:
            if record:
                with _FSOp("writing", record[0]):
                    atomic_write(Path(record[0]), record[1], 0o644)
        except BaseException:
            lk.release(force=True)
            raise
        return _FileLockHeld(lk, record[0] if record else None)

    def probe(self, op: str, args: Mapping[str, Any]) -> Any:
        root = args.get("root")
        with _FSOp(f"probe {op} of", root if isinstance(root, str) else self.root):
            return probe.run(op, dict(args))

    def fetch(self, path: str, local_path: str,
              on_bytes: Callable[[int], None] | None = None) -> int:
        """Raises OSError (not FSError) when `path` cannot be read, as `SharedFS.fetch` says."""
        with open(path, "rb") as src, open(local_path, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
                if on_bytes:
                    on_bytes(len(chunk))
            dst.flush()
            os.fsync(dst.fileno())
            return dst.tell()
