"""The paramiko fallback (no OpenSSH client on PATH, or ABLATE_SSH=paramiko): what it cannot honour
is refused loudly, what it can is done like the OpenSSH transport does it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import paramiko
import pytest

from ablate.config.project import load_project
from ablate.errors import AblateError
from ablate.transport import close_all, host_transport, shared_fs, ssh_client
from ablate.transport.paramiko_ssh import ParamikoHost, load_known_hosts, load_ssh_config
from ablate.transport.shellhost import HostKeyError, SSHConfigError
from ablate.transport.ssh import SSHHost
from ablate.transport.sshfs import SSHFS
from tests.helpers.testbed_projects import ssh_project
from tests.testbed import Testbed


@pytest.mark.parametrize("line", ["Include other.conf", "  HostKeyAlias box", "CertificateFile ~/.ssh/c",
                                  "SecurityKeyProvider internal", "KnownHostsCommand /bin/x %H"])
def test_a_keyword_the_fallback_would_ignore_is_refused(tmp_path: Path, line: str) -> None:
    cfg = tmp_path / "config"
    cfg.write_text(f"Host a\n  HostName 10.0.0.1\n{line}\n")
    with pytest.raises(SSHConfigError) as e:
        load_ssh_config(str(cfg))
    assert f"{cfg}:3" in str(e.value) and "OpenSSH" in str(e.value) and e.value.exit_code == 2


def test_marker_lines_in_known_hosts(tmp_path: Path) -> None:
    key = paramiko.Ed25519Key.from_private_key_file(_keygen(tmp_path / "k"))
    plain = f"10.0.0.1 {key.get_name()} {key.get_base64()}\n"
    kh = tmp_path / "known_hosts"
    kh.write_text(f"@cert-authority *.corp {key.get_name()} {key.get_base64()}\n{plain}")
    keys = paramiko.HostKeys()
    load_known_hosts(keys, str(kh))  # a CA line elsewhere no longer breaks every host
    assert keys.lookup("10.0.0.1") is not None and keys.lookup("*.corp") is None
    kh.write_text(f"{plain}@revoked * {key.get_name()} {key.get_base64()}\n")
    with pytest.raises(HostKeyError, match=r"known_hosts:2 revokes a host key"):
        load_known_hosts(paramiko.HostKeys(), str(kh))


def test_the_client_is_chosen_by_path_and_by_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ABLATE_SSH", raising=False)
    assert ssh_client() == "openssh"  # CI and this machine have OpenSSH's client
    monkeypatch.setenv("ABLATE_SSH", "paramiko")
    assert ssh_client() == "paramiko"
    monkeypatch.setenv("ABLATE_SSH", "putty")
    with pytest.raises(AblateError, match="give openssh or paramiko"):
        ssh_client()
    monkeypatch.setenv("ABLATE_SSH", "")
    with monkeypatch.context() as m:
        m.setenv("PATH", str(tmp_path))  # no ssh anywhere on PATH
        assert ssh_client() == "paramiko"


def test_the_fallback_runs_a_sweep_s_operations(testbed: Testbed, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABLATE_SSH", "paramiko")
    project = load_project(ssh_project(testbed, tmp_path, "fallback"))
    try:
        h1 = host_transport(project, project.hosts["tb-h1"])
        assert isinstance(h1, ParamikoHost) and not isinstance(h1, SSHHost)
        assert h1.run(["printf", "%s|", "a b", "$HOME", "'"]).stdout == "a b|$HOME|'|"
        got: list[bytes] = []
        assert h1.stream(["sh", "-c", "echo one; echo two"], got.append) == 0
        assert b"".join(got) == b"one\ntwo\n"
        fs = shared_fs(project)
        assert isinstance(fs, SSHFS)
        fs.write_atomic(f"{fs.root}/x/f", b"data")
        assert fs.read_bytes(f"{fs.root}/x/f") == b"data"
        held = fs.lock(f"{fs.root}/x/lock", timeout=5)
        assert held is not None
        assert fs.lock(f"{fs.root}/x/lock", timeout=0) is None  # the held lock is exclusive
        held.release()
        again = fs.lock(f"{fs.root}/x/lock", timeout=5)
        assert again is not None
        again.release()
    finally:
        close_all()


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return str(path)
