#!/usr/bin/env python3
"""Nothing lost, nothing twice, on a real network FS: a 12-cell sweep on 3 test-bed instances that
mount the shared directory over sshfs with its default caches, one cell crashing once, looped, as a
user runs it, and tallied (needs root; tests/testbed.py's sshfs mode).

Each repetition, through the real CLI (`python -m ablate`, a new process per command, as a user types):
  doctor (measures and records the FS's lag), deploy, launch --all; `status` polled until every
  queue has drained; at once `reconcile --fs` (its classification of the cells it did not verify)
  and `remediate --launch` (the crashed cell's cause fixed first, as a user would); `status` polled
  until drained again; `reconcile --fs` polled until complete.
Counted independently of ablate's own records: every cell's training runs that reached their last
epoch, from the trainer's own trace on each instance's local disk (tests/helpers/fault_train.py).
A repetition is clean when every cell ends verified, every cell's training completed exactly once,
nothing that had run was classified as an absence (`never_ran`/`lost`/`interrupted`/
`sync_failed`) without `unconfirmed`, and remediate re-ran exactly the crashed cell.

    sudo python3 scripts/soak_sshfs.py [--reps 10] [--shared sshfs|bind] [--ablate DIR]

`--ablate DIR` runs the CLI from another checkout (e.g. a commit before issue 11, to see what the
same loop did then); the test bed, the trainer and the tally are this checkout's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (it puts this checkout on sys.path)

from benchlib import REPO, host_queue, wait_until, write_project

from tests.helpers import fault_train
from tests.testbed import Testbed, missing_requirement

CELLS_PER_HOST = 4
EPOCHS = 3
CRASHER = "c5"  # killed after its first epoch (exit 137, as an OOM kill) until its cause is fixed
ABSENCE = {"never_ran", "lost", "interrupted", "sync_failed"}


@dataclass
class Rep:
    n: int
    verified: int = 0
    completions: dict[str, int] = field(default_factory=dict)
    false_absences: list[str] = field(default_factory=list)  # cell: state, decided on a ran cell
    remediated: list[str] = field(default_factory=list)
    unconfirmed_seen: int = 0
    lag: float | None = None
    secs: float = 0.0
    error: str | None = None

    @property
    def clean(self) -> bool:
        return (self.error is None and self.verified == len(self.completions)
                and all(v == 1 for v in self.completions.values()) and not self.false_absences
                and self.remediated == [CRASHER])


CLI_PATH = REPO  # where the `ablate` package the CLI processes import lives (--ablate)


def ablate(proj: Path, *args: str, check: bool = True, timeout: float = 300) -> dict[str, Any]:
    """`python -m ablate -C proj ARGS --json` in a new process; its one JSON object."""
    env = {**os.environ, "PYTHONPATH": str(CLI_PATH)}
    r = subprocess.run([sys.executable, "-m", "ablate", "-C", str(proj), *args, "--json"], env=env,
                       capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"ablate {' '.join(args)} exited {r.returncode}: {r.stderr.strip()[-400:]}")
    out: dict[str, Any] = json.loads(r.stdout) if r.stdout.strip() else {}
    return out


def poll(cond: Callable[[], bool], timeout: float, what: str) -> None:
    if not wait_until(cond, timeout):
        raise RuntimeError(f"{what}: not within {timeout:.0f} s")


def make_sweep(tb: Testbed, base: Path, name: str) -> tuple[Path, list[str]]:
    proj, work = base / name, tb.shared_dir / "work" / name
    queues = {h: [f"c{CELLS_PER_HOST * i + k}" for k in range(CELLS_PER_HOST)]
              for i, h in enumerate(tb.hosts)}
    cells = [c for cs in queues.values() for c in cs]
    (work / "faults").mkdir(parents=True)
    shutil.copyfile(fault_train.__file__, work / "train.py")
    (work / "faults" / f"{CRASHER}.oom").write_text("1\n")
    proj.mkdir(parents=True)
    ssh_config = proj / "ssh_config"
    tb.write_ssh_config(ssh_config, extra="\nHost *\n  ConnectTimeout 5\n")
    write_project(
        proj, name, profile="tb", profile_settings={
            "transport": "ssh", "shared_fs": tb.shared_path, "ckpt_root": f"{tb.local_path}/ckpt/{name}"},
        configs={c: yaml.safe_dump({"lr": 0.1, "hidden": 8, "seed": i, "step_time": 0.3})
                 for i, c in enumerate(cells)},
        work=work, workdir=f"{tb.shared_path}/work/{name}",
        queues={h: host_queue(h, (f"configs/{c}.yaml recon" for c in cs)) for h, cs in queues.items()},
        train=(f"{sys.executable} train.py --config {{cfg}} --epochs {{epochs}} --out {{ckpt_dir}} "
               "--resume {resume} --name {name}"),
        artifacts={"checkpoint": fault_train.CKPT, "metrics": "metrics.json", "metrics_keys": ["val_loss"]},
        tasks={"recon": {"epochs": EPOCHS, "cost_per_epoch": 1.0}},
        budget={"ckpt_size": "1MB", "scratch": "1MB"}, heartbeat_secs=1, steal=True,
        ssh_config=str(ssh_config), hosts={h: {"speed": 1.0} for h in tb.hosts})
    return proj, cells


def completions(tb: Testbed, name: str, cells: list[str]) -> dict[str, int]:
    """Per cell: training runs that reached the last epoch, from the trainer's own traces."""
    out = dict.fromkeys(cells, 0)
    for host in tb.hosts:
        for c in cells:
            trace = tb.local_dir(host) / "ckpt" / name / c / "trace.jsonl"
            if trace.exists():
                out[c] += sum(1 for ln in trace.read_text().splitlines()
                              if ln.strip() and json.loads(ln).get("ev") == "epoch"
                              and json.loads(ln).get("epoch") == EPOCHS)
    return out


def drained(proj: Path) -> bool:
    st = ablate(proj, "status")
    return bool(st["queues"]) and all(q["state"] == "drained" for q in st["queues"])


def one_rep(tb: Testbed, base: Path, n: int) -> Rep:
    rep, name, t0 = Rep(n), f"soak{n}", time.monotonic()
    proj, cells = make_sweep(tb, base, name)
    try:
        doc = ablate(proj, "doctor", check=False)
        rep.lag = (doc.get("fs_lag") or {}).get("lag") if isinstance(doc.get("fs_lag"), dict) else None
        ablate(proj, "deploy")
        ablate(proj, "launch", "--all")
        poll(lambda: drained(proj), 300, "every queue drained")
        ran = {c for c, k in completions(tb, name, cells).items() if k}
        rec = ablate(proj, "reconcile", "--fs", check=False)
        for c, st in (rec.get("cells") or {}).items():
            if st.get("unconfirmed"):
                rep.unconfirmed_seen += 1
            elif st.get("state") in ABSENCE and c in ran:
                rep.false_absences.append(f"{c}: {st['state']}")
        (tb.shared_dir / "work" / name / "faults" / f"{CRASHER}.oom").unlink()  # the cause fixed
        rem = ablate(proj, "remediate", "--launch")
        rep.remediated = sorted(rem.get("targets") or {})
        rep.unconfirmed_seen += len(rem.get("unconfirmed") or {})
        poll(lambda: drained(proj), 300, "every queue drained after remediate")
        poll(lambda: ablate(proj, "reconcile", "--fs", check=False).get("complete") is True, 180,
             "reconcile --fs complete")
        rep.verified = int(ablate(proj, "reconcile", "--fs", check=False).get("verified") or 0)
    except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
        rep.error = str(e)[:300]
    rep.completions = completions(tb, name, cells)
    rep.secs = time.monotonic() - t0
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--shared", choices=("sshfs", "bind"), default="sshfs")
    ap.add_argument("--ablate", type=Path, default=REPO, help="the checkout whose CLI runs")
    a = ap.parse_args(argv)
    global CLI_PATH
    CLI_PATH = a.ablate.resolve()
    reason = missing_requirement()
    if reason:
        print(f"soak_sshfs: cannot run: {reason}", file=sys.stderr)
        return 2
    reps: list[Rep] = []
    with tempfile.TemporaryDirectory(prefix="ablate-soak-") as tmp, Testbed(3, shared=a.shared) as tb:
        for n in range(1, a.reps + 1):
            r = one_rep(tb, Path(tmp), n)
            reps.append(r)
            twice = {c: k for c, k in r.completions.items() if k != 1}
            print(f"rep {n:>2}: {'clean' if r.clean else 'NOT CLEAN'}  verified {r.verified}/"
                  f"{len(r.completions)}  trained != once {twice or 'none'}  false absences "
                  f"{r.false_absences or 'none'}"
                  f"  remediated {r.remediated}  unconfirmed seen {r.unconfirmed_seen}"
                  f"  lag {r.lag}  {r.secs:.0f} s" + (f"  error: {r.error}" if r.error else ""), flush=True)
    clean = sum(r.clean for r in reps)
    print(f"tally ({a.shared}, ablate from {CLI_PATH}): {clean}/{len(reps)} repetitions clean; "
          "cells verified "
          f"{sum(r.verified for r in reps)}/{sum(len(r.completions) for r in reps)}; trained more than once "
          f"{sum(1 for r in reps for k in r.completions.values() if k > 1)}; never trained "
          f"{sum(1 for r in reps for k in r.completions.values() if k == 0)}; false absences "
          f"{sum(len(r.false_absences) for r in reps)}")
    return 0 if clean == len(reps) else 1


if __name__ == "__main__":
    sys.exit(main())
