"""`ablate deploy`: place the wrappers and one run spec per host on the shared FS.

Everything is content-addressed and immutable (rule 2): `wrappers/run_queue.<sha12>.sh`,
`wrappers/run_one.<sha12>.sh` and `specs/<sha12>.env`, mode 0444. Deploying the same content again
changes nothing; a changed wrapper is a new file, and queues already running keep reading the old
one. `DEPLOYED.json` names what new launches use.
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import re
import shlex
import time
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ablate import resources as packaged
from ablate.config.project import Host, Project
from ablate.errors import AblateError, CheckFailed
from ablate.remote.layout import SweepLayout
from ablate.sweep.classify import warn
from ablate.sweep.lock import controller_lock
from ablate.sweep.snapshot import load
from ablate.transport import SharedFS, shared_fs
from ablate.transport.base import CreateImmutable, Read
from ablate.util.fmt import Log
from ablate.util.fs import read_json_object
from ablate.util.progress import transfer_progress

WRAPPERS = ("run_queue", "run_one")


def sha12(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def packaged_wrappers() -> dict[str, bytes]:
    """kind -> bytes of the wrappers shipped inside the package (`ablate.wrappers`)."""
    return {kind: packaged.read("ablate.wrappers", f"{kind}.sh") for kind in WRAPPERS}


def packaged_learn() -> bytes:
    """The stdlib-only learning helper (`ablate/remote/learn.py`), inside the runner's zipapp."""
    return packaged.read("ablate.remote", "learn.py")


RUNNER_MODULES = ("grammar.py", "learn.py", "runner.py")  # ablate/remote/, stdlib only
_RUNNER_MAIN = b"from ablate.remote.runner import main\n\nraise SystemExit(main())\n"


def packaged_runner() -> bytes:
    """The zipapp run_queue asks its decisions of (`ablate/remote/runner.py` with the modules it
    imports, under their own package names, so `python3 runner.<sha12>.pyz` runs the very code the
    controller imports). Byte-for-byte the same for the same sources: its name is its content."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        def put(name: str, data: bytes) -> None:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o444 << 16
            z.writestr(info, data)

        put("__main__.py", _RUNNER_MAIN)
        put("ablate/__init__.py", b"")
        put("ablate/remote/__init__.py", b"")
        for name in RUNNER_MODULES:
            put(f"ablate/remote/{name}", packaged.read("ablate.remote", name))
    return buf.getvalue()


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
        "ABLATE_TASK_EPOCHS": " ".join(f"{t.name}={t.epochs}" for t in project.tasks.values()),
        "ABLATE_RUN_ONE": run_one_path,
        "ABLATE_HEARTBEAT_SECS": str(project.heartbeat_secs),
        "ABLATE_STEAL": "1" if project.steal else "0",
        # The runner's decisions (ablate/remote/runner.py, a stdlib-only zipapp) and what runs it.
        "ABLATE_RUNNER_PY": runner_path,
        "ABLATE_PYTHON": host.profile.python,
        # `calibrate:`: the benchmark each queue times before its first cell (empty: none).
        "ABLATE_CALIBRATE": project.calibrate.command,
        "ABLATE_CALIBRATE_TIMEOUT": str(project.calibrate.timeout),
        "ABLATE_CALIBRATE_KEEP": "1" if project.calibrate.keep else "0",
        **service_spec(project, host),
        **slurm_spec(host),
    }
    head = f"# ablate run spec: sweep {project.sweep}, host {host.name}. Content-addressed; never edited.\n"
    return (head + "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())).encode()


def slurm_spec(host: Host) -> dict[str, str]:
    """A Slurm host's queues: no GPU pinning (the job's gres is), and what the time limit's
    signal does (run_queue's `on_time_limit`)."""
    slurm = host.profile.slurm
    if host.transport != "slurm" or slurm is None:
        return {}
    return {"ABLATE_PIN_GPU": "0", "ABLATE_SLURM_RESUBMIT": "1" if slurm.resubmit and slurm.requeue else "0",
            "ABLATE_SLURM_GRACE": str(slurm.grace)}


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


def deploy(project: Project, log: Log | None = None) -> DeployResult:
    with controller_lock(project, "deploy", log=log):
        return _deploy(project, log)


def _deploy(project: Project, log: Log | None) -> DeployResult:
    fs = shared_fs(project)
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
    # Every file and the read of DEPLOYED.json in one round trip; its write, only when it changes,
    # in a second. The bar still names each file (plain: a line per file).
    with transfer_progress(log, sum(len(d) for _, d in files), len(files), label="deploy") as bar:
        got = fs.apply([*(CreateImmutable(path, data) for path, data in files), Read(layout.deployed)])
        for i, ((path, data), new) in enumerate(zip(files, got, strict=False), 1):
            rel = posixpath.relpath(path, layout.root)
            if new:
                created.append(rel)
            bar.advance(len(data))
            bar.file_done()
            bar.cell_done(i, len(files), rel, "placed" if new else "already in place")

    record = {"version": version, "run_queue": names["run_queue"], "run_one": names["run_one"],
              "runner": runner_name, "specs": specs}
    deployed = got[-1]
    if _current(deployed if isinstance(deployed, bytes) else None) != record:
        fs.write_atomic(layout.deployed, (json.dumps({**record, "t": time.time()}) + "\n").encode())
    return DeployResult(version, layout.root, names["run_queue"], names["run_one"], specs, tuple(created),
                        runner_name)


def _current(raw: bytes | None) -> dict[str, Any] | None:
    rec = read_json_object(raw)
    if rec is not None:
        rec.pop("t", None)
    return rec


# --------------------------------------------------------------------------- gc

_OLD_WRAPPER = re.compile(r"^(?:(?:run_queue|run_one)\.[0-9a-f]{12}\.sh|learn\.[0-9a-f]{12}\.py"
                          r"|runner\.[0-9a-f]{12}\.pyz)$")
_OLD_SPEC = re.compile(r"^[0-9a-f]{12}\.env$")


@dataclass(frozen=True)
class GcResult:
    removed: tuple[str, ...]  # paths relative to the sweep root
    kept: tuple[str, ...]  # what DEPLOYED.json names, and files gc does not own

    def to_json(self) -> dict[str, Any]:
        return {"removed": list(self.removed), "kept": list(self.kept)}

    def lines(self) -> list[str]:
        if not self.removed:
            return [f"nothing to remove: only the deployed version is on the FS "
                    f"({len(self.kept)} file(s) kept)"]
        return [f"removed {len(self.removed)} old file(s), kept {len(self.kept)}:",
                *(f"  removed {p}" for p in self.removed)]


def gc(project: Project, log: Log | None = None) -> GcResult:
    """Remove the wrappers and specs DEPLOYED.json does not name; refused (CheckFailed, nothing
    removed) while any queue may still read one of them: a live tmux session or a fresh `running`
    heartbeat that names it, or a host that cannot be asked while its heartbeat names it."""
    with controller_lock(project, "deploy --gc", log=log):
        fs = shared_fs(project)
        layout = SweepLayout(fs.root)
        current = read_json_object(fs.read_bytes(layout.deployed))
        if current is None:
            raise AblateError(f"nothing is deployed on {layout.root} (no DEPLOYED.json); "
                              "`ablate deploy` first")
        keep = {f"wrappers/{current.get('run_queue')}", f"wrappers/{current.get('run_one')}",
                f"wrappers/{current.get('runner')}",
                *(f"specs/{s}" for s in (current.get("specs") or {}).values())}
        old: list[str] = []
        kept: list[str] = []
        for folder, pattern in ((layout.wrappers, _OLD_WRAPPER), (layout.specs, _OLD_SPEC)):
            for name in fs.listdir(folder):
                rel = posixpath.relpath(posixpath.join(folder, name), layout.root)
                (old if pattern.match(name) and rel not in keep else kept).append(rel)
        if not old:
            return GcResult((), tuple(sorted(kept)))
        readers = old_readers(project, fs, layout, set(old), log)
        if readers:
            raise CheckFailed("deploy --gc refused: " + "; ".join(readers) + "; nothing removed. Wait "
                              "for those queues to drain (`ablate status`) or stop them, then run it again")
        for rel in old:
            fs.remove(posixpath.join(layout.root, rel))
            if log:
                log(f"removed {rel}")
        return GcResult(tuple(sorted(old)), tuple(sorted(kept)))


def old_readers(project: Project, fs: SharedFS, layout: SweepLayout, old: set[str],
                log: Log | None = None) -> list[str]:
    """One message per queue that may still read a file in `old` (paths relative to the root): a
    live queue (the one liveness rule), or, its host not answering, any queue whose heartbeat names
    the file — a file removed under a queue that comes back would fail its next cell."""
    state = load(project, fs)
    warn(log, state.warnings)
    # (host, queue) -> the files its run reads: from its heartbeat and its last ledger entry
    uses: dict[tuple[str, str], set[str]] = {}
    for beat in state.snap.heartbeats.values():
        if beat.host and beat.queue:
            uses.setdefault((beat.host, beat.queue), set()).update(beat.files)
    for queue, ledger in state.snap.ledgers.items():
        last = ledger[-1] if ledger else None
        if last is not None and last.host:
            files = {f"wrappers/{last.run_queue}"} if last.run_queue else set()
            files |= {f"specs/{last.spec}"} if last.spec else set()
            uses.setdefault((last.host, queue), set()).update(files)
    run_one_of: dict[str, str | None] = {}  # a spec names the run_one its cells run
    for files in uses.values():
        for spec in [f for f in files if f.startswith("specs/")]:
            if spec not in run_one_of:
                run_one_of[spec] = _spec_run_one(fs.read_bytes(posixpath.join(layout.root, spec)))
            if run_one_of[spec]:
                files.add(f"wrappers/{run_one_of[spec]}")
    out: list[str] = []
    for (host, queue), files in sorted(uses.items()):
        names = sorted(files & old)
        if not names:
            continue
        age, hb = state.heartbeat(host, queue)
        if state.live(host, queue):
            why = f"is live on {host}" + (" (tmux)" if state.reachable(host) else
                                          f" (heartbeat {max(age or 0.0, 0.0):.0f}s old, host not answering)")
        elif state.busy(host, queue):  # not live, but a fresh beat says running: wait for it
            why = f"reported running on {host} {max(age or 0.0, 0.0):.0f}s ago"
        elif not state.reachable(host) and hb is not None:
            why = f"may still run: {host} cannot be reached and its heartbeat names it"
        else:
            continue
        out.append(f"queue {queue} {why}, reading {', '.join(names)}")
    return out


def _spec_run_one(raw: bytes | None) -> str | None:
    for line in (raw or b"").decode(errors="replace").splitlines():
        if line.startswith("ABLATE_RUN_ONE="):
            words = shlex.split(line.partition("=")[2])
            return posixpath.basename(words[0]) if words else None
    return None
