"""`ssh -G` kept between commands (ablate/transport/sshcache.py): the real OpenSSH client, through a
wrapper that counts its runs. Kept only while every file it was made of is as it was; never where
the answer depends on more than files."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from ablate.transport.ssh import SSHHost

pytestmark = [pytest.mark.tmux,  # the OpenSSH client, one of the apt-get tools (tests/helpers/tiers.py)
              pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")]


@pytest.fixture
def ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `ssh` that logs each run to runs.log, then is the real one."""
    monkeypatch.setenv("ABLATE_SSH_CONTROL_DIR", str(tmp_path / "ctl"))
    wrapper = tmp_path / "bin" / "ssh"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/runs.log\nexec {shutil.which("ssh")} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def _old(*paths: Path) -> None:
    """Written a while ago (a file changed in the last seconds is never kept)."""
    t = time.time() - 60
    for p in paths:
        os.utime(p, (t, t))


def _runs(tmp_path: Path) -> int:
    log = tmp_path / "runs.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def _port(ssh: Path, cfg: Path, alias: str = "box") -> str:
    return SSHHost(alias, ssh_config=str(cfg), ssh=str(ssh)).options()["port"]


def test_a_second_command_uses_the_kept_answer_until_the_config_changes(ssh: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("Host box\n  HostName 10.0.0.7\n  Port 2201\n")
    _old(cfg)
    assert _port(ssh, cfg) == "2201" and _runs(tmp_path) == 1
    assert _port(ssh, cfg) == "2201" and _runs(tmp_path) == 1  # kept: no ssh run
    cfg.write_text("Host box\n  HostName 10.0.0.7\n  Port 2202\n")
    assert _port(ssh, cfg) == "2202" and _runs(tmp_path) == 2
    assert _port(ssh, cfg) == "2202" and _runs(tmp_path) == 3  # just written: not kept yet
    _old(cfg)
    assert _port(ssh, cfg) == "2202" and _runs(tmp_path) == 4
    assert _port(ssh, cfg) == "2202" and _runs(tmp_path) == 4


def test_a_file_added_where_an_include_looks_is_a_new_answer(ssh: Path, tmp_path: Path) -> None:
    confd, inc = tmp_path / "conf.d", tmp_path / "inc"
    confd.mkdir()
    inc.mkdir()
    cfg = tmp_path / "config"
    cfg.write_text(f"Include {confd}/*.conf\nInclude {inc}/more.conf\nHost box\n  Port 2201\n")
    (confd / "a.conf").write_text("Host other\n  Port 9\n")
    _old(cfg, confd / "a.conf", confd, inc)
    assert _port(ssh, cfg) == "2201" and _port(ssh, cfg) == "2201" and _runs(tmp_path) == 1
    (confd / "b.conf").write_text("Host box\n  Port 2203\n")  # first match wins: before the config's own
    assert _port(ssh, cfg) == "2203" and _runs(tmp_path) == 2
    (confd / "b.conf").unlink()
    (inc / "more.conf").write_text("Host box\n  Port 2204\n")  # a file the include named, now there
    assert _port(ssh, cfg) == "2204" and _runs(tmp_path) == 3
    (inc / "more.conf").write_text("Host box\n  Port 2205\n")  # an included file edited
    _old(confd, inc)
    assert _port(ssh, cfg) == "2205" and _runs(tmp_path) == 4


@pytest.mark.parametrize("line", ['Match exec "test -e {flag}"\n  Port 2209\n',
                                  "Host box\n  CanonicalizeHostname yes\n  CanonicalDomains example.org\n",
                                  "Include /tmp/*/never-{tag}.conf\n"])
def test_an_answer_that_depends_on_more_than_files_is_never_kept(ssh: Path, tmp_path: Path,
                                                                 line: str) -> None:
    flag = tmp_path / "flag"
    cfg = tmp_path / "config"
    cfg.write_text(line.format(flag=flag, tag=tmp_path.name) + "Host box\n  Port 2201\n")
    _old(cfg)
    assert _port(ssh, cfg) == "2201" and _port(ssh, cfg) == "2201" and _runs(tmp_path) == 2
    if "exec" in line:
        flag.touch()  # the reason: the same files, another answer
        assert _port(ssh, cfg) == "2209"


def test_another_environment_or_alias_is_another_answer(ssh: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("Host box\n  Port 2201\nHost *\n  UserKnownHostsFile ${ABLATE_TEST_DIR}/known\n")
    monkeypatch.setenv("ABLATE_TEST_DIR", "/alice")
    _old(cfg)
    assert SSHHost("box", ssh_config=str(cfg), ssh=str(ssh)).options()["userknownhostsfile"] == "/alice/known"
    monkeypatch.setenv("ABLATE_TEST_DIR", "/bob")
    assert SSHHost("box", ssh_config=str(cfg), ssh=str(ssh)).options()["userknownhostsfile"] == "/bob/known"
    assert _port(ssh, cfg, "other") == "22" and _runs(tmp_path) == 3
    # a variable no config names and OpenSSH does not read (OLDPWD after a `cd`, a terminal's own,
    # ABLATE_TIMINGS): the kept answer still holds
    monkeypatch.setenv("OLDPWD", "/somewhere/else")
    monkeypatch.setenv("ABLATE_TIMINGS", str(tmp_path / "t.jsonl"))
    assert SSHHost("box", ssh_config=str(cfg), ssh=str(ssh)).options()["userknownhostsfile"] == "/bob/known"
    assert _runs(tmp_path) == 3
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/another-agent.sock")  # one OpenSSH reads: asked again
    assert _port(ssh, cfg) == "2201" and _runs(tmp_path) == 4


def test_a_config_error_is_reported_without_the_debug_lines(ssh: Path, tmp_path: Path) -> None:
    from ablate.transport.shellhost import SSHConfigError

    cfg = tmp_path / "config"
    cfg.write_text("Host box\n  NoSuchOption yes\n")
    with pytest.raises(SSHConfigError) as e:
        _port(ssh, cfg)
    assert "NoSuchOption" in str(e.value) or "nosuchoption" in str(e.value).lower()
    assert "debug1" not in str(e.value)
