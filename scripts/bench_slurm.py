#!/usr/bin/env python3
"""A sweep on a real Slurm cluster: ablate (`transport: slurm`, one batch job per queue) against
the job array users write by hand, side by side, clean and under faults (needs root and Slurm).

One Slurm bed (tests/slurmbed.py: slurmctld and three slurmd nodes sn1..sn3, one CPU each, in their
own namespaces on this machine, one shared directory) serves every run. The sweep: `--cells` cells
(default 24) of the real small trainer tests/helpers/fault_train.py (numpy gradient descent, a
safetensors checkpoint after every epoch, `step_time` seconds of sleep per epoch), each with its own
number of epochs from a fixed seeded draw (3-6, `--seed`), so cells cost 2-5 s. Every run is a fresh
sweep on the shared directory; the two ways run the same trainer on the same configs:

  ablate  a project as in tests/test_slurm_submission.py: profile `transport: slurm`, host
          `cluster: {queues: 3}`, ckpt_root on the shared dir, the cells' epochs declared in
          ablate.yaml (`cells: [{glob, task, epochs}]`). `ablate plan`, then `ablate launch --all`
          (each `<python> -m ablate -C PROJ ...` as its own process, SLURM_CONF set, this checkout on
          PYTHONPATH): three batch jobs, each running run_queue (claims, resume, publish). Done:
          every cell's `final_ckpts/<cell>/MANIFEST.json` exists and no job of the sweep is listed
          by squeue.
  array   what users write by hand: one `sbatch --array=0-N%3 --requeue` script (printed below the
          tables); task i trains cell i directly (`--resume 0`), into its own out dir on the shared
          dir; `%3` caps it at the same three slots. Done: no task of the array is listed.

Each repetition runs both ways clean, then both with faults; the order of the two ways alternates
between repetitions (ablate first in odd ones). The bench waits between runs until every node is
idle (`heal()` after a fault run restarts the killed node).

  makespan    from just before the first submit command (`ablate plan`; `sbatch`) to the last
              result written: the newest `MANIFEST.json` (ablate: the cell published) or
              `metrics.json` (array: the trainer's last write), by mtime on this machine's clock.
  drained     from the same start until squeue lists no job of the run (polled every 0.2 s).
  submit      wall time of the submit commands themselves (plan + launch; sbatch).

Fault runs: once a quarter of the cells have completed and two jobs (ablate: queue jobs; array:
array tasks) are mid-cell (their cell has at least one epoch since its last start and not all),
the bench, at the same moment, `scontrol requeue`s the first of them (by node name) and kills the
node of the second (`SlurmBed.node_kill`: slurmd and every process on it die; slurmctld notices
after ~30 s and requeues what ran there). A requeued job waits ~11 s (its BeginTime) before it may
run again. After the run: from each cell's own trace.jsonl (the trainer appends a `start` line at
each start and an `epoch` line per epoch): how many cells completed training (reached their last
epoch) more than once, how many never did, and how many epochs were trained in all against the
sweep's total (the work redone). Expectation, checked and not assumed: ablate completes each cell
exactly once (a requeued job re-enters its claimed cell with resume=1, on the checkpoint); the
array re-runs a requeued task from epoch 0 (it completes twice only if it had finished already).
The trigger is met at slightly different times by the two ways (ablate runs each queue longest
first), so the time from the faults to the last result is reported beside the makespan. A note per
fault run gives its timeline from the traces: when the two cut cells started again and from which
epoch, the last result, the cells that first started only after the killed node's cell did (they
waited for the dead job to come back) and, for ablate, how many cells were stolen.

An ablate run that completes a cell twice, leaves one never completed, does not finish within
`--timeout`, or whose command fails, stops the bench: its events, queue logs, the trainer traces and
squeue are copied to a directory under /tmp (printed) and nothing is written.

Reported: the median of each figure over the repetitions, and ablate / array of the medians.
Prints the tables and writes them, with the machine, to docs/BENCHMARKS.md between the bench_slurm
markers (the rest of the file is kept).

    sudo python3 scripts/bench_slurm.py [--cells 24] [--reps 3] [--no-faults] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (it puts this checkout on sys.path)

from benchlib import REPO, ablate_version, measured_line, median, publish, ratio, write_project

from tests.helpers import fault_train
from tests.slurmbed import SlurmBed, missing_requirement

ABLATE = [sys.executable, "-m", "ablate"]
SLOTS = 3  # ablate's queues, the array's %3 throttle, the bed's nodes (one CPU each)
EPOCH_CHOICES = (3, 4, 5, 6)
TIME_LIMIT = "30:00"  # both ways' jobs (ablate: the profile's slurm.time)
WAYS = ("ablate", "array")


class Misbehaved(Exception):
    """ablate did something it must not (a duplicate run, a cell never finishing, a failed
    command): the bench stops and reports it."""


@dataclass
class Run:
    way: str
    faults: bool
    rep: int
    sweep: str
    makespan: float = float("nan")
    drained: float = float("nan")
    submit: float = float("nan")
    twice: int = 0  # cells whose training completed more than once
    never: int = 0  # cells whose training never completed
    epochs: int = 0  # epochs trained in all (every run of every cell)
    needed: int = 0  # the sweep's epochs
    cells: int = 0
    once: int = 0  # cells whose training completed exactly once
    restarts_scratch: int = 0  # starts of a cell beyond its first that began at epoch 0
    resumed: int = 0  # starts that continued from a checkpoint (resume=1, start_epoch >= 1)
    timed_out: bool = False
    requeued: str = ""  # what the bench requeued (job id, cell)
    killed: str = ""  # the node it killed (and the cell there)
    t0: float = 0.0  # this machine's clock at the first submit command
    t_fault: float = float("nan")  # seconds after t0 the faults were injected
    cut: tuple[str, str] = ("", "")  # the requeued job's cell, the killed node's cell
    steals: int | None = None  # ablate: steal events
    timeline: str = ""  # what happened after the faults, from the traces
    notes: list[str] = field(default_factory=list)


@dataclass
class Sweep:
    """The cells: name -> epochs, and each one's config (the same for both ways)."""
    cells: dict[str, int]
    step_time: float

    @staticmethod
    def draw(n: int, seed: int, step_time: float) -> Sweep:
        rng = random.Random(seed)
        return Sweep({f"c{i:02d}e{(e := rng.choice(EPOCH_CHOICES))}": e for i in range(n)}, step_time)

    def configs(self) -> dict[str, str]:
        """Each cell's config (name -> its text)."""
        return {c: yaml.safe_dump({"lr": 0.1, "hidden": 4, "seed": i, "step_time": self.step_time})
                for i, c in enumerate(self.cells)}

    def write_configs(self, base: Path) -> None:
        (base / "configs").mkdir(parents=True, exist_ok=True)
        for c, body in self.configs().items():
            (base / "configs" / f"{c}.yaml").write_text(body)

    @property
    def total_epochs(self) -> int:
        return sum(self.cells.values())


def trace(out_dir: Path) -> list[dict[str, Any]]:
    path = out_dir / "trace.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line cut by a killed node
            out.append(json.loads(line))
    return out


def completions(tr: list[dict[str, Any]], epochs: int) -> int:
    """Runs of the trainer that reached the cell's last epoch, by its own record."""
    return sum(1 for e in tr if e.get("ev") == "epoch" and e.get("epoch") == epochs)


def since_start(tr: list[dict[str, Any]]) -> int | None:
    """Epochs of the cell's current run (since its last start line), None before any start."""
    starts = [i for i, e in enumerate(tr) if e.get("ev") == "start"]
    if not starts:
        return None
    return max((e["epoch"] for e in tr[starts[-1]:] if e.get("ev") == "epoch"),
               default=tr[starts[-1]].get("start_epoch", 0))


def tally(run: Run, sweep: Sweep, out_of: dict[str, Path]) -> None:
    run.needed, run.cells = sweep.total_epochs, len(sweep.cells)
    for cell, epochs in sweep.cells.items():
        tr = trace(out_of[cell])
        done = completions(tr, epochs)
        run.once += done == 1
        run.twice += done > 1
        run.never += done == 0
        run.epochs += sum(1 for e in tr if e.get("ev") == "epoch")
        starts = [e for e in tr if e.get("ev") == "start"]
        run.restarts_scratch += sum(1 for e in starts[1:] if e.get("start_epoch", 0) == 0)
        run.resumed += sum(1 for e in starts if e.get("resume") == 1 and e.get("start_epoch", 0) >= 1)


def timeline(run: Run, sweep: Sweep, out_of: dict[str, Path], results: dict[str, Path]) -> None:
    """After the faults, from the traces (seconds after the first submit): when the two cut cells
    started again and from which epoch, the last result, and which cells started only once the
    killed node's cell had started again (they waited for it)."""
    if not run.requeued:
        return
    starts = {c: [(e["t"] - run.t0, e.get("start_epoch", 0)) for e in trace(out_of[c])
                  if e.get("ev") == "start"] for c in sweep.cells}
    again = {}
    for c in run.cut:
        later = [s for s in starts[c] if s[0] > run.t_fault]
        again[c] = f"{later[0][0]:.1f} s from epoch {later[0][1]}" if later else "never"
    done = {c: p.stat().st_mtime - run.t0 for c, p in results.items() if p.exists()}
    parts = [f"faults at {run.t_fault:.1f} s", f"the requeued job's cell {run.cut[0]} started again at "
             f"{again[run.cut[0]]}", f"the killed node's cell {run.cut[1]} at {again[run.cut[1]]}"]
    if done:
        last = max(done, key=lambda c: done[c])
        parts.append(f"last result {last} at {done[last]:.1f} s, its run started at "
                     f"{starts[last][-1][0]:.1f} s")
    back = [s[0] for s in starts[run.cut[1]] if s[0] > run.t_fault]
    if back:
        waited = sorted(c for c in sweep.cells
                        if c not in run.cut and starts[c] and starts[c][0][0] >= back[0])
        parts.append("cells first started after that: " + (", ".join(waited) if waited else "none"))
    if run.steals is not None:
        parts.append(f"steals: {run.steals}")
    run.timeline = "; ".join(parts)


class Bench:
    def __init__(self, sb: SlurmBed, tmp: Path, sweep: Sweep, timeout: float) -> None:
        self.sb, self.tmp, self.sweep, self.timeout = sb, tmp, sweep, timeout
        self.env = {**sb.env(), "NO_COLOR": "1",
                    "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.env.pop("PYTHONDONTWRITEBYTECODE", None)  # ablate's bytecode is used, as pip installs it
        self.array_script = ""
        self.out_dirs: dict[str, Path] = {}

    # ------------------------------------------------------------------ shared

    def jobs(self, name: str) -> list[dict[str, str]]:
        return [j for j in self.sb.squeue() if name in j.get("name", "")]

    def settle(self) -> None:
        """Every node back and idle, no job left: the next run starts on an empty cluster."""
        self.sb.heal()

    def cmd(self, argv: list[str], what: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout,
                           cwd=self.sb.shared_dir, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise Misbehaved(f"`{shlex.join(argv)}` ({what}) exited {p.returncode}:\n"
                             f"{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        return p

    def wait(self, run: Run, t0: float, done: Any, out_of: dict[str, Path], fault: Any) -> None:
        """Poll until `done()`; inject the faults once (fault run); fill in `drained`."""
        deadline = time.monotonic() + self.timeout
        injected = not run.faults
        while True:
            if not injected and self.mid_sweep(out_of):
                injected = fault()
            if done():
                run.drained = time.time() - t0
                return
            if time.monotonic() > deadline:
                run.timed_out = True
                run.drained = float("nan")
                return
            time.sleep(0.2)

    def mid_sweep(self, out_of: dict[str, Path]) -> bool:
        done = sum(completions(trace(out_of[c]), e) > 0 for c, e in self.sweep.cells.items())
        return done >= max(1, len(self.sweep.cells) // 4)

    def mid_cell(self, cell: str) -> bool:
        run = since_start(trace(self.out_dirs[cell]))
        return run is not None and 1 <= run < self.sweep.cells[cell]

    def strike(self, run: Run, running: list[tuple[str, str, str]]) -> bool:
        """Given (job id, node, cell) of the running jobs mid-cell, requeue the first and kill the
        second's node; False (not yet) while fewer than two are mid-cell."""
        running = sorted(running, key=lambda r: r[1])
        if len(running) < 2:
            return False
        (job, node, cell), (_, dead, dead_cell) = running[:2]
        self.sb.run("scontrol", "requeue", job)
        self.sb.node_kill(dead)
        run.t_fault = time.time() - run.t0
        run.cut = (cell, dead_cell)
        run.requeued = f"job {job} on {node} (cell {cell})"
        run.killed = f"{dead} (cell {dead_cell})"
        print(f"  faults: requeued {run.requeued}, killed {run.killed}", file=sys.stderr)
        return True

    # ------------------------------------------------------------------ ablate

    def run_ablate(self, rep: int, faults: bool) -> Run:
        name = f"ba{uuid.uuid4().hex[:6]}"
        run = Run("ablate", faults, rep, name)
        shared = self.sb.shared_dir
        work = shared / "work" / name
        work.mkdir(parents=True)
        shutil.copyfile(fault_train.__file__, work / "fault_train.py")
        scratch = shared / "scratch" / name
        by_epochs = sorted(set(self.sweep.cells.values()))
        proj = write_project(
            self.tmp / name, name, profile="cluster", profile_settings={
                "transport": "slurm", "shared_fs": str(shared / "fs"), "ckpt_root": str(scratch),
                "python": sys.executable, "slurm": {"time": TIME_LIMIT, "grace": 30}},
            configs=self.sweep.configs(), work=work,
            train=f"{sys.executable} fault_train.py --config {{cfg}} --epochs {{epochs}} "
                  "--out {ckpt_dir} --resume {resume} --name {name}",
            artifacts={"checkpoint": fault_train.CKPT, "metrics": "metrics.json",
                       "metrics_keys": ["val_loss"]},
            tasks={"t": {"epochs": max(by_epochs), "cost_per_epoch": self.sweep.step_time}},
            cells=[{"glob": f"configs/*e{e}.yaml", "task": "t", "epochs": e} for e in by_epochs],
            heartbeat_secs=1, hosts={"cluster": {"queues": SLOTS}})
        root = shared / "fs" / "ablate" / name
        self.out_dirs = {c: scratch / c for c in self.sweep.cells}
        manifests = [root / "final_ckpts" / c / "MANIFEST.json" for c in self.sweep.cells]

        def done() -> bool:
            return all(m.exists() for m in manifests) and not self.jobs(name)

        def fault() -> bool:
            running = []
            jobs = {j["name"]: j for j in self.jobs(name) if j["state"] == "RUNNING"}
            for hb in (root / "heartbeats").glob("cluster.*"):
                try:
                    data = json.loads(hb.read_text() or "{}")
                except ValueError:
                    continue
                cell = data.get("cell")
                job = next((j for n, j in jobs.items() if n.endswith(f"-{data.get('queue')}")), None)
                if data.get("state") == "running" and cell in self.sweep.cells and job \
                        and self.mid_cell(cell):
                    running.append((job["id"], job["nodes"], cell))
            return self.strike(run, running)

        t0 = run.t0 = time.time()
        try:
            self.cmd([*ABLATE, "-C", str(proj), "plan"], "plan")
            got = json.loads(self.cmd([*ABLATE, "-C", str(proj), "launch", "--all", "--json"],
                                      "launch").stdout)
            run.submit = time.time() - t0
            if {r.get("status") for r in got.get("launched", [])} != {"launched"}:
                raise Misbehaved(f"launch --all did not launch every queue: {got}")
        except Misbehaved as e:
            raise Misbehaved(f"{e}\n(events, queue logs and squeue kept in {self.keep(run, root, proj)})") \
                from None
        self.wait(run, t0, done, self.out_dirs, fault)
        if not run.timed_out:
            # Not the makespan `ablate report` computes from the events (ablate.report.timeline: the
            # first cell's start to the last `end`): the array writes no events, so both ways are
            # timed alike, from the first submit command to the last result written (the module
            # docstring), and the submit, the queueing and the publishing count.
            run.makespan = max(m.stat().st_mtime for m in manifests) - t0
        tally(run, self.sweep, self.out_dirs)
        run.steals = sum(f.read_text().count('"ev": "steal"') for f in (root / "events").glob("*.jsonl"))
        timeline(run, self.sweep, self.out_dirs, dict(zip(self.sweep.cells, manifests, strict=True)))
        bad = []
        if run.timed_out:
            bad.append(f"not done within {self.timeout:g}s")
        if run.twice or run.never:
            bad.append(f"{run.twice} cell(s) completed more than once, {run.never} never")
        if not bad:
            try:
                rec = json.loads(self.cmd([*ABLATE, "-C", str(proj), "reconcile", "--fs", "--json"],
                                          "reconcile").stdout)
            except Misbehaved as e:
                rec = {"failed": str(e)}
            if not (rec.get("complete") is True and rec.get("verified") == len(self.sweep.cells)):
                bad.append(f"reconcile --fs: {rec}")
        if bad:
            where = self.keep(run, root, proj)
            raise Misbehaved(f"ablate, rep {rep}, {'fault' if faults else 'clean'} run {name}: "
                             f"{'; '.join(bad)}; requeued {run.requeued or '-'}, killed "
                             f"{run.killed or '-'}; events, queue logs, traces and squeue kept in {where}")
        return run

    def keep(self, run: Run, root: Path, proj: Path) -> Path:
        """Copy what tells what happened out of the bed (which removes its dir on close)."""
        where = Path(tempfile.mkdtemp(prefix=f"bench_slurm-{run.sweep}-", dir="/tmp"))
        for sub in ("events", "slurm", "claims", "heartbeats", "queues"):
            if (root / sub).exists():
                shutil.copytree(root / sub, where / sub, dirs_exist_ok=True)
        for cell, d in self.out_dirs.items():
            if (d / "trace.jsonl").exists():
                (where / "traces").mkdir(exist_ok=True)
                shutil.copyfile(d / "trace.jsonl", where / "traces" / f"{cell}.jsonl")
        shutil.copytree(proj, where / "project", dirs_exist_ok=True)
        (where / "squeue.txt").write_text(self.sb.run("squeue", "-a", "-l", check=False).stdout)
        (where / "sinfo.txt").write_text(self.sb.run("sinfo", "-N", "-l", check=False).stdout)
        (where / "slurmctld.log").write_text(self.sb.log_tails())
        return where

    # ------------------------------------------------------------------ array

    def run_array(self, rep: int, faults: bool) -> Run:
        name = f"bj{uuid.uuid4().hex[:6]}"
        run = Run("array", faults, rep, name)
        work = self.sb.shared_dir / "array" / name
        work.mkdir(parents=True)
        shutil.copyfile(fault_train.__file__, work / "fault_train.py")
        self.sweep.write_configs(work)
        cells = list(self.sweep.cells)
        self.out_dirs = {c: work / "out" / c for c in cells}
        script = (
            "#!/bin/bash\n"
            f"#SBATCH --job-name={name}\n"
            f"#SBATCH --array=0-{len(cells) - 1}%{SLOTS}\n"
            "#SBATCH --requeue\n"
            f"#SBATCH --time={TIME_LIMIT}\n"
            f"#SBATCH --output={work}/logs/%A_%a.out\n"
            "#SBATCH --open-mode=append\n"
            f"cells=({' '.join(cells)})\n"
            f"epochs=({' '.join(str(e) for e in self.sweep.cells.values())})\n"
            "cell=${cells[$SLURM_ARRAY_TASK_ID]}\n"
            f"cd {shlex.quote(str(work))} || exit 1\n"
            f"exec {shlex.quote(sys.executable)} fault_train.py --config configs/$cell.yaml "
            "--epochs ${epochs[$SLURM_ARRAY_TASK_ID]} --out out/$cell --resume 0 --name $cell\n")
        self.array_script = script.replace(str(self.sb.shared_dir), "<shared>")  # for the docs
        (work / "logs").mkdir()
        (work / "array.sh").write_text(script)
        metrics = [d / "metrics.json" for d in self.out_dirs.values()]

        def done() -> bool:
            return not self.jobs(name)

        def fault() -> bool:
            running = []
            for j in self.jobs(name):
                if j["state"] != "RUNNING" or "_" not in j["id"]:
                    continue
                cell = cells[int(j["id"].rsplit("_", 1)[1])]
                if self.mid_cell(cell):
                    running.append((j["id"], j["nodes"], cell))
            return self.strike(run, running)

        t0 = run.t0 = time.time()
        self.cmd(["sbatch", "--parsable", str(work / "array.sh")], "sbatch")
        run.submit = time.time() - t0
        self.wait(run, t0, done, self.out_dirs, fault)
        if not run.timed_out and all(m.exists() for m in metrics):
            run.makespan = max(m.stat().st_mtime for m in metrics) - t0
        tally(run, self.sweep, self.out_dirs)
        timeline(run, self.sweep, self.out_dirs, dict(zip(cells, metrics, strict=True)))
        return run

    def one(self, way: str, rep: int, faults: bool) -> Run:
        run = (self.run_ablate if way == "ablate" else self.run_array)(rep, faults)
        print(f"rep {rep} {way} {'faults' if faults else 'clean'}: makespan {run.makespan:.1f}s, "
              f"drained {run.drained:.1f}s, submit {run.submit:.2f}s, completed twice {run.twice}, "
              f"never {run.never}, epochs {run.epochs}/{run.needed}, scratch restarts "
              f"{run.restarts_scratch}, resumed {run.resumed}" + (f"; {run.timeline}" if run.timeline else "")
              + (" (TIMED OUT)" if run.timed_out else ""), file=sys.stderr)
        self.settle()
        return run


# ---------------------------------------------------------------------- report

def _f(x: float, nd: int = 1) -> str:
    return "-" if x != x else f"{x:.{nd}f}"


def _ratio(a: float, b: float) -> str:
    x = ratio(a, b)
    return "-" if x != x else f"{x:.2f}x"


def _each(runs: list[Run], key: str, nd: int = 1) -> str:
    return ", ".join(_f(getattr(r, key), nd) if isinstance(getattr(r, key), float) else str(getattr(r, key))
                     for r in runs)


def tables(runs: list[Run], faults: bool) -> list[str]:
    def sel(way: str, f: bool) -> list[Run]:
        return [r for r in runs if r.way == way and r.faults == f]

    out = ["| run | way | makespan (s, median) | each repetition | drained (s, median) | submit (s, median) "
           "| ablate / array (makespan) | cells completed exactly once (each rep) |",
           "|:--|:--|--:|--:|--:|--:|--:|--:|"]
    for f in ((False, True) if faults else (False,)):
        a, b = sel("ablate", f), sel("array", f)
        ma, mb = median([r.makespan for r in a]), median([r.makespan for r in b])
        kind = "faults" if f else "clean"
        for way, rs, m in (("ablate", a, ma), ("array", b, mb)):
            out.append(f"| {kind} | {way} | **{_f(m)}** | {_each(rs, 'makespan')} | "
                       f"{_f(median([r.drained for r in rs]))} | {_f(median([r.submit for r in rs]), 2)} | "
                       f"{_ratio(ma, mb) if way == 'ablate' else '1.00x'} | "
                       + ", ".join(f"{r.once}/{r.cells}" for r in rs) + " |")
    if not faults:
        return out
    out += ["", "| fault run | way | faults at (s, median) | faults to last result (s, median) "
            "| ablate / array | cells completed > once (each rep) | cells never completed (each rep) "
            "| epochs trained / needed (median) | restarts from epoch 0 (each rep) "
            "| resumed from a checkpoint (each rep) |",
            "|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|"]
    after = {way: median([r.makespan - r.t_fault for r in sel(way, True)]) for way in WAYS}
    for way in WAYS:
        rs = sel(way, True)
        out.append(f"| faults | {way} | {_f(median([r.t_fault for r in rs]))} | **{_f(after[way])}** | "
                   f"{_ratio(after['ablate'], after['array']) if way == 'ablate' else '1.00x'} | "
                   f"{_each(rs, 'twice')} | {_each(rs, 'never')} | "
                   f"{median([r.epochs for r in rs]):g} / {rs[0].needed if rs else 0} | "
                   f"{_each(rs, 'restarts_scratch')} | {_each(rs, 'resumed')} |")
    return out


def notes(runs: list[Run], faults: bool) -> list[str]:
    out = []
    for r in runs:
        if r.faults:
            out.append(f"- rep {r.rep}, {r.way}: requeued {r.requeued or '(no fault injected)'}; killed "
                       f"{r.killed or '-'}; makespan {_f(r.makespan)} s, epochs {r.epochs}/{r.needed}"
                       + (", TIMED OUT" if r.timed_out else "") + (f"; {r.timeline}" if r.timeline else "")
                       + ".")
    timed = [r for r in runs if r.timed_out]
    if timed:
        out.append(f"- {len(timed)} run(s) did not finish within the time-out: "
                   + ", ".join(f"rep {r.rep} {r.way} {'faults' if r.faults else 'clean'}" for r in timed))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=24, help="cells in the sweep (default 24)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (default 3); medians reported")
    ap.add_argument("--step-time", type=float, default=0.6,
                    help="seconds of sleep per epoch in the trainer (default 0.6)")
    ap.add_argument("--seed", type=int, default=7, help="seed of the cells' epochs draw (default 7)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take (default 300)")
    ap.add_argument("--no-faults", action="store_true", help="clean runs only")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/BENCHMARKS.md alone")
    args = ap.parse_args(argv)
    reason = missing_requirement()
    if reason:
        print(f"bench_slurm: {reason}", file=sys.stderr)
        return 2
    sweep = Sweep.draw(max(2, args.cells), args.seed, args.step_time)
    reps = max(1, args.reps)
    faults = not args.no_faults
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "ablate")], check=True)
    runs: list[Run] = []
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ablate-bench-slurm-") as tmp, SlurmBed(3) as sb:
        bench = Bench(sb, Path(tmp), sweep, args.timeout)
        try:
            for rep in range(1, reps + 1):
                order = WAYS if rep % 2 else WAYS[::-1]
                for f in ((False, True) if faults else (False,)):
                    for way in order:
                        runs.append(bench.one(way, rep, f))
        except Misbehaved as e:
            print(f"bench_slurm: STOPPED: {e}", file=sys.stderr)
            return 1
        script = bench.array_script
    took = time.monotonic() - t_start
    cmd = "sudo python3 scripts/bench_slurm.py" + ("" if args.cells == 24 else f" --cells {args.cells}") \
        + ("" if reps == 3 else f" --reps {reps}") + (" --no-faults" if not faults else "") \
        + ("" if args.step_time == 0.6 else f" --step-time {args.step_time:g}") \
        + ("" if args.seed == 7 else f" --seed {args.seed}")
    counts = {e: list(sweep.cells.values()).count(e) for e in EPOCH_CHOICES}
    version = ablate_version(("ablate", "wrappers"))
    lines = ["## A sweep on a real Slurm cluster: ablate against a hand-written job array", "",
             measured_line(cmd) + f" ablate at {version}; {took / 60:.1f} min in all.", "",
             f"One Slurm bed (tests/slurmbed.py: slurmctld and 3 slurmd nodes of one CPU each in "
             f"namespaces on this machine, one shared directory). {len(sweep.cells)} cells of the real "
             f"small trainer (tests/helpers/fault_train.py, a safetensors checkpoint per epoch, "
             f"{args.step_time:g} s of sleep per epoch), epochs drawn once with seed {args.seed}: "
             + ", ".join(f"{n} x {e}" for e, n in counts.items() if n)
             + f" ({sweep.total_epochs} epochs). **ablate**: `ablate plan` + `ablate launch --all` of "
             f"a project with `transport: slurm` and host `cluster: {{queues: {SLOTS}}}` ({SLOTS} "
             f"batch jobs running run_queue; each cell claimed, published with MANIFEST.json). "
             f"**array**: one `sbatch --array=0-{len(sweep.cells) - 1}%{SLOTS} --requeue` script "
             "running the trainer per task, `--resume 0` (below). Makespan: first submit command to "
             "the last result written (ablate: MANIFEST.json; array: metrics.json); drained: until "
             "squeue lists none of the run's jobs; submit: the submit commands' own time. "
             f"Median of {reps} repetition(s), both ways in each, their order alternating."
             + (" Fault runs: once a quarter of the cells have completed and two jobs are mid-cell, "
                "one is `scontrol requeue`d and the other's node killed (slurmctld notices after "
                "~30 s and requeues its job; a requeued job waits ~11 s before it may start "
                "again); counts from each cell's own trace.jsonl; \"faults to last result\" is the "
                "makespan less the moment of the faults (the two ways meet the trigger at slightly "
                "different times); each fault run's timeline, from the traces, in the notes."
                if faults else ""), "",
             *tables(runs, faults), "", *notes(runs, faults), "",
             "The array script (task i trains cell i; `<shared>` is the bed's shared directory):", "",
             "```bash", *script.rstrip("\n").splitlines(),
             "```", ""]
    publish("bench_slurm", lines, not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
