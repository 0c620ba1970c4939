#!/usr/bin/env python3
"""Fan-out wall time of `ablate status` and `ablate launch --all` against GNU parallel's
`parallel -j0 ssh {} true` to the same test-bed hosts, side by side (needs root and GNU parallel).

For each size (default 8 and 32 instances) one test bed is built (tests/testbed.py: a real sshd +
tmux per instance in its own namespaces, one shared directory) with an ssh config whose every host
has `ConnectTimeout --connect-timeout`. Each repetition makes two fresh sweeps (one queue of one
trivial cell per host) and times, one right after the other so that any noise hits them all:

  launch_first  `ablate launch --all` on sweep A, first contact: no SSH connection open and no
                host agent running (ablate/remote/host/agent.py; the bench ends them, as a reboot would)
  parallel      `parallel -j0 ssh -F CFG -o ControlMaster=no -o ControlPath=none {} true ::: HOSTS`
                (new connections every time, never ablate's sockets)
  first         `ablate status` on sweep B, first contact (it starts the agents, as any first
                command does)
  cold          `ablate status` on sweep B again over NEW connections (the masters ended, as after
                ControlPersist; the control directory kept), the agents still running (they stay an
                hour idle, the connections two minutes)
  launch        `ablate launch --all` on sweep B, right after (its connections reused)
  warm          `ablate status` on sweep B, re-run (connections reused), once the launched queues
                have ended (their CPU would be the controller's here; on real instances it is theirs)

Every ablate command is a separate process, `<this python> -S -m ablate -C <project> ...` with this
checkout pip-installed into a directory of the bench's first on PYTHONPATH, then site-packages (the
real interpreter, not a pyenv shim; -S: this
machine's site runs .pth hooks at every start, a sandbox's CA hook importing certifi and the editable
install's finder, ~40 ms that a pip-installed ablate does not pay: `python3 -c pass` with and
without site is timed beside it), its output to a file: the
time is until the process exits; its bytecode compiled once and used, as after `pip install`
(this machine sets PYTHONDONTWRITEBYTECODE=1). The bed's profile names the real interpreter as `python` too
(`python3` on PATH is a pyenv shim on this machine, ~0.15 s of CPU per start, where a conda or
system install has the binary). The first repetition warms the page cache and is dropped; the
medians of the rest are reported with their ratio to the parallel median. Targets (issue 47): a warm
`status`, `status --json` and one `status --watch` refresh <= 0.15x parallel, first-contact
`launch --all` <= 1.25x; the other rows are figures. `ablate --version` (interpreter + CLI start, no
SSH) is timed too, as the floor under every ablate figure. Every ablate command runs with
ABLATE_TIMINGS (ablate/util/timings.py): a second table splits each status and first-contact launch
into the interpreter and its imports, the config, the round trips (count and span), the FS probe,
the output and the exit.

Every instance gets its own copy of root's `~/.pyenv/shims` (tests/testbed.py does it): the
instances share this machine's /root, and a `.bashrc` running `pyenv init -` would otherwise make
every remote command of every instance queue on one rehash lock file.

Once per size, untimed, one launch, cold status and warm status run with a logging `ssh` first on
PATH: how many connections and remote commands each makes, and how many go through the shared-FS
host and how many at a time (the notes under the tables).

Then, once per size, a dead host: one instance's network drops (its veth down, with a permanent
neighbour entry on the bridge so packets are silently lost and only the connect time-out ends a
connect), and `ablate status` is timed cold and warm (masters opened before the drop); then the
instance is killed (`Testbed.kill`: its address still answers, with a TCP reset) and status is
timed cold. Target: each costs at most one ConnectTimeout (as `ssh -G` resolves it for that host)
over the healthy cold status, not one per operation.

Prints the tables and writes them, with the machine, to docs/BENCHMARKS.md between the
bench_fanout markers (the rest of the file is kept).

    sudo python3 scripts/bench_fanout.py [--sizes 8,32] [--reps 5] [--connect-timeout 5] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (it puts this checkout on sys.path)

from benchlib import (
    REPO,
    CpuGroups,
    ablate_version,
    host_queue,
    measured_line,
    median,
    publish,
    ratio,
    write_project,
)

from tests.testbed import Testbed, missing_requirement

# -S: no `site`, so none of this machine's .pth hooks (a sandbox's CA hook that imports certifi, the
# editable install's finder: ~40 ms a start, the `python -c pass` rows) that an ablate installed by
# pip on a user's machine does not run. This checkout is pip-installed into a directory of the
# bench's (`install`), first on PYTHONPATH, site-packages after it (`Bench.run`).
ABLATE = [sys.executable, "-S", "-m", "ablate"]
SITE_PATHS = [p for p in (*site.getsitepackages(), site.getusersitepackages()) if os.path.isdir(p)]
# The trivial cell: writes its checkpoint in a few milliseconds, no Python start-up.
TRAIN = "mkdir -p {ckpt_dir} && cat {cfg} > {ckpt_dir}/ckpt.bin"
KEYS = ("cold", "launch", "warm", "warm_json", "refresh", "first", "launch_first", "parallel", "mux", "start",
        "py_site", "py_bare")
LABELS = {"cold": "`ablate status`, new connections (host agents running)",
          "launch": "`ablate launch --all`, fresh sweep, right after that status",
          "warm": "`ablate status` re-run (connections reused)",
          "warm_json": "`ablate status --json` re-run (connections reused)",
          "refresh": "one `ablate status --watch` refresh (median of its 2nd-6th)",
          "first": "`ablate status`, first contact (no connection, no agent)",
          "launch_first": "`ablate launch --all`, fresh sweep, first contact",
          "parallel": "`parallel -j0 ssh {} true`, new connections",
          "mux": "OpenSSH alone, ablate's way: `ssh -M -N -f`, then `true` through it, per host",
          "start": "`ablate --version` (process start, no SSH)",
          "py_site": "`python3 -c pass`, this machine's site and its .pth hooks",
          "py_bare": "`python3 -S -c pass` (no site)"}
# Issue 47's targets: a warm status and a dashboard refresh well under an SSH handshake, a first
# contact within a quarter of it.
TARGET = {"warm": 0.15, "warm_json": 0.15, "refresh": 0.15, "launch_first": 1.25}
# Where a command's time goes (ABLATE_TIMINGS, ablate/util/timings.py), for the rows it is read for.
PARTS = ("served", "start", "config", "to_trips", "trips", "span", "fs_probe", "after", "exit")
PART_LABELS = {"served": "served (1: by the command server)",
               "start": "to `main` (interpreter + imports; served: the client, its hand-off, the fork)",
               "config": "imports (none when served) + config and profiles",
               "to_trips": "to the first round trip", "trips": "round trips",
               "span": "round trips' span (first start to last end)", "fs_probe": "FS probe (`snapshot`)",
               "after": "last round trip to output", "exit": "output to exit"}
BROKEN_DOWN = ("warm_json", "warm", "cold", "launch_first", "first")


@dataclass
class Size:
    n: int
    times: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KEYS})
    # busy CPU-seconds during each kept run: (the command and every process it started, the instances)
    cpu: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: {k: [] for k in KEYS})
    sockets_cold: list[int] = field(default_factory=list)  # control sockets a cold status left
    held_open: list[str] = field(default_factory=list)  # processes still holding ablate's stdout
    connect_timeout: float = float("nan")
    # (fault, secs, rc, ssh runs that reached out to the dead host, the healthy row it is set against)
    dead: list[tuple[str, float, int | None, int, str]] = field(default_factory=list)
    private_shims: bool = False
    failures: list[str] = field(default_factory=list)  # runs that exited non-zero, with their error
    failed: dict[str, int] = field(default_factory=dict)  # how many per measurement
    anatomy: list[str] = field(default_factory=list)  # what each command did over SSH (traced run)
    parts: dict[str, list[dict[str, float]]] = field(default_factory=lambda: {k: [] for k in KEYS})

    def med(self, key: str) -> float:
        return median(self.times[key])

    def cpu_med(self, key: str, side: int) -> float:
        return median([c[side] for c in self.cpu[key]])

    def part_med(self, key: str, part: str) -> float:
        return median([p[part] for p in self.parts[key] if part in p])


def breakdown(spawn: float, ended: float, record: dict[str, Any]) -> dict[str, float]:
    """One command's wall time in parts (seconds; `trips` a count), from its ABLATE_TIMINGS line;
    `spawn`, `ended`: this process's clock around it."""
    marks = record["marks"]
    trips = record["trips"]
    main_t = marks["main"]
    project = marks.get("project", main_t)
    first = min((t[2] for t in trips), default=project)
    last = max((t[3] for t in trips), default=first)
    output = marks.get("output", marks.get("exit", ended))
    probes = [t[3] - t[2] for t in trips if str(t[1]) == "probe snapshot"]
    return {"served": 1.0 if "served" in marks else 0.0, "start": main_t - spawn, "config": project - main_t,
            "to_trips": first - project, "trips": float(len(trips)), "span": last - first,
            "fs_probe": max(probes, default=0.0), "after": output - last, "exit": ended - output}


def install(into: Path) -> Path:
    """This checkout as `pip install` puts it (package data in place, bytecode compiled), in `into`."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(into), str(REPO)], check=True, stdout=subprocess.DEVNULL)
    return into


class Bench:
    def __init__(self, tmp: Path, connect_timeout: float) -> None:
        self.tmp = tmp
        self.lib = install(tmp / "install")
        self.connect_timeout = connect_timeout
        self.ctl_root = Path(tempfile.mkdtemp(prefix="abf", dir="/tmp"))  # short: socket paths
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.count = 0
        # Where the CPU goes: the command's group (ablate or parallel, its ssh clients and masters:
        # the user's laptop) and the instances' (their sshd and all they start: other machines).
        self.cpu = CpuGroups(["ctl", "hosts"])
        self.last_cpu = (float("nan"), float("nan"))
        self.last_parts: dict[str, float] | None = None  # where the last ablate command's time went
        # A logging `ssh` first on PATH, for the traced (untimed) runs only: what each ssh run was
        # and when it started and ended (ablate finds its client with shutil.which("ssh")).
        self.shim_dir = tmp / "shim"
        self.shim_dir.mkdir()
        real = shutil.which("ssh") or "/usr/bin/ssh"
        (self.shim_dir / "ssh").write_text(  # a start line, then (unless killed) an end line
            '#!/bin/bash\na="$*"; a="${a//$\'\\n\'/ }"\n'
            'o="${a%% -- *}"; r="${a#* -- }"\n'  # every option, then the host and the command's start
            'printf "S %s %s %s -- %s\\n" "$$" "$(date +%s.%N)" "$o" "${r:0:300}" >> "$ABF_SSH_LOG"\n'
            f'{shlex.quote(real)} "$@"\nrc=$?\n'
            'printf "E %s %s %s\\n" "$$" "$(date +%s.%N)" "$rc" >> "$ABF_SSH_LOG"\n'
            "exit $rc\n")
        (self.shim_dir / "ssh").chmod(0o755)

    def env(self) -> dict[str, str]:
        """A command's environment: this checkout's install first on PYTHONPATH, its bytecode used (as
        pip installs it), the command server as a user has it (on: ablate/cmdserver) with its socket
        in the bench's own directory (`end_servers`)."""
        env = dict(os.environ, NO_COLOR="1", ABLATE_CMDSERVER="1", XDG_RUNTIME_DIR=str(self.ctl_root),
                   PYTHONPATH=os.pathsep.join([str(self.lib), *filter(None, [os.environ.get("PYTHONPATH")]),
                                               *SITE_PATHS]))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        return env

    def end_servers(self) -> None:
        """End the command servers the bench's commands started (their code is the bench's install)."""
        for pid in _pids_mentioning(str(self.ctl_root)):
            with contextlib.suppress(OSError):
                if b"ablate.cmdserver.server" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGTERM)

    def fresh_ctl(self) -> Path:
        """A fresh, empty ABLATE_SSH_CONTROL_DIR: no ControlMaster can be reused from it."""
        return Path(tempfile.mkdtemp(dir=self.ctl_root))

    def run(self, argv: list[str], ctl: Path | None, timeout: float = 300.0,
            trace: Path | None = None) -> tuple[float, int | None, Path]:
        """Wall seconds until the process exits (None rc: killed at `timeout`), and its log.
        Output goes to a file, not a pipe: a daemonised ControlMaster that kept the pipe open would
        otherwise be timed too (`held_by` tells whether one does)."""
        self.count += 1
        log = self.logs / f"{self.count:04d}.log"
        env = self.env()
        if ctl is not None:
            env["ABLATE_SSH_CONTROL_DIR"] = str(ctl)
        if trace is not None:
            env["PATH"] = f"{self.shim_dir}{os.pathsep}{env.get('PATH', '')}"
            env["ABF_SSH_LOG"] = str(trace)
        timings = self.logs / f"{self.count:04d}.timings.jsonl"
        env["ABLATE_TIMINGS"] = str(timings)
        cpu0 = (self.cpu.seconds("ctl"), self.cpu.seconds("hosts"))
        with open(log, "wb") as out:
            spawn = time.time()
            t0 = time.perf_counter()
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True, cwd=self.tmp,  # -m: cwd first on sys.path
                                 preexec_fn=lambda: self.cpu.join("ctl", os.getpid()))
            # A blocking wait, the time-out a timer's kill: `Popen.wait(timeout)` polls with sleeps
            # growing to 50 ms, which rounded every figure up to the next step (0.265, 0.315, ...).
            killed = threading.Event()

            def kill() -> None:
                killed.set()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)

            timer = threading.Timer(timeout, kill)
            timer.start()
            rc: int | None = p.wait()
            took = time.perf_counter() - t0
            timer.cancel()
            if killed.is_set():
                rc = None
        # A daemonised master's CPU after the exit is left out: read at once.
        self.last_cpu = (self.cpu.seconds("ctl") - cpu0[0], self.cpu.seconds("hosts") - cpu0[1])
        self.last_parts = None
        if rc == 0 and timings.exists():
            self.last_parts = breakdown(spawn, spawn + took, json.loads(timings.read_text().splitlines()[-1]))
        return took, rc, log

    def refreshes(self, argv: list[str], ctl: Path, count: int = 6, timeout: float = 120.0) -> list[float]:
        """`argv` (a `status --watch --interval 0.2`, not on a terminal: plain blocks) until it has
        refreshed `count` times, then Ctrl-C; the seconds of each refresh (ABLATE_TIMINGS spans)."""
        self.count += 1
        log = self.logs / f"{self.count:04d}.log"
        timings = self.logs / f"{self.count:04d}.timings.jsonl"
        env = dict(self.env(), ABLATE_SSH_CONTROL_DIR=str(ctl), ABLATE_TIMINGS=str(timings))
        with open(log, "wb") as out:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True, cwd=self.tmp)
            deadline = time.monotonic() + timeout
            try:
                while log.read_bytes().count(b"\n\n") < count and p.poll() is None:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"`{shlex.join(argv)}` did not refresh {count} times "
                                           f"in {timeout:.0f} s")
                    time.sleep(0.05)
            finally:
                os.killpg(p.pid, signal.SIGINT)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        spans = json.loads(timings.read_text().splitlines()[-1])["spans"] if timings.exists() else []
        return [end - start for name, start, end in spans if name == "refresh"]


def project(tb: Testbed, base: Path, sweep: str, ssh_config: Path) -> Path:
    """One queue of one trivial cell per host."""
    work = tb.shared_dir / "bench" / sweep  # the workdir, as this machine sees it
    return write_project(
        base / sweep, sweep, profile="tb", profile_settings={
            "transport": "ssh", "shared_fs": tb.shared_path, "ckpt_root": f"{tb.local_path}/ckpt",
            # the interpreter itself, as `python3` is on a conda or system install; on this machine
            # `python3` on PATH is a pyenv shim, a bash script that costs ~0.15 s of CPU per start
            "python": sys.executable},
        configs={f"{sweep}c{i}": f"seed: {i}\n" for i in range(len(tb.hosts))},
        work=work, workdir=f"{tb.shared_path}/bench/{sweep}",
        queues={f"q{i}": host_queue(host, [f"configs/{sweep}c{i}.yaml t"])
                for i, host in enumerate(tb.hosts)},
        train=TRAIN, artifacts={"checkpoint": "ckpt.bin"}, tasks={"t": {"epochs": 1}},
        heartbeat_secs=1, ssh_config=str(ssh_config), hosts={h: {} for h in tb.hosts})


def _pids_mentioning(text: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text.encode() in (d / "cmdline").read_bytes():
                    pids.append(int(d.name))
    return pids


def sockets(ctl: Path) -> list[Path]:
    """The ControlMaster sockets in `ctl` (not the agent forwards beside them, `<socket>.a`)."""
    return [p for p in ctl.rglob("*") if p.is_socket() and not p.name.endswith(".a")] \
        if ctl.exists() else []


def close_masters(ctl: Path, keep_dir: bool = False) -> None:
    """End the ControlMasters ablate left in `ctl` (`ssh -O exit`, then any process still naming
    the directory on its command line, by pid): one measurement's masters never serve another.
    `keep_dir`: leave the directory (what ablate remembers there besides the sockets), as when the
    masters end on their own after ControlPersist."""
    for sock in sockets(ctl):
        subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True, timeout=10,
                       check=False)
    for pid in _pids_mentioning(str(ctl)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if not keep_dir:
        shutil.rmtree(ctl, ignore_errors=True)


def held_by(path: Path) -> list[str]:
    """Processes (pid and command) that still have `path` open."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (d / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) == str(path):
                        cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                        out.append(f"{d.name}: {cmd.strip()[:120]}")
                        break
    return out


def resolved_connect_timeout(cfg: Path, host: str) -> float:
    out = subprocess.run(["ssh", "-G", "-F", str(cfg), host], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        k, _, v = line.partition(" ")
        if k == "connecttimeout":
            return float(v) if v.strip().isdigit() else float("nan")
    return float("nan")


def blackhole(tb: Testbed, host: str) -> None:
    """`host`'s network drops and its packets are lost without an answer: its veth goes down and
    a permanent neighbour entry keeps ARP from failing first, so a connect ends only at its time-out."""
    mac = subprocess.run(["ip", "netns", "exec", tb.netns(host), "cat", "/sys/class/net/eth0/address"],
                         capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["ip", "neigh", "replace", tb.address(host), "lladdr", mac, "dev", tb.bridge,
                    "nud", "permanent"], check=True, capture_output=True)
    tb.link_down(host)


def unblackhole(tb: Testbed, host: str) -> None:
    subprocess.run(["ip", "neigh", "del", tb.address(host), "dev", tb.bridge], check=False,
                   capture_output=True)
    tb.link_up(host)


def end_agents(tb: Testbed) -> None:
    """End the host agents ablate started: the next "cold" command finds nothing running on the
    instances, as after a reboot."""
    tb.end_agents()


def settle(tb: Testbed, timeout: float = 60.0, agents: bool = False) -> float:
    """End the host agents (unless `agents`: they stay, and count as idle), then wait until every
    instance runs nothing but sshd (the launched queues have ended), so what the launch started
    does not load the next measurement; seconds waited."""
    if not agents:
        end_agents(tb)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        busy = False
        for host in tb.hosts:
            pids = subprocess.run(["ip", "netns", "pids", tb.netns(host)], capture_output=True,
                                  text=True, check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{pid}/comm").read_text().strip() != "sshd" and not (
                            agents and b"ablate_agent" in Path(f"/proc/{pid}/cmdline").read_bytes()):
                        busy = True
                        break
            if busy:
                break
        if not busy:
            return time.monotonic() - t0
        time.sleep(0.2)
    print(f"bench: the instances still run more than sshd {timeout:g}s after the launch", file=sys.stderr)
    return time.monotonic() - t0


def measure(bench: Bench, n: int, reps: int) -> Size:
    size = Size(n)
    t0 = time.perf_counter()
    with Testbed(n, startup_timeout=60.0) as tb:
        print(f"{n} hosts: test bed up in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        for host in tb.hosts:  # every instance's sshd: what it starts counts as the instances' CPU
            for pid in subprocess.run(["ip", "netns", "pids", tb.netns(host)], capture_output=True,
                                      text=True, check=False).stdout.split():
                bench.cpu.join("hosts", int(pid))
        cfg = tb.write_ssh_config(tb.dir / "bench_ssh_config",
                                  extra=f"\nHost *\n  ConnectTimeout {bench.connect_timeout:g}\n")
        size.connect_timeout = resolved_connect_timeout(cfg, tb.hosts[-1])
        size.private_shims = (tb.host_dir(tb.hosts[0]) / "pyenv-shims").is_dir()  # the test bed's own
        par = ["parallel", "--will-cite", "-j0", "ssh", "-F", str(cfg), "-o", "ControlMaster=no",
               "-o", "ControlPath=none", "{}", "true", ":::", *tb.hosts]
        mux = ["bash", "-c", 'pids=(); for h in "${@:2}"; do ( ssh -F "$1" -o ControlMaster=yes '
               '-o "ControlPath=$ABLATE_SSH_CONTROL_DIR/%h" -o ControlPersist=60 -N -f -- "$h" && '
               'ssh -F "$1" -o ControlMaster=no -o "ControlPath=$ABLATE_SSH_CONTROL_DIR/%h" -- "$h" true'
               ' ) & pids+=($!); done; rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done; exit $rc',
               "mux", str(cfg), *tb.hosts]
        proj = Path()
        cpu: dict[str, tuple[float, float]] = {}
        parts: dict[str, dict[str, float]] = {}

        def one(key: str, r: int, argv: list[str], ctl: Path | None) -> tuple[float, Path]:
            """Seconds of one run, NaN when it failed (recorded, and left out of the medians)."""
            took, rc, log = bench.run(argv, ctl, timeout=300.0)
            cpu[key] = bench.last_cpu
            if bench.last_parts is not None and key in BROKEN_DOWN:
                parts[key] = bench.last_parts
            if rc == 0:
                return took, log
            tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-2:]
            why = f"exit {rc}" if rc is not None else "killed at 300 s"
            size.failures.append(f"{LABELS[key]}, rep {r} ({took:.1f}s): {why}: {' / '.join(tail)[:500]}")
            size.failed[key] = size.failed.get(key, 0) + 1
            print(f"bench: {size.failures[-1]}", file=sys.stderr)
            return float("nan"), log

        for r in range(reps + 1):  # the first repetition warms the page cache and is dropped
            got: dict[str, float] = {}
            # First contact: no connection, no host agent (as after the instances booted).
            end_agents(tb)
            ctl = bench.fresh_ctl()
            first = project(tb, bench.tmp, f"b{n}r{r}f", cfg)
            got["launch_first"], _ = one("launch_first", r,
                                         [*ABLATE, "-C", str(first), "launch", "--all"], ctl)
            close_masters(ctl)
            waited = settle(tb)  # ends the agents too
            got["parallel"], _ = one("parallel", r, par, None)
            got["mux"], _ = one("mux", r, mux, ctl := bench.fresh_ctl())
            close_masters(ctl)
            # The user's sequence on a fresh sweep: status, launch --all, status again. The first
            # status starts from nothing (first contact); the measured one after it opens new
            # connections to hosts whose agents still run (they stay an hour, the connections 2 min).
            proj = project(tb, bench.tmp, f"b{n}r{r}", cfg)
            status = [*ABLATE, "-C", str(proj), "status"]
            ctl = bench.fresh_ctl()
            got["first"], _ = one("first", r, status, ctl)
            close_masters(ctl, keep_dir=True)  # as ControlPersist would end them
            got["cold"], _ = one("cold", r, status, ctl)
            size.sockets_cold.append(len(sockets(ctl)))
            got["launch"], _ = one("launch", r, [*ABLATE, "-C", str(proj), "launch", "--all"], ctl)
            # The launched queues end first: on this bed their CPU is the controller's too (on real
            # instances it is theirs). The connections and agents stay.
            settle(tb, agents=True)
            got["warm"], log = one("warm", r, status, ctl)
            if r == reps:  # while the masters live: does one of them hold ablate's stdout?
                size.held_open = held_by(log)
            got["warm_json"], _ = one("warm_json", r, [*status, "--json"], ctl)
            each = bench.refreshes([*status, "--watch", "--interval", "0.2"], ctl)
            got["refresh"] = median(each[1:6]) if len(each) >= 2 else float("nan")
            cpu["refresh"] = (float("nan"), float("nan"))  # in a process that also sleeps: not comparable
            close_masters(ctl)
            settle(tb)
            got["start"], _ = one("start", r, [*ABLATE, "--version"], None)
            got["py_site"], _ = one("py_site", r, [sys.executable, "-c", "pass"], None)
            got["py_bare"], _ = one("py_bare", r, [sys.executable, "-S", "-c", "pass"], None)
            line = (", ".join(f"{k} {v:.3f}s" for k, v in got.items())
                    + f" (queues ended {waited:.1f}s after the launch)")
            print(f"{n} hosts, rep {r}{' (warm-up, dropped)' if r == 0 else ''}: {line}", file=sys.stderr)
            if r:
                for k, v in got.items():
                    if v == v:  # not NaN
                        size.times[k].append(v)
                        size.cpu[k].append(cpu[k])
                for k, v2 in parts.items():
                    size.parts[k].append(v2)
            parts.clear()
        trace_commands(bench, tb, cfg, size)
        dead(bench, tb, proj, size)
    return size


@dataclass
class SshRun:
    start: float
    end: float
    host: str
    kind: str  # "local" (ssh -G / -O: no network), "connect" (a new master), "session" (a command)


def read_trace(path: Path) -> list[SshRun]:
    """The ssh runs of a trace; one killed before it ended (a time-out) ends at the trace's end."""
    starts: dict[str, SshRun] = {}
    ends: dict[str, float] = {}
    last = 0.0
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        parts = line.split(" ", 3)
        if len(parts) < 4 or parts[0] not in ("S", "E"):
            continue
        t = float(parts[2])
        last = max(last, t)
        if parts[0] == "E":
            ends[parts[1]] = t
            continue
        args = f" {parts[3]} "
        m = re.search(r" -- (\S+)", args)
        kind = ("local" if re.search(r" -(G|O) ", args) else
                "connect" if "ControlMaster=yes" in args else
                "lock" if "flock" in args else "session")  # the controller lock, held all along
        starts[parts[1]] = SshRun(t, t, m.group(1) if m else "?", kind)
    for pid, run in starts.items():
        run.end = ends.get(pid, last)
    return sorted(starts.values(), key=lambda r: r.start)


def max_overlap(runs: list[SshRun]) -> int:
    edges = sorted([(r.start, 1) for r in runs] + [(r.end, -1) for r in runs])
    now = most = 0
    for _, d in edges:
        now += d
        most = max(most, now)
    return most


def busy(runs: list[SshRun]) -> float:
    """Seconds during which at least one of `runs` was under way."""
    total, end = 0.0, float("-inf")
    for r in sorted(runs, key=lambda r: r.start):
        if r.end > end:
            total += r.end - max(r.start, end)
            end = r.end
    return total


def anatomy(label: str, runs: list[SshRun], n: int) -> str:
    """What one ablate command did over SSH, from its trace."""
    sessions = [r for r in runs if r.kind in ("session", "lock")]
    connects = [r for r in runs if r.kind == "connect"]
    per_host: dict[str, list[SshRun]] = {}
    for r in sessions:
        per_host.setdefault(r.host, []).append(r)
    fs_host, on_it = max(per_host.items(), key=lambda kv: len(kv[1]), default=("-", []))
    others = [len(v) for h, v in per_host.items() if h != fs_host]
    span = max((r.end for r in runs), default=0.0) - min((r.start for r in runs), default=0.0)
    held = " besides the one holding the controller lock" if any(r.kind == "lock" for r in on_it) else ""
    on_it = [r for r in on_it if r.kind != "lock"]
    return (f"{label}: {len(connects)} new connection(s) and {len(sessions)} remote commands for {n} "
            f"hosts (GNU parallel: {n} connections, {n} commands); {fs_host}, the shared-FS host, ran "
            f"{len(on_it)}{held}, at most {max_overlap(on_it)} at a time, busy {busy(on_it):.1f}s of "
            f"the {span:.1f}s the command spent over SSH; each other host "
            f"{min(others, default=0)}-{max(others, default=0)}")


def trace_commands(bench: Bench, tb: Testbed, cfg: Path, size: Size) -> None:
    """One untimed launch, cold status and warm status with the logging ssh: how many SSH round
    trips each makes, and how many go through the shared-FS host, how many at a time."""
    proj = project(tb, bench.tmp, f"b{size.n}trace", cfg)
    status = [*ABLATE, "-C", str(proj), "status"]
    steps = (("`launch --all` (first contact)", [*ABLATE, "-C", str(proj), "launch", "--all"], True),
             ("`status` (first contact)", status, True), ("`status` (warm)", status, False))
    ctl: Path | None = None
    for i, (label, argv, fresh) in enumerate(steps):
        if fresh:
            if ctl is not None:
                close_masters(ctl)
                settle(tb)
            ctl = bench.fresh_ctl()
        trace = bench.tmp / f"trace-{size.n}-{i}.log"
        took, rc, _ = bench.run(argv, ctl, trace=trace)
        size.anatomy.append(anatomy(f"{label}, {took:.1f}s traced, exit {rc}", read_trace(trace), size.n))
        print(f"{size.n} hosts, traced {size.anatomy[-1]}", file=sys.stderr)
    if ctl is not None:
        close_masters(ctl)


def dead(bench: Bench, tb: Testbed, proj: Path, size: Size) -> None:
    """Status with one host gone: network dropped (cold, and warm over masters opened before the
    drop), then the instance killed (cold)."""
    host = tb.hosts[-1]
    cap = 60.0 + 4 * bench.connect_timeout
    status = [*ABLATE, "-C", str(proj), "status"]

    def timed(fault: str, ctl: Path, base: str) -> None:
        trace = bench.tmp / f"trace-{size.n}-dead-{len(size.dead)}.log"
        took, rc, log = bench.run(status, ctl, timeout=cap, trace=trace)
        tries = [r for r in read_trace(trace) if r.host == host and r.kind != "local"]
        size.dead.append((fault, took, rc, len(tries), base))
        print(f"{size.n} hosts, {fault}: status {took:.3f}s (rc {rc})", file=sys.stderr)
        if rc not in (0, 1):  # 1: a host could not be reached
            size.failures.append(f"status, {fault}: exit {rc}: {log.read_text(errors='replace')[-500:]}")

    warm = bench.fresh_ctl()
    bench.run(status, warm)  # opens the masters the warm case then finds
    blackhole(tb, host)
    try:
        timed(f"{host} unreachable (link down, packets lost), cold", cold := bench.fresh_ctl(), "first")
        close_masters(cold)
        timed(f"{host} unreachable, warm (masters opened before the drop)", warm, "warm")
    finally:
        close_masters(warm)
        unblackhole(tb, host)
    tb.kill(host)
    timed(f"{host} killed (sshd gone: connect refused), cold", cold := bench.fresh_ctl(), "first")
    close_masters(cold)


def tables(sizes: list[Size]) -> list[str]:
    out = ["| hosts | command | median (s) | min-max (s) | x parallel | target | result "
           "| CPU-s, command (median) | CPU-s, instances (median) |",
           "|--:|:--|--:|--:|--:|:--|:--|--:|--:|"]
    for s in sizes:
        par = s.med("parallel")
        for k in KEYS:
            xs = s.times[k] or [float("nan")]
            vs_par = ratio(s.med(k), par)
            failed = s.failed.get(k, 0)
            if k in TARGET:
                target = f"<= {TARGET[k]:g}x"
                result = "PASS" if not failed and vs_par <= TARGET[k] else "FAIL"
            else:
                target, result = "-", "-"
            if failed:
                result += f" ({failed} run(s) failed)"
            out.append(f"| {s.n} | {LABELS[k]} | {s.med(k):.3f} | {min(xs):.3f}-{max(xs):.3f} | "
                       f"{vs_par:.2f}x | {target} | {result} | {s.cpu_med(k, 0):.3f} | "
                       f"{s.cpu_med(k, 1):.3f} |")
    out += ["", "Where each command's wall time goes (medians, seconds; ABLATE_TIMINGS, "
            "ablate/util/timings.py):",
            "", "| hosts | command | wall | " + " | ".join(PART_LABELS[p] for p in PARTS) + " |",
            "|--:|:--|" + "--:|" * (len(PARTS) + 1)]
    for s in sizes:
        for k in BROKEN_DOWN:
            if s.parts[k]:
                cells = [f"{s.part_med(k, p):.0f}" if p in ("trips", "served") else f"{s.part_med(k, p):.3f}"
                         for p in PARTS]
                out.append(f"| {s.n} | {LABELS[k]} | {s.med(k):.3f} | " + " | ".join(cells) + " |")
    out += ["", "| hosts | status with one host dead | wall (s) | exit | over healthy (s) | "
            "ConnectTimeout (s) | about | ssh runs to it | target | result |",
            "|--:|:--|--:|--:|--:|--:|--:|--:|:--|:--|"]
    for s in sizes:
        for fault, took, rc, tries, base in s.dead:
            extra = took - s.med(base)
            ct = s.connect_timeout
            result = "PASS" if rc in (0, 1) and extra <= 1.5 * ct else "FAIL"
            rc_s = "killed at cap" if rc is None else str(rc)
            out.append(f"| {s.n} | {fault} | {took:.3f} | {rc_s} | {extra:+.3f} | {ct:g} | "
                       f"{max(0.0, extra) / ct:.1f} time-outs | {tries} | one time-out at most | {result} |")
    return out


def cpu_note(s: Size) -> str:
    """First contact on this bed is CPU-bound (the instances share the controller's cores): the
    wall ratio of a first-contact launch follows the ratio of all the CPU it costs, which says on
    whose side (the command's or the instances') the difference is."""
    def both(key: str) -> tuple[float, float]:
        return s.cpu_med(key, 0), s.cpu_med(key, 1)

    (lc, li), (pc, pi) = both("launch_first"), both("parallel")
    return (f"- {s.n} hosts, first-contact `launch --all` against parallel: wall "
            f"{ratio(s.med('launch_first'), s.med('parallel')):.2f}x, all CPU {ratio(lc + li, pc + pi):.2f}x "
            f"({lc + li:.2f} CPU-s against {pc + pi:.2f}: the command's {lc:.2f} against {pc:.2f}, the "
            f"instances' {li:.2f} against {pi:.2f}, {li - pi:+.2f}); on {os.cpu_count()} core(s) a first "
            "contact keeps every core busy, so its wall time follows its CPU.")


def notes(sizes: list[Size]) -> list[str]:
    out = []
    out.append("- Traced runs count ssh processes: a command a host agent runs is none (the warm "
               "rows), so \"remote commands\" there are those that went through a login shell.")
    out.append("- Dead host: \"over healthy\" is the wall time a dead host adds to `status` (against the "
               "healthy row of the same kind: first contact for a fresh control directory, the re-run "
               "for masters opened before the drop); when "
               "the healthy status takes longer than the time-out, the time-out runs under it, and \"ssh "
               "runs to it\" (the ssh processes that tried that host; a request to its agent is none) is "
               "the gauge: one try, one time-out.")
    for s in sizes:
        out.append(cpu_note(s))
        socks = sorted(set(s.sockets_cold))
        out.append(f"- {s.n} hosts: ControlMaster sockets a cold `status` left in its "
                   f"ABLATE_SSH_CONTROL_DIR: {'/'.join(map(str, socks))} of {s.n}"
                   + (" (none: this transport keeps no connection between commands, so the warm row "
                      "is a second cold one)" if socks == [0] else "") + ".")
        for a in s.anatomy:
            out.append(f"- {s.n} hosts, traced {a}.")
        for f in s.failures:
            out.append(f"- {s.n} hosts: failed: {f}")
        if s.held_open:
            out.append(f"- {s.n} hosts: after `ablate status` exited, {len(s.held_open)} process(es) "
                       f"still held its stdout (a pipe reader such as `ablate status | less` would wait "
                       f"for them), e.g. {s.held_open[0]}.")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8,32", help="comma-separated instance counts (default 8,32)")
    ap.add_argument("--reps", type=int, default=5,
                    help="repetitions kept per size (one more runs first, as a warm-up); median reported")
    ap.add_argument("--connect-timeout", type=float, default=5.0,
                    help="ConnectTimeout of every host in the bench's ssh config (default 5)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/BENCHMARKS.md alone")
    args = ap.parse_args(argv)
    reason = missing_requirement()
    if reason is None and shutil.which("parallel") is None:
        reason = "GNU parallel is missing: apt-get install parallel (scripts/test.sh does)"
    if reason:
        print(f"bench_fanout: {reason}", file=sys.stderr)
        return 2
    sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    reps = max(1, args.reps)
    runner = (f"`{shlex.join(ABLATE)}` (its command server on, as by default on Linux: the run's first "
              "command starts it, and every later one is handed to it: ablate/cmdserver) "
              f"with this checkout pip-installed into a directory first on "
              "PYTHONPATH, then site-packages (the real "
              "interpreter, not a pyenv shim; -S: none of this machine's site hooks, see the `python3 -c "
              "pass` rows, which a pip-installed ablate on a user's machine does not run, and not the few "
              "ms of plain site either)")
    print(f"ablate runs as {runner}, one process per command", file=sys.stderr)
    results: list[Size] = []
    with tempfile.TemporaryDirectory(prefix="ablate-bench-") as tmp:
        bench = Bench(Path(tmp), args.connect_timeout)
        try:
            for n in sizes:
                results.append(measure(bench, n, reps))
        finally:
            bench.end_servers()
            for ctl in list(bench.ctl_root.iterdir()):
                if ctl.name != "ablate-cmdserver":
                    close_masters(ctl)
            shutil.rmtree(bench.ctl_root, ignore_errors=True)
            bench.cpu.close()
    cmd = "python3 scripts/bench_fanout.py" + ("" if args.sizes == "8,32" else f" --sizes {args.sizes}") \
        + ("" if reps == 5 else f" --reps {reps}")
    body = tables(results)
    lines = ["## Fan-out: `ablate status` / `launch --all` against GNU parallel", "",
             measured_line(cmd) + f" ablate at {ablate_version()}.", "",
             f"Test-bed instances (tests/testbed.py: real sshd + tmux in network namespaces on this one "
             f"machine, one shared directory), `ConnectTimeout {args.connect_timeout:g}` for every host; "
             f"one queue of one trivial cell per host, two fresh sweeps per repetition. ablate runs as "
             f"{runner}, a separate process per command with `-C <project>`, timed until it exits; "
             "the profile names the real interpreter as the hosts' `python` (`python3` on PATH is a "
             "pyenv shim here), and ablate's bytecode is compiled and used, as after `pip install` "
             "(this machine sets PYTHONDONTWRITEBYTECODE=1: every module would be compiled again at "
             "every start, ~0.13 s). Each repetition times, in this order: `launch --all` on sweep A at "
             "first contact (no connection, no host agent: the bench ends the agents, as a reboot "
             "would); GNU parallel; then the user's sequence on sweep B: `status` at first contact "
             "(it starts the agents), `status` again over new connections (its ControlMasters ended "
             "as after ControlPersist, the control directory kept) with the agents running, "
             "`launch --all` right after it, and `status` re-run once the launched queues have ended "
             "(on this bed their CPU is the controller's; on real instances it is theirs). "
             f"Median of {reps} repetitions after one warm-up. GNU parallel: "
             "`parallel -j0 ssh -F CFG -o ControlMaster=no -o ControlPath=none {} true ::: HOSTS`. "
             "Before parallel and after each sequence, the bench ends the agents and waits until the "
             "launched queues have ended (every instance runs only sshd again). The CPU columns: busy "
             "CPU-seconds (cgroup accounting) of the command with every process it started (ablate or "
             "parallel, their ssh clients and masters: what runs on the user's machine), and of the "
             "instances (their sshd and everything it starts: the login shells, the host agents, the "
             "probes, tmux: what runs on the instances); on this bed both share the same 2 cores, on "
             "real instances only the first is on the user's machine. The `OpenSSH alone` row is ablate's "
             "transport without ablate: per host, in parallel, `ssh -M -N -f` (authenticated, the "
             "master in the background) then `ssh -S <socket> HOST true`."
             + (" Every instance has its own copy of root's `~/.pyenv/shims` (root's `.bashrc` runs "
                "`pyenv init -`, so every remote command does a `pyenv rehash` under a lock file "
                "there, which the instances would otherwise share)." if any(s.private_shims for s in results)
                else ""), "",
             *body, "", *notes(results), ""]
    publish("bench_fanout", lines, not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
