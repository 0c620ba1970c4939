"""A long-running remote command whose stdout is handed over as it arrives (`ablate logs -f`).

Closing an SSH channel does not end the remote command (no pty, no signal): a `tail -F` would
linger until it next wrote. So the command runs under a small guard that ends it when the channel's
stdin reaches EOF, which happens when we stop (`shutdown_write`) and when the connection closes.
"""

from __future__ import annotations

import contextlib
import select
import shlex
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import paramiko

from ablate.errors import RemoteError

if TYPE_CHECKING:
    from ablate.transport.ssh import SSHHost

# fd 3 keeps the channel's stdin for the watcher; the command itself reads /dev/null.
GUARD = ('exec 3<&0 </dev/null; "$@" & p=$!; { read -r _ <&3; kill "$p" 2>/dev/null; } & w=$!; '
         'wait "$p"; rc=$?; kill "$w" 2>/dev/null; exit "$rc"')


def stream(host: SSHHost, argv: Sequence[str], on_stdout: Callable[[bytes], None], *,
           stop: Callable[[], bool] | None = None, poll: float = 0.5,
           open_timeout: float = 30.0) -> int | None:
    if not argv:
        raise ValueError("stream: empty argv")
    chan = host.open_channel(shlex.join(["bash", "-c", GUARD, "bash", *argv]), timeout=open_timeout)
    transport = chan.get_transport()
    asked = time.monotonic()
    with chan:
        chan.settimeout(max(0.1, poll))
        while True:
            got = False
            while chan.recv_ready():
                on_stdout(chan.recv(1 << 16))
                got = True
            while chan.recv_stderr_ready():
                chan.recv_stderr(1 << 16)  # tail's "file truncated" chatter: not the log
                got = True
            if ((chan.eof_received or chan.closed) and chan.exit_status_ready()
                    and not chan.recv_ready() and not chan.recv_stderr_ready()):
                rc = chan.recv_exit_status()
                return 255 if rc < 0 else rc
            if not transport.is_active():
                host.close()
                raise RemoteError(f"{host.name}: the connection dropped while running `{argv[0]} …`")
            if stop is not None and time.monotonic() - asked >= poll:
                asked = time.monotonic()
                if stop():
                    with contextlib.suppress(OSError, paramiko.SSHException):
                        chan.shutdown_write()  # EOF on the guard's fd 3: it kills the command
                    return None
            if not got:
                select.select([chan], [], [], min(0.1, poll))
