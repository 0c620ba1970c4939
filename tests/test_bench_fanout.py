"""Smoke test of scripts/bench_fanout.py: on a 2-instance test bed it launches and asks status at
first contact, over new connections and reused ones, runs GNU parallel, takes one host down and
prints both tables (one repetition, no file written; the figures themselves are not asserted)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testbed import missing_requirement

pytestmark = pytest.mark.bed  # tests/helpers/tiers.py

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_fanout.py"


def test_bench_fanout_runs_and_prints_the_table() -> None:
    reason = missing_requirement()
    if reason:
        pytest.skip(reason)
    if shutil.which("parallel") is None:
        pytest.skip("bench_fanout compares against GNU parallel: apt-get install parallel "
                    "(scripts/test.sh does)")
    bench = SCRIPT.parent.parent / "docs" / "BENCHMARKS.md"
    before = bench.read_bytes() if bench.exists() else None
    p = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "2", "--reps", "1", "--no-write",
                        "--connect-timeout", "3"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in p.stdout.splitlines()
            if line.startswith("| 2 |")]
    commands = [r[1] for r in rows if len(r) == 9]
    assert commands == ["`ablate status`, new connections (host agents running)",
                        "`ablate launch --all`, fresh sweep, right after that status",
                        "`ablate status` re-run (connections reused)",
                        "`ablate status --json` re-run (connections reused)",
                        "one `ablate status --watch` refresh (median of its 2nd-6th)",
                        "`ablate status`, first contact (no connection, no agent)",
                        "`ablate launch --all`, fresh sweep, first contact",
                        "`parallel -j0 ssh {} true`, new connections",
                        "OpenSSH alone, ablate's way: `ssh -M -N -f`, then `true` through it, per host",
                        "`ablate --version` (process start, no SSH)",
                        "`python3 -c pass`, this machine's site and its .pth hooks",
                        "`python3 -S -c pass` (no site)"], p.stdout
    main = {r[1]: r for r in rows if len(r) == 9}
    targets = {"`ablate status` re-run (connections reused)": "<= 0.15x",
               "`ablate status --json` re-run (connections reused)": "<= 0.15x",
               "one `ablate status --watch` refresh (median of its 2nd-6th)": "<= 0.15x",
               "`ablate launch --all`, fresh sweep, first contact": "<= 1.25x"}
    assert {k: r[5] for k, r in main.items() if r[5] != "-"} == targets, p.stdout
    assert all(main[k][6] in ("PASS", "FAIL") for k in targets), p.stdout
    assert float(main["one `ablate status --watch` refresh (median of its 2nd-6th)"][2]) > 0, p.stdout
    # busy CPU-seconds of the command's processes and of the instances' (NaN: no cgroup to count in;
    # a --watch refresh is one step of a process that also sleeps: none)
    cpu = [(float(r[7]), float(r[8])) for k, r in main.items() if "--watch" not in k]
    assert all(c > 0 and h > 0 for c, h in cpu[:8]) or all(c != c for c, _ in cpu), p.stdout
    # where the time goes: the parts add up to the wall time, and a status asks each host once
    parts = {r[1]: [float(x) for x in r[2:]] for r in rows if len(r) == 12}
    assert set(parts) == {"`ablate status --json` re-run (connections reused)",
                          "`ablate status` re-run (connections reused)",
                          "`ablate status`, new connections (host agents running)",
                          "`ablate launch --all`, fresh sweep, first contact",
                          "`ablate status`, first contact (no connection, no agent)"}, p.stdout
    for label, (wall, served, start, config, to_trips, trips, span, probe, after, end) in parts.items():
        # the warm-up started the command server: every kept run was handed to it (ablate/cmdserver)
        assert served == 1, (label, p.stdout)
        assert min(start, config, to_trips, span, probe, after, end) >= 0 and trips >= 2, (label, p.stdout)
        assert abs(start + config + to_trips + span + after + end - wall) < 0.02, (label, p.stdout)
        assert 0 < probe <= span, (label, p.stdout)
    dead = [r for r in rows if len(r) == 10]
    assert len(dead) == 3 and all(r[9] in ("PASS", "FAIL") for r in dead), p.stdout
    assert "traced `launch --all`" in p.stdout and "traced `status` (warm)" in p.stdout, p.stdout
    assert (bench.read_bytes() if bench.exists() else None) == before
