"""`ablate deploy`: place the wrappers and one run spec per host on the shared FS.

Everything is content-addressed and immutable (rule 2): `wrappers/run_queue.<sha12>.sh`,
`wrappers/run_one.<sha12>.sh` and `specs/<sha12>.env`, mode 0444. Deploying the same content again
changes nothing; a changed wrapper is a new file, and queues already running keep reading the old
one. `DEPLOYED.json` names what new launches use.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ablate.config import Host, Project
from ablate.fsutil import read_json_object
from ablate.layout import SweepLayout
from ablate.transport import shared_fs

Log = Callable[[str], None] | None
WRAPPERS = ("run_queue", "run_one")


def sha12(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def packaged_wrappers() -> dict[str, bytes]:
    """kind -> bytes of the wrappers shipped inside the package (`ablate.wrappers`)."""
    try:
        root: Any = resources.files("ablate.wrappers")
    except ModuleNotFoundError:
        # A source checkout that is not installed: setup.cfg maps `wrappers/` to the
        # `ablate.wrappers` package only at install time.
        root = Path(__file__).resolve().parent.parent / "wrappers"
    return {kind: (root / f"{kind}.sh").read_bytes() for kind in WRAPPERS}


def render_spec(project: Project, host: Host, run_one_path: str) -> bytes:
    """The bash-sourceable run spec of one host (docs/ARCHITECTURE.md, "Run spec")."""
    values = {
        "ABLATE_ROOT": project.sweep_root(host),
        "ABLATE_SWEEP": project.sweep,
        "ABLATE_HOST": host.name,
        "ABLATE_WORKDIR": project.workdir,
        "ABLATE_CKPT_ROOT": host.ckpt_root,
        "ABLATE_TRAIN": project.train,
        "ABLATE_ENV": host.profile.env or "",
        "ABLATE_CHECKPOINT": project.artifacts.checkpoint,
        "ABLATE_METRICS": project.artifacts.metrics or "",
        "ABLATE_TASK_EPOCHS": " ".join(f"{t.name}={t.epochs}" for t in project.tasks.values()),
        "ABLATE_RUN_ONE": run_one_path,
        "ABLATE_HEARTBEAT_SECS": str(project.heartbeat_secs),
    }
    head = f"# ablate run spec: sweep {project.sweep}, host {host.name}. Content-addressed; never edited.\n"
    return (head + "".join(f"{k}={shlex.quote(v)}\n" for k, v in values.items())).encode()


@dataclass(frozen=True)
class DeployResult:
    version: str  # sha12 over both wrappers' contents
    root: str  # the sweep root as the controller sees it
    run_queue: str  # file names under wrappers/
    run_one: str
    specs: Mapping[str, str]  # host -> file name under specs/
    created: tuple[str, ...] = field(default=())  # paths (relative to root) written by this call

    def run_queue_path(self, layout: SweepLayout) -> str:
        return posixpath.join(layout.wrappers, self.run_queue)

    def spec_path(self, layout: SweepLayout, host: str) -> str:
        return posixpath.join(layout.specs, self.specs[host])

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "root": self.root, "run_queue": self.run_queue,
                "run_one": self.run_one, "specs": dict(self.specs), "created": list(self.created)}

    def lines(self) -> list[str]:
        state = f"{len(self.created)} new file(s)" if self.created else "already in place"
        out = [f"deployed version {self.version} ({state})",
               f"  wrappers/{self.run_queue}  wrappers/{self.run_one}"]
        out += [f"  {host}: specs/{spec}" for host, spec in self.specs.items()]
        return out


def deploy(project: Project, log: Log = None) -> DeployResult:
    fs = shared_fs(project)
    layout = SweepLayout(fs.root)
    wrappers = packaged_wrappers()
    names = {kind: f"{kind}.{sha12(data)}.sh" for kind, data in wrappers.items()}
    version = sha12(b"".join(wrappers[k] for k in WRAPPERS))
    created: list[str] = []

    def place(path: str, data: bytes) -> None:
        if fs.create_immutable(path, data):
            rel = posixpath.relpath(path, layout.root)
            created.append(rel)
            if log:
                log(f"placed {rel}")

    for kind in WRAPPERS:
        place(posixpath.join(layout.wrappers, names[kind]), wrappers[kind])
    specs: dict[str, str] = {}
    for name, host in project.hosts.items():
        run_one = posixpath.join(project.layout(host).wrappers, names["run_one"])
        data = render_spec(project, host, run_one)
        specs[name] = f"{sha12(data)}.env"
        place(posixpath.join(layout.specs, specs[name]), data)

    record = {"version": version, "run_queue": names["run_queue"], "run_one": names["run_one"],
              "specs": specs}
    if _current(fs.read_bytes(layout.deployed)) != record:
        fs.write_atomic(layout.deployed, (json.dumps({**record, "t": time.time()}) + "\n").encode())
    return DeployResult(version, layout.root, names["run_queue"], names["run_one"], specs, tuple(created))


def _current(raw: bytes | None) -> dict[str, Any] | None:
    rec = read_json_object(raw)
    if rec is not None:
        rec.pop("t", None)
    return rec
