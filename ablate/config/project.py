"""Parse `ablate.yaml` and profiles once into frozen dataclasses.

Every error names the file, the key path, why, and (for unknown keys) "did you mean …?".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ablate import resources as packaged
from ablate.config.entries import Resume, checkpoint_entries, parse_resume, relative
from ablate.config.reader import Reader, UniqueKeyLoader, check_template, load_yaml, suggest, tname
from ablate.config.services import Service, gpus_per_queue, parse_services, train_fields
from ablate.config.settings import (
    DEFAULT_MONITOR,
    DEFAULT_REPORT,
    NO_CALIBRATE,
    Autostop,
    Calibrate,
    CostOverride,
    Monitor,
    ReportSettings,
    parse_autostop,
    parse_calibrate,
    parse_costs,
    parse_monitor,
    parse_report,
    parse_steal,
)
from ablate.config.settings import parse_size as parse_size  # re-exported: callers import it from here
from ablate.config.slurm import SlurmSettings, parse_slurm
from ablate.config.storage import SAFE_PATH, local_path, one_place, parse_place
from ablate.errors import ConfigError
from ablate.remote.checkpoints.artifacts import PICKS
from ablate.remote.layout import SweepLayout
from ablate.remote.queue.defaults import HEARTBEAT_SECS

CONFIG_NAME = "ablate.yaml"
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
TRAIN_FIELDS = {"cfg", "task", "epochs", "name", "ckpt_dir", "cat", "resume", "gpu", "run_id", "attempt"}
TRANSPORTS = ("local", "ssh", "slurm")
VERIFY = ("load", "structure", "hash")  # artifacts.verify: strongest first


@dataclass(frozen=True)
class Profile:
    name: str
    shared_fs: str  # with storage: the instance-local parent of the sweep's copy, <ckpt_root>/.ablate
    ckpt_root: str  # may hold {host}; instance-local
    env: str | None
    release: str | None
    transport: str
    python: str
    source: str  # the file it came from
    slurm: SlurmSettings | None = None  # transport: slurm
    storage: str | None = None  # s3://BUCKET[/PREFIX]: the sweep's state there (ablate/config/storage.py)
    storage_endpoint: str | None = None  # a non-AWS store's http(s) URL
    autostop: Autostop | None = None  # its hosts' `autostop:`, over ablate.yaml's (Host.autostop)
    autostop_off: bool = False  # the profile says `autostop: false`: off for its hosts


@dataclass(frozen=True)
class Host:
    name: str
    profile: Profile
    ssh: str
    speed: float
    gpus: tuple[int, ...] | None  # None: one queue, no CUDA_VISIBLE_DEVICES pinning
    instance_id: str | None
    transport: str
    per_queue: int = 1  # GPUs each queue takes: its trainer's slot, then its services' (services:)
    autostop_default: Autostop | None = None  # ablate.yaml's `autostop:`, for a profile without one

    @property
    def slots(self) -> tuple[int | None, ...]:
        """The trainers' GPUs: one queue each (every `per_queue`-th of gpus)."""
        if not self.gpus:
            return (None,)
        n = len(self.gpus) // self.per_queue
        return tuple(self.gpus[k * self.per_queue] for k in range(n))

    def queue_gpus(self, slot: int | None) -> tuple[int, tuple[int, ...]]:
        """(k, the services' GPUs) of the queue on `slot`: its index on this host and the GPUs after
        its trainer's in its share."""
        if slot is None or not self.gpus or slot not in self.slots:
            return 0, ()
        k = self.slots.index(slot)
        return k, self.gpus[k * self.per_queue + 1:(k + 1) * self.per_queue]

    @property
    def ckpt_root(self) -> str:
        return self.profile.ckpt_root.replace("{host}", self.name)

    @property
    def autostop(self) -> Autostop | None:
        """Its profile's `autostop:` (`false` there: off), else ablate.yaml's; never on Slurm (a job
        ends when its queue drains: nothing idles to stop)."""
        if self.transport == "slurm" or self.profile.autostop_off:
            return None
        return self.profile.autostop or self.autostop_default

    @property
    def pins_gpus(self) -> bool:
        """Whether a queue's slot is its GPU (CUDA_VISIBLE_DEVICES); on Slurm the job's gres is."""
        return self.transport != "slurm"

    @property
    def sweep_parent(self) -> str:
        """The shared FS; with storage, the parent of this host's own copy of the sweep."""
        p = self.profile
        return p.shared_fs.replace("{host}", self.name) if p.storage else p.shared_fs


@dataclass(frozen=True)
class Task:
    name: str
    epochs: int
    cost_per_epoch: float


@dataclass(frozen=True)
class Artifacts:
    checkpoint: tuple[str, ...]  # files, directories or globs relative to {ckpt_dir}
    metrics: str | None
    metrics_keys: tuple[str, ...]
    pick: str = "all"  # which matches of a glob count: all | newest
    verify: tuple[tuple[str, str], ...] = ()  # (checkpoint entry, load|structure|hash); else the strongest


@dataclass(frozen=True)
class CellSource:
    glob: str
    task: str
    epochs: int | None
    priority: int = 0  # higher runs first in its queue and is stolen first


@dataclass(frozen=True)
class Budget:
    ckpt_size: int
    scratch: int
    inodes_per_cell: int


@dataclass(frozen=True)
class Project:
    dir: Path  # the user's repo root, where ablate.yaml is
    config_path: Path
    profile: Profile  # default profile
    sweep: str
    workdir: str
    train: str
    artifacts: Artifacts
    tasks: Mapping[str, Task]
    cells: tuple[CellSource, ...]
    budget: Budget
    hosts: Mapping[str, Host]
    ssh_config: str | None
    resources: Mapping[str, Any]
    candidates: tuple[str, ...]
    heartbeat_secs: int
    costs: tuple[CostOverride, ...] = ()
    monitor: Monitor = DEFAULT_MONITOR
    report: ReportSettings = DEFAULT_REPORT
    steal: bool = True
    services: tuple[Service, ...] = ()
    calibrate: Calibrate = NO_CALIBRATE
    autostop: Autostop | None = None  # ablate.yaml's; a host's own is Host.autostop
    resume: Resume | None = None  # what a cell resumes from (ablate/config/entries.py); None: off

    @property
    def queues_dir(self) -> Path:
        return self.dir / "queues"

    def sweep_root(self, host: Host | None = None) -> str:
        """The sweep root as seen by `host` (or by the default profile). With storage: a host's own
        copy on its disk, `<ckpt_root>/.ablate/<sweep>`; the controller's, the sweep's store URL."""
        store = self.sweep_store(host)
        if store is not None:
            return f"{host.sweep_parent}/{self.sweep}" if host else store[0]
        shared = host.profile.shared_fs if host else self.profile.shared_fs
        return f"{shared.rstrip('/')}/ablate/{self.sweep}"

    def sweep_store(self, host: Host | None = None) -> tuple[str, str | None] | None:
        """(`<storage>/ablate/<sweep>`, endpoint) of `host`'s profile (or the default); None: shared FS."""
        p = host.profile if host else self.profile
        return None if p.storage is None else (f"{p.storage}/ablate/{self.sweep}", p.storage_endpoint)

    def layout(self, host: Host | None = None) -> SweepLayout:
        return SweepLayout(self.sweep_root(host))

    def host(self, name: str) -> Host:
        if name not in self.hosts:
            raise ConfigError(
                f"unknown host {name!r}: {CONFIG_NAME} has hosts {', '.join(self.hosts) or '(none)'}"
                f"{suggest(name, self.hosts)}"
            )
        return self.hosts[name]


# --------------------------------------------------------------------------- profiles

PROFILE_KEYS = {"shared_fs", "storage", "storage_endpoint", "ckpt_root", "env", "release", "transport",
                "python", "slurm", "autostop"}


def shipped_profiles() -> dict[str, str]:
    """name -> YAML text of the profiles shipped inside the package."""
    return {name[: -len(".yaml")]: data.decode("utf-8")
            for name, data in packaged.listing("ablate.profiles", ".yaml").items()}


def load_profile(name: str, project_dir: Path, where: str) -> Profile:
    if not SAFE_NAME.match(name):
        raise ConfigError(f"{where}: profile name {name!r} is not a plain name")
    local = project_dir / "profiles" / f"{name}.yaml"
    shipped = shipped_profiles()
    if local.is_file():
        data, source = load_yaml(local), str(local)
    elif name in shipped:
        data, source = yaml.load(shipped[name], Loader=UniqueKeyLoader), f"<shipped profiles/{name}.yaml>"
    else:
        raise ConfigError(
            f"{where}: unknown profile {name!r}{suggest(name, shipped)}; shipped: "
            f"{', '.join(sorted(shipped))} (or add profiles/{name}.yaml to your repo)"
        )
    r = Reader(data, source, "", PROFILE_KEYS)
    transport = r.text("transport", "ssh") or "ssh"
    if transport not in TRANSPORTS:
        raise r.err("transport", f"must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    place = parse_place(r, transport, project_dir)
    release = r.text("release")
    if release:
        check_template(release, {"instance_id", "host", "ssh"}, r, "release")
    if transport == "slurm" and r.data.get("autostop") not in (None, False):
        raise r.err("autostop", "a Slurm host's job ends when its queue drains, nothing idles to stop; "
                                "remove autostop from this profile")
    return Profile(
        name=name,
        shared_fs=place.shared_fs,
        ckpt_root=place.ckpt_root,
        env=r.text("env"),
        release=release,
        transport=transport,
        python=r.text("python", "python3") or "python3",
        source=source,
        slurm=parse_slurm(r, transport),
        storage=place.storage,
        storage_endpoint=place.endpoint,
        autostop=parse_autostop(r),
        autostop_off=r.data.get("autostop", True) is False,
    )


_SAFE_GLOB = re.compile(r"^[A-Za-z0-9._/+@,=*?\[\]-]+$")
def _verify(a: Reader, entries: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """artifacts.verify: one check for every checkpoint entry, or {entry: check} for some of them."""
    raw = a.data.get("verify")
    items = raw.items() if isinstance(raw, dict) else [(e, raw) for e in entries] if raw is not None else []
    out: dict[str, str] = {}
    for key, how in items:
        entry = key.strip().rstrip("/") if isinstance(key, str) else key
        if entry not in entries:
            raise a.err("verify", f"{key!r} is not a checkpoint entry{suggest(str(key), entries)}; the "
                                  f"keys are entries of artifacts.checkpoint ({', '.join(entries)})")
        if how not in VERIFY:
            hint = suggest(how, VERIFY) if isinstance(how, str) else ""
            raise a.err("verify", f"{'' if raw is how else f'{key}: '}{how!r}{hint} is not a check; write "
                                  f"{', '.join(VERIFY)} (for every checkpoint entry) or {{entry: check}}")
        out[entry] = how
    return tuple(out.items())


# --------------------------------------------------------------------------- project

TOP_KEYS = {
    "profile", "sweep", "workdir", "train", "artifacts", "tasks", "cells", "budget", "resources",
    "candidates", "ssh_config", "hosts", "heartbeat_secs", "costs", "monitor", "report", "steal",
    "services", "calibrate", "stop_grace", "autostop", "resume",
}
HOST_KEYS = {"profile", "ssh", "speed", "gpus", "slots", "instance_id", "transport", "queues"}


def find_config(start: Path) -> Path:
    path = start / CONFIG_NAME
    if not path.is_file():
        raise ConfigError(f"no {CONFIG_NAME} in {start}: run `ablate init` there, or pass -C DIR")
    return path


def load_project(directory: Path | str = ".") -> Project:
    project_dir = Path(directory).resolve()
    path = find_config(project_dir)
    data = load_yaml(path)
    if data is None:
        raise ConfigError(f"{path}: is empty; run `ablate init` in a new directory for a template")
    file = str(path)
    r = Reader(data, file, "", TOP_KEYS)

    sweep = r.text("sweep", required=True) or ""
    if not SAFE_NAME.match(sweep):
        raise r.err("sweep", f"{sweep!r} must be a plain name (letters, digits, . _ + -)")
    default_profile = load_profile(r.text("profile", "local") or "local", project_dir, f"{file}: profile")

    train = (r.text("train", required=True) or "").strip()
    if "\n" in train:
        raise r.err("train", "spans several lines; write one command "
                             "(YAML `>-` folds a long one onto one line)")
    services = parse_services(r)
    check_template(train, TRAIN_FIELDS | train_fields(services), r, "train")
    if "{cfg}" not in train:
        raise r.err("train", "must use {cfg} so each cell trains its own config")

    a = r.sub("artifacts", {"checkpoint", "metrics", "metrics_keys", "pick", "verify"})
    checkpoint = checkpoint_entries(a)
    metrics = a.text("metrics")
    if metrics is not None and not relative(metrics, SAFE_PATH):
        raise a.err("metrics", f"{metrics!r} must be a plain relative file name inside {{ckpt_dir}}")
    pick = a.text("pick", "all") or "all"
    if pick not in PICKS:
        raise a.err("pick", f"must be all (every match of a checkpoint glob) or newest (the most "
                            f"recently modified match), got {pick!r}")
    keys = a.data.get("metrics_keys") or []
    if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
        raise a.err("metrics_keys", f"must be a list of key names, got {keys!r}")
    if keys and not metrics:
        raise a.err("metrics_keys", "needs artifacts.metrics (the JSON file holding those keys)")
    artifacts = Artifacts(checkpoint, metrics, tuple(keys), pick, _verify(a, checkpoint))

    tasks = _tasks(r)
    cells = _cells(r, tasks)
    b = r.sub("budget", {"ckpt_size", "scratch", "inodes_per_cell"})
    budget = Budget(
        ckpt_size=parse_size(b.data.get("ckpt_size", 0), f"{file}: budget.ckpt_size"),
        scratch=parse_size(b.data.get("scratch", 0), f"{file}: budget.scratch"),
        inodes_per_cell=b.whole("inodes_per_cell", 16) or 16,
    )
    resources_ = r.data.get("resources") or {}
    if not isinstance(resources_, dict):
        raise r.err("resources", f"must be a mapping, got {tname(resources_)}")
    candidates = r.data.get("candidates") or []
    if not isinstance(candidates, list) or not all(isinstance(c, str) for c in candidates):
        raise r.err("candidates", f"must be a list of profile names, got {candidates!r}")
    for c in candidates:
        load_profile(c, project_dir, f"{file}: candidates")

    autostop = parse_autostop(r)
    hosts = _hosts(r, default_profile, project_dir, gpus_per_queue(services), bool(services), autostop)
    workdir = r.text("workdir")
    if workdir is None:
        remote = [h.name for h in hosts.values() if h.transport != "local"]
        if remote:
            raise r.err("workdir", f"is required for hosts that are not this machine ({', '.join(remote)}): "
                                   "the repo path on the instances (on Slurm: as the compute nodes see it)")
        workdir = str(project_dir)
    elif not workdir.startswith("/"):
        remote = [h.name for h in hosts.values() if h.transport != "local"]
        if remote:
            raise r.err("workdir", f"{workdir!r} must be an absolute path on the instances "
                                   f"(hosts {', '.join(remote)}); `~` is not expanded there")
        workdir = local_path(workdir, project_dir)
    if not SAFE_PATH.match(workdir):
        raise r.err("workdir", f"{workdir!r} has characters a shell would interpret; use a plain path")

    return Project(
        dir=project_dir,
        config_path=path,
        profile=default_profile,
        sweep=sweep,
        workdir=workdir,
        train=train,
        artifacts=artifacts,
        tasks=tasks,
        cells=cells,
        budget=budget,
        hosts=hosts,
        ssh_config=r.text("ssh_config"),
        resources=resources_,
        candidates=tuple(candidates),
        heartbeat_secs=r.whole("heartbeat_secs", HEARTBEAT_SECS) or HEARTBEAT_SECS,
        costs=parse_costs(r, tasks),
        monitor=parse_monitor(r),
        report=parse_report(r, artifacts.metrics_keys),
        steal=parse_steal(r),
        services=services,
        calibrate=parse_calibrate(r),
        autostop=autostop,
        resume=parse_resume(r, checkpoint),
    )


def _tasks(r: Reader) -> dict[str, Task]:
    raw = r.data.get("tasks")
    if not isinstance(raw, dict) or not raw:
        raise r.err("tasks", "must map each task name to {epochs: N, cost_per_epoch: X}")
    out: dict[str, Task] = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not SAFE_NAME.match(name):
            raise r.err(f"tasks.{name}", "task names must be plain names (letters, digits, . _ + -)")
        t = Reader(spec or {}, r.file, f"tasks.{name}", {"epochs", "cost_per_epoch"})
        out[name] = Task(name, t.whole("epochs", required=True) or 0, t.num("cost_per_epoch", 1.0))
    return out


def _cells(r: Reader, tasks: Mapping[str, Task]) -> tuple[CellSource, ...]:
    raw = r.data.get("cells") or []
    if not isinstance(raw, list):
        raise r.err("cells", f"must be a list of {{glob, task, epochs}}, got {tname(raw)}")
    out = []
    for i, item in enumerate(raw):
        c = Reader(item, r.file, f"cells[{i}]", {"glob", "task", "epochs", "priority"})
        task = c.text("task", required=True) or ""
        if task not in tasks:
            raise c.err("task", f"{task!r} is not in tasks{suggest(task, tasks)}")
        glob = c.text("glob", required=True) or ""
        if glob.startswith("/") or ".." in glob.split("/"):
            raise c.err("glob", f"{glob!r} must be relative to the repo root and stay inside it")
        if not _SAFE_GLOB.match(glob):
            raise c.err("glob", f"{glob!r} has characters a shell would interpret; use letters, digits, "
                                ". _ / + @ , = - and the wildcards * ? [ ]")
        prio = c.data.get("priority", 0)
        if isinstance(prio, bool) or not isinstance(prio, int) or abs(prio) > 999999:
            raise c.err("priority", f"must be a whole number (higher runs first; default 0), got {prio!r}")
        out.append(CellSource(glob, task, c.whole("epochs"), prio))
    return tuple(out)


def _hosts(r: Reader, default: Profile, project_dir: Path, per_queue: int = 1,
           services: bool = False, autostop: Autostop | None = None) -> dict[str, Host]:
    raw = r.data.get("hosts")
    if not isinstance(raw, dict) or not raw:
        raise r.err("hosts", "must map at least one host name to its settings, "
                             "e.g. `hosts: {h1: {speed: 1.0}}`")
    out: dict[str, Host] = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not SAFE_NAME.match(name):
            raise r.err(f"hosts.{name}", "host names must be plain names (letters, digits, . _ + -)")
        h = Reader(spec or {}, r.file, f"hosts.{name}", HOST_KEYS)
        profile = default
        if h.has("profile"):
            profile = load_profile(h.text("profile") or "", project_dir, f"{r.file}: hosts.{name}.profile")
        transport = h.text("transport", profile.transport) or profile.transport
        if transport not in TRANSPORTS:
            raise h.err("transport", f"must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        ssh = h.text("ssh", name) or name
        if not SAFE_NAME.match(ssh) and not re.match(r"^[A-Za-z0-9_.-]+@[A-Za-z0-9_.-]+$", ssh):
            raise h.err("ssh", f"{ssh!r} must be an ssh alias or user@host")
        one_place(h, default, profile, transport)
        if (transport == "slurm") != (profile.transport == "slurm"):
            raise h.err("transport", "a Slurm host takes its transport from its profile "
                                     "(`transport: slurm` with a slurm: mapping); set `profile:` instead")
        if transport == "slurm":
            for key, why in (("ssh", "is reached through its profile's slurm.login (absent: this machine)"),
                             ("instance_id", "has no instance to release (release cleans its scratch)")):
                if h.has(key):
                    raise h.err(key, f"a Slurm host {why}; remove hosts.{name}.{key}")
        gpus = _slurm_queues(h, services) if transport == "slurm" else _gpus(h)
        if transport != "slurm" and h.has("queues"):
            raise h.err("queues", "only a host of a `transport: slurm` profile takes queues: N "
                                  "(N batch jobs); give this host gpus: [...] or slots: N")
        iid = h.data.get("instance_id")
        bad_iid = isinstance(iid, bool) or not isinstance(iid, (str, int))
        if iid is not None and (bad_iid or not re.match(r"^[A-Za-z0-9_.-]+$", str(iid))):
            raise h.err("instance_id", f"{iid!r} must be letters, digits, . _ -")
        if gpus and len(gpus) < per_queue:
            raise h.err("gpus", f"{len(gpus)} GPU(s), but each queue takes {per_queue}: its trainer's "
                                "and its services' (services[].gpus); list more or give services fewer")
        out[name] = Host(name, profile, ssh, h.num("speed", 1.0), gpus,
                         None if iid is None else str(iid), transport, per_queue, autostop)
    return out


def _slurm_queues(h: Reader, services: bool) -> tuple[int, ...]:
    """A Slurm host is N queues (N batch jobs, `queues: N`): its slots 0..N-1 name the queues;
    Slurm, not ablate, picks each job's node and GPUs."""
    for key in ("gpus", "slots"):
        if h.has(key):
            raise h.err(key, "a Slurm host has no GPU list: give queues: N (N batch jobs) and the "
                             "GPUs per job as the profile's slurm.gpus")
    if services:
        raise h.err("queues", "services: beside the trainer are not supported on a Slurm host yet; "
                              "start them in the train command, or run the services on ssh hosts")
    return tuple(range(h.whole("queues", 1) or 1))


def _gpus(h: Reader) -> tuple[int, ...] | None:
    if h.has("gpus") and h.has("slots"):
        raise h.err("slots", "give either gpus: [0, 1] or slots: N, not both")
    if h.has("slots"):
        return tuple(range(h.whole("slots") or 1))
    g = h.data.get("gpus")
    if g is None:
        return None
    if not isinstance(g, list) or not g or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in g):
        raise h.err("gpus", f"must be a list of GPU indices like [0, 1], got {g!r}")
    if len(set(g)) != len(g):
        raise h.err("gpus", f"lists a GPU twice: {g!r}")
    return tuple(g)
