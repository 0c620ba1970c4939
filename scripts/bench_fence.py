#!/usr/bin/env python3
"""How soon a queue stops a cell that was run elsewhere meanwhile (the fence: ablate/remote/queue/
fence.py), with the default heartbeat (10 s), on real tmux with the real wrappers.

Each repetition deploys a throw-away local project and launches one queue whose cell waits forever
(a `while` loop on a marker file), then, once run_one has started:

- `released`: after a random part of a heartbeat, the claim is released as `ablate remediate`
  releases it (renamed to `released/<name>.<t>/`): the time from the rename to the cell's `end`;
- `paused`: the queue's tmux server and every process of the queue are SIGSTOPped (an instance
  paused when outbid), the claim released and taken by another queue's line meanwhile, `--pause`
  seconds pass, everything is SIGCONTed: the time from the thaw to the cell's `end`.

The figures are medians and maxima over `--reps` repetitions of each, with the heartbeat they are
bounded by.

    python3 scripts/bench_fence.py [--reps 5] [--pause 15] [--heartbeat 10] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (it puts this checkout on sys.path)

from benchlib import ablate_version, measured_line, median, publish, wait_until, write_project

from ablate.config.project import load_project
from ablate.remote.queue.defaults import HEARTBEAT_SECS
from ablate.run.launch import launch
from tests.helpers.proc import group, state


def end_of(shared: Path) -> dict[str, Any] | None:
    path = shared / "events" / "h1.q1.jsonl"
    if not path.exists():
        return None
    return next((e for e in map(json.loads, path.read_text().splitlines()) if e["ev"] == "end"), None)


def one(base: Path, kind: str, pause: float, heartbeat: int) -> tuple[float, dict[str, Any]]:
    """One repetition: seconds from the release (or the thaw) to the cell's `end`, and that end."""
    proj = base / uuid.uuid4().hex[:8]
    go = proj / "go"
    train = f"while [ ! -e {go} ]; do sleep 0.1; done; cat {{cfg}} > {{ckpt_dir}}/m.bin"
    write_project(proj, "fence", train=train,
                  artifacts={"checkpoint": "m.bin"}, tasks={"t": {"epochs": 1, "cost_per_epoch": 1.0}},
                  hosts={"h1": {"speed": 1.0}}, configs={"cut": "seed: 1\n"},
                  queues={"q1": ["configs/cut.yaml t 1"]}, stop_grace=5, heartbeat_secs=heartbeat,
                  budget={"ckpt_size": "1MB", "scratch": "1MB"})
    launch(load_project(proj), "q1", "h1")
    shared = proj / ".ablate" / "shared" / "ablate" / "fence"
    log = proj / ".ablate" / "local" / "h1" / "ckpt" / "cut.log"
    if not wait_until(lambda: log.exists() and "# ablate cmd:" in log.read_text(), 60, 0.05):
        raise SystemExit(f"the queue did not start its cell: {log}")
    claim = shared / "claims" / "cut"

    def release() -> None:
        t = f"{time.time():.6f}"
        (claim / "release.json").write_text(json.dumps({"t": float(t), "state": "lost"}) + "\n")
        (shared / "released").mkdir(exist_ok=True)
        os.rename(claim, shared / "released" / f"cut.{t}")

    if kind == "released":
        time.sleep(random.uniform(0, heartbeat))  # anywhere in the watcher's period
        release()
    else:
        pgid = json.loads((shared / "heartbeats" / "h1.q1").read_text())["pgid"]
        server = int(subprocess.run(["tmux", "-L", os.environ["ABLATE_TMUX_SOCKET"], "display-message", "-p",
                                     "#{pid}"], capture_output=True, text=True, check=True).stdout)
        os.kill(server, signal.SIGSTOP)  # first: tmux continues a pane's process that stops
        os.killpg(pgid, signal.SIGSTOP)
        try:
            wait_until(lambda: all(state(p) in ("T", "gone") for p in group(pgid)), 10, 0.05)
            release()
            claim.mkdir()
            (claim / "owner").write_text(f"h2 rq1-h2 0 {time.time():.6f} - elsewhere\n")
            time.sleep(pause)
        finally:
            os.killpg(pgid, signal.SIGCONT)
            os.kill(server, signal.SIGCONT)
    t0 = time.monotonic()
    if not wait_until(lambda: end_of(shared), 120, 0.02):
        raise SystemExit(f"{kind}: the cell was not stopped within 120 s")
    took = time.monotonic() - t0
    end = end_of(shared)
    assert end is not None and end.get("reason") == "superseded", end
    # The queue drains and ends by itself (its one cell is done): every process of it gone before
    # the server goes and the project is removed, so nothing writes into it while it is.
    pgid = json.loads((shared / "heartbeats" / "h1.q1").read_text())["pgid"]
    if not wait_until(lambda: not group(pgid), 60, 0.05):
        raise SystemExit(f"{kind}: the queue did not end after its cell was stopped")
    subprocess.run(["tmux", "-L", os.environ["ABLATE_TMUX_SOCKET"], "kill-server"], capture_output=True)
    return took, end


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pause", type=float, default=15.0)
    ap.add_argument("--heartbeat", type=int, default=HEARTBEAT_SECS, help="heartbeat_secs (ablate's default)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        os.environ["HOME"] = d
        for kind in ("released", "paused"):
            took = []
            for _ in range(args.reps):
                os.environ["ABLATE_TMUX_SOCKET"] = f"ablate-bench-fence-{uuid.uuid4().hex[:8]}"
                t, end = one(Path(d), kind, args.pause, args.heartbeat)
                took.append(t)
                print(f"{kind}: {t:.2f} s ({end.get('how')} by {end.get('by')}, away {end.get('away')} s)",
                      flush=True)
            rows.append(f"| {kind} | {args.reps} | {median(took):.2f} | {max(took):.2f} | "
                        f"{max(took) / args.heartbeat:.2f} |")
    lines = ["## The fence: how soon a superseded cell is stopped", "",
             measured_line(f"python3 scripts/bench_fence.py --reps {args.reps} --pause {args.pause:g}"
                           + (f" --heartbeat {args.heartbeat}" if args.heartbeat != HEARTBEAT_SECS else ""))
             + f" ablate {ablate_version()}.", "",
             f"One queue on real tmux with a heartbeat of {args.heartbeat} s, its cell waiting "
             "forever. `released`: the claim renamed as `ablate remediate` releases it, at a random "
             f"point of the watcher's period; seconds from the rename to the cell's `end`. `paused`: the "
             f"queue and its tmux server SIGSTOPped for {args.pause:g} s while the claim was released and "
             "taken by another queue, then SIGCONTed; seconds from the thaw to the cell's `end`.", "",
             "| case | runs | median (s) | max (s) | max / heartbeat |", "|:--|--:|--:|--:|--:|", *rows, "",
             "The watcher's wait is on the monotonic clock, which runs on while the box is paused: a "
             "queue thawed after more than a heartbeat checks at once, so `paused` is the check and "
             "the stop, not a heartbeat's wait."]
    publish("bench_fence", lines, not args.no_write)


if __name__ == "__main__":
    main()
