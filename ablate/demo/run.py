"""`ablate demo`: the whole flow on this machine, with a tiny real trainer and a failure caught.

Builds a throw-away project with three local hosts of different speeds and a dozen cells, then
runs plan → deploy → launch --all → live status → pull → reconcile → release gate. One config is
broken on purpose (`lr: fast`); reconcile reports it, the gate refuses and says why; the demo fixes
the config as a user would, re-runs that cell, reconciles to 100 % and the gate opens.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from ablate.config.project import Project, load_project
from ablate.errors import AblateError, CheckFailed
from ablate.monitor import status
from ablate.plan import planner as plan
from ablate.results import pull, reconcile, remediate
from ablate.results import release as gate
from ablate.run import deploy, launch
from ablate.sweep import classify

HOSTS = {"fast": 1.4, "mid": 1.0, "slow": 0.6}
BROKEN = "recon_lr_fast"


def _configs(n_cells: int) -> list[tuple[str, str, dict[str, object]]]:
    """(task, name, config) for n cells: two thirds reconstruction, one third detection."""
    out: list[tuple[str, str, dict[str, object]]] = [("recon", "recon_baseline", {"lr": 0.1, "hidden": 8})]
    out.append(("recon", BROKEN, {"lr": "fast", "hidden": 8}))  # the mistake a user makes
    n_det = max(1, n_cells // 3)
    i = 0
    while len(out) < n_cells - n_det:
        lr, hidden = (0.02, 0.05, 0.2, 0.3)[i % 4], (4, 8, 16)[i % 3]
        out.append(("recon", f"recon_lr{lr}_h{hidden}_{i}", {"lr": lr, "hidden": hidden}))
        i += 1
    out.append(("det", "det_baseline", {"lr": 0.05, "hidden": 16}))
    j = 0
    while len(out) < n_cells:
        out.append(("det", f"det_h{(4, 32)[j % 2]}_{j}", {"lr": 0.05, "hidden": (4, 32)[j % 2]}))
        j += 1
    return out


def build_project(root: Path, n_cells: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    trainer = root / "train.py"
    shutil.copyfile(Path(__file__).with_name("train.py"), trainer)
    for k, (task, name, cfg) in enumerate(_configs(n_cells)):
        path = root / "configs" / "ablation" / task / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({**cfg, "seed": k, "step_time": 0.12}, sort_keys=False))
    config = {
        "profile": "local",
        "sweep": "demo",
        "train": f"{shlex.quote(sys.executable)} train.py --config {{cfg}} --epochs {{epochs}} "
                 "--out {ckpt_dir} --resume {resume}",
        "artifacts": {"checkpoint": "model.safetensors", "metrics": "metrics.json",
                      "metrics_keys": ["val_loss"]},
        "tasks": {"recon": {"epochs": 6, "cost_per_epoch": 1.0},
                  "det": {"epochs": 4, "cost_per_epoch": 2.0}},
        "cells": [{"glob": "configs/ablation/recon/*.yaml", "task": "recon"},
                  {"glob": "configs/ablation/det/*.yaml", "task": "det"}],
        "budget": {"ckpt_size": "1MB", "scratch": "10MB"},
        "heartbeat_secs": 1,
        "hosts": {name: {"speed": speed} for name, speed in HOSTS.items()},
    }
    (root / "ablate.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return root


def run_demo(directory: Path | None, n_cells: int = 12, echo: Callable[[str], None] = print) -> int:
    root = directory or Path(tempfile.mkdtemp(prefix="ablate-demo-"))
    if (root / "ablate.yaml").exists():
        raise AblateError(f"{root} already holds an ablate.yaml; give `ablate demo --dir` a new directory")
    t0 = time.monotonic()
    build_project(root, n_cells)
    echo(f"demo project: {root}  ({n_cells} cells, hosts {', '.join(f'{h} x{s}' for h, s in HOSTS.items())})")
    project = load_project(root)

    def step(cmd: str) -> None:
        echo(f"\n$ ablate {cmd}")

    def show(lines: list[str]) -> None:
        for line in lines:
            echo(f"  {line}")

    def pull_and_reconcile() -> reconcile.ReconcileReport:
        step("pull")
        show(pull.pull(project).lines())
        step("reconcile")
        report = reconcile.reconcile(project)
        show(report.lines())
        return report

    step("plan")
    show(plan.plan(project).lines())
    project = load_project(root)
    step("deploy")
    show(deploy.deploy(project).lines())
    step("launch --all")
    for res in launch.launch_all(project):
        show(res.lines())
    step("status   (polled until every queue drains)")
    _wait_drained(project, echo)
    report = pull_and_reconcile()
    if report.complete:
        raise AblateError(f"demo: the broken cell {BROKEN} should have failed but reconcile is complete")
    host = next(iter(HOSTS))
    step(f"release {host} --yes")
    try:
        gate.release(project, host, yes=True, confirm=lambda _q: True)
        raise AblateError("demo: the release gate opened with a cell missing")
    except CheckFailed as refused:
        echo(f"  refused (exit 1): {refused.message}")

    step("status   (every cell that is not verified, classified from the shared FS)")
    got = classify.collect(project)
    broken = got.cells[BROKEN]
    show([c.line() for c in got.not_verified()])
    if broken.state != "crashed":
        raise AblateError(f"demo: {BROKEN} should be classified crashed, got {broken.state}: {broken.reason}")
    said = [ln for ln in broken.tail if ln and not ln.startswith("# ablate")]
    echo(f"\n# {BROKEN} crashed on {broken.host} (queue {broken.queue}); the last line of its log:")
    echo(f"#   {said[-1] if said else '(empty)'}")
    bad = root / "configs" / "ablation" / "recon" / f"{BROKEN}.yaml"
    cfg = yaml.safe_load(bad.read_text())
    echo(f"# lr was {cfg['lr']!r}; fix the config as you would: {bad.relative_to(root)}: lr: 0.3")
    cfg["lr"] = 0.3
    bad.write_text(yaml.safe_dump(cfg, sort_keys=False))
    step("remediate --launch   (the identical queue line, on a live host; never a patched config)")
    show(remediate.remediate(project, launch=True).lines())
    _wait_drained(project, echo)
    report = pull_and_reconcile()
    if not report.complete:
        raise CheckFailed("demo: reconcile is still incomplete after the fix; see the lines above")
    for h in HOSTS:
        step(f"release {h} --yes")
        show(gate.release(project, h, yes=True, confirm=lambda _q: True).lines())
    echo(f"\ndemo finished in {time.monotonic() - t0:.1f}s; project kept at {root}")
    how = ", ".join(f"{k} {n}" for k, n in report.checkpoint_checks.items()) or "none"
    echo(f"{report.verified}/{report.roster} cells verified (checkpoint files: {how}); "
         "the release gate is open for all hosts")
    return 0


def _wait_drained(project: Project, echo: Callable[[str], None], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        rep = status.status(project)
        active = [r for r in rep.rows if r.state in ("running", "stale")]
        line = "  " + "  ".join(f"{r.queue}:{r.index}/{r.total}{'*' if r.state == 'running' else ''}"
                                for r in rep.rows) + f"   synced {rep.synced}/{rep.roster}"
        if line != last:
            echo(line)
            last = line
        if not active:
            return
        if time.monotonic() > deadline:
            raise AblateError(f"demo: queues still running after {timeout:.0f}s: {[r.queue for r in active]}")
        time.sleep(0.3)
