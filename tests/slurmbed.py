"""A real Slurm cluster on one Linux machine (recipe: ../shared/TESTBED.md, "A real Slurm cluster").

Debian's `slurmctld`, `slurmd` and `munged`, each node its own machine as far as Slurm can tell:

- the controller: a network namespace with `<subnet>.2` on a per-run bridge (the host side holds
  `<subnet>.1`, so client commands run here reach it), its own hostname (`sbctl`), `munged` with a
  key of its own (its socket under the run dir: the system's /etc/munge is never used) and
  `slurmctld -D`;
- node i (`sn1`, `sn2`, ...): a network namespace with `<subnet>.(10+i)`, a private mount and UTS
  namespace (hostname `sn<i>`, a tmpfs `/tmp` of its own, its own local disk bound at `local_path`)
  and `slurmd -D` as its first process, started with `nsenter` (`ip netns exec` remounts /sys);
- the shared FS: `shared_dir`, one directory every namespace sees at the same path (job scripts'
  working dir and output go there).

    with SlurmBed(3) as sb:
        job = sb.sbatch("hostname", "-w", "sn2")
        sb.wait_job(job, "COMPLETED")
        sb.output(job)                      # -> "sn2\\n"

The run dir is not under /tmp (each node mounts its own). Everything carries a per-run id (bridge,
veths, namespaces, a 10.232.X.0/24 subnet: tests/testbed.py's beds use 10.231.X), and a run whose
pytest process died is torn down by the next one. Faults: `node_kill` (every process of a node dies:
slurmctld marks it `down*` about 30 s later, SlurmdTimeout plus its pings' MessageTimeout),
`node_restart`; `heal()` cancels every job and brings every node back.

`SlurmBed(3, accounting=True)` adds real accounting (`sacct`, `sacctmgr`): a MariaDB of its own (a
datadir under the run dir, on the controller's 127.0.0.1) and `slurmdbd -D` beside slurmctld, which
registers its cluster itself and sends job records asynchronously: an ended job is in the database
within ~0.1 s (`sacct -j <id>` has it), but plain `sacct` (jobs eligible since midnight) lists it
only once slurmctld has sent its eligible time too, 3-5 s later; tests poll. It starts in about
2.3 s instead of 0.3 s; the default bed has no accounting (accounting_storage/none).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.testbed import (
    _kill_pids,
    _proc_start,
    _remove_dir,
    _sh,
    free_subnet,
    reap_leftovers,
    teardown_names,
)

BASE = Path("/var/lib/ablate-slurmbed")
SUBNET = "10.232"  # tests/testbed.py (and its sshfs storage) take 10.231.X.0/24
SLURMCTLD, SLURMD, MUNGED = "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged"
# Accounting (`SlurmBed(accounting=True)`): slurmdbd and its MariaDB, both beside slurmctld.
SLURMDBD, MARIADBD = "/usr/sbin/slurmdbd", "/usr/sbin/mariadbd"
ACCOUNTING_TOOLS = ("mariadb-install-db", "mariadb", "sacct", "sacctmgr")
DB_PORT = 3306  # on the controller's own loopback: beds side by side (and a system MariaDB) never meet
SSHD = "/usr/sbin/sshd"  # the login node (`login()`)
TOOLS = ("ip", "nsenter", "unshare", "mount", "sinfo", "squeue", "sbatch", "scontrol", "scancel")
CONTROLLER = "sbctl"
SLURMD_TIMEOUT = 10  # seconds without an answer before slurmctld marks a node DOWN
# How long a requeued job waits (its BeginTime) before it may start again; Slurm's default is 120 s.
CRED_EXPIRE = 10
# Node states in which a node answers and takes jobs (sinfo's %t, no `*` = responding).
UP_STATES = {"idle", "mix", "alloc", "comp"}
GRACE_TIME = 20  # seconds a preempted job of partition `main` has to stop before it is requeued


def missing_requirement(accounting: bool = False) -> str | None:
    """Why the Slurm bed (with `accounting`: slurmdbd and MariaDB too) cannot be built here, or None
    when it can."""
    if os.geteuid() != 0:
        return "the Slurm bed needs root (network namespaces, mounts, slurmd); CI runs it as root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    missing += [p for p in (SLURMCTLD, SLURMD, MUNGED) if not os.access(p, os.X_OK)]
    if missing:
        return (f"the Slurm bed needs {', '.join(missing)}: apt-get install slurmd slurmctld "
                "slurm-client munge iproute2 util-linux (scripts/test.sh does)")
    if accounting:
        missing = [t for t in ACCOUNTING_TOOLS if shutil.which(t) is None]
        missing += [p for p in (SLURMDBD, MARIADBD) if not os.access(p, os.X_OK)]
        if missing:
            return (f"the Slurm bed's accounting needs {', '.join(missing)}: apt-get install slurmdbd "
                    "mariadb-server (scripts/test.sh does)")
    return None


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:].strip() or "(empty)"
    except OSError:
        return "(none)"


class SlurmBed:
    def __init__(self, n: int = 3, *, startup_timeout: float = 45.0,
                 slurmd_timeout: int = SLURMD_TIMEOUT, accounting: bool = False) -> None:
        self.n = n
        self.accounting = accounting
        self.startup_timeout = startup_timeout
        self.slurmd_timeout = slurmd_timeout
        self.rid = secrets.token_hex(3)
        self.dir = BASE / self.rid
        self.shared_dir = self.dir / "shared"  # the shared FS: the same path on every node and here
        self.local_path = str(self.dir / "mnt" / "local")  # each node's local disk, as it sees it
        self.conf_path = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.sock"
        self.db_dir = self.dir / "db"  # accounting: MariaDB's datadir, socket, pid file, tmpdir
        self.db_socket = self.db_dir / "mariadb.sock"
        self.db_password = secrets.token_hex(12)  # slurmdbd's MariaDB user `slurm`
        self.nodes = [f"sn{i}" for i in range(1, n + 1)]
        self.bridge = f"sbr{self.rid}"
        self.subnet = ""
        # "munged", "slurmctld", node names; "mariadbd" and "slurmdbd" with accounting
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._dead: set[str] = set()
        self.overrides: dict[str, str] = {}  # further slurm.conf keys (`reconfigure`)

    # ------------------------------------------------------------------ names

    def _i(self, node: str) -> int:
        if node not in self.nodes:
            raise KeyError(f"slurmbed: no node {node!r}; nodes are {self.nodes}")
        return self.nodes.index(node) + 1

    @property
    def cluster(self) -> str:
        """ClusterName (and, with accounting, the cluster's name in slurmdbd)."""
        return f"ablate{self.rid}"

    @property
    def ctl_netns(self) -> str:
        return f"sb{self.rid}c"

    @property
    def ctl_address(self) -> str:
        return f"{self.subnet}.2"

    def netns(self, node: str) -> str:
        return f"sb{self.rid}n{self._i(node)}"

    def veth(self, node: str) -> str:
        return f"vsb{self.rid}{self._i(node)}"  # <= 15 chars for n < 100

    def address(self, node: str) -> str:
        return f"{self.subnet}.{10 + self._i(node)}"

    def node_dir(self, node: str) -> Path:
        return self.dir / "nodes" / node

    def local_dir(self, node: str) -> Path:
        """Backing dir of `node`'s local disk (the node sees it at `local_path`)."""
        return self.node_dir(node) / "local"

    @property
    def ctl_veth(self) -> str:
        return f"vsb{self.rid}c"

    def slurmd_pid(self, node: str) -> int:
        return self._procs[node].pid

    def pids(self) -> dict[str, int]:
        """The daemons this bed started: "munged", "slurmctld", each node's slurmd (and "mariadbd",
        "slurmdbd" with accounting; "sshd" once `login()` ran)."""
        return {name: proc.pid for name, proc in self._procs.items()}

    def env(self) -> dict[str, str]:
        """This process's environment with SLURM_CONF pointing at the bed (for client commands)."""
        return {**os.environ, "SLURM_CONF": str(self.conf_path)}

    # ------------------------------------------------------------------ build / tear down

    def __enter__(self) -> SlurmBed:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        reason = missing_requirement()
        if reason:
            raise RuntimeError(reason)
        BASE.mkdir(parents=True, exist_ok=True)
        with open(BASE / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # subnet choice + bridge creation are one step
            reap_leftovers(BASE)
            self.dir.mkdir()
            self.subnet = free_subnet(SUBNET)
            self._save_state()
            _sh("ip", "link", "add", self.bridge, "type", "bridge", "forward_delay", "0")
            _sh("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            _sh("ip", "link", "set", self.bridge, "up")
        for d in (self.shared_dir, Path(self.local_path), self.dir / "ctld", self.munge_socket.parent):
            d.mkdir(parents=True)
        # munged wants its key's dir not group/world-writable and its socket's dir searchable by
        # all, whatever the umask.
        self.munge_socket.parent.chmod(0o755)
        for node in self.nodes:
            for sub in ("local", "spool"):
                (self.node_dir(node) / sub).mkdir(parents=True)
        self._write_conf()
        self._add_netns(self.ctl_netns, self.ctl_veth, self.ctl_address)
        for node in self.nodes:
            self._add_netns(self.netns(node), self.veth(node), self.address(node))
        self._start_munged()
        if self.accounting:
            self._start_accounting()
        self._start_slurmctld()
        if self.accounting:
            self._check_registered()
        for node in self.nodes:
            self._launch(node)
        self.wait_nodes(self.nodes, {"idle"}, self.startup_timeout)

    def _save_state(self) -> None:
        state = {"pid": os.getpid(), "start": _proc_start(os.getpid()), "bridge": self.bridge,
                 "netns": self.namespaces()}
        (self.dir / "state.json").write_text(json.dumps(state))

    def namespaces(self) -> list[str]:
        return [self.netns(node) for node in self.nodes] + [self.ctl_netns]  # the controller last

    def _add_netns(self, ns: str, veth: str, address: str) -> None:
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _sh("ip", "link", "set", veth, "master", self.bridge)
        _sh("ip", "link", "set", veth, "up")
        for cmd in (["ip", "addr", "add", f"{address}/24", "dev", "eth0"],
                    ["ip", "link", "set", "eth0", "up"], ["ip", "link", "set", "lo", "up"]):
            _sh("nsenter", f"--net=/run/netns/{ns}", *cmd)

    def _write_conf(self) -> None:
        d = self.dir
        nodes = "".join(f"NodeName={node} NodeAddr={self.address(node)} CPUs=1 RealMemory=1000 "
                        "State=UNKNOWN\n" for node in self.nodes)
        accounting = "AccountingStorageType=accounting_storage/none\n"
        if self.accounting:
            accounting = ("AccountingStorageType=accounting_storage/slurmdbd\n"
                          f"AccountingStorageHost={self.ctl_address}\n"
                          # The munge socket of every connection to slurmdbd, slurmctld's and the
                          # client commands' (AuthInfo is not used for those).
                          f"AccountingStoragePass={self.munge_socket}\n")
        self.conf_path.write_text(
            f"ClusterName={self.cluster}\n"
            f"SlurmctldHost={CONTROLLER}({self.ctl_address})\n"
            "AuthType=auth/munge\nCredType=cred/munge\n"
            # Our own munged: the system's socket (and key) are left alone.
            f"AuthInfo=socket={self.munge_socket},cred_expire={CRED_EXPIRE}\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            f"StateSaveLocation={d / 'ctld'}\n"
            f"SlurmctldPidFile={d / 'ctld' / 'slurmctld.pid'}\n"
            f"SlurmctldLogFile={d / 'slurmctld.log'}\n"
            f"SlurmdSpoolDir={d / 'nodes' / '%n' / 'spool'}\n"
            f"SlurmdPidFile={d / 'nodes' / '%n' / 'slurmd.pid'}\n"
            f"SlurmdLogFile={d / 'nodes' / '%n' / 'slurmd.log'}\n"
            "SlurmctldDebug=info\nSlurmdDebug=info\n"
            # No cgroups: every process of a job stays in its node's namespaces, where node_kill
            # finds it.
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
            "MpiDefault=none\nJobAcctGatherType=jobacct_gather/none\n"
            + accounting
            + "JobCompType=jobcomp/none\n"
            "MailProg=/bin/true\n"
            f"ReturnToService=2\nSlurmdTimeout={self.slurmd_timeout}\nJobRequeue=1\n"
            # Schedule within seconds (not the default 60 s pass) once a requeued job's BeginTime
            # has come.
            "SchedulerType=sched/backfill\nSchedulerParameters=sched_interval=2,bf_interval=1\n"
            # Preemption as sites set it up: a job of `urgent` requeues one of `main`, whose batch
            # shell gets its --signal at once (preempt_send_user_signal) and GRACE_TIME s to stop.
            "PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE\n"
            "SlurmctldParameters=preempt_send_user_signal\n"
            + "".join(f"{k}={v}\n" for k, v in self.overrides.items())
            + nodes +
            f"PartitionName=main Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP "
            f"PriorityTier=1 GraceTime={GRACE_TIME}\n"
            f"PartitionName=urgent Nodes={','.join(self.nodes)} MaxTime=INFINITE State=UP "
            "PriorityTier=10 PreemptMode=OFF\n")

    def reconfigure(self, **overrides: str) -> None:
        """Set slurm.conf keys (`MaxArraySize="3"`; none: back to the bed's own) and make slurmctld
        and every slurmd read the file again (`scontrol reconfigure`)."""
        self.overrides = dict(overrides)
        self._write_conf()
        self.run("scontrol", "reconfigure")
        want = self.overrides
        deadline = time.monotonic() + 30
        while True:
            conf = dict(re.findall(r"^(\w+)\s*=\s*(\S*)", self.run("scontrol", "show", "config").stdout,
                                   re.M))
            if all(conf.get(k) == v for k, v in want.items()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurmbed: {want} not in effect after reconfigure: "
                                   f"{ {k: conf.get(k) for k in want} }")
            time.sleep(0.2)

    def _popen(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        """Start a daemon in the foreground; its stdout and stderr go to `<dir>/<name>.out`."""
        with open(self.dir / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    env=self.env(), start_new_session=True)
        self._procs[name] = proc
        return proc

    def _start_munged(self) -> None:
        m = self.munge_socket.parent
        key = m / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        # In the foreground munged logs to stderr: munged.out.
        proc = self._popen("munged", [
            "nsenter", f"--net=/run/netns/{self.ctl_netns}", MUNGED, "--foreground",
            f"--key-file={key}", f"--socket={self.munge_socket}", f"--pid-file={m / 'munged.pid'}",
            f"--seed-file={m / 'munged.seed'}"])
        self._wait_daemon(proc, "munged", self.munge_socket.exists)

    def _start_accounting(self) -> None:
        """MariaDB (a datadir of its own) and `slurmdbd -D` in the controller's network, before
        slurmctld: slurmctld then sends every job's record to slurmdbd, and `sacct` reads them."""
        db = self.db_dir
        db.mkdir()
        (db / "tmp").mkdir()
        # A throw-away database: a small redo log and buffer pool (slurmdbd logs that they are below
        # its recommended values: harmless here), no log flush per commit (mariadbd below).
        innodb = ["--innodb-log-file-size=8M", "--innodb-buffer-pool-size=64M"]
        _sh("mariadb-install-db", "--no-defaults", f"--datadir={db / 'data'}", "--user=root",
            "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve",
            *innodb, timeout=self.startup_timeout)
        proc = self._popen("mariadbd", [
            "nsenter", f"--net=/run/netns/{self.ctl_netns}", MARIADBD, "--no-defaults", "--user=root",
            f"--datadir={db / 'data'}", f"--socket={self.db_socket}", f"--pid-file={db / 'mariadbd.pid'}",
            f"--tmpdir={db / 'tmp'}", "--bind-address=127.0.0.1", f"--port={DB_PORT}",
            "--skip-name-resolve", "--innodb-flush-log-at-trx-commit=0", "--innodb-lock-wait-timeout=900",
            *innodb])
        self._wait_daemon(proc, "mariadbd", lambda: self._sql("SELECT 1", check=False).returncode == 0)
        self._sql(f"CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{self.db_password}'; "
                  "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
        # slurmdbd reads slurmdbd.conf from slurm.conf's dir (SLURM_CONF: `_popen`'s environment);
        # it holds a password, so slurmdbd wants it readable by its user only. It checks that DbdHost
        # is its hostname (sbctl, as slurmctld's) and listens on DbdPort (6819) of the controller's
        # network, where slurmctld and client commands reach it (slurm.conf's AccountingStorageHost).
        conf = self.conf_path.with_name("slurmdbd.conf")
        conf.touch(mode=0o600)
        conf.write_text(
            "AuthType=auth/munge\n"
            f"AuthInfo=socket={self.munge_socket}\n"
            f"DbdHost={CONTROLLER}\nDbdAddr={self.ctl_address}\n"
            "SlurmUser=root\nDebugLevel=info\n"
            f"LogFile={self.dir / 'slurmdbd.log'}\nPidFile={db / 'slurmdbd.pid'}\n"
            f"StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={DB_PORT}\n"
            f"StorageUser=slurm\nStoragePass={self.db_password}\nStorageLoc=slurm_acct_db\n")
        proc = self._popen("slurmdbd", [
            "nsenter", f"--net=/run/netns/{self.ctl_netns}", "unshare", "-u", "sh", "-c",
            f"hostname {CONTROLLER} && exec {SLURMDBD} -D"])

        def answers() -> bool:
            return self.run("sacctmgr", "-n", "-P", "list", "cluster", check=False,
                            timeout=10).returncode == 0

        self._wait_daemon(proc, "slurmdbd", answers)

    def _check_registered(self) -> None:
        """slurmctld adds its cluster to slurmdbd itself while it starts (Slurm 22.05: before it
        answers), so job records have a cluster to go to; `sacctmgr add cluster` is not needed."""
        clusters = self.run("sacctmgr", "-n", "-P", "list", "cluster", "format=Cluster").stdout.split()
        if self.cluster not in clusters:
            raise RuntimeError(f"slurmbed: slurmctld did not register cluster {self.cluster} with slurmdbd "
                               f"(it has {clusters}):\n{self.log_tails()}")

    def _sql(self, sql: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `sql` as MariaDB's root, over the bed's own MariaDB socket."""
        return _sh("mariadb", "--no-defaults", f"--socket={self.db_socket}", "-uroot", "-e", sql,
                   check=check, timeout=10)

    def _start_slurmctld(self) -> None:
        q = shlex.quote
        proc = self._popen("slurmctld", [
            "nsenter", f"--net=/run/netns/{self.ctl_netns}", "unshare", "-u", "sh", "-c",
            f"hostname {CONTROLLER} && exec {SLURMCTLD} -D -i -f {q(str(self.conf_path))}"])

        def answers() -> bool:
            return self.run("scontrol", "ping", check=False, timeout=10).returncode == 0

        self._wait_daemon(proc, "slurmctld", answers)

    def _wait_daemon(self, proc: subprocess.Popen[bytes], name: str, ready: Callable[[], object]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"slurmbed: {name} did not come up (exit {proc.poll()}):\n"
                                   f"{self.log_tails()}")
            time.sleep(0.05)

    def _launch(self, node: str) -> None:
        """Boot `node`: private mounts + hostname, then `slurmd -D` as its first process. `nsenter`
        (not `ip netns exec`, which remounts /sys) keeps the host's cgroup mounts."""
        q = shlex.quote
        # Order matters: bind the local disk first, then hide /tmp behind a private tmpfs.
        script = (f"mount --make-rprivate / && hostname {q(node)} && "
                  f"mount --bind {q(str(self.local_dir(node)))} {q(self.local_path)} && "
                  "mount -t tmpfs -o mode=1777 tmpfs /tmp && "
                  f"exec {SLURMD} -D -N {q(node)} -f {q(str(self.conf_path))}")
        # nsenter, unshare and `sh -c ... exec` all exec: the Popen pid is slurmd's.
        self._popen(node, ["nsenter", f"--net=/run/netns/{self.netns(node)}",
                           "unshare", "-m", "-u", "sh", "-c", script])

    def close(self) -> None:
        """Tear everything down; every step runs even when an earlier one failed."""
        errors: list[str] = []
        killed: list[int] = []
        for ns in self.namespaces():  # nodes first, then munged and slurmctld
            if Path(f"/run/netns/{ns}").exists():
                try:
                    killed += _ns_pids(ns)
                    _kill_pids(ns)
                except Exception as e:
                    errors.append(str(e))
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        teardown_names(self.bridge, self.namespaces(), errors)
        _remove_dir(self.dir, errors)
        # Orphans (slurmscriptd, job steps) are zombies until this machine's init reaps them: give
        # it a moment, so that nothing of the bed shows in `ps` afterwards (not an error if not).
        deadline = time.monotonic() + 5.0
        while any(Path(f"/proc/{pid}").exists() for pid in killed) and time.monotonic() < deadline:
            time.sleep(0.05)
        if errors:
            raise RuntimeError("slurmbed teardown: " + "; ".join(errors))

    # ------------------------------------------------------------------ a login node

    def login(self) -> Path:
        """A login node users reach over SSH: a real `sshd` beside slurmctld (its network, at the
        controller's address, hostname `sbctl`), whose sessions have Slurm's client (SLURM_CONF set
        by sshd) and the shared dir at the same path. Returns an ssh_config with the alias
        `slurm-login` (its own client key, the host key in its known_hosts). Started once."""
        cfg = self.dir / "login" / "ssh_config"
        if cfg.exists():
            return cfg
        d = cfg.parent
        d.mkdir()
        for key, comment in (("hostkey", "sbctl"), ("client", "ablate-slurmbed")):
            _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(d / key))
        (d / "authorized_keys").write_text((d / "client.pub").read_text())
        (d / "authorized_keys").chmod(0o600)
        (d / "sshd_config").write_text(
            f"ListenAddress {self.ctl_address}\nHostKey {d / 'hostkey'}\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "UseDNS no\nPrintMotd no\nMaxStartups 100\nSubsystem sftp internal-sftp\n"
            f"SetEnv SLURM_CONF={self.conf_path}\nPidFile {d / 'sshd.pid'}\n")
        kind, blob = (d / "hostkey.pub").read_text().split()[:2]
        (d / "known_hosts").write_text(f"{self.ctl_address} {kind} {blob}\n")
        cfg.write_text(f"Host slurm-login\n  HostName {self.ctl_address}\n  User root\n"
                       f"  IdentityFile {d / 'client'}\n  IdentitiesOnly yes\n"
                       f"  UserKnownHostsFile {d / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
                       "  BatchMode yes\n  ConnectTimeout 5\n")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privsep dir
        proc = self._popen("sshd", ["nsenter", f"--net=/run/netns/{self.ctl_netns}", SSHD, "-D",
                                    "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")])

        def answers() -> bool:
            return subprocess.run(["ssh", "-F", str(cfg), "slurm-login", "true"], capture_output=True,
                                  timeout=20).returncode == 0

        self._wait_daemon(proc, "sshd", answers)
        return cfg

    # ------------------------------------------------------------------ client commands

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """A Slurm client command (`sinfo`, `sbatch`, `scontrol`, ...) against this cluster, from the
        shared dir (a job's default working dir: the nodes cannot see this machine's /tmp)."""
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                           env=self.env(), cwd=self.shared_dir)
        if check and p.returncode != 0:
            raise RuntimeError(f"slurmbed: `{shlex.join(argv)}` exited {p.returncode}: "
                               f"{p.stderr.strip() or p.stdout.strip()}")
        return p

    def sinfo(self) -> dict[str, str]:
        """Node -> its short state as sinfo prints it (`idle`, `alloc`, `down*`, `idle*`, ...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def squeue(self) -> list[dict[str, str]]:
        """The queue (pending, running, completing jobs): id, state, node list or reason."""
        out = self.run("squeue", "-h", "-o", "%i|%T|%N|%r|%j").stdout
        keys = ("id", "state", "nodes", "reason", "name")
        return [dict(zip(keys, line.split("|"), strict=True)) for line in out.splitlines() if line]

    def sbatch(self, wrap: str, *args: str) -> str:
        """Submit `wrap` (a shell command) with sbatch `args`; its output goes to `output(job)`.
        Returns the job id."""
        jobs = self.shared_dir / "jobs"
        jobs.mkdir(exist_ok=True)
        out = self.run("sbatch", "--parsable", "-o", str(jobs / "%j.out"), *args, "--wrap", wrap)
        return out.stdout.strip().split(";")[0]

    def output(self, job: str) -> str:
        path = self.shared_dir / "jobs" / f"{job}.out"
        return path.read_text() if path.exists() else ""

    def node(self, node: str) -> dict[str, str]:
        """`scontrol show node` as a dict (State, NodeAddr, NodeHostName, Reason, ...)."""
        return _pairs(self.run("scontrol", "-o", "show", "node", node).stdout)

    def job(self, job: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, NodeList, Restarts, Reason, BeginTime, ...)."""
        return _pairs(self.run("scontrol", "-o", "show", "job", job).stdout)

    def wait_job(self, job: str, *states: str, timeout: float = 60.0) -> dict[str, str]:
        """Wait until the job is in one of `states` (JobState values, e.g. RUNNING, COMPLETED)."""
        deadline = time.monotonic() + timeout
        while (info := self.job(job)).get("JobState") not in states:
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurmbed: job {job} not {'/'.join(states)} within {timeout}s: "
                                   f"{info}\n{self.log_tails()}")
            time.sleep(0.1)
        return info

    def wait_nodes(self, nodes: list[str], states: set[str], timeout: float) -> dict[str, str]:
        """Wait until each of `nodes` is in one of `states` (sinfo's %t); fail early when a daemon
        of those nodes (or the controller) exits."""
        deadline = time.monotonic() + timeout
        while True:
            now = self.sinfo()
            if all(now.get(node) in states for node in nodes):
                return now
            daemons = ["munged", *(["mariadbd", "slurmdbd"] if self.accounting else []), "slurmctld", *nodes]
            gone = [name for name in daemons if self._procs[name].poll() is not None]
            if gone or time.monotonic() > deadline:
                why = f"{', '.join(gone)} exited" if gone else f"not within {timeout}s"
                raise RuntimeError(f"slurmbed: {nodes} not {'/'.join(sorted(states))} ({why}); "
                                   f"sinfo: {now}\n{self.log_tails()}")
            time.sleep(0.1)

    def log_tails(self) -> str:
        parts = [f"--- {p.relative_to(self.dir)}:\n{_tail(p)}"
                 for p in [self.dir / "slurmctld.log", self.dir / "slurmdbd.log",
                           *sorted(self.dir.glob("*.out")), *sorted(self.dir.glob("nodes/*/slurmd.log"))]
                 if p.exists()]
        return "\n".join(parts)

    # ------------------------------------------------------------------ faults

    def node_kill(self, node: str) -> None:
        """The node dies: slurmd, its step daemons and every job process on it are killed (its
        /tmp goes with its mount namespace; its local disk stays). slurmctld finds out by itself:
        the node turns `down*` once it has not answered for SlurmdTimeout."""
        self._dead.add(node)
        _kill_pids(self.netns(node))
        self._procs[node].wait(timeout=10)

    def node_restart(self, node: str, timeout: float = 30.0) -> None:
        """Boot `node` again (a killed one, or kill it first): same address, spool and local disk,
        an empty /tmp. Returns once slurmctld has it back in service (ReturnToService=2)."""
        if self._procs[node].poll() is None:
            self.node_kill(node)
        self._launch(node)
        self.wait_nodes([node], UP_STATES, timeout)
        self._dead.discard(node)

    def heal(self) -> None:
        """Cancel every job, boot every killed node, put slurm.conf back (`reconfigure`), and wait
        until all nodes are idle."""
        jobs = [j["id"] for j in self.squeue()]
        if jobs:
            self.run("scancel", *jobs, check=False)
        for node in sorted(self._dead):
            self.node_restart(node)
        if self.overrides:
            self.reconfigure()
        self.wait_nodes(self.nodes, {"idle"}, 60.0)


def _ns_pids(ns: str) -> list[int]:
    return [int(p) for p in _sh("ip", "netns", "pids", ns, check=False).stdout.split()]


def _pairs(line: str) -> dict[str, str]:
    return dict(re.findall(r"(\w+)=(\S*)", line))
