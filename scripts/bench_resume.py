#!/usr/bin/env python3
"""Durable resume copies (ablate/remote/resume/, issue 45) on real tmux with the real wrappers, a
local project whose hosts h1 and h2 have disks of their own (`ckpt_root` per host):

- `overhead`: one cell whose trainer writes a `--size-mb` checkpoint (tmp + rename) each of
  `--epochs` epochs, `--step` seconds apart; its wall time (its `end` event's `dur`) with the
  copies made (`resume:` absent: the checkpoint) and without (`resume: false`), alternated, and how
  the copies made in the background;
- `saved`: a cell of `--epochs` epochs of `--step` seconds (tests/helpers/fault_train.py) held at
  75 % of them, its queue SIGKILLed and its disk wiped (an instance taken away), then run again by
  `remediate --launch`: the epochs the re-run trained and its wall time, with the copies and without,
  and how soon after the save at the cut its copy was committed.

    python3 scripts/bench_resume.py [--reps 3] [--size-mb 256] [--epochs 8] [--step 2] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (it puts this checkout on sys.path)

from benchlib import ablate_version, measured_line, median, publish, read_events, wait_until, write_project

from ablate.config.project import load_project
from ablate.results.remediate import remediate
from ablate.run.launch import launch
from tests.helpers import fault_train
from tests.helpers.proc import group

BIG = '''import os, sys, time, json
out, epochs, size, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
os.makedirs(out, exist_ok=True)
block = os.urandom(1 << 20)
for e in range(epochs):
    tmp = os.path.join(out, "state.bin.tmp")
    with open(tmp, "wb") as f:
        f.write(e.to_bytes(8, "little"))
        for _ in range(size):
            f.write(block)
    os.replace(tmp, os.path.join(out, "state.bin"))
    with open(os.path.join(out, "saves.jsonl"), "a") as f:
        f.write(json.dumps({"epoch": e, "t": time.time()}) + "\\n")
    time.sleep(step)
with open(os.path.join(out, "metrics.json"), "w") as f:
    json.dump({"val_loss": 0.0}, f)
'''


def _project(base: Path, train: str, resume: bool, files: dict[str, str]) -> tuple[Path, Path]:
    proj = base / uuid.uuid4().hex[:8]
    off: dict[str, Any] = {} if resume else {"resume": False}
    write_project(proj, "resume", train=train,
                  artifacts={"checkpoint": "state.bin" if "big.py" in train else fault_train.CKPT,
                             "metrics": "metrics.json"},
                  tasks={"t": {"epochs": 1, "cost_per_epoch": 1.0}},
                  hosts={"h1": {"speed": 1.0}, "h2": {"speed": 1.0}}, configs={"c1": "seed: 1\n"},
                  queues={"h1": ["# ablate: host=h1", "configs/c1.yaml t 1"]}, heartbeat_secs=1, steal=False,
                  budget={"ckpt_size": "2GB", "scratch": "4GB"}, **off)
    for name, body in files.items():
        (proj / name).write_text(body)
    return proj, proj / ".ablate" / "shared" / "ablate" / "resume"


def _ends(shared: Path) -> list[dict[str, Any]]:
    return [e for e in read_events(shared) if e["ev"] == "end"] if (shared / "events").exists() else []


def _kill_server() -> None:
    subprocess.run(["tmux", "-L", os.environ["ABLATE_TMUX_SOCKET"], "kill-server"], capture_output=True)


def overhead(base: Path, resume: bool, size: int, epochs: int, step: float) -> float:
    """The cell's wall time."""
    train = f"{sys.executable} big.py {{ckpt_dir}} {epochs} {size} {step} # {{cfg}}"
    proj, shared = _project(base, train, resume, {"big.py": BIG})
    launch(load_project(proj), "h1", "h1")
    if not wait_until(lambda: _ends(shared), 120 + epochs * (step + size / 50), 0.2):
        raise SystemExit("overhead: the cell did not end")
    [end] = _ends(shared)
    _kill_server()
    return float(end["dur"])


def saved(base: Path, resume: bool, epochs: int, step: float) -> tuple[int, float, float | None]:
    """(epochs the re-run trained, its wall time, seconds from the save at the cut to its copy's
    commit) after a cut at 75 %."""
    cut_at = max(1, epochs * 3 // 4)
    train = (f"{sys.executable} fault_train.py --config {{cfg}} --epochs {epochs} --out {{ckpt_dir}} "
             "--resume {resume} --name {name}")
    proj, _ = _project(base, train, resume, {"fault_train.py": Path(fault_train.__file__).read_text()})
    (proj / "configs" / "c1.yaml").write_text(f"seed: 1\nstep_time: {step}\n")
    (proj / "faults").mkdir()
    (proj / "faults" / "c1.hang").write_text(f"{cut_at}\n")
    launch(load_project(proj), "h1", "h1")
    root = proj / ".ablate" / "shared" / "ablate" / "resume"
    local = proj / ".ablate" / "local" / "h1" / "ckpt" / "c1"
    trace = local / "trace.jsonl"

    def at_cut() -> bool:
        """The save at the cut is done, and with copies its copy committed (a commit after it)."""
        done = [json.loads(x) for x in trace.read_text().splitlines()] if trace.exists() else []
        at = [e["t"] for e in done if e["ev"] == "epoch" and e["epoch"] == cut_at]
        copies = (root / "resume" / "c1").glob("[0-9]*/RESUME.json")
        made = [json.loads(c.read_text())["committed"] for c in copies]
        return bool(at) and (not resume or any(t > at[0] for t in made))

    if not wait_until(at_cut, 60 + epochs * step * 2, 0.1):
        raise SystemExit("saved: the cell did not reach its cut")
    lag = None
    if resume:
        saved_t = next(e["t"] for e in map(json.loads, trace.read_text().splitlines())
                       if e["ev"] == "epoch" and e["epoch"] == cut_at)
        newest = max((json.loads(r.read_text()) for r in (root / "resume" / "c1").glob("[0-9]*/RESUME.json")),
                     key=lambda r: r["seq"])
        lag = newest["committed"] - saved_t
    pgid = json.loads((root / "heartbeats" / "h1.h1").read_text())["pgid"]
    os.killpg(pgid, signal.SIGKILL)  # the instance taken away, its disk with it
    wait_until(lambda: not group(pgid), 30, 0.05)
    shutil.rmtree(local)
    (proj / "faults" / "c1.hang").unlink()
    remediate(load_project(proj), launch=True)
    if not wait_until(lambda: [e for e in _ends(root) if e["rc"] == 0], 120 + epochs * step * 2, 0.1):
        raise SystemExit("saved: the re-run did not end")
    m = json.loads((root / "final_ckpts" / "c1" / "MANIFEST.json").read_text())
    again = proj / ".ablate" / "local" / m["host"] / "ckpt" / "c1" / "trace.jsonl"
    trained = sum(1 for x in again.read_text().splitlines() if json.loads(x)["ev"] == "epoch")
    [end] = [e for e in _ends(root) if e["rc"] == 0]
    _kill_server()
    return trained, float(end["dur"]), lag


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--step", type=float, default=2.0)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    walls: dict[bool, list[float]] = {True: [], False: []}
    redone: dict[bool, list[tuple[int, float, float | None]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as d:
        os.environ["HOME"] = d
        for rep in range(a.reps):
            for with_copies in ((True, False) if rep % 2 == 0 else (False, True)):
                os.environ["ABLATE_TMUX_SOCKET"] = f"ablate-bench-resume-{uuid.uuid4().hex[:8]}"
                wall = overhead(Path(d), with_copies, a.size_mb, a.epochs, a.step)
                walls[with_copies].append(wall)
                os.environ["ABLATE_TMUX_SOCKET"] = f"ablate-bench-resume-{uuid.uuid4().hex[:8]}"
                redone[with_copies].append(saved(Path(d), with_copies, a.epochs, a.step))
                got = redone[with_copies][-1]
                print(f"rep {rep} copies={with_copies}: overhead wall {wall:.2f} s; re-run trained "
                      f"{got[0]} epoch(s) in {got[1]:.2f} s", flush=True)
    on, off = median(walls[True]), median(walls[False])
    r_on = median([float(x[0]) for x in redone[True]]), median([x[1] for x in redone[True]])
    r_off = median([float(x[0]) for x in redone[False]]), median([x[1] for x in redone[False]])
    lag = median([x[2] for x in redone[True] if x[2] is not None])
    lines = ["## Resume copies: the trainer's overhead and the work a cut does not re-do", "",
             measured_line(f"python3 scripts/bench_resume.py --reps {a.reps} --size-mb {a.size_mb} "
                           f"--epochs {a.epochs} --step {a.step:g}") + f" ablate at {ablate_version()}.",
             "",
             f"Local project, real tmux and wrappers, the sweep's shared FS and each host's disk on this "
             f"machine's disk; medians of {a.reps}, the two ways alternated.", "",
             "| measure | with copies | `resume: false` | ratio |", "|:--|--:|--:|--:|",
             f"| a cell saving {a.size_mb} MB each of {a.epochs} epochs {a.step:g} s apart: its wall "
             f"time (s) | {on:.2f} | {off:.2f} | {on / off:.2f}x |",
             f"| a cell of {a.epochs} epochs of {a.step:g} s cut at 75 % with its disk: epochs the re-run "
             f"trained | {r_on[0]:.0f} | {r_off[0]:.0f} | {r_on[0] / max(r_off[0], 1):.2f}x |",
             f"| the same: the re-run's wall time (s) | {r_on[1]:.2f} | {r_off[1]:.2f} | "
             f"{r_on[1] / r_off[1]:.2f}x |",
             f"| the same: seconds from the save at the cut to its copy's commit | {lag:.2f} | - | - |"]
    publish("bench_resume", lines, not a.no_write)


if __name__ == "__main__":
    main()
