#!/usr/bin/env python3
"""Per-cell overhead of the wrappers against running the same command bare, on a local FS.

A throw-away local project (profile `local`: the "shared FS" is a directory on this disk) is
deployed with `ablate.run.deploy.deploy` (the packaged wrappers and the real run spec); its FS queue
file gets N cells, and the real `run_queue.<sha12>.sh SPEC QUEUE 0` runs them in the foreground:
per cell it claims, writes events and the heartbeat (restarting its ticker), runs run_one (log,
train command, copies with size + sha256 checks, MANIFEST.json, rename into final_ckpts/).
Per-cell time = the gap between consecutive `end` events (the first from `queue_start`).

Bare: a bash loop that runs the same rendered command for the same N cells, each through
`bash -c` (the train command is a shell command line, as a user's script would run it), timing each
cell with $EPOCHREALTIME. The command is tiny on purpose (`mkdir` + `cat` of the config into the
checkpoint) so the difference is the wrappers' own cost.

Repetitions alternate bare and wrapped runs, each on a fresh sweep; the figure is the median over
repetitions of each run's median per-cell time.

    python3 scripts/bench_overhead.py [--cells 100] [--reps 5] [--no-write]
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (it puts this checkout on sys.path)

from benchlib import measured_line, median, publish, write_project

from ablate.config.project import load_project
from ablate.run.deploy import deploy

TRAIN = "mkdir -p {ckpt_dir} && cat {cfg} > {ckpt_dir}/ckpt.bin"
BARE_LOOP = r"""
cd "$1"; shift
for cfg in "$@"; do
  name=${cfg##*/}; name=${name%.yaml}
  t0=$EPOCHREALTIME
  bash -c "mkdir -p $CKPT/$name && cat $cfg > $CKPT/$name/ckpt.bin"
  t1=$EPOCHREALTIME
  echo $(( ${t1/./} - ${t0/./} ))
done
"""


def make_project(base: Path, sweep: str, n: int) -> tuple[Path, list[str]]:
    configs = {f"c{i:05d}": f"seed: {i}\nlr: 0.1\n" for i in range(n)}
    proj = write_project(base / sweep, sweep, train=TRAIN, artifacts={"checkpoint": "ckpt.bin"},
                         tasks={"t": {"epochs": 1}}, hosts={"h1": {}}, configs=configs)
    return proj, [f"configs/{c}.yaml" for c in configs]


def wrapped(base: Path, rep: int, n: int) -> list[float]:
    """Seconds per cell through the real run_queue."""
    proj, cfgs = make_project(base, f"w{rep}", n)
    project = load_project(proj)
    d = deploy(project)
    root = Path(project.sweep_root(project.host("h1")))
    (root / "queues").mkdir(parents=True, exist_ok=True)
    (root / "queues" / "q.txt").write_text("".join(f"{c} t\n" for c in cfgs))
    p = subprocess.run(["bash", str(root / "wrappers" / d.run_queue), str(root / "specs" / d.specs["h1"]),
                        "q", "0"], capture_output=True, text=True, timeout=60 + 2 * n)
    if p.returncode != 0:
        raise SystemExit(f"bench_overhead: run_queue exited {p.returncode}: {p.stderr[-2000:]}")
    evs = [json.loads(line) for line in (root / "events" / "h1.q.jsonl").read_text().splitlines()]
    marks = [e["t"] for e in evs if e["ev"] in ("queue_start", "end")]
    ends = [e for e in evs if e["ev"] == "end"]
    if len(ends) != n or any(e["rc"] != 0 for e in ends):
        raise SystemExit(f"bench_overhead: expected {n} cells ending rc 0, got {ends[:3]}...")
    if len(list((root / "final_ckpts").iterdir())) != n:
        raise SystemExit("bench_overhead: not every cell has its final_ckpts/ dir")
    return [b - a for a, b in itertools.pairwise(marks)]


def bare(base: Path, rep: int, n: int) -> list[float]:
    """Seconds per cell of the same command, run from a bash loop."""
    proj, cfgs = make_project(base, f"b{rep}", n)
    ckpt = proj / "bare-ckpt"
    p = subprocess.run(["bash", "-c", BARE_LOOP, "bare", str(proj), *cfgs], capture_output=True, text=True,
                       env={"CKPT": shlex.quote(str(ckpt)), "PATH": "/usr/bin:/bin"}, timeout=60 + n)
    if p.returncode != 0 or len(list(ckpt.iterdir())) != n:
        raise SystemExit(f"bench_overhead: the bare loop failed: {p.stderr[-2000:]}")
    return [int(x) / 1e6 for x in p.stdout.split()]


def measure(n: int, reps: int) -> dict[str, list[float]]:
    """name -> per repetition: median seconds per cell; `_mean` the mean; `_cpu` CPU seconds
    (user + sys of every process the run started) per cell."""
    out: dict[str, list[float]] = {f"{k}{x}": [] for k in ("bare", "wrapped") for x in ("", "_mean", "_cpu")}
    with tempfile.TemporaryDirectory(prefix="ablate-bench-ovh-") as tmp:
        base = Path(tmp)
        bare(base, -1, min(n, 10))  # warm-up: page cache, bash binary
        wrapped(base, -1, min(n, 10))
        for r in range(reps):
            for kind, fn in (("bare", bare), ("wrapped", wrapped)):
                t0 = time.perf_counter()
                ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                per = fn(base, r, n)
                ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                out[f"{kind}_cpu"].append((ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / n)
                print(f"rep {r} {kind}: median {statistics.median(per) * 1e3:.1f} ms/cell "
                      f"({time.perf_counter() - t0:.1f}s)", file=sys.stderr)
                out[kind].append(statistics.median(per))
                out[f"{kind}_mean"].append(statistics.fmean(per))
    return out


def table(res: dict[str, list[float]]) -> tuple[list[str], float]:
    b, w = median(res["bare"]) * 1e3, median(res["wrapped"]) * 1e3
    bm, wm = median(res["bare_mean"]) * 1e3, median(res["wrapped_mean"]) * 1e3
    bc, wc = median(res["bare_cpu"]) * 1e3, median(res["wrapped_cpu"]) * 1e3
    rows = ["| per cell | median wall (ms) | mean wall (ms) | CPU (ms) |", "|:--|--:|--:|--:|",
            f"| bare command | {b:.1f} | {bm:.1f} | {bc:.1f} |",
            f"| through run_queue + run_one | {w:.1f} | {wm:.1f} | {wc:.1f} |",
            f"| **overhead** | **{w - b:.1f}** | {wm - bm:.1f} | {wc - bc:.1f} |"]
    return rows, w - b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=100, help="cells per run (default 100)")
    ap.add_argument("--reps", type=int, default=5, help="alternating bare/wrapped repetitions (default 5)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/BENCHMARKS.md alone")
    args = ap.parse_args(argv)
    n, reps = max(1, args.cells), max(1, args.reps)
    res = measure(n, reps)
    rows, overhead = table(res)
    met = "met" if overhead <= 100 else "MISSED"
    verdict = f"overhead {overhead:.1f} ms per cell (target <= 100 ms: {met})"
    print(f"{n} cells x {reps} repetitions, median per cell")
    print("\n".join(rows))
    print(verdict)
    publish("bench_overhead", [
        "## Per-cell overhead of the wrappers (local FS)", "",
        measured_line(f"python3 scripts/bench_overhead.py --cells {n} --reps {reps}"), "",
        f"{n} cells of a tiny command (`{TRAIN}`) run by the real `run_queue.sh` / `run_one.sh` "
        "(deployed by `ablate.run.deploy`, the real run spec; claims, events, heartbeat, copy + size + "
        "sha256 checks, MANIFEST.json, rename) against the same command run bare from a bash loop "
        "(`bash -c` per cell). Both on this machine's disk; bare and wrapped runs alternate, "
        f"{reps} repetitions each, a fresh sweep each; median over repetitions of each run's "
        "median per-cell time (wrapped: the gap between consecutive `end` events). CPU: user + "
        "sys time of every process the run started, per cell (less sensitive to other load "
        "than wall time: each cell forks ~30 short processes, which wait for a CPU on a "
        "busy machine).", "",
        *rows, "", f"- {verdict}", ""], not args.no_write, echo=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
