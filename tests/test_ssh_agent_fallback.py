"""When the host agent cannot be used, commands still run, each exactly once (on the test bed): sshd
refusing the forward, no Python on the host, an agent directory others could write, an agent
gone between commands, a kept master's silence while the host is busy (no command under way is
cut, and a host object of an ended command ends no master), an agent that takes connections but
never answers (gone around: tests/test_agent_sessions.py has how long)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from ablate.transport.agentlink import SILENT_RETRY, request
from ablate.transport.shellhost import HostUnreachable
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


def _count_once(tb: Testbed, hosts: list[SSHHost]) -> None:
    """Each host object appends one line on tb-h1; the file then has exactly one line per call."""
    for i, h in enumerate(hosts):
        h.run(["sh", "-c", f"echo {i} >> /tmp/count"]).check()
    assert _on(tb, "tb-h1", "cat /tmp/count").split() == [str(i) for i in range(len(hosts))]


def test_where_sshd_refuses_the_forward_commands_go_the_usual_way_once(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    testbed.configure_sshd("tb-h1", "AllowStreamLocalForwarding no\n")
    hosts = [SSHHost("tb-h1", ssh_config=str(testbed.ssh_config)) for _ in range(3)]
    _count_once(testbed, hosts)  # the 1st starts an agent; the 2nd finds it out of reach
    assert [n for n in os.listdir(fresh) if n.endswith(".refused")]  # so the 3rd did not try


def test_a_host_without_the_python_runs_commands_the_usual_way_once(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    hosts = [SSHHost("tb-h1", ssh_config=str(testbed.ssh_config), python="/nonexistent/python3")
             for _ in range(3)]
    _count_once(testbed, hosts)
    assert not _agent_serves(testbed, "tb-h1") and not any(h._agent_up for h in hosts)
    assert [n for n in os.listdir(fresh) if n.endswith(".refused")]  # tried once, not per command
    ahead = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config), python="/nonexistent/python3")
    ahead.run = lambda *a, **k: pytest.fail("warm-up sent a command")  # type: ignore[method-assign]
    ahead.disconnect()
    ahead.warm()  # launch's connect_ahead: the master only, no login shell to start no agent
    assert ahead.master_pid() is not None


def test_an_agent_directory_someone_else_could_write_is_never_used(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    _on(testbed, "tb-h1", "mkdir -m 777 /tmp/ablate-agent-root")
    hosts = [SSHHost("tb-h1", ssh_config=str(testbed.ssh_config)) for _ in range(3)]
    _count_once(testbed, hosts)
    assert not _agent_serves(testbed, "tb-h1") and not any(h._agent_up for h in hosts)


def test_an_agent_gone_between_commands_costs_nothing_twice(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    first = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    first.run(["true"]).check()
    wait_for(lambda: _agent_serves(testbed, "tb-h1"), 20)
    second = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    second.run(["true"]).check()
    assert second._agent_up
    testbed.signal_agents("tb-h1")
    wait_for(lambda: not testbed.agent_pids("tb-h1"), 10)
    third = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    _count_once(testbed, [second, third])  # second: its agent vanished (it starts one again)
    wait_for(lambda: _agent_serves(testbed, "tb-h1"), 20)


def test_a_kept_masters_silence_for_one_command_does_not_cut_another_under_way(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    """A master left by an earlier command is unproven: a command that hears nothing through it for
    the connect time-out ends it (the host is taken for gone). Not when the host is busy, not gone:
    ending the master would cut the commands under way (CI once saw launch's FS probe end so: 'the
    connection dropped while running'). Here the host's agent is stopped for longer than that
    time-out while one command runs and another is sent; both end well, each run once."""
    import threading

    first = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    first.run(["true"]).check()
    wait_for(lambda: _agent_serves(testbed, "tb-h1"), 20)
    first.close()
    host = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config), connect_timeout=2)  # silence: 3 s
    tag = f"/tmp/abl-kept-{os.getpid()}"
    got: dict[str, Any] = {}

    def long() -> None:
        try:
            got["a"] = host.run(["sh", "-c", f"echo a >>{tag}.runs; touch {tag}; sleep 4; echo A"],
                                timeout=60)
        except Exception as e:
            got["a"] = e

    t = threading.Thread(target=long)
    t.start()
    wait_for(lambda: _on(testbed, "tb-h1", f"test -e {tag} && echo y || true").strip() == "y", 20)
    testbed.signal_agents("tb-h1", signal.SIGSTOP)
    resume = threading.Timer(5.0, lambda: testbed.signal_agents("tb-h1", signal.SIGCONT))
    resume.start()
    try:
        b = host.run(["sh", "-c", f"echo b >>{tag}.runs; echo B"], timeout=60)
    finally:
        resume.join()
        testbed.signal_agents("tb-h1", signal.SIGCONT)
        t.join(60)
    runs = _on(testbed, "tb-h1", f"sort {tag}.runs; rm -f {tag} {tag}.runs")
    assert (b.rc, b.stdout) == (0, "B\n")
    assert not isinstance(got["a"], Exception), got["a"]
    assert (got["a"].rc, got["a"].stdout) == (0, "A\n")
    assert runs == "a\nb\n"
    assert host.master_pid() is not None
    host.close()


def test_a_host_object_of_an_ended_command_ends_no_master(
        testbed: Testbed, fresh: Path, no_agents: None) -> None:
    """connect_ahead's warm-up threads may outlive their command (in a process that runs several,
    as the tests do): one that then meets a silent link must not end the master under the next
    command, which uses the same master through a host object of its own (the link may come back
    before the master's keep-alives give up, as here)."""
    first = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    first.run(["true"]).check()
    wait_for(lambda: _agent_serves(testbed, "tb-h1"), 20)
    first.run(["true"]).check()
    pid = first.master_pid()
    left = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config), connect_timeout=2)
    left.close()  # its command ended; a thread of it goes on below
    testbed.link_down("tb-h1")
    try:
        with pytest.raises(HostUnreachable):  # 3 s of silence on a kept master: the host seems gone
            left.run(["true"], timeout=30)
    finally:
        testbed.link_up("tb-h1")
    assert pid is not None and first.master_pid() == pid
    assert first.run(["echo", "ok"]).check().stdout == "ok\n"
    first.close()


def test_an_agent_that_takes_connections_but_never_answers_is_gone_around(
        testbed: Testbed, fresh: Path, no_agents: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped or hung agent (the forward reaches its socket, no hello ever comes) must not make
    its host unreachable while `ssh` reaches it: after half the time-out, a session the usual way
    starts, so the command goes that way (once); the next ones, of this process and the next,
    go there at once, never to the agent (`.refused`), for SILENT_RETRY seconds: then it is tried
    again, and, answering again, used."""
    first = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config))
    first.run(["true"]).check()
    wait_for(lambda: _agent_serves(testbed, "tb-h1"), 20)
    first.run(["true"]).check()
    first.close()
    tag = f"/tmp/abl-hung-{os.getpid()}"
    testbed.signal_agents("tb-h1", signal.SIGSTOP)
    try:
        host = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config), connect_timeout=2)
        chain = host.run(["sh", "-c", f"echo 1 >>{tag}; " + CHAIN]).check().stdout
        assert "sshd" in chain and "ablate_agent" not in chain
        assert host.master_pid() is not None
        monkeypatch.setattr("ablate.transport.ssh.request",
                            lambda *a, **k: pytest.fail("a command went to the silent agent again"))
        assert "sshd" in host.run(["sh", "-c", f"echo 2 >>{tag}; " + CHAIN]).check().stdout
        host.close()
        later = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config), connect_timeout=2)
        assert "sshd" in later.run(["sh", "-c", f"echo 3 >>{tag}; " + CHAIN]).check().stdout
        later.close()
    finally:
        testbed.signal_agents("tb-h1", signal.SIGCONT)
    marks = [fresh / n for n in os.listdir(fresh) if n.endswith(".refused")]
    assert len(marks) == 1 and marks[0].read_text() == "silent"
    aged = marks[0].stat().st_mtime - SILENT_RETRY - 1
    os.utime(marks[0], (aged, aged))  # the stall is over: the agent is tried again
    monkeypatch.setattr("ablate.transport.ssh.request", request)  # (not undo(): fresh's env stays)
    again = SSHHost("tb-h1", ssh_config=str(testbed.ssh_config), connect_timeout=2)
    for i in (4, 5):  # tried again (over the kept master) and, answering, used
        assert "ablate_agent" in again.run(["sh", "-c", f"echo {i} >>{tag}; " + CHAIN]).check().stdout
    again.close()
    assert _on(testbed, "tb-h1", f"cat {tag}; rm -f {tag}") == "1\n2\n3\n4\n5\n"  # each ran once

