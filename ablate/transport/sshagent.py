"""How an OpenSSH host's commands go to its host agent (`ablate.remote.host.agent`, `agentlink.py`): the
part of `SSHHost` that decides whether the agent may be there, sends a command to it through the
ControlMaster's forwarded socket, starts it with a command that goes the usual way, and what its
silence or a lost connection mean (the `ssh.py` module doc).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ablate.errors import RemoteError
from ablate.transport.agentlink import (
    AgentLost,
    AgentSilent,
    Marks,
    agent_idle_seconds,
    bootstrap,
    remote_socket,
    session_key,
    started,
)
from ablate.transport.shellhost import HostUnreachable
from ablate.transport.sshproc import persist_seconds

R = TypeVar("R")


class AgentRoute:
    """Mixed into `SSHHost`, whose state it reads and sets (declared here for the type checker)."""

    _agent_session: str | None = None  # `session_key` of this host's resolved settings

    if TYPE_CHECKING:
        name: str
        python: str
        multiplex: bool
        retry_after: float
        _lock: threading.Lock
        _ready: bool
        _kept: bool
        _failed: tuple[RemoteError, float] | None
        _agent_up: bool
        _agent_booted: bool
        _booting: threading.Event
        _resolved: bytes

        @property
        def connect_timeout(self) -> float: ...
        def options(self) -> dict[str, str]: ...
        def _socket(self) -> str: ...
        def _ensure(self) -> None: ...
        def _drop_master(self) -> None: ...
        def _session_starts(self, within: float) -> None: ...
        def _where(self) -> str: ...

    def _agent_link(self) -> tuple[str, str] | None:
        """(the local socket the master forwards, the agent's socket on the host), or None: no
        agent for this host (see the module doc)."""
        if not self.multiplex or persist_seconds() == 0 or os.environ.get("ABLATE_SSH_AGENT") == "0":
            return None
        user = self.options().get("user", "")  # resolves `_resolved` first
        if self._agent_session is None:  # once per host object: its settings are resolved once
            self._agent_session = session_key(self._resolved.decode(errors="replace"), os.environ)
        remote = remote_socket(user, self._agent_session)
        return (f"{self._socket()}.a", remote) if remote else None

    def agent_ready(self) -> bool:
        return (link := self._agent_link()) is not None and (self._agent_up or Marks(link[0]).seen())

    def agent_runs(self, python: str) -> bool:
        return python == self.python and self.agent_ready()

    def agent_on_first(self) -> bool:
        link = self._agent_link()
        if link is None or Marks(link[0]).refused():
            return False
        with self._lock:
            return not self._agent_booted or not self._booting.is_set()

    def _proven(self) -> None:
        """A command got through the master (the agent's hello, a command's start): its link carries,
        kept or not."""
        self._kept = False

    def _via_agent(self, command: str, timeout: float,
                   call: Callable[[str, float, Callable[[], None]], R | None]) -> R | None:
        """`call(local socket, hello_within, on_hello)` to the agent, when one may be there (a kept
        master, an agent that answered or started in this process, or `.seen`; never where
        `.refused`); None when none answered (nothing was sent): the command goes the usual way.

        Silence is told apart within one time-out (the connect time-out, at least 3 s, on a kept
        master; the command's on one proven here): no hello for half of it (at most the connect
        time-out), then a session the usual way (`_session_starts`) for the rest. It starts: the
        link carries and the agent alone is silent (stopped, hung, or too busy to answer), so the
        command goes the usual way, and so do the next ones (`.refused`, for SILENT_RETRY s), where
        before the host was taken for unreachable while `ssh` reached it. It does not: the host or
        the link is gone, the master is ended, HostUnreachable."""
        link = self._agent_link()
        if link is None:
            return None
        self._ensure()
        local = link[0]
        if Marks(local).refused() or not (self._kept or self._agent_up or Marks(local).seen()):
            return None
        kept = self._kept
        limit = min(timeout, max(self.connect_timeout, 3.0)) if kept else timeout
        hello = min(limit / 2, max(self.connect_timeout, 3.0))
        try:
            got = call(local, hello, self._proven)
        except AgentSilent:
            try:
                self._session_starts(limit - hello)
            except HostUnreachable:
                e = HostUnreachable(
                    f"{self._where()}: no answer within {limit:g}s on the kept connection (host down or "
                    "network unreachable)" if kept else
                    f"{self.name}: the open connection did not answer within {limit:g}s; nothing was run")
                self._failed = (e, time.monotonic() + self.retry_after)
                raise e from None
            with self._lock:
                self._agent_up = False
            Marks(local).silent()
            return None
        except AgentLost as e:
            raise RemoteError(f"{self.name}: the connection dropped while running `{command[:200]}`: "
                              f"{e} (the host agent logs why it ended a request in {link[1]}.log "
                              "there)") from None
        with self._lock:
            was_up, self._agent_up = self._agent_up, got is not None
            if got is not None:  # the connection carried a command: proven
                self._ready, self._kept = True, False
        if got is None or not was_up:  # the marks change with the news, not with every command
            Marks(local).answered(got is not None)
        return got

    def _boot_or_wait(self, timeout: float, retry: Callable[[], R | None]) -> tuple[str, R | None]:
        """Before a command goes the usual way: the agent's bootstrap to put before it (this command
        starts the agent: `_booted` hears how that went), or, while another command of this process
        starts it, that one's news awaited (it comes with its start, not its end) and `retry`'s
        answer through the agent: no second login shell. ("", None): the usual way, as it is."""
        link = self._agent_link()
        with self._lock:
            if link is not None and not self._agent_booted and not Marks(link[0]).refused():
                self._agent_booted = True
                self._booting.clear()
                return bootstrap(self.python, link[1], agent_idle_seconds()), None
        if self._booting.is_set():
            return "", None
        self._booting.wait(timeout)
        return "", retry()

    def _booted(self, preamble: bytes) -> None:
        link = self._agent_link()
        assert link is not None
        self._agent_up = up = started(preamble)
        Marks(link[0]).started(up)
        self._booting.set()
