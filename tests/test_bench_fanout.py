"""Smoke test of scripts/bench_fanout.py: it builds test beds, launches, asks status and prints the
table (tiny sizes, no file written; the figures themselves are not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.testbed import missing_requirement

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_fanout.py"


def test_bench_fanout_runs_and_prints_the_table() -> None:
    reason = missing_requirement()
    if reason:
        pytest.skip(reason)
    bench = SCRIPT.parent.parent / "docs" / "BENCHMARKS.md"
    before = bench.read_bytes() if bench.exists() else None
    p = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "1,2", "--reps", "1", "--no-write"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = [line for line in p.stdout.splitlines() if line.startswith("| ")]
    assert [r.split("|")[1].strip() for r in rows] == ["hosts", "1", "2"]
    assert (bench.read_bytes() if bench.exists() else None) == before
