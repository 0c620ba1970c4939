"""The local transport: hosts are names on this machine, the shared FS is a local directory."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import libtmux
from libtmux.exc import LibTmuxException

from ablate import probe
from ablate.errors import AblateError
from ablate.fsutil import atomic_write, create_immutable
from ablate.transport.base import CommandResult

# All local "hosts" share one private tmux server so a user's own sessions are never touched.
TMUX_SOCKET_ENV = "ABLATE_TMUX_SOCKET"
DEFAULT_SOCKET = "ablate"


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

    def tmux_start(self, session: str, argv: Sequence[str], env: Mapping[str, str],
                   cwd: str | None = None) -> None:
        import shlex

        try:
            self._server.new_session(session_name=session, window_command=shlex.join(argv),
                                     environment=dict(env), start_directory=cwd, detach=True)
        except LibTmuxException as e:
            raise AblateError(f"{self.name}: tmux could not start session {session}: {e}") from e

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


class LocalFS:
    def __init__(self, root: str) -> None:
        self.root = root

    def read_bytes(self, path: str) -> bytes | None:
        try:
            return Path(path).read_bytes()
        except FileNotFoundError:
            return None

    def write_atomic(self, path: str, data: bytes, mode: int = 0o644) -> None:
        atomic_write(Path(path), data, mode)

    def create_immutable(self, path: str, data: bytes) -> bool:
        return create_immutable(Path(path), data)

    def append_line(self, path: str, line: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND writes of one short line are atomic with respect to other appenders.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line.rstrip("\n") + "\n").encode())
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def probe(self, op: str, args: Mapping[str, Any]) -> Any:
        return probe.run(op, dict(args))

    def fetch(self, path: str, local_path: str,
              on_bytes: Callable[[int], None] | None = None) -> int:
        with open(path, "rb") as src, open(local_path, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
                if on_bytes:
                    on_bytes(len(chunk))
            dst.flush()
            os.fsync(dst.fileno())
            return dst.tell()
