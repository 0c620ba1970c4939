"""What `ablate deploy` places on the shared FS, and what every launch places first: the wrappers,
the runner's zipapp and one run spec per host.

Everything is content-addressed and immutable (rule 2): `wrappers/run_queue.<sha12>.sh`,
`wrappers/run_one.<sha12>.sh`, `wrappers/runner.<sha12>.pyz` and `specs/<sha12>.env`, mode 0444.
Placing the same content again changes nothing; a changed wrapper is a new file, and queues already
running keep reading the old one. `DEPLOYED.json` names what new launches use.

With `storage:` the files go into the store the same way (`fs` is then the controller's view of the
store), and a storage host's spec names the paths of its own copy of the sweep on its disk
(`Project.sweep_root(host)`), where its launch fetches them first (ablate/run/store_launch.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import re
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ablate import resources as packaged
from ablate.config.project import Host, Project
from ablate.config.slurm import DEFAULT_GRACE, DEFAULT_MAX_RESTARTS
from ablate.remote.layout import SweepLayout
from ablate.remote.queue.defaults import CLAIM_WAIT
from ablate.remote.slurm.stop_plan import FALLBACK_WAIT
from ablate.remote.store.client import FS_WAIT
from ablate.transport import SharedFS
from ablate.transport.base import CreateImmutable, OpResult, Read, WriteAtomic
from ablate.util.fmt import Log
from ablate.util.fs import read_json_object
from ablate.util.progress import transfer_progress

WRAPPERS = ("run_queue", "run_one")


def sha12(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


# A wrapper's line that deploy replaces with the bash file it names, wrappers/common.sh (what both
# wrappers share) or wrappers/services.sh (run_queue's services), with the shellcheck directive before it.
_INLINE = re.compile(rb"^# shellcheck source=wrappers/(common|services)\.sh\n"
                     rb"[^\n]*/\1\.sh\"  # ablate: inline[^\n]*\n", re.M)


def packaged_wrappers() -> dict[str, bytes]:
    """kind -> bytes of the wrappers as deployed: the package's (`ablate.wrappers`), each with the
    bash files it names (`common.sh`, `services.sh`) put in place of their `# ablate: inline` lines
    (one file, parsed whole)."""
    parts = {name.encode(): packaged.read("ablate.wrappers", f"{name}.sh") for name in ("common", "services")}
    return {kind: _INLINE.sub(lambda m: parts[m.group(1)], packaged.read("ablate.wrappers", f"{kind}.sh"))
            for kind in WRAPPERS}


def packaged_learn() -> bytes:
    """The stdlib-only learning helper (`ablate/remote/queue/learn.py`), inside the runner's zipapp."""
    return packaged.module("ablate.remote.queue.learn")


# The modules in the runner zipapp (stdlib only at import: the store's client imports boto3 when a
# store is opened, which only a storage host's runner does; the checkpoint loaders import numpy,
# torch or safetensors when a file is loaded, which only the autostop watcher does): exactly the
# ablate modules that `queue.serve`, `queue.publish` and `host.autostop_watch` import, at any depth
# (tests/test_shipped_code.py).
RUNNER_MODULES = ("ablate.remote.checkpoints.artifacts", "ablate.remote.checkpoints.filecheck",
                  "ablate.remote.checkpoints.framework_dirs", "ablate.remote.checkpoints.loaders",
                  "ablate.remote.checkpoints.pickles", "ablate.remote.checkpoints.torchzip",
                  "ablate.remote.checkpoints.verify", "ablate.remote.host.autostop",
                  "ablate.remote.host.autostop_store", "ablate.remote.host.autostop_watch",
                  "ablate.remote.layout", "ablate.remote.queue.calibrate", "ablate.remote.queue.defaults",
                  "ablate.remote.queue.fence", "ablate.remote.queue.grammar", "ablate.remote.queue.learn",
                  "ablate.remote.queue.publish", "ablate.remote.queue.rules", "ablate.remote.queue.runner",
                  "ablate.remote.queue.serve", "ablate.remote.queue.walk",
                  "ablate.remote.resume.copies", "ablate.remote.resume.keeper",
                  "ablate.remote.resume.store_place",
                  "ablate.remote.slurm.signal_window", "ablate.remote.slurm.stop_plan",
                  "ablate.remote.slurm.time_limit_cuts", "ablate.remote.store.client",
                  "ablate.remote.store.local_copy", "ablate.remote.store.queue_side")
# run_one's publish where it runs as a Python start of its own: without the decisions' modules
_RUNNER_MAIN = b"""import sys

if sys.argv[1:2] == ["publish"]:
    from ablate.remote.queue.publish import main as publish

    raise SystemExit(publish(sys.argv[2:]))
if sys.argv[1:2] == ["autostop"]:
    from ablate.remote.host.autostop_watch import main as autostop

    raise SystemExit(autostop(sys.argv[2:]))
from ablate.remote.queue.serve import main

raise SystemExit(main())
"""


def packaged_runner() -> bytes:
    """The zipapp run_queue asks its decisions of (`ablate/remote/queue/runner.py` with the modules it
    imports, under their own package names, so `python3 runner.<sha12>.pyz` runs the very code the
    controller imports). Byte-for-byte the same for the same sources: its name is its content."""
    return packaged.zipapp(_RUNNER_MAIN, RUNNER_MODULES, deflate=True)


def render_spec(project: Project, host: Host, run_one_path: str, runner_path: str = "") -> bytes:
    """The bash-sourceable run spec of one host (docs/ARCHITECTURE.md, "Run spec")."""
    values = {
        "ABLATE_ROOT": project.sweep_root(host),
        "ABLATE_SWEEP": project.sweep,
        "ABLATE_HOST": host.name,
        "ABLATE_WORKDIR": project.workdir,
        "ABLATE_CKPT_ROOT": host.ckpt_root,
        "ABLATE_TRAIN": project.train,
        "ABLATE_ENV": host.profile.env or "",
        "ABLATE_CHECKPOINT": " ".join(project.artifacts.checkpoint),  # entries hold no spaces
        "ABLATE_PICK": project.artifacts.pick,
        "ABLATE_METRICS": project.artifacts.metrics or "",
        # `resume:` (ablate/remote/resume/keeper.py): what a cell resumes from, "-" when off
        "ABLATE_RESUME": " ".join(project.resume.checkpoint) if project.resume is not None else "-",
        "ABLATE_RESUME_PICK": project.resume.pick if project.resume is not None else "newest",
        "ABLATE_TASK_EPOCHS": " ".join(f"{t.name}={t.epochs}" for t in project.tasks.values()),
        "ABLATE_RUN_ONE": run_one_path,
        "ABLATE_HEARTBEAT_SECS": str(project.heartbeat_secs),
        "ABLATE_STEAL": "1" if project.steal else "0",
        # The runner's decisions (ablate/remote/queue/runner.py, a stdlib-only zipapp) and what runs it.
        "ABLATE_RUNNER_PY": runner_path,
        "ABLATE_PYTHON": host.profile.python,
        # `calibrate:`: the benchmark each queue times before its first cell (empty: none).
        "ABLATE_CALIBRATE": project.calibrate.command,
        "ABLATE_CALIBRATE_TIMEOUT": str(project.calibrate.timeout),
        "ABLATE_CALIBRATE_KEEP": "1" if project.calibrate.keep else "0",
        **service_spec(project, host),
        **stop_spec(project, host),
        **store_spec(project, host),
    }
    head = f"# ablate run spec: sweep {project.sweep}, host {host.name}. Content-addressed; never edited.\n"
    return (head + "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())).encode()


def stop_spec(project: Project, host: Host) -> dict[str, str]:
    """What run_queue computes its waits and its stop path with, in every spec, each from its one
    definition here in Python (the wrapper keeps no copy): the cell's stop grace, the claim wait,
    GPU pinning (a Slurm host's job's gres pins them instead), and what Slurm's signals do (the
    runner's `stop-plan`, `ablate/remote/slurm/stop_plan.py`: on another host only a USR2 sent by hand
    reads them)."""
    slurm = host.profile.slurm if host.transport == "slurm" else None
    resubmit, grace, restarts = ((slurm.resubmit and slurm.requeue, slurm.grace, slurm.max_restarts)
                                 if slurm is not None else (False, DEFAULT_GRACE, DEFAULT_MAX_RESTARTS))
    return {"ABLATE_STOP_GRACE": str(max(1, math.ceil(project.monitor.stop_grace))),
            "ABLATE_CLAIM_WAIT": str(CLAIM_WAIT),
            "ABLATE_FS_WAIT": str(int(FS_WAIT)),
            "ABLATE_PIN_GPU": "1" if host.pins_gpus else "0",
            "ABLATE_SLURM_RESUBMIT": "1" if resubmit else "0",
            "ABLATE_SLURM_GRACE": str(grace),
            "ABLATE_SLURM_MAX_RESTARTS": str(restarts),
            "ABLATE_SLURM_FALLBACK_WAIT": str(FALLBACK_WAIT)}


def store_spec(project: Project, host: Host) -> dict[str, str]:
    """A storage host's queues keep the sweep in its store: the store's URL for this sweep and its
    endpoint (empty: AWS S3). ABLATE_ROOT and every path is then the instance's own copy, where the
    launch fetched the wrappers and the spec (ablate/run/store_launch.py)."""
    store = project.sweep_store(host)
    if store is None:
        return {}
    return {"ABLATE_STORE": store[0], "ABLATE_STORE_ENDPOINT": store[1] or ""}


SERVICE_GRACE = 10  # seconds between a service's TERM and its KILL


def service_spec(project: Project, host: Host) -> dict[str, str]:
    """The run spec's lines for `services:` (docs/ARCHITECTURE.md, "Services"); none without."""
    if not project.services:
        return {}
    out = {"ABLATE_SERVICES": " ".join(s.name for s in project.services),
           "ABLATE_SVC_GRACE": str(SERVICE_GRACE)}
    for s in project.services:
        out.update({f"ABLATE_SVC_{s.name}_CMD": s.command, f"ABLATE_SVC_{s.name}_PORT": str(s.port),
                    f"ABLATE_SVC_{s.name}_HTTP": s.ready_http or "",
                    f"ABLATE_SVC_{s.name}_READY": s.ready_cmd or "",
                    f"ABLATE_SVC_{s.name}_TIMEOUT": str(max(1, round(s.timeout))),
                    f"ABLATE_SVC_{s.name}_SCOPE": s.scope})
    # Per trainer slot: `SLOT:K:GPUS/GPUS/...` (K: the queue's index on this host, so its ports are
    # port + K; then each service's GPUs, comma-separated, in the order of services:).
    slots = []
    for slot in host.slots:
        k, gpus = host.queue_gpus(slot)
        per, i = [], 0
        for s in project.services:
            per.append(",".join(str(g) for g in gpus[i:i + s.gpus]))
            i += s.gpus
        slots.append(f"{'-' if slot is None else slot}:{k}:{'/'.join(per)}")
    out["ABLATE_SVC_SLOTS"] = " ".join(slots)
    return out


@dataclass(frozen=True)
class DeployResult:
    version: str  # sha12 over both wrappers' contents
    root: str  # the sweep root as the controller sees it
    run_queue: str  # file names under wrappers/
    run_one: str
    specs: Mapping[str, str]  # host -> file name under specs/
    created: tuple[str, ...] = field(default=())  # paths (relative to root) written by this call
    runner: str = ""  # the runner's zipapp's file name under wrappers/

    def run_queue_path(self, layout: SweepLayout) -> str:
        return posixpath.join(layout.wrappers, self.run_queue)

    def spec_path(self, layout: SweepLayout, host: str) -> str:
        return posixpath.join(layout.specs, self.specs[host])

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "root": self.root, "run_queue": self.run_queue,
                "run_one": self.run_one, "runner": self.runner, "specs": dict(self.specs),
                "created": list(self.created)}

    def lines(self) -> list[str]:
        state = f"{len(self.created)} new file(s)" if self.created else "already in place"
        out = [f"deployed version {self.version} ({state})",
               f"  wrappers/{self.run_queue}  wrappers/{self.run_one}"]
        out += [f"  {host}: specs/{spec}" for host, spec in self.specs.items()]
        return out


def place(project: Project, fs: SharedFS, log: Log | None = None) -> DeployResult:
    """Every file in place (those already there untouched) and DEPLOYED.json naming them, through
    `fs`; the caller holds the controller lock."""
    placed = place_and_read(project, fs, log)
    if placed.deployed is not None:
        fs.write_atomic(placed.deployed.path, placed.deployed.data)
    return placed.result


@dataclass(frozen=True)
class Placed:
    result: DeployResult
    deployed: WriteAtomic | None  # DEPLOYED.json's write, when it changes (the caller's to do)
    read: list[OpResult]  # what `place_and_read` read beside


def place_and_read(project: Project, fs: SharedFS, log: Log | None = None,
                   reads: Sequence[str] = ()) -> Placed:
    """`place`'s files and the read of DEPLOYED.json in one round trip, with the files `reads`
    (their bytes, or None); DEPLOYED.json's write, when it changes, is left to the caller (a
    launch puts it first in the round trip of its records: ablate/run/pipeline.py)."""
    layout = SweepLayout(fs.root)
    wrappers = packaged_wrappers()
    names = {kind: f"{kind}.{sha12(data)}.sh" for kind, data in wrappers.items()}
    version = sha12(b"".join(wrappers[k] for k in WRAPPERS))
    created: list[str] = []

    runner = packaged_runner()
    runner_name = f"runner.{sha12(runner)}.pyz"
    files = [(posixpath.join(layout.wrappers, names[kind]), wrappers[kind]) for kind in WRAPPERS]
    files.append((posixpath.join(layout.wrappers, runner_name), runner))
    specs: dict[str, str] = {}
    for name, host in project.hosts.items():
        run_one = posixpath.join(project.layout(host).wrappers, names["run_one"])
        data = render_spec(project, host, run_one, posixpath.join(project.layout(host).wrappers, runner_name))
        specs[name] = f"{sha12(data)}.env"
        files.append((posixpath.join(layout.specs, specs[name]), data))
    # Every file, the read of DEPLOYED.json and the caller's reads in one round trip. The bar still
    # names each file (plain: a line per file).
    with transfer_progress(log, sum(len(d) for _, d in files), len(files), label="deploy") as bar:
        got = fs.apply([*(CreateImmutable(path, data) for path, data in files), Read(layout.deployed),
                        *(Read(path) for path in reads)])
        for i, ((path, data), new) in enumerate(zip(files, got, strict=False), 1):
            rel = posixpath.relpath(path, layout.root)
            if new:
                created.append(rel)
            bar.advance(len(data))
            bar.file_done()
            bar.cell_done(i, len(files), rel, "placed" if new else "already in place")

    record = {"version": version, "run_queue": names["run_queue"], "run_one": names["run_one"],
              "runner": runner_name, "specs": specs}
    deployed = got[len(files)]
    write = None
    if _current(deployed if isinstance(deployed, bytes) else None) != record:
        write = WriteAtomic(layout.deployed, (json.dumps({**record, "t": time.time()}) + "\n").encode())
    result = DeployResult(version, layout.root, names["run_queue"], names["run_one"], specs, tuple(created),
                          runner_name)
    return Placed(result, write, got[len(files) + 1:])


def _current(raw: bytes | None) -> dict[str, Any] | None:
    rec = read_json_object(raw)
    if rec is not None:
        rec.pop("t", None)
    return rec
