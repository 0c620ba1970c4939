#!/usr/bin/env python3
"""What a draining runner pays to learn before a steal: the learning step (`ablate/remote/queue/learn.py`,
run as `python3 learn.py ROOT`: the fit the runner's `drained` decision makes before its pick)
against a bare `python3 -c pass`, side by side, on sweeps whose events hold N ended cells.

Each size gets a throw-away sweep root: `estimates.tsv` with 8 runners and a `cell` and `cost` line
per cell (3 tasks), and per runner an events file with each of its cells' `start`, `synced` and
`end` (durations from a speed per runner, an overhead and a scale per task). Runs alternate helper
and bare python; the figures are medians of `--reps` runs each, and the helper's cost beyond
starting Python is their difference.

    python3 scripts/bench_learn.py [--cells 100,1000,5000] [--reps 9] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib (it puts this checkout on sys.path)

from benchlib import ablate_version, alternate, measured_line, publish

from ablate.run.deploy import packaged_learn

RUNNERS = 8


def sweep(root: Path, cells: int) -> int:
    """A sweep root whose events hold `cells` ended cells; returns the events' bytes."""
    (root / "events").mkdir(parents=True)
    rows = ["# ablate estimates 0 declared", *(f"host\th{i}\t-\t1000" for i in range(RUNNERS))]
    for c in range(cells):
        rows += [f"cell\tc{c}\t{1000 * (1 + c % 5)}", f"cost\tc{c}\tt{c % 3}\t{1 + c % 5}"]
    (root / "estimates.tsv").write_text("\n".join(rows) + "\n")
    size = 0
    for i in range(RUNNERS):
        ev = [{"ev": "queue_start", "host": f"h{i}", "queue": f"q{i}", "slot": None}]
        for c in range(i, cells, RUNNERS):
            where = {"host": f"h{i}", "queue": f"q{i}", "cell": f"c{c}"}
            dur = 3.0 + (1 + c % 5) * (0.5 + c % 3) / (0.6 + i / 8)
            ev += [{"ev": "start", **where, "resume": 0}, {"ev": "synced", **where},
                   {"ev": "end", **where, "rc": 0, "dur": round(dur, 3)}]
        path = root / "events" / f"h{i}.q{i}.jsonl"
        path.write_text("".join(json.dumps(e) + "\n" for e in ev))
        size += path.stat().st_size
    return size


def command(argv: list[str]) -> Callable[[int], Callable[[], None]]:
    """A way for `alternate`: run `argv`, which must exit 0."""
    def run() -> None:
        p = subprocess.run(argv, capture_output=True)
        if p.returncode != 0:
            raise SystemExit(f"{argv} exited {p.returncode}: {p.stderr.decode(errors='replace')[-300:]}")
    return lambda _r: run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", default="100,1000,5000")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    sizes = [int(x) for x in args.cells.split(",")]
    lines = ["## A draining runner's learning step", "",
             measured_line(f"python3 scripts/bench_learn.py --cells {args.cells} --reps {args.reps}")
             + f" ablate {ablate_version()}.", "",
             f"The learning helper run as run_queue runs it before a steal, on a sweep of {RUNNERS} "
             "runners whose events hold N ended cells, beside a bare `python3 -c pass` (medians of "
             f"{args.reps} alternating runs).", "",
             "| ended cells | events | helper (ms) | bare python (ms) | learning itself (ms) |",
             "|--:|--:|--:|--:|--:|"]
    with tempfile.TemporaryDirectory() as d:
        helper = Path(d) / "learn.py"
        helper.write_bytes(packaged_learn())
        for n in sizes:
            root = Path(d) / f"s{n}"
            size = sweep(root, n)
            got = alternate({"helper": command([sys.executable, str(helper), str(root)]),
                             "bare": command([sys.executable, "-c", "pass"])}, args.reps)
            ml, mb = got["helper"].median * 1000, got["bare"].median * 1000
            lines.append(f"| {n} | {size / 1024:.0f} KiB | {ml:.0f} | {mb:.0f} | {ml - mb:.0f} |")
    lines += ["", "It runs only when a queue has drained its own lines, once per steal; nothing of it "
              "is on a cell's path."]
    publish("bench_learn", lines, not args.no_write)


if __name__ == "__main__":
    main()
