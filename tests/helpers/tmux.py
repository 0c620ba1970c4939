"""Real tmux for tests: the requirement, and a shell in a pane of its own server driven by keys."""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest


def require_tmux() -> None:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is not installed; the README's test command installs it")


class Pane:
    """One shell in a tmux pane on its own server (not the queues' server), killed at the end."""

    def __init__(self, env: dict[str, str], width: int = 160, height: int = 50) -> None:
        require_tmux()
        self.socket = f"ablate-ui-{uuid.uuid4().hex[:10]}"
        self._tmux("-f", "/dev/null", "new-session", "-d", "-x", str(width), "-y", str(height),
                   "bash --norc --noprofile", env=env)

    def _tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        p = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                           env=env, timeout=20)
        assert p.returncode == 0, (args, p.stderr)
        return p.stdout

    def run(self, command: str) -> None:
        self._tmux("send-keys", "-l", command)
        self._tmux("send-keys", "Enter")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", *keys)

    def text(self, escapes: bool = False) -> str:
        return self._tmux("capture-pane", "-p", *(["-e"] if escapes else []))

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)
