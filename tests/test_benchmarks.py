"""Smoke tests of the benchmark scripts (scripts/bench_*.py): each runs at a tiny size against the
real code it measures and prints its table; none writes docs/BENCHMARKS.md with --no-write. The
figures are not asserted (they are not timed tests), only what holds at any size: a makespan is
never below its lower bound, every cell is verified, the table has its rows."""

from __future__ import annotations

import importlib.util
import math
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import slurmbed
from tests.testbed import missing_requirement

REPO = Path(__file__).resolve().parent.parent
BENCH_MD = REPO / "docs" / "BENCHMARKS.md"


@pytest.fixture(autouse=True)
def _docs_untouched() -> Iterator[None]:
    before = BENCH_MD.read_bytes() if BENCH_MD.exists() else None
    yield
    assert (BENCH_MD.read_bytes() if BENCH_MD.exists() else None) == before


def run(script: str, *args: str, timeout: float = 120) -> str:
    p = subprocess.run([sys.executable, str(REPO / "scripts" / script), *args, "--no-write"],
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def rows(out: str) -> list[list[str]]:
    """The body rows of the printed markdown table, as cells."""
    table = [line for line in out.splitlines() if line.startswith("| ")]
    return [[c.strip().strip("*") for c in line.strip("|").split("|")] for line in table[1:]]


BALANCE_ROWS = ["round-robin", "waves", "pull queue", "static plan", "plan+steal",
                "variant: plan+steal, first fit", "variant: plan+steal, last fit",
                "variant: plan+steal, cfg order",
                "reference: pull, fastest first", "learned: plan+steal, last fit",
                "learned: plan+steal, first fit", "learned: plan+steal, min-max",
                "reference: plan+steal, min-max, true medians"]


def test_bench_balance_simulates_every_policy_in_both_worlds() -> None:
    # 4 sweeps per world: what is asserted holds for every sweep, and 4 is the fewest that two worker
    # processes split (run_parallel runs one process below 2 per job).
    out = run("bench_balance.py", "--sweeps", "4", "--sigmas", "0,0.3", "--jobs", "2")
    exact_out, mis_out = out.split("misspecified world:")
    exact, mis = rows(exact_out), rows(mis_out)
    for body in (exact, mis):
        assert [r[0] for r in body] == BALANCE_ROWS
        assert all(len(r) == 5 for r in body)  # mean and p90 for each of the two sigmas
        # no schedule beats the lower bound (in the misspecified world: the exact fractional optimum)
        assert all(float(x) >= 1.0 for r in body for x in r[1:])
    static, steal = exact[3], exact[4]
    # With exact estimates a steal only happens when the thief finishes before the victim would:
    # it never lengthens the makespan.
    assert float(steal[1]) <= float(static[1]) and float(steal[2]) <= float(static[2])
    assert "static plan mean at sigma=0:" in exact_out and "plan+steal at sigma=0.3:" in exact_out
    assert "learned: plan+steal, min-max at sigma=0.3:" in mis_out and "best learned rule" in mis_out
    # The worker processes only split the sweeps: one process prints the same figures.
    assert run("bench_balance.py", "--sweeps", "4", "--sigmas", "0,0.3", "--jobs", "1") == out


def test_bench_gate_compares_what_the_deal_knows_on_the_same_sweeps() -> None:
    spec = importlib.util.spec_from_file_location("bench_gate", REPO / "scripts" / "bench_gate.py")
    assert spec and spec.loader
    gate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate)
    labels = [row[0] for row in gate.ROWS]
    # 4 sweeps (the fewest two worker processes split) of a seed whose first four have few hosts and
    # cells (the simulation's cost), three of them with 8 or more cells per host and one with fewer, so
    # both sides of that split are checked. What is asserted holds on every sweep of any seed.
    sweeps = ("--sweeps", "4", "--seed", "213")
    out = run("bench_gate.py", *sweeps, "--jobs", "1")
    head, errors = out.split("| cells ended per host |")
    body = rows(head)
    assert [r[0] for r in body] == labels
    # no schedule beats the lower bound, on every sweep and on either side of 8 cells per host
    assert all(float(x) >= 1.0 for r in body for x in (r[1], r[2], *r[4:]) if x != "nan")
    assert all(x != "nan" for r in body for x in r[4:])  # these sweeps have both sides (see above)
    assert all(r[3] in ("met", "MISSED") for r in body)
    buckets = rows("| cells ended per host |" + errors)
    assert len(buckets) == 7 and sum(int(r[1]) for r in buckets) > 0
    assert all(float(r[2]) >= 0 for r in buckets if r[1] != "0")
    # the worker processes only split the sweeps: the same figures (the header line has the time)
    assert rows(run("bench_gate.py", *sweeps, "--jobs", "2")) == rows(out)


def test_bench_overhead_runs_cells_through_the_real_wrappers() -> None:
    out = run("bench_overhead.py", "--cells", "4", "--reps", "1")
    body = rows(out)
    assert [r[0] for r in body] == ["bare command", "through run_queue + run_one", "overhead"]
    bare, wrapped, overhead = (float(r[1]) for r in body)
    assert 0 < bare < wrapped and overhead == pytest.approx(wrapped - bare, abs=0.11)
    assert "ms per cell (target <= 100 ms:" in out


@pytest.mark.tmux
def test_bench_fence_stops_a_released_and_a_thawed_cell() -> None:
    out = run("bench_fence.py", "--reps", "1", "--pause", "1", "--heartbeat", "1", timeout=180)
    body = rows(out)
    assert [r[0] for r in body] == ["released", "paused"] and all(r[1] == "1" for r in body)
    assert all(float(r[2]) > 0 for r in body)


@pytest.mark.tmux
def test_bench_resume_measures_the_overhead_and_the_work_a_cut_does_not_redo() -> None:
    out = run("bench_resume.py", "--reps", "1", "--size-mb", "4", "--epochs", "4", "--step", "0.3",
              timeout=240)
    body = {r[0].split(":")[-1].strip(): r[1:] for r in rows(out)}
    redone = body["epochs the re-run trained"]
    assert float(redone[0]) == 1 and float(redone[1]) == 4, out  # cut at epoch 3 of 4: 1 left with copies
    assert float(body["seconds from the save at the cut to its copy's commit"][0]) > 0, out


def test_bench_learn_times_the_shipped_helper_beside_bare_python() -> None:
    out = run("bench_learn.py", "--cells", "20,40", "--reps", "1")
    body = rows(out)
    assert [r[0] for r in body] == ["20", "40"], out
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in body), out


def test_bench_reconcile_verifies_real_checkpoints_and_compares_with_cat() -> None:
    out = run("bench_reconcile.py", "--small", "6", "--large", "2", "--large-mb", "1",
              "--large-format", "torch", "--reps", "1")
    body = rows(out)
    assert [(r[0].split(":")[0], r[1]) for r in body] == [
        ("small (safetensors)", "cold"), ("small (safetensors)", "warm"),
        ("large (torch)", "cold"), ("large (torch)", "warm")]
    assert [r[0].split(": ")[1].split(" cells")[0] for r in body] == ["6", "6", "2", "2"]
    assert all(float(r[2].replace(",", "")) > 0 and float(r[3].replace(",", "")) > 0 for r in body)
    assert "large files, cold: reconcile at" in out and "of the cat rate, the disk's limit (target" in out


@pytest.mark.bed
def test_bench_testbed_plans_launches_and_measures() -> None:
    reason = missing_requirement()
    if reason:
        pytest.skip(reason)
    out = run("bench_testbed.py", "--cells", "4", "--scale", "0.2", "--policies", "steal", timeout=240)
    body = rows(out)
    assert [r[0] for r in body] == ["plan + stealing"]
    ratio, makespan, bound = float(body[0][1]), float(body[0][3]), float(body[0][4])
    # makespan and bound are printed to 0.1 s, the ratio to 0.001: compare within that rounding
    assert 0 < bound <= makespan and ratio >= 1.0
    assert (makespan - 0.05) / (bound + 0.05) - 0.001 <= ratio <= (makespan + 0.05) / (bound - 0.05) + 0.001
    assert "plan + stealing: makespan / lower bound" in out


@pytest.mark.bed
def test_bench_autostop_stops_each_host_after_its_idle_time() -> None:
    reason = missing_requirement()
    if reason:
        pytest.skip(reason)
    out = run("bench_autostop.py", "--reps", "1", "--cell", "1", "--idle", "3", "--heartbeat", "1",
              timeout=240)
    body = {r[0]: r[1:] for r in rows(out)}
    auto = float(body["idle billed with autostop (last work → stop)"][0].split()[0])
    assert 2.0 <= auto <= 3.0 + 60.0, out
    assert "premature stops: 0 of 3" in out and "**PASS**" in out


def test_bench_testbed_peer_mode_draws_its_world_and_tabulates_without_a_bed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pure parts of `bench_testbed.py --peer parallel` (the bed and GNU parallel are too slow
    for a smoke test: each side runs 24 real PyTorch start-ups)."""
    spec = importlib.util.spec_from_file_location("bench_testbed", REPO / "scripts" / "bench_testbed.py")
    assert spec is not None and spec.loader is not None
    bt = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_testbed", bt)  # its dataclasses look their module up
    spec.loader.exec_module(bt)
    declared = {"h1": 1.0, "h2": 0.6, "h3": 1.4}
    world = bt.draw_world(declared, 24, 2.5, 0.4, 7, (0.6, 1.6), False)
    assert world == bt.draw_world(declared, 24, 2.5, 0.4, 7, (0.6, 1.6), False)  # seeded
    assert world != bt.draw_world(declared, 24, 2.5, 0.4, 8, (0.6, 1.6), False)
    assert all(0.6 * declared[h] - 1e-3 <= s <= 1.6 * declared[h] + 1e-3 for h, s in world.true.items())
    base = 2.5 / statistics.fmean(c.units for c in world.cells)
    assert all(base / 2 - 1e-3 <= s <= base * 2 + 1e-3 for s in world.scale.values())
    assert len({c.name for c in world.cells}) == 24
    assert all(c.name.endswith(f"-{c.task}-e{c.epochs}") for c in world.cells)
    c = world.cells[0]
    assert world.train_seconds(c, "h2") == pytest.approx(
        c.units * world.scale[c.task] * math.exp(0.4 * c.z) / world.true["h2"])
    compile(bt.TRAINER, "train.py", "exec")  # the trainer the instances run is valid Python

    def side(way: str, makespan: float, wall: float) -> object:
        return bt.Side(way, makespan, wall, 0.5, {}, 10.0, ["x"] if way == "ablate" else [])

    pairs = [(side("ablate", 45.0, 46.0), side("parallel", 50.0, 50.0)),
             (side("ablate", 60.0, 61.0), side("parallel", 50.0, 50.0)),
             (side("ablate", 40.0, 41.0), side("parallel", 50.0, 50.0))]
    body = rows("\n".join(bt.peer_tables([world] * 3, pairs, ["ablate", "parallel", "ablate"])))
    assert [r[0] for r in body] == ["0", "1", "2", "median"]
    assert [r[5] for r in body] == ["0.900", "1.200", "0.800", "0.900"]  # makespan ratios, median
    assert [r[8] for r in body] == ["0.920", "1.220", "0.820", "0.920"]  # wall ratios, median
    verdicts = bt.peer_verdicts(pairs, "the next sweep, ")
    assert verdicts[0].startswith("the next sweep, makespan ablate / parallel 0.900") and "met" in verdicts[0]
    assert "0.920" in verdicts[1] and "met" in verdicts[1]
    assert "MISSED" in bt.peer_verdicts(pairs[1:2], "")[0] and bt.peer_verdicts([], "x") == []


@pytest.mark.bed
def test_bench_slurm_runs_the_sweep_both_ways_on_the_slurm_bed() -> None:
    reason = slurmbed.missing_requirement()
    if reason:
        pytest.skip(reason)
    out = run("bench_slurm.py", "--cells", "4", "--reps", "1", "--no-faults", timeout=180)
    body = rows(out)
    assert [(r[0], r[1]) for r in body] == [("clean", "ablate"), ("clean", "array")]
    for r in body:
        makespan, drained = float(r[2]), float(r[4])
        # 4 cells of 3-6 epochs at 0.6 s each on 3 slots: the longest cell alone sleeps >= 1.8 s
        assert 1.8 <= makespan <= drained
        assert r[7] == "4/4"  # every cell's training completed exactly once, by its own trace
    # the ratio is of the unrounded medians: it lies within what the shown figures (0.1 s) allow
    (ma, mb), ratio = (float(r[2]) for r in body), float(body[0][6].rstrip("x"))
    assert (ma - 0.05) / (mb + 0.05) - 0.005 <= ratio <= (ma + 0.05) / (mb - 0.05) + 0.005
    assert "#SBATCH --array=0-3%3" in out


def test_bench_store_uploads_through_ablate_and_boto3_side_by_side() -> None:
    out = run("bench_store.py", "--size", "5MB", "--reps", "1", "--no-aws-cli", timeout=240)
    body = rows(out)
    assert [r[0].split(":")[0] for r in body] == ["boto3 alone", "ablate", "ablate, read back"], out
    assert all(float(r[1]) > 0 for r in body) and body[0][3] == "1.00"


def test_bench_store_requests_counts_each_kind_at_the_wire() -> None:
    out = run("bench_store_requests.py", "--cells", "2", "--hold", "2", "--heartbeat", "1", timeout=300)
    body = {r[0]: r[1:] for r in rows(out)}
    cell = body["per cell (claim, pulls, events, upload, commit)"]
    assert float(cell[0]) >= 5 and float(cell[3]) >= 1, out  # PUTs: claim, uploads, commit; LISTs: a pull
    assert float(body["per queue-hour while a cell trains (heartbeat_secs 1)"][0]) > 0, out
    assert body["controller: status, nothing new (2 cells)"][1] == "0", out  # nothing new: nothing read
    assert any(k.startswith("a sweep of 1000") for k in body), out
