"""A multi-instance test bed on one Linux machine (recipe: ../shared/TESTBED.md).

Each instance is a network namespace with its own address on a per-run bridge, a private mount and
UTS namespace (own hostname, own tmpfs `/tmp` so its own tmux server, its own local disk bound at
`local_path`), one directory bound at `shared_path` on all of them, and a real `sshd -D`. With
`shared="sshfs"` a storage server serves that directory instead and each instance mounts it over
sshfs, client caches on (tests/testbed_storage.py); `storage_down`/`storage_up` is an outage. With
`shared="none"` nothing is shared: each instance has only its own disk (Vast.ai's case; the sweep is
then kept in an object store the instances reach on the bridge's address, `gateway`).

    with Testbed(3) as tb:
        SSHHost("tb-h1", ssh_config=str(tb.ssh_config)).run(["hostname"])   # -> tb-h1

Everything a run creates carries a per-run id (bridge, veths, namespaces, subnet, state dir), and a
run whose pytest process died is cleaned up by the next one, so parallel and leftover runs never
clash. Faults: `kill`, `reboot`, `pause`/`thaw`, `link_down`/`link_up`, `fill_disk`, `read_only`,
`slow_link`, `change_host_key`, `configure_sshd` (extra sshd_config lines), `storage_down`; `heal()`
undoes them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tests.helpers.proc import alive

if TYPE_CHECKING:
    from tests.testbed_storage import Storage

BASE = Path("/var/lib/ablate-testbed")  # not under /tmp: each instance mounts its own /tmp
SSHD = "/usr/sbin/sshd"
_EXTRA_MARK = "# -- extra lines (Testbed.configure_sshd) --\n"
TOOLS = ("ip", "tmux", "ssh-keygen", "unshare", "nsenter", "mount", "rsync")


def missing_requirement(shared: str = "bind") -> str | None:
    """Why the test bed (with that `shared` FS mode) cannot be built here, or None when it can."""
    if os.geteuid() != 0:
        return "the SSH test bed needs root (network namespaces, mounts); CI runs it as root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if not os.access(SSHD, os.X_OK):
        missing.append(SSHD)
    if missing:
        return (f"the SSH test bed needs {', '.join(missing)}: apt-get install openssh-server "
                "iproute2 tmux rsync util-linux (scripts/test.sh does)")
    from tests.testbed_storage import missing_sshfs

    return missing_sshfs() if shared == "sshfs" else None


def _sh(*argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"testbed: `{shlex.join(argv)}` exited {p.returncode}: "
                           f"{p.stderr.strip() or p.stdout.strip()}")
    return p


def _wait(cond: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"testbed: {what} not reached within {timeout}s")
        time.sleep(0.05)


def _port_open(addr: str, port: int = 22) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=0.5):
            return True
    except OSError:
        return False


def _proc_start(pid: int) -> str | None:
    """The start time of a pid (to tell a live owner from a recycled pid)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class Testbed:
    __test__ = False  # not a test class, despite the name

    def __init__(self, n: int = 3, shared: Literal["bind", "sshfs", "none"] = "bind", *,
                 startup_timeout: float = 20.0, sshfs_options: str = "") -> None:
        assert shared in ("bind", "sshfs", "none"), \
            f"testbed: shared is 'bind', 'sshfs' or 'none', not {shared!r}"
        assert not sshfs_options or shared == "sshfs", "testbed: sshfs_options needs shared='sshfs'"
        self.n, self.shared = n, shared
        self.sshfs_options = sshfs_options  # appended to the mounts' own (`dcache_timeout=60`)
        self.startup_timeout = startup_timeout
        self.rid = secrets.token_hex(3)
        self.dir = BASE / self.rid
        self.shared_dir = self.dir / "fs"  # backing dir of the shared FS, for assertions
        # Per-run mountpoints: nothing is bound over a path of the real machine.
        self.shared_path = str(self.dir / "mnt" / "shared")
        self.local_path = str(self.dir / "mnt" / "local")
        self.hosts = [f"tb-h{i}" for i in range(1, n + 1)]
        self.bridge = f"abr{self.rid}"
        self.ssh_config = self.dir / "ssh_config"
        self.known_hosts = self.dir / "known_hosts"
        self.client_key = self.dir / "client_key"
        self.subnet = ""
        self.storage: Storage | None = None  # the shared FS's server when shared == "sshfs"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._down: set[str] = set()
        self._paused: set[str] = set()
        self._dead: set[str] = set()
        self._filled: set[str] = set()
        self._rekeyed: set[str] = set()
        self._reconfigured: set[str] = set()
        self._read_only: dict[str, list[str]] = {}

    # ------------------------------------------------------------------ names

    def _i(self, host: str) -> int:
        if host not in self.hosts:
            raise KeyError(f"testbed: no host {host!r}; hosts are {self.hosts}")
        return self.hosts.index(host) + 1

    def netns(self, host: str) -> str:
        return f"tb{self.rid}h{self._i(host)}"

    def veth(self, host: str) -> str:
        return f"vtb{self.rid}{self._i(host)}"  # <= 15 chars for n < 100

    def address(self, host: str) -> str:
        return f"{self.subnet}.{10 + self._i(host)}"

    def hostname(self, host: str) -> str:
        return host

    @property
    def gateway(self) -> str:
        """This machine's address on the bed's bridge: where a service of the test's (an object
        store) is reached from every instance."""
        return f"{self.subnet}.1"

    def host_dir(self, host: str) -> Path:
        return self.dir / host

    def local_dir(self, host: str) -> Path:
        """Backing dir of `host`'s instance-local disk (seen there at `local_path`)."""
        return self.host_dir(host) / "local"

    def sshd_pid(self, host: str) -> int:
        return self._procs[host].pid

    # ------------------------------------------------------------------ build / tear down

    def __enter__(self) -> Testbed:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        reason = missing_requirement(self.shared)
        if reason:
            raise RuntimeError(reason)
        BASE.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privsep dir; left in place
        with open(BASE / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # subnet choice + bridge creation are one step
            reap_leftovers()
            self.dir.mkdir()
            self.subnet = free_subnet()
            if self.shared == "sshfs":  # imported here: testbed.py also runs as a script (delay-proxy)
                from tests.testbed_storage import Storage

                self.storage = Storage(self)
            self._save_state()
            _sh("ip", "link", "add", self.bridge, "type", "bridge", "forward_delay", "0")
            _sh("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            _sh("ip", "link", "set", self.bridge, "up")
        for p in ((self.shared_dir, Path(self.shared_path)) if self.shared != "none" else ()) + (
                Path(self.local_path),):
            p.mkdir(parents=True)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ablate-testbed",
            "-f", str(self.client_key))
        auth = self.dir / "authorized_keys"
        shutil.copy(f"{self.client_key}.pub", auth)
        auth.chmod(0o600)
        if self.storage is not None:
            self.storage.start()
        for host in self.hosts:
            self._make_instance(host)
            self._launch(host)
        for host in self.hosts:
            self._wait_sshd(host)
        self.trust_current_keys()
        self.write_ssh_config(self.ssh_config)

    def _save_state(self) -> None:
        state = {"pid": os.getpid(), "start": _proc_start(os.getpid()), "bridge": self.bridge,
                 "netns": self._namespaces()}
        (self.dir / "state.json").write_text(json.dumps(state))

    def _namespaces(self) -> list[str]:
        return [self.netns(h) for h in self.hosts] + ([self.storage.netns] if self.storage else [])

    def _make_instance(self, host: str) -> None:
        ns, veth, hdir = self.netns(host), self.veth(host), self.host_dir(host)
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _sh("ip", "link", "set", veth, "master", self.bridge)
        _sh("ip", "link", "set", veth, "up")
        _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        (hdir / "local").mkdir(parents=True)
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host, "-f", str(hdir / "hostkey"))
        (hdir / "sshd_config").write_text(
            f"ListenAddress {self.address(host)}\n"
            f"HostKey {hdir / 'hostkey'}\n"
            "PermitRootLogin prohibit-password\n"
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nStrictModes no\nUseDNS no\nPrintMotd no\nMaxStartups 100\n"
            "Subsystem sftp internal-sftp\n"
            f"PidFile {hdir / 'sshd.pid'}\n")

    def _launch(self, host: str) -> None:
        """Start the instance: private mounts + hostname, then `sshd -D` as its first process."""
        hdir = self.host_dir(host)
        q = shlex.quote
        shims = _private_shims(hdir)
        shared = (self.storage.mount_script(hdir / "sshfs.log") if self.storage else
                  "true" if self.shared == "none" else
                  f"mount --bind {q(str(self.shared_dir))} {q(self.shared_path)}")
        # Order matters: bind the dirs first, then hide /tmp behind a private tmpfs.
        script = (f"mount --make-rprivate / && hostname {q(self.hostname(host))} && "
                  f"mount --bind {q(str(hdir / 'local'))} {q(self.local_path)} && {shared} && "
                  + (f"mount --bind {q(str(shims[0]))} {q(str(shims[1]))} && " if shims else "") +
                  "mount -t tmpfs -o mode=1777 tmpfs /tmp && "
                  f"exec {SSHD} -D -f {q(str(hdir / 'sshd_config'))} -E {q(str(hdir / 'sshd.log'))}")
        # `ip netns exec`, `unshare` and `sh -c ... exec` all exec: the Popen pid is sshd's.
        self._procs[host] = subprocess.Popen(
            ["ip", "netns", "exec", self.netns(host), "unshare", "-m", "-u", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)

    def _wait_sshd(self, host: str) -> None:
        proc, addr = self._procs[host], self.address(host)
        deadline = time.monotonic() + self.startup_timeout
        while not _port_open(addr):
            if proc.poll() is not None or time.monotonic() > deadline:
                logs = [self.host_dir(host) / f for f in ("sshd.log", "sshfs.log")]
                tail = " ".join(f.read_text()[-500:] for f in logs if f.exists()) or "(no log)"
                raise RuntimeError(f"testbed: sshd of {host} ({addr}) did not come up "
                                   f"(exit {proc.poll()}): {tail}")
            time.sleep(0.05)

    def close(self) -> None:
        """Tear everything down; every step runs even when an earlier one failed."""
        errors: list[str] = []
        for host in self.hosts:
            try:
                self._kill_netns(host)
            except Exception as e:
                errors.append(str(e))
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        teardown_names(self.bridge, self._namespaces(), errors)  # the storage last
        if self.storage is not None:
            self.storage.reap()
        _remove_dir(self.dir, errors)
        if errors:
            raise RuntimeError("testbed teardown: " + "; ".join(errors))

    def _kill_netns(self, host: str) -> None:
        ns = self.netns(host)
        if not Path(f"/run/netns/{ns}").exists():
            return
        _kill_pids(ns)
        proc = self._procs.get(host)
        if proc is not None:
            proc.wait(timeout=10)

    # ------------------------------------------------------------------ client-side files

    def trust_current_keys(self, path: Path | None = None, hosts: list[str] | None = None) -> Path:
        """Write a known_hosts file holding the current host key of `hosts` (default: all)."""
        path = path or self.known_hosts
        lines = []
        for host in hosts if hosts is not None else self.hosts:
            kind, blob = (self.host_dir(host) / "hostkey.pub").read_text().split()[:2]
            lines.append(f"{self.address(host)} {kind} {blob}\n")
        path.write_text("".join(lines))
        return path

    def write_ssh_config(self, path: Path, *, known_hosts: Path | None = None,
                         strict: str = "yes", extra: str = "") -> Path:
        """An ssh_config with one alias per host (and `extra` appended verbatim)."""
        blocks = []
        for host in self.hosts:
            blocks.append(
                f"Host {host}\n  HostName {self.address(host)}\n  User root\n"
                f"  IdentityFile {self.client_key}\n  IdentitiesOnly yes\n"
                f"  UserKnownHostsFile {known_hosts or self.known_hosts}\n"
                f"  StrictHostKeyChecking {strict}\n  BatchMode yes\n")
        path.write_text("\n".join(blocks) + extra)
        return path

    def ssh_argv(self, host: str, *command: str) -> list[str]:
        """The OpenSSH client command line for `host` (for tests that want the real `ssh`)."""
        return ["ssh", "-F", str(self.ssh_config), host, *command]

    def agent_pids(self, host: str) -> list[int]:
        """The host agents (ablate/remote/host/agent.py) running on `host`: this instance's alone,
        by its network namespace (a `pkill -f` there would reach every bed's on this machine)."""
        pids = []
        for pid in _sh("ip", "netns", "pids", self.netns(host), check=False).stdout.split():
            with contextlib.suppress(OSError):
                if b"ablate_agent" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(int(pid))
        return pids

    def signal_agents(self, host: str, sig: int = signal.SIGKILL) -> None:
        """`sig` to the host agents on `host` (SIGSTOP: a hung agent; SIGCONT: it comes back)."""
        for pid in self.agent_pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def end_agents(self) -> None:
        """End the host agents ablate started on the instances (ablate/remote/host/agent.py), as a
        reboot would: the next command is a first contact again."""
        for host in self.hosts:
            self.signal_agents(host)

    # ------------------------------------------------------------------ faults

    def kill(self, host: str) -> None:
        """The instance dies (preemption): every process in it is killed, its /tmp is gone."""
        self._dead.add(host)
        self._filled.discard(host)  # its mount namespace went with it
        self._read_only.pop(host, None)
        _kill_pids(self.netns(host))
        self._procs[host].wait(timeout=10)

    def terminate(self, host: str, grace: float = 5.0) -> None:
        """The instance is stopped as RunPod stops a spot pod: SIGTERM to every process in it, then,
        `grace` seconds later, `kill` (SIGKILL to what is left)."""
        out = _sh("ip", "netns", "pids", self.netns(host), check=False).stdout
        for pid in (int(p) for p in out.split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 15)
        time.sleep(grace)  # the provider's grace, not a wait for a condition
        self.kill(host)

    def revive(self, host: str) -> None:
        """Boot a killed instance again (same address, host key and disks; empty /tmp; in sshfs
        mode a fresh mount, so the storage must be up: a boot without it fails here)."""
        if self._procs[host].poll() is None:
            self.kill(host)
        self._launch(host)
        self._wait_sshd(host)
        self._dead.discard(host)

    def reboot(self, host: str) -> None:
        """The instance restarts (AutoDL "shut down" + start): every process dies, its /tmp (and
        so its tmux server) is empty again; its local disk and the shared FS are kept."""
        self.kill(host)
        self.revive(host)

    def read_only(self, host: str, path: str) -> None:
        """`path` (as `host` sees it, e.g. a dir on the shared FS) turns read-only for `host`
        only: writes fail with EROFS even for root, as a full or permission-denied mount does.
        In sshfs mode it is a read-only bind over the FUSE mount, with the same effect."""
        q = shlex.quote(path)
        _sh("nsenter", "-t", str(self.sshd_pid(host)), "-m", "sh", "-c",
            f"mount --bind {q} {q} && mount -o remount,bind,ro {q}")
        self._read_only.setdefault(host, []).append(path)

    def writable(self, host: str) -> None:
        """Undo `read_only` on `host`."""
        for path in reversed(self._read_only.pop(host, [])):
            _sh("nsenter", "-t", str(self.sshd_pid(host)), "-m", "umount", path)

    def slow_link(self, host: str, delay: float, stall: Path | None = None) -> str:
        """An ssh_config block (for `write_ssh_config(extra=...)`) that reaches `host` through a
        proxy delaying every byte the client sends by `delay` seconds, and holding it while the
        file `stall` exists (the link stalls). A client that dies loses what was still in flight:
        that command never reaches the instance."""
        argv = [sys.executable, os.path.abspath(__file__), "delay-proxy", self.address(host), "22",
                str(delay), *([str(stall)] if stall else [])]
        return f"\nHost {host}\n  ProxyCommand {shlex.join(argv)}\n"

    def link_down(self, host: str) -> None:
        """The network drops; the instance and its processes live on."""
        self._down.add(host)
        _sh("ip", "link", "set", self.veth(host), "down")

    def link_up(self, host: str) -> None:
        _sh("ip", "link", "set", self.veth(host), "up")
        self._down.discard(host)
        _wait(lambda: _port_open(self.address(host)), 10, f"{host} reachable again")

    def pause(self, host: str) -> None:
        """The instance is paused, as a Vast.ai interruptible instance is when outbid: every process
        in it (sshd, the tmux server, the queues, the trainers, the runner, an sshfs mount) frozen
        by SIGSTOP, and its link down. Its disks, /tmp and mounts stay as they are; `thaw` resumes
        it. Stopped until no new pid appears (a process not stopped yet may fork), each one seen
        stopped (or in an uninterruptible wait: it stops as it leaves it, before it runs again)."""
        ns = self.netns(host)
        self._paused.add(host)
        stopped: set[int] = set()
        while new := [p for p in _netns_pids(ns) if p not in stopped]:
            for pid in new:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                stopped.add(pid)
            _wait(lambda: all(_run_state(p) in "TtDZX-" for p in new), 10, f"every process of {host} stopped")
        _sh("ip", "link", "set", self.veth(host), "down")

    def thaw(self, host: str) -> None:
        """The paused instance resumes by itself, as when its bid wins again: its link up first,
        then every process continued. In that order because a real box resumes whole: its processes
        never run into a dead link of their own making (an sshfs mount's server-alive probes, a
        store client's retries and back-off would count an outage the real box never has)."""
        _sh("ip", "link", "set", self.veth(host), "up")
        for pid in _netns_pids(self.netns(host)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._paused.discard(host)
        if self._procs[host].poll() is None:
            _wait(lambda: _port_open(self.address(host)), 10, f"{host} reachable again")

    def fill_disk(self, host: str, size: str = "8m", full: bool = True) -> None:
        """Replace `host`'s local disk by a small tmpfs of `size`, filled up when `full`."""
        self._filled.add(host)
        fill = f"; dd if=/dev/zero of={shlex.quote(self.local_path)}/.fill bs=64k 2>/dev/null" if full else ""
        _sh("nsenter", "-t", str(self.sshd_pid(host)), "-m", "sh", "-c",
            f"mount -t tmpfs -o size={shlex.quote(size)} tmpfs {shlex.quote(self.local_path)}"
            f"{fill}; true")

    def unfill_disk(self, host: str) -> None:
        _sh("nsenter", "-t", str(self.sshd_pid(host)), "-m", "umount", self.local_path)
        self._filled.discard(host)

    def change_host_key(self, host: str) -> None:
        """The instance's host key changes (re-created instance); known_hosts still has the old."""
        self._rekeyed.add(host)
        hdir = self.host_dir(host)
        for f in ("hostkey", "hostkey.pub"):
            (hdir / f).unlink()
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host, "-f", str(hdir / "hostkey"))
        new = (hdir / "hostkey.pub").read_text().split()[1]
        os.kill(self.sshd_pid(host), 1)  # SIGHUP: sshd re-execs itself and reads the new key
        _wait(lambda: _server_key(self.address(host)) == new, 10, f"{host} serving its new host key")

    def configure_sshd(self, host: str, extra: str = "") -> None:
        """Restart `host`'s sshd with the `extra` sshd_config lines after its own (`HostCertificate
        <path>`, `ListenAddress <addr>:2299`, ...); `configure_sshd(host)` restores its own config.
        Its processes (tmux, open sessions) live on: sshd re-execs itself on SIGHUP. Returns once
        every ListenAddress of the new config is listening again."""
        hdir = self.host_dir(host)
        path, log = hdir / "sshd_config", hdir / "sshd.log"
        text = path.read_text().split(_EXTRA_MARK)[0] + (_EXTRA_MARK + extra if extra else "")
        trial = hdir / "sshd_config.new"
        trial.write_text(text)
        checked = _sh(SSHD, "-t", "-f", str(trial), check=False)
        if checked.returncode != 0:
            trial.unlink()
            raise RuntimeError(f"testbed: sshd rejects the extra config for {host}: {checked.stderr.strip()}")
        trial.replace(path)
        if extra:
            self._reconfigured.add(host)
        else:
            self._reconfigured.discard(host)
        if self._procs[host].poll() is not None:
            return  # dead: `revive` starts it with this config
        listeners = sum(1 for line in text.splitlines() if line.split()[:1] == ["ListenAddress"])

        def listening() -> int:
            return log.read_text().count("Server listening on ")

        before = listening()
        os.kill(self.sshd_pid(host), signal.SIGHUP)
        _wait(lambda: listening() >= before + listeners, 10, f"{host}'s sshd listening again")

    def storage_down(self) -> None:
        """A storage outage (sshfs mode): the storage server's link drops until `storage_up`."""
        assert self.storage is not None, "testbed: only Testbed(n, shared='sshfs') has a storage server"
        self.storage.set_down()

    def storage_up(self) -> None:
        """Returns once the server answers; each mount reconnects on its next use (`wait_mounts`)."""
        assert self.storage is not None, "testbed: only Testbed(n, shared='sshfs') has a storage server"
        self.storage.set_up()

    def heal(self) -> None:
        """Undo every fault injected so far (storage and links up, dead revived, disks back, keys
        trusted); in sshfs mode it returns once the mounts that lost their server answer again."""
        stalled = set(self._down) | set(self._paused) | (
            set(self.hosts) if self.storage and self.storage.down else set())
        if self.storage is not None and self.storage.down:
            self.storage_up()  # first: `revive` mounts the shared FS
        for host in sorted(self._paused):
            self.thaw(host)
        for host in sorted(self._down):
            self.link_up(host)
        for host in sorted(self._dead):
            self.revive(host)
        for host in sorted(self._filled):
            self.unfill_disk(host)
        for host in sorted(self._read_only):
            self.writable(host)
        for host in sorted(self._reconfigured):
            self.configure_sshd(host)
        if self._rekeyed:
            self.trust_current_keys()
            self._rekeyed.clear()
        if self.storage is not None and stalled:
            self.storage.wait_mounts(sorted(stalled))


def _server_key(addr: str) -> str | None:
    """The base64 host key `addr` serves now, or None while it does not answer."""
    import paramiko

    try:
        sock = socket.create_connection((addr, 22), timeout=1)
    except OSError:
        return None
    t = paramiko.Transport(sock)
    try:
        t.start_client(timeout=2)
        return t.get_remote_server_key().get_base64()
    except (paramiko.SSHException, OSError, EOFError):
        return None
    finally:
        t.close()


def _private_shims(hdir: Path) -> tuple[Path, Path] | None:
    """Every instance shares this machine's /root, and root's .bashrc may run `pyenv init -`: every
    remote command's login shell then runs `pyenv rehash` under one lock file in the shims dir.
    Shared, it queues all instances' commands, and an instance killed while holding it leaves a
    lock every later shell waits 60 s on. Each instance gets its own copy (like its own /tmp)."""
    shims = Path(pwd.getpwuid(0).pw_dir) / ".pyenv" / "shims"
    if not shims.is_dir():
        return None
    mine = hdir / "pyenv-shims"
    mine.mkdir(exist_ok=True)
    for f in shims.iterdir():  # a rehash elsewhere may add or remove files meanwhile
        if not f.name.startswith(".pyenv-"):  # its lock and prototype files
            with contextlib.suppress(FileNotFoundError, FileExistsError):
                shutil.copy2(f, mine / f.name, follow_symlinks=False)
    return mine, shims


def _netns_pids(ns: str) -> list[int]:
    return [int(p) for p in _sh("ip", "netns", "pids", ns, check=False).stdout.split()]


def _run_state(pid: int) -> str:
    """A process's state letter (`T` stopped, `D` uninterruptible, `Z` zombie), `-` once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "-"


def _kill_pids(ns: str) -> None:
    def pids() -> list[int]:
        out = _sh("ip", "netns", "pids", ns, check=False).stdout
        return [int(p) for p in out.split()]

    killed = pids()
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    # a dying process leaves its netns before it is a zombie: `ip netns pids` alone returns too early
    _wait(lambda: not pids() and not any(alive(p) for p in killed), 10, f"every process of {ns} gone")


def free_subnet(prefix: str = "10.231") -> str:
    """A `<prefix>.X` no address or route on this machine uses (X random: beds side by side)."""
    used = set(re.findall(rf"{re.escape(prefix)}\.(\d+)\.", _sh("ip", "-o", "-4", "addr", "show").stdout
                          + _sh("ip", "-4", "route", "show", "table", "all").stdout))
    free = [x for x in range(1, 255) if str(x) not in used]
    if not free:
        raise RuntimeError(f"testbed: no free {prefix}.X.0/24 subnet")
    return f"{prefix}.{secrets.choice(free)}"


def teardown_names(bridge: str, namespaces: list[str], errors: list[str]) -> None:
    for ns in namespaces:
        if Path(f"/run/netns/{ns}").exists():
            try:
                _kill_pids(ns)
                _sh("ip", "netns", "del", ns)  # takes the veth pair with it
            except Exception as e:
                errors.append(str(e))
    if Path(f"/sys/class/net/{bridge}").exists():
        p = _sh("ip", "link", "del", bridge, check=False)
        if p.returncode != 0:
            errors.append(f"ip link del {bridge}: {p.stderr.strip()}")


def _remove_dir(path: Path, errors: list[str]) -> None:
    # Nothing is mounted in this mount namespace, but never rm -rf through a mount if one is.
    mounted = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
               if line.split()[4].startswith(str(path) + "/")]
    if mounted:
        errors.append(f"left {path} in place: still mounted here: {', '.join(mounted)}")
        return
    shutil.rmtree(path, ignore_errors=True)


def _owner_runs(pid: int, start: str | None) -> bool:
    """Whether `pid` is still the process that started at `start` and not a zombie (a killed
    owner stays one until this machine's init reaps it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return fields[0] != "Z" and fields[19] == start


def reap_leftovers(base: Path = BASE) -> None:
    """Tear down runs under `base` whose pytest process is gone (killed before its teardown ran)."""
    for state_file in base.glob("*/state.json"):
        try:
            state: dict[str, Any] = json.loads(state_file.read_text())
        except (OSError, ValueError):
            continue
        if _owner_runs(int(state["pid"]), state.get("start")):
            continue  # its owner still runs
        errors: list[str] = []
        teardown_names(state["bridge"], list(state["netns"]), errors)
        if not errors:
            _remove_dir(state_file.parent, errors)


def delay_proxy(addr: str, port: int, delay: float, stall: str | None = None) -> None:
    """A ProxyCommand: stdin/stdout <-> addr:port, each chunk from the client held back `delay`
    seconds, and for as long as the file `stall` exists; the server's replies pass at once. Exits
    when either side closes, dropping what it still holds (a killed controller's last command
    never arrives)."""
    import queue

    sock = socket.create_connection((addr, port), timeout=10)
    sock.settimeout(None)
    held: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def to_client() -> None:
        while data := sock.recv(65536):
            os.write(1, data)
        os._exit(0)

    def to_server() -> None:
        while True:
            t, data = held.get()
            time.sleep(max(0.0, t + delay - time.monotonic()))
            while stall and os.path.exists(stall):
                time.sleep(0.01)
            sock.sendall(data)

    threading.Thread(target=to_client, daemon=True).start()
    threading.Thread(target=to_server, daemon=True).start()
    while data := os.read(0, 65536):
        held.put((time.monotonic(), data))
    os._exit(0)


if __name__ == "__main__":  # testbed.py delay-proxy ADDR PORT SECONDS [STALL_FILE]: Testbed.slow_link
    if len(sys.argv) not in (5, 6) or sys.argv[1] != "delay-proxy":
        sys.exit("usage: testbed.py delay-proxy ADDR PORT SECONDS [STALL_FILE]")
    stall_file = sys.argv[5] if len(sys.argv) == 6 else None
    delay_proxy(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), stall_file)
