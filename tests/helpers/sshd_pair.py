"""Two real sshds on this machine (127.0.0.1, two free ports), each setting its own session
environment (`SetEnv ABLATE_T_SESSION=<its name>`), and one ssh config with an alias for each:
the same machine reached through two aliases whose sessions differ, as a user's laptop reaches a
cluster's login node through two entries, or a box through two sshd ports. Needs root (sshd)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SSHD = "/usr/sbin/sshd"
VAR = "ABLATE_T_SESSION"


def missing_requirement() -> str | None:
    if os.geteuid() != 0:
        return "needs root (an sshd of its own)"
    if not Path(SSHD).is_file() or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "needs OpenSSH's server and client (scripts/test.sh installs them)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd on {port} exited: {log.read_text() if log.exists() else ''}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"sshd on {port} did not listen within 20 s")


@contextmanager
def sshd_pair(tmp: Path, names: tuple[str, str] = ("sa", "sb"), setenv: str = "") -> Iterator[Path]:
    """Start the two sshds; yield the ssh config naming them `names`; stop them. `setenv`: more
    `NAME=VALUE` words both sshds set (`TMUX_TMPDIR`: one tmux server of their own for both)."""
    tmp.mkdir(parents=True, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / "client")], check=True)
    (tmp / "authorized_keys").write_text((tmp / "client.pub").read_text())
    (tmp / "authorized_keys").chmod(0o600)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    procs: list[subprocess.Popen[bytes]] = []
    config, known = [], []
    try:
        for name in names:
            port = _free_port()
            d = tmp / name
            d.mkdir()
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "hostkey")],
                           check=True)
            (d / "sshd_config").write_text(
                f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {d / 'hostkey'}\n"
                f"AuthorizedKeysFile {tmp / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                f"UseDNS no\nPrintMotd no\nMaxStartups 100\nSetEnv {VAR}={name} {setenv}\n"
                f"PidFile {d / 'sshd.pid'}\n")
            proc = subprocess.Popen([SSHD, "-D", "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")],
                                    start_new_session=True)
            procs.append(proc)
            _wait_listening(port, proc, d / "sshd.log")
            kind, blob = (d / "hostkey.pub").read_text().split()[:2]
            known.append(f"[127.0.0.1]:{port} {kind} {blob}\n")
            config.append(f"Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  User root\n"
                          f"  IdentityFile {tmp / 'client'}\n  IdentitiesOnly yes\n"
                          f"  UserKnownHostsFile {tmp / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
                          "  BatchMode yes\n  ConnectTimeout 5\n")
        (tmp / "known_hosts").write_text("".join(known))
        (tmp / "ssh_config").write_text("".join(config))
        yield tmp / "ssh_config"
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
