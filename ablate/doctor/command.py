"""`ablate doctor`: preflight every host in parallel, each check ok/FAIL with a one-line reason.

Per ssh host first a connection of its own, as the next cold command will make it (no kept
ControlMaster, no host agent: OpenSSH checks the host key and the user authenticates now), then one
batched `sh -c` script over the usual, shared connection (ablate/run/host_measure.py); before it, one
nonce written on the shared FS through the host that serves it, and after it the nonce removed.
"Shared" is proved, not assumed: every host reads the nonce back through its own transport at the
path its own profile gives (AutoDL file storage is per region; only this tells), waiting up to the
cap for it (a caching FS shows a new file late). Then the FS's visibility lag between the hosts that
passed (ablate/doctor/fs_lag.py): a sweep-level section, recorded in gate/fslag.json. `launch` measures
the disk/inode budget and the commit itself, in the one command it asks each host with its tmux
sessions, and refuses as doctor would before it changes anything: both judge by
ablate/run/refusals.py.
"""

from __future__ import annotations

import json
import os
import posixpath
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass
from typing import Any

from ablate.config.project import Host, Project, parse_size
from ablate.doctor.deployed import deployed_check, deployed_files
from ablate.doctor.fs_lag import LagResult, await_content, cap_seconds, raise_cap, survey
from ablate.doctor.services import service_checks, service_sections
from ablate.doctor.slurm import slurm_checks
from ablate.doctor.store import store_checks, store_host_check
from ablate.errors import AblateError, ConfigError
from ablate.remote.layout import SweepLayout
from ablate.run.host_measure import Section, ask_text, measure
from ablate.run.refusals import (
    Cells,
    Check,
    budget_sections,
    commit_check,
    controller_commit,
    count_cells,
    disk_check,
    git_section,
    inodes_check,
    shared_check,
)
from ablate.run.store_launch import controller_credentials
from ablate.transport import HostTransport, SharedFS, fan_out, host_transport, shared_fs
from ablate.transport.shellhost import BASH_C, ShellHost
from ablate.transport.slurm import SlurmHost
from ablate.transport.ssh import SSHHost
from ablate.util.fmt import Log

RUNPOD_PROXY = "ssh.runpod.io"
TMUX_FIX = "install it: apt-get install -y tmux"
# Drivers report a little less memory than a card's nominal size (an "A10 24GB" shows 23028 MiB).
GPU_MEMORY_SLACK = 0.95
_ENV_PY = ('if [ -n "$1" ]; then eval "$1" >&2 || exit 98; fi\n'
           'command -v -- "$2" >/dev/null 2>&1 || exit 97\n'
           'exec "$2" -c "import sys; print(sys.version.split()[0])"')


@dataclass(frozen=True)
class HostReport:
    host: str
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


@dataclass(frozen=True)
class DoctorReport:
    hosts: Mapping[str, HostReport]
    fs_lag: LagResult | None = None  # the FS's visibility lag (a long one only warns)
    store: tuple[Check, ...] = ()  # the object store's self-test (`storage:`), from this machine

    @property
    def ok(self) -> bool:
        return (all(h.ok for h in self.hosts.values()) and (self.fs_lag is None or self.fs_lag.ok)
                and all(c.ok for c in self.store))

    @property
    def problems(self) -> int:
        lag = self.fs_lag is not None and not self.fs_lag.ok
        return (sum(not c.ok for h in self.hosts.values() for c in h.checks) + lag
                + sum(not c.ok for c in self.store))

    def check(self, host: str, name: str) -> Check | None:
        return next((c for c in self.hosts[host].checks if c.check == name), None)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "hosts": {name: {"ok": h.ok, "checks": [c.to_json() for c in h.checks]}
                                         for name, h in self.hosts.items()},
                "fs_lag": self.fs_lag.to_json() if self.fs_lag else None,
                **({"store": [c.to_json() for c in self.store]} if self.store else {})}

    def lines(self) -> list[str]:
        rows = [("store", c.check, "ok" if c.ok else "FAIL", c.reason) for c in self.store]
        rows += [(h.host, c.check, "ok" if c.ok else "FAIL", c.reason)
                 for h in self.hosts.values() for c in h.checks]
        wh = max((len(r[0]) for r in rows), default=4)
        wc = max((len(r[1]) for r in rows), default=5)
        out = [f"{host:<{wh}}  {check:<{wc}}  {state:<4}  {reason}" for host, check, state, reason in rows]
        verdict = "all checks passed" if self.ok else f"{self.problems} problem(s)"
        lag = self.fs_lag.lines() if self.fs_lag else []
        return [*out, *lag, f"doctor: {len(self.hosts)} host(s), {verdict}"]


# --------------------------------------------------------------------------- GPUs


def gpu_ask(project: Project) -> dict[str, Any] | None:
    """resources.gpu as {count, name, memory (text), min_bytes}; None when no GPU is asked for."""
    raw = project.resources.get("gpu")
    where = f"{project.config_path}: resources.gpu"
    if raw is None or raw is False or raw == 0:
        return None
    if isinstance(raw, bool):
        return {"count": 1}
    if isinstance(raw, int):
        raw = {"count": raw}
    elif isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or set(raw) - {"name", "count", "memory"}:
        raise ConfigError(f"{where}: expected a count, a name, or {{name, count, memory}} like "
                          f"{{name: A100, count: 1, memory: 24GB+}}, got {raw!r}")
    count = raw.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"{where}.count: must be a positive whole number, got {count!r}")
    ask: dict[str, Any] = {"count": count, "name": raw.get("name"), "memory": raw.get("memory")}
    if ask["memory"] is not None:
        ask["min_bytes"] = parse_size(str(ask["memory"]).rstrip("+"), f"{where}.memory")
    return ask


def _gpu(host: Host, ask: dict[str, Any] | None, sec: Section | None) -> Check:
    asked = f"resources.gpu asks for {ask_text(ask)}" if ask else ""
    if sec is None or sec.rc != 0:
        why = "nvidia-smi not found" if sec is None or sec.rc == 127 else f"nvidia-smi failed: {sec.last}"
        return Check("gpu", not ask, f"{asked}; no GPU here ({why})" if ask else f"no GPU ({why})")
    gpus: list[tuple[str, int | None]] = []
    for line in sec.out.splitlines():
        name, _, mem = line.partition(",")
        if name.strip():
            words = mem.split()
            size = int(words[0]) * 2**20 if words and words[0].isdigit() else None
            gpus.append((name.strip(), size))
    found = ", ".join(f"{n} ({m // 2**20} MiB)" if m else n for n, m in gpus) or "none listed"
    if host.gpus and max(host.gpus) >= len(gpus):
        return Check("gpu", False, f"ablate.yaml gives {host.name} GPU slots "
                                   f"{','.join(map(str, host.gpus))} but it has {len(gpus)} GPU(s): {found}")
    if ask:
        fit = [g for g in gpus if (not ask["name"] or str(ask["name"]).lower() in g[0].lower())
               and ("min_bytes" not in ask or (g[1] or 0) >= ask["min_bytes"] * GPU_MEMORY_SLACK)]
        if len(fit) < ask["count"]:
            return Check("gpu", False, f"{asked}; {len(fit)} of the host's GPUs fit: {found}")
    return Check("gpu", True, f"{len(gpus)} GPU(s): {found}")


# --------------------------------------------------------------------------- one host


def _proxy_host(host: Host, t: HostTransport) -> str | None:
    """The RunPod SSH proxy (no exec channel without a PTY, no SFTP) when the host goes through it."""
    if host.transport != "ssh" or not isinstance(t, ShellHost):
        return None
    try:
        target = t.target()
    except AblateError:
        return None  # the transport reports an unusable ssh config itself
    return target if target.lower().rstrip(".") == RUNPOD_PROXY else None


@dataclass(frozen=True)
class _Plan:
    """What every host's script needs from the controller's side."""

    nonce_rel: str | None  # under each host's sweep root; None when it could not be written
    nonce: str
    writer: str
    fs_error: str | None
    deployed: dict[str, Any] | None
    cells: Cells
    commit: str | None
    ask: dict[str, Any] | None
    cap: float  # seconds to wait for the nonce on a caching FS
    creds: Mapping[str, str] | None = None  # a storage sweep: what launch would hand its queues


def _sections(project: Project, host: Host, plan: _Plan) -> list[tuple[str, Sequence[str]]]:
    root = project.sweep_root(host)
    out: list[tuple[str, Sequence[str]]] = [
        ("bash", ["command", "-v", "bash"]),
        ("tmux", ["tmux", "-V"]),
        ("env", [*BASH_C, _ENV_PY, "bash", host.profile.env or "", host.profile.python]),
    ]
    if plan.nonce_rel:
        out.append(("nonce", ["cat", "--", posixpath.join(root, plan.nonce_rel)]))
    files = deployed_files(plan.deployed, host.name)
    if files:
        out.append(("sha", ["sha256sum", "--", *(posixpath.join(root, f) for f in files)]))
    out += budget_sections(project, host)
    out += [("gpu", ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"]),
            ("workdir", ["test", "-d", project.workdir]),
            git_section(project)]
    return out + service_sections(project, host)


def _shared(project: Project, host: Host, plan: _Plan, sec: Section | None, t: HostTransport) -> Check:
    if plan.nonce_rel is None:
        return Check("shared_fs", False, f"could not write the nonce on the shared FS: {plan.fs_error}")
    path = posixpath.join(project.sweep_root(host), plan.nonce_rel)
    waited = 0.0 if sec is not None and sec.rc == 0 and sec.out.strip() == plan.nonce else None
    try:  # not there yet: a caching FS may show it late
        waited = await_content(t, path, plan.nonce, plan.cap) if waited is None else waited
    except AblateError as e:
        return Check("shared_fs", False, f"could not look for the nonce {path}: {e.message}")
    if waited is not None:
        late = f" after {waited:.1f} s (the FS's client cache)" if waited >= 1 else ""
        return Check("shared_fs", True, f"{host.profile.shared_fs} is shared: nonce written through "
                                        f"{plan.writer} read back here{late}")
    missing = sec is None or sec.rc != 0
    late = (f"; if it is the same FS behind a longer client cache, {raise_cap(plan.cap)}" if missing
            else "")
    return Check("shared_fs", False, f"not the same shared FS as {plan.writer} (AutoDL file storage "
                                     f"is per region?): the nonce {path} "
                                     f"{'is missing' if missing else 'holds other bytes'} on {host.name} "
                                     f"(waited {plan.cap:.0f} s){late}")


def _cold(t: HostTransport) -> Check | None:
    """The connection as the next cold command will make it (`SSHHost.cold_check`): a failed
    reachable check, or None. A kept master (or the host agent behind it) was authenticated
    earlier: through it alone, a host key removed or changed in known_hosts since would pass."""
    inner = t.inner if isinstance(t, SlurmHost) else t
    if not isinstance(inner, SSHHost):
        return None  # this machine, or paramiko (a new connection in every process already)
    try:
        inner.cold_check()
    except AblateError as e:
        return Check("reachable", False, e.message)
    return None


def _check_slurm(project: Project, host: Host, plan: _Plan, t: HostTransport) -> HostReport:
    """A Slurm host: its client, its request, and (in a probe job) a compute node's view."""
    cold = _cold(t)
    if cold is not None:
        return HostReport(host.name, (cold,))
    sections = _sections(project, host, plan)
    node = [s for s in sections if s[0] in ("env", "nonce", "sha", "workdir")]
    gpu = next(s for s in sections if s[0] == "gpu")  # where the queue's GPUs are: its own probe

    def on_node(got: Mapping[str, Section], why: str | None) -> list[tuple[str, bool, str]]:
        n = got.get("nonce")
        seen = n is not None and n.rc == 0 and n.out.strip() == plan.nonce
        wd = got.get("workdir")
        out = [astuple(_env(host, got.get("env"))),
               ("shared_fs", seen, f"{host.profile.shared_fs} is shared: the nonce written through "
                                   f"{plan.writer} read back on the compute node" if seen else
                                   f"the compute node does not see the nonce written through {plan.writer} "
                                   f"under {project.sweep_root(host)}: not the same shared FS"),
               deployed_check(project, host, plan.deployed, plan.fs_error, got.get("sha")),
               ("workdir", bool(wd and wd.rc == 0), f"{project.workdir} on the compute node")]
        return out + ([("script", False, why)] if why else [])

    def on_gpu(sec: Section | None) -> tuple[str, bool, str]:
        return astuple(_gpu(host, plan.ask, sec))

    checks = slurm_checks(project, host, t, node, on_node, gpu, on_gpu)
    return HostReport(host.name, tuple(Check(*c) for c in checks))


def _check_host(project: Project, host: Host, plan: _Plan) -> HostReport:
    t = host_transport(project, host)
    if host.transport == "slurm":
        return _check_slurm(project, host, plan, t)
    proxy = _proxy_host(host, t)
    if proxy:
        return HostReport(host.name, (Check("reachable", False, f"{host.ssh} goes through the RunPod proxy "
                                            f"{proxy} (no exec, no SFTP): use full SSH (root@IP -p PORT) "
                                            "with the pod's public IP and exposed port 22"),))
    cold = _cold(t)
    if cold is not None:
        return HostReport(host.name, (cold,))
    try:
        got, why = measure(t, _sections(project, host, plan))
    except AblateError as e:
        return HostReport(host.name, (Check("reachable", False, e.message),))
    checks = [Check("reachable", True, "this machine (local transport)" if host.transport == "local"
                    else f"ssh {host.ssh}")]

    def sec(key: str) -> Section | None:
        return got.get(key)

    b = sec("bash")
    checks.append(Check("bash", bool(b and b.rc == 0), b.last if b and b.rc == 0
                        else "bash not found: the wrappers need it (apt-get install -y bash)"))
    tm = sec("tmux")
    tm_ok = bool(tm and tm.rc == 0 and tm.out.startswith("tmux"))
    checks.append(Check("tmux", tm_ok, tm.last if tm and tm_ok else
                        f"tmux missing or broken ({tm.last if tm else 'no answer'}); {TMUX_FIX}"))
    checks.append(_env(host, sec("env")))
    if project.sweep_store(host) is not None:
        checks.append(store_host_check(project, host, t, plan.creds))
    else:
        checks.append(_shared(project, host, plan, sec("nonce"), t))
    checks.append(Check(*deployed_check(project, host, plan.deployed, plan.fs_error, sec("sha"))))
    checks.append(disk_check(project, host, plan.cells, sec("disk")))
    checks.append(shared_check(project, host, plan.cells, sec("shared_disk")))
    checks.append(inodes_check(project, host, plan.cells, sec("inodes")))
    checks.append(_gpu(host, plan.ask, sec("gpu")))
    wd = sec("workdir")
    wd_ok = bool(wd and wd.rc == 0)
    checks.append(Check("workdir", wd_ok, f"{project.workdir} exists" if wd_ok else
                        f"{project.workdir} does not exist on {host.name} (the train command runs there)"))
    checks.append(commit_check(project, host, plan.commit, sec("git")) if wd_ok
                  else Check("commit", True, "not compared (no workdir)"))
    checks += [Check(*c) for c in service_checks(project, host, got)]
    if why:
        checks.append(Check("script", False, why))
    return HostReport(host.name, tuple(checks))


def _env(host: Host, sec: Section | None) -> Check:
    env = host.profile.env
    py = host.profile.python
    if sec is None or sec.rc == 127:
        return Check("env", False, "not checked: no bash to run the profile's env in")
    if sec.rc == 98:
        return Check("env", False, f"the profile's env `{env}` failed: {sec.last}")
    if sec.rc == 97:
        return Check("env", False, f"{py} not found after the profile's env (`{env or 'none'}`); the "
                                   f"probe, verification and the queues' decisions run with it "
                                   f"(profile key `python`)")
    if sec.rc != 0:
        return Check("env", False, f"{py} does not start: {sec.last}")
    return Check("env", True, f"{py} {sec.last}" + (f" after `{env}`" if env else ""))


# --------------------------------------------------------------------------- the command


def doctor(project: Project, hosts: list[str] | None = None, log: Log | None = None,
           cap: float | None = None) -> DoctorReport:
    """`cap`: how long to wait for a write to show through another host (default fs_lag.CAP / env)."""
    cap = cap_seconds() if cap is None else cap
    names = list(dict.fromkeys(hosts)) if hosts else list(project.hosts)
    chosen = [project.host(n) for n in names]
    ask = gpu_ask(project)  # a malformed resources.gpu is bad config: refused before any host work
    token = secrets.token_hex(16)
    nonce_rel = f".doctor-nonce.{token[:12]}"
    fs: SharedFS | None = None
    writer = "the shared FS"
    fs_error: str | None = None
    deployed: dict[str, Any] | None = None
    written = False
    store = project.sweep_store()
    store_report: tuple[Check, ...] = ()
    creds: Mapping[str, str] | None = None
    if store is not None:  # no shared FS to prove: the store's own self-test, once, from here
        store_report = tuple(store_checks(*store))
        creds = controller_credentials()
    try:
        fs = shared_fs(project)
        if store is None:
            fs.write_atomic(posixpath.join(fs.root, nonce_rel), token.encode())
            written = True
        writer = str(getattr(fs, "via", "this machine"))
        raw = fs.read_bytes(SweepLayout(fs.root).deployed)
        loaded = json.loads(raw) if raw else None
        deployed = loaded if isinstance(loaded, dict) else None
    except (AblateError, OSError, ValueError) as e:
        fs_error = e.message if isinstance(e, AblateError) else f"{type(e).__name__}: {e}"
    if log:
        log(f"doctor: checking {len(chosen)} host(s) in parallel"
            + (f"; nonce written through {writer}" if written else ""))
    try:
        plan = _Plan(nonce_rel if written else None, token, writer, fs_error, deployed,
                     count_cells(project, fs if fs_error is None else None), controller_commit(project), ask,
                     cap, creds)
        results = fan_out(names, lambda name: _check_host(project, project.hosts[name], plan))
    finally:
        if written and fs is not None:
            _remove_nonce(project, fs, writer, posixpath.join(fs.root, nonce_rel), log)
    reports: dict[str, HostReport] = {}
    for name in names:
        r = results[name]
        reports[name] = r if isinstance(r, HostReport) else HostReport(
            name, (Check("reachable", False, f"doctor failed on this host: {type(r).__name__}: {r}"),))
    bad = {n: ", ".join(c.check for c in r.checks if not c.ok and c.check in ("reachable", "shared_fs"))
           for n, r in reports.items()}
    if store is not None:  # strongly consistent: no lag to measure
        return DoctorReport(reports, None, store_report)
    lag = survey(project, [n for n in names if not bad[n]], fs if written else None,
                 {n: f"{why} failed" for n, why in bad.items() if why}, cap=cap, log=log)
    return DoctorReport(reports, lag)


def _remove_nonce(project: Project, fs: SharedFS, writer: str, path: str, log: Log | None) -> None:
    """Through the host that wrote it (SharedFS has no delete), or directly for a local FS."""
    try:
        if writer in project.hosts and project.hosts[writer].transport == "ssh":
            host_transport(project, project.hosts[writer]).run(["rm", "-f", "--", path]).check()
        else:
            os.remove(path)
    except (AblateError, OSError) as e:
        if log:
            log(f"doctor: could not remove the nonce {path}: {e}")
