"""What OpenSSH resolved for one alias (`ssh -G`), for `ssh.SSHHost`: its options, the host it
connects to, its connect time-out, and the `ssh` command a message tells the user to paste. The
answer is kept between commands while every file it was made of is unchanged (`sshcache`)."""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time

from ablate.errors import RemoteError
from ablate.transport.shellhost import SSHConfigError
from ablate.transport.sshcache import chatter, lookup, store
from ablate.transport.sshproc import last_lines, which

DEFAULT_CONNECT_TIMEOUT = 10.0


class Resolved:
    """The `ssh -G` half of `SSHHost` (its attributes are set by SSHHost.__init__)."""

    name: str
    alias: str
    ssh: str
    ssh_config: str | None
    _connect_timeout: float | None
    _opts: dict[str, str] | None
    _opts_lock: threading.Lock
    _resolved: bytes

    def options(self) -> dict[str, str]:
        """`ssh -G`: the settings OpenSSH applies to this alias (first value of each key)."""
        with self._opts_lock:  # once, whichever thread asks first
            return self._options()

    def options_kept(self) -> bool:
        """Whether the settings are known without running `ssh -G` (resolved already, or kept from
        an earlier run: read now, in this thread)."""
        with self._opts_lock:
            if self._opts is None:
                kept = lookup(self._ssh_path(), self.ssh_config, self.alias)
                if kept is None:
                    return False
                self._set(kept)
            return True

    def _options(self) -> dict[str, str]:
        if self._opts is None:
            self._set(self._resolve())
        assert self._opts is not None
        return self._opts

    def _set(self, resolved: bytes) -> None:
        self._resolved = resolved
        opts: dict[str, str] = {}
        for line in resolved.decode(errors="replace").splitlines():
            key, _, value = line.partition(" ")
            opts.setdefault(key.lower(), value)
        self._opts = opts

    def _ssh_path(self) -> str:
        return self.ssh if os.path.isabs(self.ssh) else which(self.ssh) or self.ssh

    def _resolve(self) -> bytes:
        """`ssh -G`'s output: kept from an earlier run while nothing it was made of changed
        (`sshcache`), else run now (`-v`: it names the files it read)."""
        ssh = self._ssh_path()
        kept = lookup(ssh, self.ssh_config, self.alias)
        if kept is not None:
            return kept
        argv = [self.ssh, *self._config_args(), "-G", "--", self.alias]
        started = time.time_ns()
        try:
            r = subprocess.run([*argv[:-3], "-v", *argv[-3:]], capture_output=True, timeout=30,
                               stdin=subprocess.DEVNULL, start_new_session=True)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RemoteError(f"{self.name}: `{shlex.join(argv)}` failed: {e}") from e
        if r.returncode != 0:
            raise SSHConfigError(f"{self.name}: ssh config rejected by OpenSSH "
                                 f"(`{shlex.join(argv)}`): {last_lines(chatter(r.stderr).strip())}")
        store(ssh, self.ssh_config, self.alias, r.stdout, r.stderr, started)
        return r.stdout

    def target(self) -> str:
        return self.options().get("hostname", self.alias)

    @property
    def connect_timeout(self) -> float:
        if self._connect_timeout is not None:
            return self._connect_timeout
        raw = self.options().get("connecttimeout", "none")
        return float(raw) if raw.isdigit() else DEFAULT_CONNECT_TIMEOUT

    def _config_args(self) -> list[str]:
        return ["-F", self.ssh_config] if self.ssh_config else []

    def _where(self) -> str:
        o = self.options()
        return f"{self.name} ({o.get('user', '?')}@{o.get('hostname', self.alias)}:{o.get('port', '22')})"

    def _hint_ssh(self, ask: bool = False) -> str:
        """The `ssh` command to paste (`ask`: one that asks to trust an unknown key even where the
        config says StrictHostKeyChecking yes)."""
        strict = self.options().get("stricthostkeychecking", "ask").lower() in ("true", "yes")
        extra = ["-o", "StrictHostKeyChecking=ask"] if ask and strict else []
        return shlex.join(["ssh", *self._config_args(), *extra, self.alias])
