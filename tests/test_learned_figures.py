"""The learned figures (`ablate.remote.queue.learn`): per-host rate and fixed overhead, per-task scale of
the declared units, from the cells a sweep has finished; what a draining runner will steal by and
what scripts/bench_balance.py simulates with."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from ablate.remote.queue.learn import DECLARED, learn_rates

TRUE_SPEED = {"a": 1.0, "b": 0.5, "c": 1.6}
TRUE_OVER = 3.0
TRUE_SCALE = {"recon": 2.0, "det": 0.5}


def seconds(host: str, task: str, cost: float) -> float:
    return TRUE_OVER + cost * TRUE_SCALE[task] / TRUE_SPEED[host]


def observations(noise: float = 0.0, seed: int = 1) -> list[tuple[str, str, float, float]]:
    rng = random.Random(seed)
    out = []
    for host in TRUE_SPEED:
        for task in TRUE_SCALE:
            for cost in (1.0, 2.5, 4.0, 8.0):
                out.append((host, task, cost, seconds(host, task, cost) * math.exp(noise * rng.gauss(0, 1))))
    return out


def test_nothing_finished_means_the_declared_figures() -> None:
    r = learn_rates([], {"a": 1.0})
    assert r is DECLARED and r.cells == 0
    assert r.seconds("a", "recon", 4.0, 2.0) == 2.0  # declared cost / declared speed


def test_exact_history_is_predicted_exactly_whatever_was_declared() -> None:
    """Declared speeds wrong by up to 1.6x: with every host having run cells of several sizes, the
    predictions of cells not seen match the truth (the free scale does not matter to them)."""
    declared = {"a": 1.6, "b": 0.5, "c": 1.0}
    r = learn_rates(observations(), declared)
    assert r.cells == 24
    for host in TRUE_SPEED:
        for task in TRUE_SCALE:
            want = seconds(host, task, 5.5)
            assert r.seconds(host, task, 5.5, declared[host]) == pytest.approx(want, rel=0.02)
    assert all(o == pytest.approx(TRUE_OVER, rel=0.05) for o in r.overhead.values())


def test_noisy_history_lands_near_the_truth_and_unseen_task_and_host_fall_back() -> None:
    declared = {"a": 1.0, "b": 0.5, "c": 1.6, "d": 1.0}
    r = learn_rates(observations(noise=0.2), declared)
    for host in TRUE_SPEED:
        got = r.seconds(host, "recon", 6.0, declared[host])
        assert got == pytest.approx(seconds(host, "recon", 6.0), rel=0.25)
    # an unseen host: its declared speed and the pooled overhead; an unseen task: the pooled scale
    d = r.seconds("d", "recon", 6.0, declared["d"])
    assert d == pytest.approx(r.pooled_overhead + 6.0 * r.scale["recon"] / 1.0)
    assert r.seconds("a", "new", 2.0, 1.0) == pytest.approx(
        r.overhead["a"] + 2.0 * r.pooled_scale / r.speed["a"])


def test_a_silent_host_past_its_prediction_is_slowed() -> None:
    declared = {"a": 1.0, "b": 0.5, "c": 1.6, "slow": 1.0}
    base = learn_rates(observations(), declared)
    expected = base.seconds("slow", "recon", 4.0, 1.0)
    r = learn_rates(observations(), declared, running=[("slow", "recon", 4.0, 3 * expected)])
    assert r.seconds("slow", "recon", 4.0, 1.0) == pytest.approx(1.25 * 3 * expected, rel=0.01)
    # one within its prediction changes nothing
    same = learn_rates(observations(), declared, running=[("slow", "recon", 4.0, 0.5 * expected)])
    assert same.seconds("slow", "recon", 4.0, 1.0) == pytest.approx(expected)


# --------------------------------------------------------------------------- the runner's helper


def _estimates() -> str:
    rows = ["# ablate estimates 0 declared", "host\ta\t-\t1000", "host\tb\t0\t1000", "host\tb\t1\t1000"]
    for task in TRUE_SCALE:
        for cost in (1.0, 2.5, 4.0, 8.0):
            rows += [f"cell\t{task}{cost}\t{int(cost * 1000)}", f"cost\t{task}{cost}\t{task}\t{cost}"]
    rows += ["cell\tnew\t3000", "cost\tnew\trecon\t3", "cell\tbare\t700"]
    return "\n".join(rows) + "\n"


def _events(runners: dict[tuple[str, str, int | None], str]) -> list[dict[str, object]]:
    """Every cell of _estimates ended once on each runner (host, queue, slot) at the true speed
    of `runners[...]` (a TRUE_SPEED key), plus records the fit must not use."""
    out: list[dict[str, object]] = []
    for (host, queue, slot), like in runners.items():
        out.append({"ev": "queue_start", "host": host, "queue": queue, "slot": slot})
        for task in TRUE_SCALE:
            for cost in (1.0, 2.5, 4.0, 8.0):
                cell = f"{task}{cost}"
                out += [{"ev": "start", "host": host, "queue": queue, "cell": cell, "resume": 0},
                        {"ev": "end", "host": host, "queue": queue, "cell": cell, "rc": 0,
                         "dur": seconds(like, task, cost)}]
        # A failed cell, a resumed one (its duration is a part) and a cell without declared cost.
        out += [{"ev": "start", "host": host, "queue": queue, "cell": "new", "resume": 0},
                {"ev": "end", "host": host, "queue": queue, "cell": "new", "rc": 1, "dur": 0.1},
                {"ev": "start", "host": host, "queue": queue, "cell": "new", "resume": 1},
                {"ev": "end", "host": host, "queue": queue, "cell": "new", "rc": 0, "dur": 0.1},
                {"ev": "end", "host": host, "queue": queue, "cell": "bare", "rc": 0, "dur": 0.1}]
    return out


def _rows(text: str) -> dict[tuple[str, ...], int]:
    return {tuple(f[:-1]): int(f[-1]) for f in (line.split("\t") for line in text.splitlines())
            if f[0] in ("host", "over", "cell")}


def test_the_runner_figures_are_learned_per_runner_from_the_ended_cells() -> None:
    """Host a at speed 1.0, b's slot 0 at 0.5 and its slot 1 at 1.6 (all declared 1.0): the learned
    file has each runner's speed on the declared scale, its overhead, and each cell's seconds at
    speed 1 from its task's scale; failed, resumed and cost-less records are not used, a cell
    without a cost line keeps the controller's figure."""
    from ablate.remote.queue.learn import learned_text

    text = learned_text(_estimates(), _events({("a", "q1", None): "a", ("b", "q2", 0): "b",
                                               ("b", "q3", 1): "c"}), 0.0)
    assert text is not None and text.startswith("# ablate estimates 0 learned-by-runner 24\n")
    got = _rows(text)
    speeds = {k[1:]: v for k, v in got.items() if k[0] == "host"}
    # the free scale is pinned by the median runner: a (1.0) stays near 1000 (a fit of 8 rounds)
    want = {("a", "-"): 1000, ("b", "0"): 500, ("b", "1"): 1600}
    assert set(speeds) == set(want) and all(abs(speeds[k] / v - 1) < 0.01 for k, v in want.items()), speeds
    assert all(abs(v / (TRUE_OVER * 1000) - 1) < 0.05 for k, v in got.items() if k[0] == "over"), got
    for cell, ms in (("recon4.0", 8000), ("det2.5", 1250), ("new", 6000)):
        assert abs(got[("cell", cell)] / ms - 1) < 0.02, (cell, got)
    assert got[("cell", "bare")] == 700, got


def test_the_runner_helper_says_nothing_learned_before_any_cell_ends(tmp_path: Path) -> None:
    """The shipped file run as run_queue runs it: exit 3 (keep the controller's file) while no cell
    has ended; the learned text once one has; exit 2 on a missing estimates file."""
    import json
    import subprocess
    import sys

    from ablate.run.deploy import packaged_learn

    helper = tmp_path / "learn.py"
    helper.write_bytes(packaged_learn())
    root = tmp_path / "root"
    (root / "events").mkdir(parents=True)

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(helper), str(root)], capture_output=True, text=True)

    assert run().returncode == 2
    (root / "estimates.tsv").write_text(_estimates())
    partial = '{"ev": "queue_start", "host": "a", "queue": "q1"}\n{"ev": "sta'  # a line being appended
    (root / "events" / "a.q1.jsonl").write_text(partial)
    assert run().returncode == 3
    with open(root / "events" / "a.q1.jsonl", "a") as f:
        f.write("\n" + "".join(json.dumps(e) + "\n" for e in _events({("a", "q1", None): "a"})))
    p = run()
    assert p.returncode == 0 and abs(_rows(p.stdout)[("host", "a", "-")] - 1000) <= 10, p
