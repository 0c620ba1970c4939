"""What the host agent's tests (tests/test_ssh_agent_*.py) share: the agent's source and an agent
of this machine's user (a module's `agent` fixture); on the test bed, a control directory of a
test's own (`fresh`), a bed with no agent running (`no_agents`), and what runs on an instance."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ablate.transport.agentlink import AgentLost, agent_code, request
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

AGENT = str(Path(__file__).resolve().parents[2] / "ablate" / "remote" / "host" / "agent.py")
# the process chain above the command, one command line per line ($$ first)
CHAIN = ("p=$$; while [ \"$p\" -gt 1 ]; do tr '\\0' ' ' < /proc/$p/cmdline; echo; "
         "p=$(cut -d' ' -f4 < /proc/$p/stat); done")


def agent_fixture() -> Any:
    """A module's `agent` fixture (`agent = agent_fixture()`): a live agent's socket path."""

    @pytest.fixture(name="agent")
    def agent(tmp_path: Path) -> Iterator[str]:
        """An agent of this machine's user, on a socket in a fresh private directory."""
        d = tmp_path / "agent"
        path = str(d / "a.sock")
        r = subprocess.run([sys.executable, "-I", "-S", AGENT, path, "30"], capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr
        wait_for(lambda: _answers(path), 10)
        yield path
        subprocess.run(["pkill", "-f", f"{AGENT} {path}"], check=False)

    return agent


def _answers(path: str) -> bool:
    try:
        return request(path, "true", timeout=5, hello_within=5) is not None
    except (AgentLost, OSError):
        return False


def is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


def fresh_fixture() -> Any:
    """A module's `fresh` fixture (`fresh = fresh_fixture()`): a control directory of its own."""

    @pytest.fixture(name="fresh")
    def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
        """A control directory of its own: no master of another test is reused. Short, under /tmp: a
        socket's path must fit in 108 bytes, and pytest-xdist's tmp_path is longer than that allows."""
        ctl = Path(tempfile.mkdtemp(prefix="actl-", dir="/tmp"))
        monkeypatch.setenv("ABLATE_SSH_CONTROL_DIR", str(ctl))
        monkeypatch.delenv("ABLATE_SSH_AGENT", raising=False)
        monkeypatch.delenv("ABLATE_SSH_PERSIST", raising=False)
        yield ctl
        shutil.rmtree(ctl, ignore_errors=True)

    return fresh


def run_on(tb: Testbed, host: str, command: str) -> str:
    return subprocess.run(tb.ssh_argv(host, command), capture_output=True, text=True, timeout=30,
                          check=True).stdout


def agent_serves(tb: Testbed, host: str) -> bool:
    """Whether an agent of this ablate listens on `host` (for any session: one alias per instance)."""
    pattern = f"/tmp/ablate-agent-root/{agent_code().version}.*.sock"
    return run_on(tb, host, f"for s in {pattern}; do test -S \"$s\" && echo yes && break; done; true"
                  ).strip() == "yes"


def no_agents_fixture() -> Any:
    """A module's `no_agents` fixture (`no_agents = no_agents_fixture()`): no agent on the bed."""

    @pytest.fixture(name="no_agents")
    def no_agents(testbed: Testbed) -> Iterator[None]:
        """Start and end with no agent on the bed (one may be left by another test's command); this
        bed's agents alone, not those of another bed or test run on the machine."""
        testbed.end_agents()
        yield
        testbed.end_agents()
        for h in testbed.hosts:
            run_on(testbed, h, "rm -rf /tmp/ablate-agent-root /tmp/count")  # each instance's own /tmp

    return no_agents
