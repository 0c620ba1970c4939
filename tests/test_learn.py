"""The learned figures (`ablate.remote.learn`): per-host rate and fixed overhead, per-task scale of
the declared units, from the cells a sweep has finished; what a draining runner will steal by and
what scripts/bench_balance.py simulates with."""

from __future__ import annotations

import math
import random

import pytest

from ablate.remote.learn import DECLARED, learn_rates

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
