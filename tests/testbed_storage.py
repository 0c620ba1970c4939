"""The test bed's shared FS as a real network filesystem (`Testbed(n, shared="sshfs")`; recipe:
../shared/TESTBED.md).

A storage server (its own network namespace on the run's bridge, a real `sshd` with the sftp
subsystem and its own host key) serves the bed's `shared_dir`; every instance mounts it at
`shared_path` with Debian's `sshfs` and its default options, so its caches stay on: another
instance's new file, rename or append shows up there seconds later, as on NFS or a cloud's file
storage. Only robustness options a user would set are added (`reconnect`, server-alive probes).
The sshfs process lives in the instance's namespaces: killing the instance kills its mount.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from pathlib import Path

from tests.testbed import SSHD, Testbed, _port_open, _sh, _wait

SSHFS_OPTIONS = "allow_other,reconnect,ServerAliveInterval=5,ServerAliveCountMax=3,ConnectTimeout=5"


def missing_sshfs() -> str | None:
    """Why an instance cannot mount the shared FS over sshfs here, or None when it can."""
    missing = [] if shutil.which("sshfs") else ["sshfs"]
    if not os.path.exists("/dev/fuse"):
        missing.append("/dev/fuse")
    if missing:
        return (f"the sshfs test bed needs {', '.join(missing)}: apt-get install sshfs "
                "(scripts/test.sh does) and a machine with FUSE")
    return None


class Storage:
    """The storage server of one bed: `netns`, `veth` (its bridge side), `address`; `ssh_config`
    and `known_hosts` are what the instances' sshfs connects with (the storage key is pinned)."""

    def __init__(self, tb: Testbed) -> None:
        self.tb = tb
        self.netns = f"tb{tb.rid}st"
        self.veth = f"vtb{tb.rid}s"
        self.dir = tb.dir / "storage"
        self.ssh_config = self.dir / "ssh_config"
        self.known_hosts = self.dir / "known_hosts"
        self.down = False
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.tb.subnet}.2"

    def start(self) -> None:
        d = self.dir
        d.mkdir()
        _sh("ip", "netns", "add", self.netns)
        _sh("ip", "link", "add", self.veth, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        _sh("ip", "link", "set", self.veth, "master", self.tb.bridge)
        _sh("ip", "link", "set", self.veth, "up")
        for cmd in (["ip", "addr", "add", f"{self.address}/24", "dev", "eth0"],
                    ["ip", "link", "set", "eth0", "up"], ["ip", "link", "set", "lo", "up"]):
            _sh("ip", "netns", "exec", self.netns, *cmd)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "storage", "-f", str(d / "hostkey"))
        (d / "sshd_config").write_text(
            f"ListenAddress {self.address}\nHostKey {d / 'hostkey'}\n"
            f"AuthorizedKeysFile {self.tb.dir / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            f"UseDNS no\nMaxStartups 100\nPidFile {d / 'sshd.pid'}\nSubsystem sftp internal-sftp\n")
        self._proc = proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, SSHD, "-D", "-f", str(d / "sshd_config"),
             "-E", str(d / "sshd.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        _wait(lambda: _port_open(self.address) or proc.poll() is not None, self.tb.startup_timeout,
              "the storage sshd listening")
        if proc.poll() is not None:
            raise RuntimeError(f"testbed: the storage sshd exited {proc.returncode}: "
                               f"{(d / 'sshd.log').read_text()[-500:]}")
        kind, blob = (d / "hostkey.pub").read_text().split()[:2]
        self.known_hosts.write_text(f"{self.address} {kind} {blob}\n")
        self.ssh_config.write_text(
            f"Host storage\n  HostName {self.address}\n  User root\n  IdentityFile {self.tb.client_key}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {self.known_hosts}\n"
            "  StrictHostKeyChecking yes\n  BatchMode yes\n")

    def mount_script(self, log: Path) -> str:
        """The shell step (run inside an instance's namespaces) that mounts the shared FS; sshfs
        daemonizes once mounted, its ssh client's messages go to `log`."""
        q = shlex.quote
        options = ",".join(o for o in (SSHFS_OPTIONS, self.tb.sshfs_options) if o)
        return (f"sshfs -F {q(str(self.ssh_config))} {q('storage:' + str(self.tb.shared_dir))} "
                f"{q(self.tb.shared_path)} -o {q(options)} 2>>{q(str(log))}")

    def set_down(self) -> None:
        self.down = True
        _sh("ip", "link", "set", self.veth, "down")

    def set_up(self) -> None:
        _sh("ip", "link", "set", self.veth, "up")
        self.down = False
        _wait(lambda: _port_open(self.address), 10, "the storage reachable again")

    def reap(self) -> None:
        """Wait for the storage sshd once its namespace's processes were killed."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait(timeout=10)

    def probe(self, host: str, timeout: float = 10.0) -> bool:
        """Whether `host`'s mount answers a round trip to the server within `timeout` seconds (a
        create and a remove: a listing or a stat may come from its cache)."""
        probe = shlex.quote(f"{self.tb.shared_path}/.testbed-probe-{host}")
        try:
            p = subprocess.run(["nsenter", "-t", str(self.tb.sshd_pid(host)), "-m", "-n", "sh", "-c",
                                f"touch {probe} && rm -f {probe}"], capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return p.returncode == 0

    def wait_mounts(self, hosts: list[str], timeout: float = 60.0) -> None:
        """Wait until the mount of every one of `hosts` answers again (after an outage)."""
        for host in hosts:
            _wait(functools.partial(self.probe, host), timeout, f"{host}'s shared mount answering")
