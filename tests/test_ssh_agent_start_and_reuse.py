"""How the ssh transport starts the host agent and uses it, on the test bed: the first command
starts it and the later ones (of this process and the next, over a new connection too) go to it,
never through a login shell; a command sent while another starts it waits and goes to it; a host
connected ahead has its master and agent before its first command; a held command (the
controller lock) carries the agent's start and ends as a closed ssh session would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ablate.transport.agentlink import AgentLive
from ablate.transport.shellhost import Live
from ablate.transport.ssh import SSHHost
from tests.helpers.ssh_agent import CHAIN, fresh_fixture, no_agents_fixture
from tests.helpers.ssh_agent import agent_serves as _agent_serves
from tests.helpers.ssh_agent import run_on as _on
from tests.helpers.wait import wait_for
from tests.testbed import Testbed

# They time a silent agent's seconds-long window, which another worker's load stretches.
pytestmark = pytest.mark.alone

fresh = fresh_fixture()
no_agents = no_agents_fixture()


def test_the_first_command_starts_the_agent_and_later_ones_use_it(testbed: Testbed, fresh: Path,
                                                                  no_agents: None) -> None:
    first = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    chain = first.run(["sh", "-c", CHAIN]).check().stdout
    assert "sshd" in chain and "ablate_agent" not in chain  # the usual way: sshd, a login shell
    assert _agent_serves(testbed, "tb-h1")  # started before that command, listening already
    chain = first.run(["sh", "-c", CHAIN]).check().stdout
    assert "ablate_agent" in chain and "sshd" not in chain  # this process's next command
    first.close()

    later = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))  # the next ablate command
    chain = later.run(["sh", "-c", CHAIN]).check().stdout
    assert "ablate_agent" in chain and "sshd" not in chain  # no session, no login shell
    r = later.run(["sh", "-c", "cat; echo e >&2; exit 5"], stdin=b"x" * 100_000)
    assert (r.rc, r.stdout, r.stderr) == (5, "x" * 100_000, "e\n")
    assert [n for n in os.listdir(fresh) if n.endswith(".a")]  # the master's forward, beside it
    assert later.run(["sh", "-c", "echo $SHLVL"]).check().stdout == "1\n"  # as under a login shell
    later.close()


def test_a_new_connection_uses_the_agent_still_running_there(testbed: Testbed, fresh: Path,
                                                             no_agents: None) -> None:
    first = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    first.run(["true"]).check()
    wait_for(lambda: _agent_serves(testbed, "tb-h1"), 20)
    second = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    second.run(["true"]).check()  # through the agent: remembered here for the next connection
    old = second.master_pid()
    second.disconnect()  # the ControlMaster ends (ControlPersist ran out)
    wait_for(lambda: old is not None and not Path(f"/proc/{old}").exists(), 10)

    third = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    chain = third.run(["sh", "-c", CHAIN]).check().stdout
    assert third.master_pid() not in (None, old)  # a new connection...
    assert "ablate_agent" in chain and "sshd" not in chain  # ...and still no login shell


def test_a_command_sent_while_another_starts_the_agent_goes_to_it(
        testbed: Testbed, fresh: Path, no_agents: None, tmp_path: Path) -> None:
    """First contact, two commands at once (status's FS probe and its host query): the second waits
    for the first to start, the agent's news with it, then goes to the agent; never a second login
    shell, and never the first command's end (it still runs when the second is done)."""
    import threading

    marker = f"/tmp/abl-first-{os.getpid()}"
    host = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    first: list[str] = []
    t = threading.Thread(target=lambda: first.append(host.run(
        ["sh", "-c", CHAIN + f"; sleep 3; touch {marker}"], timeout=60).check().stdout))
    t.start()
    wait_for(lambda: host._agent_booted, 20)  # the first command carries the agent's start
    second = host.run(["sh", "-c", CHAIN + f"; test ! -e {marker} && echo first-still-running"],
                      timeout=60).check().stdout
    t.join(60)
    _on(testbed, "tb-h1", f"rm -f {marker}")
    assert "sshd" in first[0] and "ablate_agent" not in first[0]
    assert "ablate_agent" in second and "sshd" not in second
    assert "first-still-running" in second
    host.close()


def test_a_host_connected_ahead_has_its_master_and_agent_before_its_first_command(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    """`launch` connects to its hosts while it takes the lock through the shared FS's host
    (`transport.connect_ahead`, `SSHHost.warm`): the master and the agent are up before any
    command is asked there, and the first command goes to the agent (the one login shell was the
    warm-up's), as it does after warming up a new connection to an agent already running; where
    the master and the agent are there already, warming up sends nothing."""
    host = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    host.warm()
    assert host.master_pid() is not None and _agent_serves(testbed, "tb-h1")
    chain = host.run(["sh", "-c", CHAIN]).check().stdout
    assert "ablate_agent" in chain and "sshd" not in chain
    host.disconnect()
    host.close()

    again = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))  # a next command, new connection
    again.warm()
    assert again.master_pid() is not None
    chain = again.run(["sh", "-c", CHAIN]).check().stdout
    assert "ablate_agent" in chain and "sshd" not in chain

    third = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))  # its master and agent are there
    third.run = lambda *a, **k: pytest.fail("warm sent a command where nothing was to be gained")  # type: ignore[method-assign]
    third.warm()
    again.close()


def test_a_held_command_at_first_contact_starts_the_agent_for_the_next_ones(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    """launch's first command on the shared-FS host is the controller lock, held open: it carries
    the agent's start, so the commands after it go to the agent, not through login shells."""
    host = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    live = host.open_live("echo held; cat")
    assert b"held" in _read_until(live, b"held")
    chain = host.run(["sh", "-c", CHAIN]).check().stdout
    assert "ablate_agent" in chain and "sshd" not in chain
    live.shutdown_write()
    _read_until(live, b"never printed")  # read to the end: it ends once its stdin is closed
    assert live.exit_status() == 0
    live.close()
    host.close()


def _read_until(live: Live, text: bytes, timeout: float = 20.0) -> bytes:
    got = [b""]

    def seen() -> bool:
        got[0] += live.read(0.1)[0]
        return text in got[0] or live.exit_status() is not None

    wait_for(seen, timeout)
    return got[0]


def test_a_held_command_goes_through_the_agent_and_ends_as_a_closed_session_would(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    """`open_live` (what holds the controller lock): its stdin stays open until `shutdown_write`,
    and closing it gives the command EOF first, so it cleans up as when an ssh session closes."""
    h = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    h.run(["true"]).check()  # starts the agent
    live = h.open_live("echo ready; cat > /tmp/count; echo after")
    assert isinstance(live, AgentLive)
    assert b"ready" in _read_until(live, b"ready")
    live.shutdown_write()
    assert b"after" in _read_until(live, b"after")
    wait_for(lambda: live.exit_status() == 0, 10)
    live.close()

    live = h.open_live("echo ready; cat; echo cleaned > /tmp/count")
    assert b"ready" in _read_until(live, b"ready")
    live.close()  # the controller dies: EOF, and it ends on its own
    wait_for(lambda: _on(testbed, "tb-h1", "cat /tmp/count").strip() == "cleaned", 10)
