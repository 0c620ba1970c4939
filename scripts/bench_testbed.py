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
so the wrappers' per-cell overhead and the launch fan-out (the spread of the `queue_start`s, shown)
count against the policy; "plan's own ratio" is the plan's makespan / lower bound on the declared
costs, before any noise.

    sudo python3 scripts/bench_testbed.py [--cells 30] [--scale 1] [--sigma 0.3] [--seed 4]
                                          [--speeds 0.6,1.0,1.4] [--reps 1] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from benchlib import measured_line, median, write_section  # noqa: E402

from ablate.config.project import load_project  # noqa: E402  (after the sys.path lines above)
from ablate.plan.planner import plan  # noqa: E402
from ablate.run.launch import launch_all  # noqa: E402
from ablate.transport import close_all  # noqa: E402
from tests.testbed import Testbed, missing_requirement  # noqa: E402

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
    proj = base / sweep
    (proj / "profiles").mkdir(parents=True)
    (proj / "profiles" / "tb.yaml").write_text(yaml.safe_dump({
        "transport": "ssh", "shared_fs": tb.shared_path, "ckpt_root": f"{tb.local_path}/ckpt/{sweep}"}))
    work = tb.shared_dir / "bench" / sweep  # the instances see it at shared_path/bench/<sweep>
    work.mkdir(parents=True)
    (work / "emu.py").write_text(EMU)
    (work / "speeds.json").write_text(json.dumps({tb.hostname(h): s for h, s in speeds.items()}))
    for i, c in enumerate(cells):
        body = json.dumps({"cost": c.cost, "z": c.z, "sigma": sigma, "seed": i})
        for where in (proj, work):
            (where / "configs" / f"{c.name}.yaml").parent.mkdir(parents=True, exist_ok=True)
            (where / "configs" / f"{c.name}.yaml").write_text(body + "\n")
    ssh_config = tb.write_ssh_config(base / f"{sweep}.ssh_config", extra="\nHost *\n  ConnectTimeout 5\n")
    (proj / "ablate.yaml").write_text(yaml.safe_dump({
        "profile": "tb", "sweep": sweep, "workdir": f"{tb.shared_path}/bench/{sweep}",
        "train": f"{sys.executable} emu.py {{cfg}} {{ckpt_dir}}",
        "artifacts": {"checkpoint": "model.safetensors"},
        "tasks": {"t": {"epochs": 1, "cost_per_epoch": 1.0}},
        "cells": [{"glob": "configs/*.yaml", "task": "t"}],
        "costs": [{"glob": f"configs/{c.name}.yaml", "cost": c.cost} for c in cells],
        "heartbeat_secs": 1, "steal": steal, "ssh_config": str(ssh_config),
        "hosts": {h: {"speed": s} for h, s in speeds.items()}}, sort_keys=False))
    return proj


def read_events(root: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted((root / "events").glob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


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
    deadline = time.monotonic() + 120 + 10 * expected
    while True:
        evs = read_events(root)
        ended = {e["queue"] for e in evs if e["ev"] in ("queue_end", "queue_stop")}
        if queues <= ended:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_testbed: {sweep}: queues {sorted(queues - ended)} did not end in time")
        time.sleep(0.2)
    ends = [e for e in evs if e["ev"] == "end"]
    failed = [e for e in ends if e["rc"] != 0]
    names = {e["cell"] for e in ends if e["rc"] == 0}
    if failed or names != {c.name for c in cells} or len(ends) != len(cells):
        raise SystemExit(f"bench_testbed: {sweep}: every cell must run once with rc 0; got "
                         f"{len(ends)} ends, {len(failed)} failed, {len(names)} distinct")
    work = [e["dur"] * speeds[e["host"]] for e in ends]
    lb = max(sum(work) / sum(speeds.values()), max(work) / max(speeds.values()))
    starts = [e["t"] for e in evs if e["ev"] == "queue_start"]
    t0 = min(starts)
    makespan = max(e["t"] for e in ends) - t0
    steals = sum(1 for e in evs if e["ev"] == "steal")
    return Run(makespan, lb, steals, max(starts) - t0, planned.makespan / planned.lower_bound)


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=30, help="cells (default 30)")
    ap.add_argument("--scale", type=float, default=1.0, help="seconds per unit of cost (default 1)")
    ap.add_argument("--sigma", type=float, default=0.3, help="lognormal duration noise (default 0.3)")
    ap.add_argument("--seed", type=int, default=4, help="seed of the costs and draws of the first "
                    "repetition; repetition r uses seed + r (default 4)")
    ap.add_argument("--speeds", default="0.6,1.0,1.4", help="emulated host speeds (default 0.6,1.0,1.4)")
    ap.add_argument("--reps", type=int, default=1, help="repetitions; the median is kept (default 1)")
    ap.add_argument("--policies", default="steal,nosteal",
                    help="steal (steal: true) and/or nosteal (steal: false); default both")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/BENCHMARKS.md alone")
    args = ap.parse_args(argv)
    reason = missing_requirement()
    if reason:
        print(f"bench_testbed: {reason}", file=sys.stderr)
        return 2
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
        path = write_section("bench_testbed", [
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
            f"{args.seed} + r, the same for both policies.", "", *rows, "", f"- {verdict}", ""])
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
