"""The host agent answers only for connections whose sessions it shares: an agent runs every later
command in the environment of the session that started it, so one started through one sshd or alias
never answers for another with other session settings (sshd's SetEnv, the keys, the client's SetEnv
or SendEnv). The key is `agentlink.session_key` over `ssh -G`'s settings (milliseconds), and on two
real sshds of this machine, each command sees its own session's environment, in either order, with
the agent doing the work. What this machine remembers of an agent that could not serve (`Marks`):
a silent one is gone around for SILENT_RETRY seconds, a refusing host for an idle time."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ablate.transport.agentlink import SILENT_RETRY, Marks, remote_socket, session_key
from ablate.transport.ssh import SSHHost
from tests.helpers.sshd_pair import VAR, missing_requirement, sshd_pair

G = ("host sa\nuser root\nhostname 127.0.0.1\nport 2201\nidentityfile ~/.ssh/id_ed25519\n"
     "identityfile ~/.ssh/id_rsa\nconnecttimeout 5\nserveraliveinterval 0\nsendenv LANG LC_*\n")


def _with(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


def test_the_session_key_follows_what_makes_a_session_and_nothing_else() -> None:
    key = session_key(G, {"LANG": "C.UTF-8", "HOME": "/root"})
    assert len(key) == 12 and key == session_key(G, {"LANG": "C.UTF-8", "HOME": "/elsewhere"})
    # another sshd, another user, other keys, a client SetEnv, another value sent: another agent
    for changed in (_with(G, "port 2201", "port 2202"), _with(G, "hostname 127.0.0.1", "hostname ::1"),
                    _with(G, "user root", "user ml"), _with(G, "identityfile ~/.ssh/id_rsa\n", ""),
                    G + "setenv SLURM_CONF=/etc/slurm/a.conf\n", G + "proxyjump bastion\n"):
        assert session_key(changed, {"LANG": "C.UTF-8"}) != key, changed
    assert session_key(G, {"LANG": "de_DE.UTF-8"}) != key
    assert session_key(G, {"LANG": "C.UTF-8", "LC_ALL": "C"}) != key  # LC_* is sent too
    # the alias's own name and settings of the connection alone are no session setting
    same = _with(_with(G, "host sa", "host other-alias"), "connecttimeout 5", "connecttimeout 30")
    assert session_key(same, {"LANG": "C.UTF-8"}) == key


def test_each_session_has_its_own_agent_socket() -> None:
    a, b = session_key(G, {}), session_key(_with(G, "port 2201", "port 2202"), {})
    sa, sb = remote_socket("root", a), remote_socket("root", b)
    assert sa and sb and sa != sb and sa.startswith("/tmp/ablate-agent-root/") and sa.endswith(f".{a}.sock")
    assert remote_socket("root", "../x") is None and remote_socket("bad user", a) is None


@pytest.mark.bed
@pytest.mark.parametrize("order", [("sa", "sb"), ("sb", "sa")])
def test_two_sshds_with_their_own_setenv_each_answer_with_their_own(tmp_path: Path,
                                                                     order: tuple[str, str]) -> None:
    reason = missing_requirement()
    if reason:
        pytest.skip(reason)
    with sshd_pair(tmp_path / "sshd") as cfg:
        hosts = {name: SSHHost(name, ssh_config=str(cfg)) for name in order}
        links = {name: host._agent_link() for name, host in hosts.items()}
        try:
            for name in order:  # the first command starts this session's agent, the later ones use it
                for _ in range(3):
                    r = hosts[name].run(["sh", "-c", f'printf %s "${VAR}"'], timeout=30)
                    assert (r.rc, r.stdout) == (0, name), (name, r)
                assert hosts[name].agent_ready(), f"{name}: the agent was never used"
            assert all(links.values()) and links["sa"] != links["sb"], links
            for name, link in links.items():
                assert link is not None and Path(link[1]).is_socket(), (name, link)
        finally:
            for host in hosts.values():
                host.close()
            for link in links.values():  # the agents this test started (they would idle an hour)
                if link is not None:
                    subprocess.run(["pkill", "-f", link[1]], check=False)


def test_a_silent_agent_is_gone_around_for_a_while_and_a_refusing_host_for_an_idle_time(
        tmp_path: Path) -> None:
    silent, refusing = Marks(str(tmp_path / "a")), Marks(str(tmp_path / "b"))
    silent.started(True)
    silent.silent()
    refusing.started(False)  # no Python there, say
    assert silent.refused() and refusing.refused() and not silent.seen()
    for m, age in ((silent, SILENT_RETRY + 1), (refusing, SILENT_RETRY + 1)):
        t = os.stat(m.refused_path).st_mtime - age
        os.utime(m.refused_path, (t, t))
    assert not silent.refused() and refusing.refused()
    t = os.stat(refusing.refused_path).st_mtime - 3600
    os.utime(refusing.refused_path, (t, t))
    assert not refusing.refused()  # an idle time (the default hour) later, tried again
