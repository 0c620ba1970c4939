#!/usr/bin/env python3
"""Real makespan on the test bed: a noisy sweep planned by `ablate plan`, launched with
`ablate launch --all`, with and without work stealing, side by side (needs root).

One test bed (tests/testbed.py: 3 instances, each a real sshd + tmux in its own namespaces, one
shared directory). Each host gets an emulated speed (declared in ablate.yaml as `speed:` too).
Every cell declares its cost (a `costs:` entry per config: seconds of work at speed 1.0, so the
declared estimates are also the expected seconds) from a bimodal mix (30 % large U(4, 8), else
U(0.8, 1.6), times --scale); its trainer (a small script in the shared workdir) sleeps
cost * exp(sigma * Z) / speed-of-this-host seconds, Z ~ N(0, 1) drawn per cell with a fixed seed,
then writes a real safetensors checkpoint, which the wrappers sync and publish as usual.

For each policy (stealing on, `steal: true`; stealing off, `steal: false`) a fresh sweep with the
same cells and the same draws is planned (`ablate.plan.planner.plan`), launched
(`ablate.run.launch.launch_all`) and waited for until every queue has ended. From the `end`
events actually written:
    work of a cell  = dur * speed of the host that ran it
    lower bound     = max(sum(work) / sum(speeds), max(work) / max(speeds))
    makespan        = last `end` - first `queue_start`
(the last `end` and the lower bound as `ablate report` computes them: ablate.report.timeline, over
the hosts that ran a queue)
so the wrappers' per-cell overhead and the launch fan-out (the spread of the `queue_start`s, shown)
count against the policy; "plan's own ratio" is the plan's makespan / lower bound on the declared
costs, before any noise.

    sudo python3 scripts/bench_testbed.py [--cells 30] [--scale 1] [--sigma 0.3] [--seed 4]
                                          [--speeds 0.6,1.0,1.4] [--reps 1] [--no-write]

`--peer parallel` (issue 13) measures ablate against GNU parallel's pull queue instead, in a world
whose declared figures are wrong; its own section of docs/BENCHMARKS.md (`bench_testbed_peer`):
    hosts         declared speeds --speeds (default 1.0,0.6,1.4); the true emulated speed of each
                  is declared x U(--misspeed, default 0.6,1.6), drawn per repetition
    tasks         a, b, c with `cost_per_epoch` 1, 1.5, 2.5 (arbitrary units); the true seconds per
                  unit of each task on a speed-1 host = base x a factor log-uniform on [1/2, 2], base
                  = --train / the mean declared units of the drawn cells
    cells         --cells (default 24) of a uniform task and epochs 1-4 (declared cost = cost_per_epoch
                  x epochs), noise z ~ N(0, 1) each
    trainer       a real small PyTorch trainer (TRAINER below): `import torch`, a small model, 5 SGD
                  steps (by hand; with --torch-optim through torch.optim, whose first use imports
                  torch._dynamo: ~1.1 s more CPU per start), the real start-up, scaled by no speed;
                  then it sleeps units x task scale x exp(sigma z) / true speed of its host in
                  `epochs` parts and `torch.save`s a real checkpoint; each invocation appends
                  `<cell> <host>` to runs.log, and its start, end of start-up and end to times.log
    ablate        `ablate.plan.planner.plan` + `ablate.run.launch.launch_all`, `steal: true`, hosts
                  declared with the wrong speeds; makespan = last `end` - first `queue_start`; wall =
                  just before launch_all to the moment the poll (every 50 ms) sees the last cell's
                  final_ckpts/<cell>/MANIFEST.json (published)
    parallel      `parallel --sshlogin 1/h1,1/h2,1/h3 --ssh 'ssh -F <bed config>' --joblog`, fed the
                  same cells longest declared first, each job: the trainer on that host into its local
                  disk, then cp to the shared dir + rename (published); makespan = last job end - first
                  job start (joblog); wall = the parallel command's own
Both run the same cells, noise and speeds in each repetition, one after the other, their order
alternating; a repetition fails unless every cell ran exactly once on each side (runs.log). The
notes say where each side's time went (times.log); --keep DIR keeps the events, queues, joblogs and
trainer logs of every run for a closer look.

    sudo python3 scripts/bench_testbed.py --peer parallel [--cells 24] [--sigma 0.4] [--train 2.5]
                                          [--speeds 1.0,0.6,1.4] [--misspeed 0.6,1.6] [--reps 5]
                                          [--torch-optim] [--keep DIR] [--no-write]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (it puts this checkout on sys.path)

from benchlib import (
    ablate_version,
    measured_line,
    median,
    publish,
    read_events,
    timeline,
    wait_until,
    write_project,
)

from ablate.config.project import load_project
from ablate.plan.planner import plan
from ablate.run.launch import launch_all
from ablate.transport import close_all
from tests.testbed import Testbed, missing_requirement

EMU = '''"""Emulated training: sleep cost * exp(sigma * z) / speed of this host, write a real checkpoint."""
import json, math, os, socket, sys, time
cfg_path, out = sys.argv[1], sys.argv[2]
with open(cfg_path) as f:
    cfg = json.load(f)  # JSON is YAML too
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "speeds.json")) as f:
    speed = json.load(f)[socket.gethostname()]
time.sleep(cfg["cost"] * math.exp(cfg["sigma"] * cfg["z"]) / speed)
import numpy as np
from safetensors.numpy import save_file
os.makedirs(out, exist_ok=True)
save_file({"w": np.full(256, cfg["seed"], dtype=np.float32)}, os.path.join(out, "model.safetensors"))
'''


@dataclass(frozen=True)
class CellSpec:
    name: str
    cost: float  # seconds of work at speed 1.0 (declared)
    z: float  # the noise draw


def cell_specs(n: int, scale: float, seed: int) -> list[CellSpec]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        cost = rng.uniform(4.0, 8.0) if rng.random() < 0.3 else rng.uniform(0.8, 1.6)
        out.append(CellSpec(f"c{i:03d}", round(cost * scale, 3), rng.gauss(0.0, 1.0)))
    return out


def make_project(tb: Testbed, base: Path, sweep: str, cells: list[CellSpec], speeds: dict[str, float],
                 sigma: float, steal: bool) -> Path:
    work = tb.shared_dir / "bench" / sweep  # the instances see it at shared_path/bench/<sweep>
    work.mkdir(parents=True)
    (work / "emu.py").write_text(EMU)
    (work / "speeds.json").write_text(json.dumps({tb.hostname(h): s for h, s in speeds.items()}))
    ssh_config = tb.write_ssh_config(base / f"{sweep}.ssh_config", extra="\nHost *\n  ConnectTimeout 5\n")
    return write_project(
        base / sweep, sweep, profile="tb", profile_settings={
            "transport": "ssh", "shared_fs": tb.shared_path, "ckpt_root": f"{tb.local_path}/ckpt/{sweep}"},
        configs={c.name: json.dumps({"cost": c.cost, "z": c.z, "sigma": sigma, "seed": i}) + "\n"
                 for i, c in enumerate(cells)},
        work=work, workdir=f"{tb.shared_path}/bench/{sweep}",
        train=f"{sys.executable} emu.py {{cfg}} {{ckpt_dir}}", artifacts={"checkpoint": "model.safetensors"},
        tasks={"t": {"epochs": 1, "cost_per_epoch": 1.0}}, cells=[{"glob": "configs/*.yaml", "task": "t"}],
        costs=[{"glob": f"configs/{c.name}.yaml", "cost": c.cost} for c in cells],
        heartbeat_secs=1, steal=steal, ssh_config=str(ssh_config),
        hosts={h: {"speed": s} for h, s in speeds.items()})


def ended_queues(root: Path) -> set[str]:
    return {e["queue"] for e in read_events(root) if e["ev"] in ("queue_end", "queue_stop")}


def spans(root: Path, speeds: dict[str, float]) -> tuple[float, float, float]:
    """(makespan, lower bound, launch spread) of an ended sweep. The last cell's end and the lower
    bound are what `ablate report` computes (benchlib.timeline: `ablate.report.timeline` over the
    events; the bound `ablate.plan.balance.lower_bound` of each cell's `dur` x its host's speed, over
    the hosts that ran a queue, said on stderr when one did not). The makespan counts from the first
    `queue_start` rather than the timeline's first cell start, so the launch fan-out and each
    runner's start-up count against the policy; the spread is from the first `queue_start` to the
    last."""
    tl = timeline(root, speeds)
    idle = sorted(set(speeds) - {lane.host for lane in tl.lanes})
    if idle:
        print(f"bench_testbed: {root.name}: {', '.join(idle)} ran no queue; the lower bound is over the "
              "other hosts' speeds", file=sys.stderr)
    starts = [e["t"] for e in read_events(root) if e["ev"] == "queue_start"]
    bound = tl.lower_bound if tl.lower_bound is not None else float("nan")
    return tl.t0 + tl.makespan - min(starts), bound, max(starts) - min(starts)


@dataclass
class Run:
    makespan: float
    lower_bound: float
    steals: int
    spread: float  # last queue_start - first queue_start: the launch fan-out
    planned_ratio: float  # the plan's own makespan / lower bound, on the declared costs

    @property
    def ratio(self) -> float:
        return self.makespan / self.lower_bound


def run_sweep(tb: Testbed, base: Path, sweep: str, cells: list[CellSpec], speeds: dict[str, float],
              sigma: float, steal: bool) -> Run:
    proj = make_project(tb, base, sweep, cells, speeds, sigma, steal)
    project = load_project(proj)
    planned = plan(project)
    queues = {q.queue for q in planned.queues if q.cells}
    close_all()
    results = launch_all(project)
    bad = [r for r in results if getattr(r, "status", "") != "launched" and r.queue in queues]
    if bad:
        raise SystemExit(f"bench_testbed: launch --all failed: {bad}")
    close_all()
    root = tb.shared_dir / "ablate" / sweep
    expected = sum(c.cost * math.exp(sigma * c.z) for c in cells) / sum(speeds.values())
    if not wait_until(lambda: queues <= ended_queues(root), 120 + 10 * expected, every=0.2):
        raise SystemExit(f"bench_testbed: {sweep}: queues {sorted(queues - ended_queues(root))} did not "
                         "end in time")
    evs = read_events(root)
    ends = [e for e in evs if e["ev"] == "end"]
    failed = [e for e in ends if e["rc"] != 0]
    names = {e["cell"] for e in ends if e["rc"] == 0}
    if failed or names != {c.name for c in cells} or len(ends) != len(cells):
        raise SystemExit(f"bench_testbed: {sweep}: every cell must run once with rc 0; got "
                         f"{len(ends)} ends, {len(failed)} failed, {len(names)} distinct")
    makespan, bound, spread = spans(root, speeds)
    steals = sum(1 for e in evs if e["ev"] == "steal")
    return Run(makespan, bound, steals, spread, planned.makespan / planned.lower_bound)


def table(runs: dict[str, list[Run]]) -> list[str]:
    def each(xs: list[float], fmt: str) -> str:
        return ", ".join(format(x, fmt) for x in xs)

    out = ["| policy | makespan / lower bound (median) | each repetition | makespan (s) | lower bound (s) "
           "| steals | launch spread (s) | plan's own ratio |", "|:--|--:|--:|--:|--:|--:|--:|--:|"]
    for name, rs in runs.items():
        ratios = [r.ratio for r in rs]
        out.append(f"| {name} | **{median(ratios):.3f}** | {each(ratios, '.3f')} "
                   f"| {each([r.makespan for r in rs], '.1f')} | {each([r.lower_bound for r in rs], '.1f')} "
                   f"| {each([r.steals for r in rs], 'd')} | {each([r.spread for r in rs], '.1f')} "
                   f"| {each([r.planned_ratio for r in rs], '.3f')} |")
    return out


# ---------------------------------------------------------------------------------------------------
# --peer parallel: ablate against GNU parallel's pull queue, the declared figures wrong (issue 13)

TASK_UNITS = {"a": 1.0, "b": 1.5, "c": 2.5}  # declared cost_per_epoch (arbitrary units)
EPOCHS = (1, 2, 3, 4)
POLL = 0.05  # seconds between two looks for published results
LIGHT = (" `--light`: the benchmark is Python's start-up and the timed work, without `import torch`. On "
         "these cells of seconds a benchmark that imports torch costs about a small cell (its own section), "
         "where a real GPU benchmark of a few seconds is about 1 % of cells of minutes.")

TRAINER = '''"""Bench trainer: the real PyTorch start-up, emulated training time, a real checkpoint."""
import time
t_start = time.time()
import json, math, os, socket, sys
here = os.path.dirname(os.path.abspath(__file__))
host = socket.gethostname()
if sys.argv[1] == "--calibrate":  # `calibrate:`: the start-up, then SECONDS of work at speed 1 timed
    if sys.argv[3:] != ["--light"]:  # --light: Python's start-up only, no `import torch`
        import torch
        torch.set_num_threads(1)
        torch.nn.functional.relu(torch.randn(256, 32)).sum()
    with open(os.path.join(here, "speeds.json")) as f:
        speed = json.load(f)[host]
    t = time.time()
    time.sleep(float(sys.argv[2]) / speed)
    print(f"{time.time() - t:.6f}")  # the timed part's seconds, without the start-up
    sys.exit(0)
cfg_path, out = sys.argv[1], sys.argv[2]
with open(cfg_path) as f:
    cfg = json.load(f)  # JSON is YAML too
with open(os.path.join(here, "runs.log"), "a") as f:  # one line per invocation: exactly once?
    f.write(f"{cfg['name']} {host} {t_start:.3f}\\n")
import torch
torch.set_num_threads(1)
torch.manual_seed(cfg["seed"])
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
x, y = torch.randn(256, 32), torch.randint(0, 4, (256,))
opt = torch.optim.SGD(model.parameters(), lr=0.1) if cfg["torch_optim"] else None
for _ in range(5):
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    if opt is not None:
        opt.step()
    else:  # the same SGD step by hand: torch.optim's first use imports torch._dynamo (~1.1 s of CPU)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-0.1)
t_ready = time.time()
with open(os.path.join(here, "speeds.json")) as f:
    speed = json.load(f)[host]
per_epoch = cfg["units"] * cfg["scale"] * math.exp(cfg["sigma"] * cfg["z"]) / speed / cfg["epochs"]
for e in range(cfg["epochs"]):
    time.sleep(per_epoch)
    print(f"epoch {e + 1}/{cfg['epochs']} loss={loss.item():.4f}", flush=True)
os.makedirs(out, exist_ok=True)
torch.save({"model": model.state_dict(), "epochs": cfg["epochs"]}, os.path.join(out, "model.pt"))
with open(os.path.join(here, "times.log"), "a") as f:  # start, start-up done, checkpoint saved
    f.write(f"{cfg['name']} {host} {t_start:.3f} {t_ready:.3f} {time.time():.3f}\\n")
'''


@dataclass(frozen=True)
class PeerCell:
    name: str
    task: str
    epochs: int
    z: float

    @property
    def units(self) -> float:  # the declared cost: cost_per_epoch x epochs
        return TASK_UNITS[self.task] * self.epochs


@dataclass(frozen=True)
class World:
    """One repetition's draws: what the hosts and tasks really are, and the cells."""
    declared: dict[str, float]  # host -> declared speed (ablate.yaml)
    true: dict[str, float]  # host -> emulated speed
    scale: dict[str, float]  # task -> true seconds per declared unit on a speed-1 host
    cells: tuple[PeerCell, ...]
    sigma: float
    torch_optim: bool  # the trainer's steps through torch.optim (else the same SGD step by hand)

    def train_seconds(self, cell: PeerCell, host: str) -> float:
        return cell.units * self.scale[cell.task] * math.exp(self.sigma * cell.z) / self.true[host]


def draw_world(declared: dict[str, float], n: int, train: float, sigma: float, seed: int,
               misspeed: tuple[float, float], torch_optim: bool, task_spread: float = 2.0) -> World:
    rng = random.Random(seed)
    true = {h: round(s * rng.uniform(*misspeed), 3) for h, s in declared.items()}
    cells = []
    for i in range(n):
        task, epochs = rng.choice(sorted(TASK_UNITS)), rng.choice(EPOCHS)
        cells.append(PeerCell(f"c{i:02d}-{task}-e{epochs}", task, epochs, rng.gauss(0.0, 1.0)))
    base = train / statistics.fmean(c.units for c in cells)
    spread = math.log(task_spread)
    scale = {t: round(base * math.exp(rng.uniform(-spread, spread)), 4) for t in sorted(TASK_UNITS)}
    return World(dict(declared), true, scale, tuple(cells), sigma, torch_optim)


def peer_workdir(tb: Testbed, name: str, world: World) -> Path:
    """The trainer, its configs and the true speeds in the shared dir (shared_path/bench/<name>)."""
    work = tb.shared_dir / "bench" / name
    (work / "configs").mkdir(parents=True)
    (work / "train.py").write_text(TRAINER)
    (work / "speeds.json").write_text(json.dumps({tb.hostname(h): s for h, s in world.true.items()}))
    for i, c in enumerate(world.cells):
        body = {"name": c.name, "epochs": c.epochs, "units": c.units, "scale": world.scale[c.task],
                "z": c.z, "sigma": world.sigma, "seed": i, "torch_optim": world.torch_optim}
        (work / "configs" / f"{c.name}.yaml").write_text(json.dumps(body) + "\n")
    return work


Trace = tuple[str, float, float, float]  # host, trainer start, its start-up done, checkpoint saved


def trainer_runs(work: Path, world: World, way: str, t0: float) -> dict[str, Trace]:
    """cell -> what its one trainer run did (seconds from t0), from the trainer's own runs.log and
    times.log; fails loudly unless every cell ran exactly once."""
    runs = [line.split() for line in (work / "runs.log").read_text().splitlines() if line.strip()]
    counts = Counter(r[0] for r in runs)
    wrong = {c.name: counts.get(c.name, 0) for c in world.cells if counts.get(c.name, 0) != 1}
    strays = sorted(set(counts) - {c.name for c in world.cells})
    if wrong or strays:
        raise SystemExit(f"bench_testbed: {way}: every cell must run exactly once; runs per cell "
                         f"{wrong}, unknown {strays} (runs.log in {work})")
    done = [line.split() for line in (work / "times.log").read_text().splitlines() if line.strip()]
    return {d[0]: (d[1], float(d[2]) - t0, float(d[3]) - t0, float(d[4]) - t0) for d in done}


def busy_cpu() -> float:
    """CPU seconds this machine has spent so far outside idle and niced work (/proc/stat)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (f[0] + f[2] + f[5] + f[6]) / os.sysconf("SC_CLK_TCK")  # user, system, irq, softirq


@dataclass
class Side:
    way: str  # ablate | parallel
    makespan: float  # ablate: first queue_start to last end; parallel: first job start to last job end
    wall: float  # ablate: launch_all to the last published result; parallel: its command
    launch: float  # ablate: launch_all's own time; parallel: its start to the first job's start
    runs: dict[str, Trace]  # cell -> its trainer run, seconds from the side's t0
    cpu: float  # busy CPU seconds of the machine during the side (every process, not niced)
    steals: list[str] = field(default_factory=list)  # one line per steal
    learned: str = ""  # the learned figures at the end, against the truth
    calibrated: str = ""  # ablate with `calibrate:`: each queue's measurement, and whether it was kept


def run_ablate_peer(tb: Testbed, base: Path, name: str, world: World, timeout: float,
                    dest: Path | None, calibrate: float = 0.0, measured_before: bool = False,
                    kept: bool | None = None, light: bool = False) -> Side:
    """ablate's side; with `kept` (`calibrate:` on), every queue's measurement must have been kept
    from an earlier sweep (True) or measured by this one (False)."""
    work = peer_workdir(tb, name, world)
    proj = base / name
    shutil.copytree(work / "configs", proj / "configs")
    ssh_config = tb.write_ssh_config(base / f"{name}.ssh_config", extra="\nHost *\n  ConnectTimeout 5\n")
    kinds = sorted({(c.task, c.epochs) for c in world.cells})
    write_project(
        proj, name, profile="tb", profile_settings={
            "transport": "ssh", "shared_fs": tb.shared_path, "ckpt_root": f"{tb.local_path}/ckpt/{name}",
            "python": sys.executable},
        workdir=f"{tb.shared_path}/bench/{name}", train=f"{sys.executable} train.py {{cfg}} {{ckpt_dir}}",
        artifacts={"checkpoint": "model.pt"},
        tasks={t: {"epochs": 1, "cost_per_epoch": u} for t, u in TASK_UNITS.items()},
        cells=[{"glob": f"configs/*-{t}-e{e}.yaml", "task": t, "epochs": e} for t, e in kinds],
        steal=True, ssh_config=str(ssh_config),
        **({"calibrate": f"{sys.executable} train.py --calibrate {calibrate:g}{' --light' if light else ''}"}
           if calibrate else {}),
        hosts={h: {"speed": s} for h, s in world.declared.items()})
    project = load_project(proj)
    planned = plan(project)
    queues = {q.queue for q in planned.queues if q.cells}
    root = tb.shared_dir / "ablate" / name
    if calibrate and measured_before:  # as a relaunch finds them: what each host's benchmark measured
        (root / "calib").mkdir(parents=True)
        for h, v in world.true.items():
            (root / "calib" / f"{h}.-").write_text(f"{round(calibrate * 1000 / v)}\n")
    waiting = {c.name: root / "final_ckpts" / c.name / "MANIFEST.json" for c in world.cells}

    def published() -> bool:
        for c in [c for c, m in waiting.items() if m.exists()]:
            del waiting[c]
        return not waiting

    cpu0, t0, t0_wall = busy_cpu(), time.monotonic(), time.time()
    results = launch_all(project)
    launch = time.monotonic() - t0
    bad = [r for r in results if r.status != "launched" and r.queue in queues]
    if bad:
        raise SystemExit(f"bench_testbed: {name}: launch --all failed: {bad}")
    if not wait_until(published, t0 + timeout - time.monotonic(), every=POLL):
        raise SystemExit(f"bench_testbed: {name}: {sorted(waiting)} not published in {timeout:g}s")
    wall, cpu = time.monotonic() - t0, busy_cpu() - cpu0
    if not wait_until(lambda: queues <= ended_queues(root), t0 + timeout - time.monotonic(), every=0.2):
        raise SystemExit(f"bench_testbed: {name}: queues did not end in {timeout:g}s")
    close_all()
    keep(dest, name, [p for p in root.iterdir() if p.name != "final_ckpts"]
         + [work / "runs.log", work / "times.log"]
         + [f for f in (root / "final_ckpts").glob("*/*") if f.suffix in (".json", ".log")], root)
    evs = read_events(root)
    ends = [e for e in evs if e["ev"] == "end"]
    if sorted(e["cell"] for e in ends if e["rc"] == 0) != sorted(c.name for c in world.cells):
        raise SystemExit(f"bench_testbed: {name}: every cell must end once with rc 0; ends: "
                         f"{[(e['cell'], e['rc']) for e in ends]}")
    runs = trainer_runs(work, world, f"ablate {name}", t0_wall)
    makespan, _, _ = spans(root, world.declared)
    steals = [f"{e['t'] - t0_wall:.1f} s {e['host']} took {e['cell']} from {e['from_host']} (est "
              f"{e['est']:.1f} s, by {e.get('by', '?')})"
              for e in sorted((e for e in evs if e["ev"] == "steal"), key=lambda e: e["t"])]
    calib = sorted((e for e in evs if e["ev"] == "calibrate"), key=lambda e: e["host"])
    if kept is not None and (len(calib) != len(queues) or any(e.get("kept", False) != kept for e in calib)):
        raise SystemExit(f"bench_testbed: {name}: every queue's measurement must be "
                         f"{'kept from the sweep before' if kept else 'made by this sweep'}; calibrate "
                         f"events {calib}")
    calibrated = ", ".join(f"{e['host']} {e.get('secs', 'failed')} s{' (kept)' if e.get('kept') else ''}"
                           for e in calib)
    return Side("ablate", makespan, wall, launch, runs, cpu, steals,
                learned_figures(world, ends), calibrated)


def learned_figures(world: World, ends: list[dict[str, Any]]) -> str:
    """What this sweep's learning (ablate.remote.queue.learn) makes of all its ended cells: per host the
    learned speed / the true one on the same scale (the median of true / declared pinned to 1, as
    learn pins its own) and the learned fixed seconds per cell."""
    try:
        from ablate.remote.queue.learn import learn_rates

        cells = {c.name: c for c in world.cells}
        rates = learn_rates([(e["host"], cells[e["cell"]].task, cells[e["cell"]].units, e["dur"])
                             for e in ends], world.declared)
        k = statistics.median(world.true[h] / world.declared[h] for h in world.declared)
        return ", ".join(f"{h} {rates.speed.get(h, float('nan')):.2f}/{world.true[h] / k:.2f} "
                         f"+{rates.overhead.get(h, float('nan')):.1f} s" for h in world.declared)
    except Exception as e:  # the learning code is being worked on: the figures are a note only
        return f"(not available: {type(e).__name__}: {e})"


def run_parallel_peer(tb: Testbed, base: Path, name: str, world: World, timeout: float,
                      dest: Path | None, share: bool = False) -> Side:
    work = peer_workdir(tb, name, world)
    local, shared = f"{tb.local_path}/peer/{name}", f"{tb.shared_path}/bench/{name}"
    order = sorted(world.cells, key=lambda c: (-c.units, c.name))  # longest declared first
    jobs = "".join(f"cd {shared} && {sys.executable} train.py configs/{c.name}.yaml {local}/{c.name} "
                   f"&& mkdir -p out && cp -r {local}/{c.name} out/.{c.name}.part "
                   f"&& mv out/.{c.name}.part out/{c.name}\n" for c in order)
    joblog = base / f"{name}.joblog"
    argv = ["parallel", "--will-cite", "--sshlogin", ",".join(f"1/{h}" for h in tb.hosts),
            "--ssh", f"ssh -F {tb.ssh_config}", "--joblog", str(joblog), *(["-M"] if share else [])]
    cpu0, t0, t0_wall = busy_cpu(), time.monotonic(), time.time()
    p = subprocess.run(argv, input=jobs, capture_output=True, text=True, timeout=timeout)
    wall, cpu = time.monotonic() - t0, busy_cpu() - cpu0
    (base / f"{name}.out").write_text(p.stdout + p.stderr)
    keep(dest, name, [joblog, base / f"{name}.out", work / "runs.log", work / "times.log"])
    # One row per job of ours (with -M, parallel may log more: only rows running the trainer count).
    rows = [r for r in (line.split("\t") for line in joblog.read_text().splitlines()[1:] if line.strip())
            if len(r) >= 9 and "train.py" in r[8]]
    failed = [r for r in rows if r[6] != "0" or r[7] != "0"]
    if p.returncode != 0 or failed or len(rows) != len(order):
        raise SystemExit(f"bench_testbed: parallel {name}: exit {p.returncode}, {len(failed)} failed "
                         f"of {len(rows)} jobs: {p.stderr[-2000:]}")
    missing = [c.name for c in order if not (work / "out" / c.name / "model.pt").exists()]
    if missing:
        raise SystemExit(f"bench_testbed: parallel {name}: no published checkpoint for {missing}")
    runs = trainer_runs(work, world, f"parallel {name}", t0_wall)
    starts = [float(r[2]) for r in rows]
    # GNU parallel writes no events: its makespan is its joblog's (first job start to last job end),
    # which `ablate report`'s timeline cannot compute.
    makespan = max(float(r[2]) + float(r[3]) for r in rows) - min(starts)
    return Side("parallel", makespan, wall, min(starts) - t0_wall, runs, cpu)


def keep(dest: Path | None, name: str, paths: list[Path], under: Path | None = None) -> None:
    """Copy what tells what happened out of the bed (which removes its dir at the end): each path
    to dest/name/, at its place relative to `under` when it is there."""
    if dest is None:
        return
    for p in paths:
        to = dest / name / (p.relative_to(under) if under and p.is_relative_to(under) else p.name)
        if p.is_dir():
            shutil.copytree(p, to, dirs_exist_ok=True)
        elif p.exists():
            to.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(p, to)


def breakdown(world: World, side: Side) -> str:
    """Where a side's time went, from the trainer's own clock (seconds from the side's t0)."""
    runs = side.runs
    last = max(r[3] for r in runs.values())
    gaps, hosts = [], []
    for h in world.declared:
        mine = sorted((r for r in runs.values() if r[0] == h), key=lambda r: r[1])
        gaps += [b[1] - a[3] for a, b in itertools.pairwise(mine)]
        train = sum(world.train_seconds(c, h) for c in world.cells if runs[c.name][0] == h)
        hosts.append(f"{h} {len(mine)} cells, training {train:.1f} s, idle at the end "
                     f"{last - max((r[3] for r in mine), default=0.0):.1f} s")
    return (f"first trainer start {min(r[1] for r in runs.values()):.1f} s; start-up median "
            f"{median([r[2] - r[1] for r in runs.values()]):.2f} s; between a host's trainer runs median "
            f"{median(gaps):.2f} s (sum {sum(gaps):.1f} s); last trainer end {last:.1f} s, its result "
            f"published by {side.wall:.1f} s; CPU {side.cpu:.0f} s; {'; '.join(hosts)}")


def peer_tables(worlds: list[World], pairs: list[tuple[Side, Side]], first: list[str]) -> list[str]:
    out = ["| rep | first | true speeds | ablate makespan (s) | parallel makespan (s) | makespan ablate / "
           "parallel | ablate wall (s) | parallel wall (s) | wall ablate / parallel | steals | launch "
           "(s, ablate / parallel) |", "|--:|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for i, (w, (a, p)) in enumerate(zip(worlds, pairs, strict=True)):
        speeds = "/".join(f"{w.true[h]:.2f}" for h in w.declared)
        out.append(f"| {i} | {first[i]} | {speeds} | {a.makespan:.1f} | {p.makespan:.1f} | "
                   f"{a.makespan / p.makespan:.3f} | {a.wall:.1f} | {p.wall:.1f} | {a.wall / p.wall:.3f} | "
                   f"{len(a.steals)} | {a.launch:.2f} / {p.launch:.2f} |")

    def med(f: Callable[[Side, Side], float], fmt: str) -> str:
        return format(median([f(a, p) for a, p in pairs]), fmt)

    out.append(f"| **median** | | | **{med(lambda a, p: a.makespan, '.1f')}** | "
               f"**{med(lambda a, p: p.makespan, '.1f')}** | "
               f"**{med(lambda a, p: a.makespan / p.makespan, '.3f')}** | "
               f"**{med(lambda a, p: a.wall, '.1f')}** | **{med(lambda a, p: p.wall, '.1f')}** | "
               f"**{med(lambda a, p: a.wall / p.wall, '.3f')}** | {med(lambda a, p: len(a.steals), 'g')} | "
               f"{med(lambda a, p: a.launch, '.2f')} / {med(lambda a, p: p.launch, '.2f')} |")
    return out


def peer_notes(worlds: list[World], pairs: list[tuple[Side, Side]],
               nexts: list[tuple[Side, Side]] | None = None) -> list[str]:
    out = []
    for i, (w, (a, p)) in enumerate(zip(worlds, pairs, strict=True)):
        scale = ", ".join(f"{t} {s:.2f}" for t, s in w.scale.items())
        out += [f"- rep {i} (task seconds per unit {scale})"]
        for what, side in (("ablate", a), *((("ablate, next sweep", nexts[i][0]),) if nexts else ())):
            out += [f"  - {what}: {breakdown(w, side)}",
                    *([f"  - measured (calibrate): {side.calibrated}"] if side.calibrated else []),
                    f"  - steals: {'; '.join(side.steals) or 'none'}",
                    f"  - learned at the end, speed / true speed on the same scale and fixed seconds per "
                    f"cell: {side.learned}"]
        out.append(f"  - parallel: {breakdown(w, p)}")
    return out


def peer_verdicts(pairs: list[tuple[Side, Side]], what: str) -> list[str]:
    """The two targets of issue 13 on these pairs (ablate, parallel): medians of the ratios."""
    if not pairs:
        return []
    mk = median([a.makespan / p.makespan for a, p in pairs])
    wl = median([a.wall / p.wall for a, p in pairs])
    return [f"{what}makespan ablate / parallel {mk:.3f} (median of the repetitions' ratios; target "
            f"<= 0.95: {'met' if mk <= 0.95 else 'MISSED'})",
            f"{what}wall from `launch --all` to the last result published, ablate / parallel {wl:.3f} "
            f"(target <= 1.0: {'met' if wl <= 1.0 else 'MISSED'})"]


def progress(what: str, world: World, side: Side) -> None:
    """One side's figures on stderr as soon as it has run."""
    print(f"  {what}: makespan {side.makespan:.1f} s, wall {side.wall:.1f} s, launch {side.launch:.2f} s; "
          f"{breakdown(world, side)}", file=sys.stderr)


def run_peer(args: argparse.Namespace) -> int:
    declared_list = [float(s) for s in args.speeds.split(",") if s.strip()]
    lo, hi = (float(x) for x in args.misspeed.split(","))
    worlds: list[World] = []
    pairs: list[tuple[Side, Side]] = []
    nexts: list[tuple[Side, Side]] = []  # --next-sweep: the second sweep on the same instances
    first: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ablate-bench-peer-") as tmp, \
            Testbed(len(declared_list)) as tb:
        base = Path(tmp)
        os.environ["ABLATE_SSH_CONTROL_DIR"] = str(base / "ssh-control")  # this run's masters only
        try:
            for rep in range(max(1, args.reps)):
                world = draw_world(dict(zip(tb.hosts, declared_list, strict=True)), args.cells,
                                   args.train, args.sigma, args.seed + rep, (lo, hi), args.torch_optim)
                print(f"rep {rep}: true speeds {world.true} (declared {world.declared}), task scales "
                      f"{world.scale}", file=sys.stderr)
                order = ("ablate", "parallel") if rep % 2 == 0 else ("parallel", "ablate")
                got: dict[str, Side] = {}
                for way in order:
                    if way == "ablate":
                        if args.next_sweep:  # new instances: nothing measured on them yet
                            shutil.rmtree(tb.shared_dir / "ablate" / ".calib", ignore_errors=True)
                        s = run_ablate_peer(tb, base, f"p{rep}{way[0]}", world, args.timeout, args.keep,
                                            args.calibrate, args.measured_before,
                                            False if args.next_sweep else None, args.light)
                        if args.next_sweep:
                            got["next"] = n = run_ablate_peer(tb, base, f"p{rep}n", world, args.timeout,
                                                              args.keep, args.calibrate, kept=True,
                                                              light=args.light)
                            progress("ablate, next sweep", world, n)
                    else:
                        s = run_parallel_peer(tb, base, f"p{rep}{way[0]}", world, args.timeout, args.keep,
                                              args.controlmaster)
                    got[way] = s
                    progress(way, world, s)
                    for line in s.steals:
                        print(f"    steal {line}", file=sys.stderr)
                worlds.append(world)
                pairs.append((got["ablate"], got["parallel"]))
                if args.next_sweep:
                    nexts.append((got["next"], got["parallel"]))
                first.append(order[0])
        finally:
            close_all()
            for sock in (base / "ssh-control").rglob("*"):  # end this run's ControlMasters
                if sock.is_socket() and not sock.name.endswith(".a"):
                    subprocess.run(["ssh", "-S", str(sock), "-O", "exit", "x"], capture_output=True,
                                   timeout=10, check=False)
    rows = peer_tables(worlds, pairs, first)
    sides = 3 if nexts else 2
    verdicts = [*peer_verdicts(pairs, "the first sweep, " if nexts else ""),
                *peer_verdicts(nexts, "the next sweep, "),
                f"every cell completed exactly once on each side in each repetition: yes "
                f"({args.cells} cells x {len(pairs)} repetitions x {sides})"]
    cmd = (f"sudo python3 scripts/bench_testbed.py --peer parallel --cells {args.cells} "
           f"--sigma {args.sigma:g} --train {args.train:g} --seed {args.seed} --speeds {args.speeds} "
           f"--misspeed {args.misspeed} --reps {args.reps}{' --torch-optim' if args.torch_optim else ''}"
           f"{' --controlmaster' if args.controlmaster else ''}"
           f"{f' --calibrate {args.calibrate:g}' if args.calibrate else ''}"
           f"{' --light' if args.light else ''}"
           f"{' --measured-before' if args.measured_before else ''}"
           f"{' --next-sweep' if args.next_sweep else ''}")
    calibration = (
        f" With `calibrate:` (`--calibrate {args.calibrate:g}`): before its first cell each queue runs "
        f"the trainer's benchmark mode ({'no torch' if args.light else 'the same start-up'}, then "
        f"{args.calibrate:g} s of work at speed 1, "
        "divided by the host's true speed; it prints the timed part's seconds), the runners wait for "
        "every measurement, and the shared head is dealt by the measured speeds; the calibration counts "
        "in ablate's makespan and wall." + (LIGHT if args.light else "") if args.calibrate else "")
    if args.measured_before:
        calibration += (" `--measured-before`: each host's `calib/` file is in place before the launch (as "
                        "a relaunch finds it), so no benchmark runs and nobody waits: the deal alone.")
    if args.next_sweep:
        calibration += (" `--next-sweep`: ablate runs two sweeps of the repetition's world, one after the "
                        "other, with nothing measured before the first (a repetition's instances are new: "
                        "`ablate/.calib/` is emptied): the **first sweep** runs every host's benchmark, "
                        "the **next sweep** (another sweep name, the same cells and instances: the next "
                        "round of an ablation) takes every host's kept measurement and runs none; the "
                        "bench refuses a run where either is not so. Order in a repetition: first sweep, "
                        "next sweep, parallel, or parallel first.")
    steps = ("5 `torch.optim.SGD` steps (its first use imports torch._dynamo, ~1.1 s of CPU)"
             if args.torch_optim else "5 SGD steps (forward, backward, update by hand: `torch.optim`'s "
             "first use would import torch._dynamo, another ~1.1 s of CPU per start on these shared cores)")
    lines = [
        "## Real makespan against GNU parallel on the test bed"
        + ("" if args.light and args.next_sweep else
           ", declared figures wrong"
           + (", speeds measured (`calibrate:`)" if args.calibrate else "")
           + (", measured before the launch" if args.measured_before else "")
           + (", the first and the next sweep on the same instances" if args.next_sweep else "")), "",
        measured_line(cmd) + f" ablate at {ablate_version(('ablate', 'wrappers'))}.", "",
        f"{args.cells} cells on {len(declared_list)} test-bed instances (tests/testbed.py), declared speeds "
        f"{args.speeds}; each host's true emulated speed is declared x U({lo:g}, {hi:g}), drawn per "
        "repetition. Tasks a, b, c declare `cost_per_epoch` 1, 1.5, 2.5 (arbitrary units); each cell "
        "has a uniform task and 1-4 epochs; a task's true seconds per unit (speed 1) is a base x a "
        f"factor log-uniform on [1/2, 2], the base making a mean cell {args.train:g} s at speed 1 before "
        f"that factor. The trainer is real PyTorch: `import torch`, a small model, {steps}, scaled by "
        f"no speed; then it sleeps units x task scale x exp({args.sigma:g} Z) / true speed in `epochs` "
        "parts and `torch.save`s its checkpoint. **ablate**: `ablate plan` + `ablate launch --all` "
        "with `steal: true` and the declared (wrong) speeds; makespan = last `end` - first "
        "`queue_start`; wall = just before `launch --all` to the moment a 50 ms poll saw the last "
        "`final_ckpts/<cell>/MANIFEST.json`. **parallel**: `parallel --sshlogin 1/tb-h1,1/tb-h2,1/tb-h3 "
        f"--ssh 'ssh -F <bed config>' --joblog{' -M' if args.controlmaster else ''}`"
        f"{' (-M: one ssh ControlMaster per host, reused by every job)' if args.controlmaster else ''}"
        ", fed the same cells longest declared first, each job "
        "the trainer into the host's local disk, then `cp -r` to the shared dir and a rename; "
        "makespan = last job end - first job start (joblog); wall = the command's. Each repetition r "
        f"draws its world with seed {args.seed} + r, runs both sides on it one after the other (order "
        "alternating) and checks that each side ran every cell exactly once (the trainer's own "
        f"runs.log). {len(pairs)} repetitions; the machine's 2 cores are every instance's CPU."
        f"{calibration}", "",
        *(["The first sweep (every host runs the benchmark):", ""] if nexts else []), *rows, "",
        *(["The next sweep on the same instances (every host's measurement kept):", "",
           *peer_tables(worlds, nexts, first), ""] if nexts else []),
        *(f"- {v}" for v in verdicts), "",
        "Where the time went, per repetition, from the trainer's own clock (seconds from the side's "
        "start: `launch --all` or the parallel command): start-up = the trainer's start to the end of "
        "its steps; between a host's trainer runs = one run's checkpoint saved to the next one's "
        "first line (ablate: run_one's publishing and run_queue's next claim, a steal's learning "
        "step; parallel: the copy, the job's end, the next ssh and login shell); CPU = the machine's "
        "busy CPU seconds during the side (niced work excluded, other users' not).", "",
        *peer_notes(worlds, pairs, nexts), ""]
    key = "bench_testbed_peer"
    if args.calibrate:
        key += "_measured" if args.measured_before else "_next" if args.next_sweep else "_calibrate"
        key += "_light" if args.light else ""
    publish(key, lines, not args.no_write)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", choices=["parallel"], help="measure ablate against GNU parallel's pull "
                    "queue, the declared figures wrong (its own section; see above)")
    ap.add_argument("--cells", type=int, help="cells (default 30; with --peer 24)")
    ap.add_argument("--scale", type=float, default=1.0, help="seconds per unit of cost (default 1)")
    ap.add_argument("--sigma", type=float, help="lognormal duration noise (default 0.3; with --peer 0.4)")
    ap.add_argument("--seed", type=int, default=4, help="seed of the costs and draws of the first "
                    "repetition; repetition r uses seed + r (default 4)")
    ap.add_argument("--speeds", help="emulated host speeds (default 0.6,1.0,1.4); with --peer the declared "
                    "ones (default 1.0,0.6,1.4)")
    ap.add_argument("--misspeed", default="0.6,1.6", help="--peer: true speed = declared x U(lo, hi) "
                    "(default 0.6,1.6)")
    ap.add_argument("--train", type=float, default=2.5, help="--peer: mean training seconds of a cell at "
                    "speed 1 before the task factor (default 2.5)")
    ap.add_argument("--torch-optim", action="store_true", help="--peer: the trainer's steps through "
                    "torch.optim (imports torch._dynamo: ~1.1 s more CPU per start)")
    ap.add_argument("--controlmaster", action="store_true", help="--peer: GNU parallel with -M (one ssh "
                    "ControlMaster per host, reused by its jobs: the peer without a new connection per job)")
    ap.add_argument("--calibrate", type=float, default=0.0, help="--peer: ablate's side with `calibrate:`, "
                    "a benchmark of this many seconds of work at speed 1 (default 0: none); its own section")
    ap.add_argument("--light", action="store_true", help="--peer --calibrate: the benchmark without "
                    "`import torch` (Python's start-up, then the timed work): as cheap against these "
                    "seconds-long cells as a GPU benchmark of a few seconds is against cells of minutes")
    ap.add_argument("--measured-before", action="store_true", help="--peer --calibrate: the hosts' "
                    "measurements already on the FS (a relaunch): the deal without the benchmark's cost")
    ap.add_argument("--next-sweep", action="store_true", help="--peer --calibrate: ablate runs a first "
                    "sweep on new instances (measuring) and then the next sweep (taking the kept "
                    "measurements), each against the same parallel run")
    ap.add_argument("--keep", type=Path, help="--peer: copy each run's events, queues, joblog and the "
                    "trainer's runs.log / times.log into this directory")
    ap.add_argument("--timeout", type=float, default=300,
                    help="--peer: seconds a side may take (default 300)")
    ap.add_argument("--reps", type=int, default=1, help="repetitions; the median is kept (default 1)")
    ap.add_argument("--policies", default="steal,nosteal",
                    help="steal (steal: true) and/or nosteal (steal: false); default both")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/BENCHMARKS.md alone")
    args = ap.parse_args(argv)
    peer = args.peer is not None
    calibrating = bool(args.calibrate or args.measured_before)
    if (calibrating and not peer) or ((args.measured_before or args.next_sweep) and not args.calibrate):
        ap.error("--calibrate goes with --peer, and --measured-before or --next-sweep with --calibrate")
    if args.light and not args.calibrate:
        ap.error("--light goes with --calibrate")
    if args.measured_before and args.next_sweep:
        ap.error("--measured-before and --next-sweep: choose one (the next sweep finds its measurements "
                 "kept by the first)")
    if args.calibrate < 0:
        ap.error(f"--calibrate: seconds of work, 0 or more; got {args.calibrate:g}")
    args.cells = max(1, args.cells or (24 if peer else 30))
    args.sigma = args.sigma if args.sigma is not None else (0.4 if peer else 0.3)
    args.speeds = args.speeds or ("1.0,0.6,1.4" if peer else "0.6,1.0,1.4")
    reason = missing_requirement()
    if reason:
        print(f"bench_testbed: {reason}", file=sys.stderr)
        return 2
    if peer:
        if shutil.which("parallel") is None:
            print("bench_testbed: --peer parallel needs GNU parallel (apt-get install parallel)",
                  file=sys.stderr)
            return 2
        return run_peer(args)
    speed_list = [float(s) for s in args.speeds.split(",") if s.strip()]
    wanted = [(name, steal) for key, name, steal in (("steal", "plan + stealing", True),
                                                     ("nosteal", "plan, no stealing", False))
              if key in args.policies.split(",")]
    if not wanted:
        ap.error("--policies: give steal, nosteal or both")
    runs: dict[str, list[Run]] = {name: [] for name, _ in wanted}
    with tempfile.TemporaryDirectory(prefix="ablate-bench-tb-") as tmp, Testbed(len(speed_list)) as tb:
        speeds = dict(zip(tb.hosts, speed_list, strict=True))
        for r in range(max(1, args.reps)):
            cells = cell_specs(max(1, args.cells), args.scale, args.seed + r)  # the same for each policy
            for name, steal in wanted:
                sweep = f"tb{r}{'s' if steal else 'n'}"
                got = run_sweep(tb, Path(tmp), sweep, cells, speeds, args.sigma, steal)
                runs[name].append(got)
                print(f"rep {r} {name}: makespan {got.makespan:.1f}s, lower bound {got.lower_bound:.1f}s, "
                      f"ratio {got.ratio:.3f}, {got.steals} steals", file=sys.stderr)
        close_all()
    rows = table(runs)
    verdict = ""
    if "plan + stealing" in runs:
        ratio = median([r.ratio for r in runs["plan + stealing"]])
        verdict = (f"plan + stealing: makespan / lower bound {ratio:.3f} (target <= 1.10: "
                   f"{'met' if ratio <= 1.10 else 'MISSED'})")
    print(f"{args.cells} cells on {len(speed_list)} test-bed hosts (speeds {args.speeds}), "
          f"sigma {args.sigma}")
    print("\n".join(rows))
    print(verdict)
    if not args.no_write:
        cmd = (f"sudo python3 scripts/bench_testbed.py --cells {args.cells} --scale {args.scale:g} "
               f"--sigma {args.sigma:g} --seed {args.seed} --speeds {args.speeds} --reps {args.reps} "
               f"--policies {args.policies}")
        publish("bench_testbed", [
            "## Real makespan on the test bed (plan, launch --all, stealing)", "",
            measured_line(cmd), "",
            f"{args.cells} cells on {len(speed_list)} test-bed instances (tests/testbed.py) of emulated "
            f"speeds {args.speeds}; declared costs from a bimodal mix (30 % U(4, 8), else U(0.8, 1.6) "
            f"seconds at speed 1, x {args.scale:g}); each trainer sleeps cost x exp({args.sigma:g} Z) "
            "/ speed and writes a real safetensors checkpoint. Planned by `ablate plan`, launched by "
            "`ablate launch --all`; the same cells and draws with `steal: true` and `steal: false`. "
            "Work of a cell = its `end` event's `dur` x its host's speed; lower bound = "
            "max(sum(work) / sum(speeds), max(work) / fastest speed); makespan = last `end` - first "
            f"`queue_start`. Median of {args.reps} repetitions; repetition r draws its cells with seed "
            f"{args.seed} + r, the same for both policies.", "", *rows, "", f"- {verdict}", ""],
            True, echo=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
