"""Split jobs of known cost over machines of known speed to minimise the makespan.

Uniform machines (a job of cost c takes c / speed on a machine): longest-processing-time first,
each job onto the machine that would finish it earliest, then a bounded local search that moves
or swaps one job off the machine that finishes last whenever that lowers the pair's later finish.
Pure arithmetic, deterministic (ties go to the faster machine, then the lower index), and
O(rounds * jobs-on-the-last-machine * machines * log) for the search, so a thousand jobs on fifty
machines take well under a second.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

MAX_ROUNDS = 1000  # each round strictly improves; real sweeps converge in a few dozen


def lower_bound(costs: Sequence[float], speeds: Sequence[float]) -> float:
    """No schedule finishes before this: all work at the total speed, or the largest job alone
    on the fastest machine."""
    if not costs or not speeds:
        return 0.0
    return max(sum(costs) / sum(speeds), max(costs) / max(speeds))


def balance(costs: Sequence[float], speeds: Sequence[float], max_rounds: int = MAX_ROUNDS) -> list[int]:
    """The machine index of each job. `speeds` must be positive."""
    m = len(speeds)
    if m == 0:
        raise ValueError("no machines to balance onto")
    assign = [0] * len(costs)
    load = [0.0] * m
    by_speed = sorted(range(m), key=lambda j: (-speeds[j], j))
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        j = min(by_speed, key=lambda j: (load[j] + costs[i]) / speeds[j])  # min keeps the first tie
        assign[i] = j
        load[j] += costs[i]
    _improve(costs, speeds, assign, load, max_rounds, lower_bound(costs, speeds))
    return assign


def _improve(costs: Sequence[float], speeds: Sequence[float], assign: list[int], load: list[float],
             max_rounds: int, bound: float) -> None:
    m = len(speeds)
    # Per machine, its jobs as a sorted list of (cost, job) so a swap partner is found by bisection.
    jobs: list[list[tuple[float, int]]] = [[] for _ in range(m)]
    for i, j in enumerate(assign):
        jobs[j].append((costs[i], i))
    for lst in jobs:
        lst.sort()

    for _ in range(max_rounds):
        last = max(range(m), key=lambda j: (load[j] / speeds[j], -j))
        f_last = load[last] / speeds[last]
        eps = 1e-9 * max(f_last, 1e-12)
        if f_last <= bound + eps:
            return
        best: tuple[float, int, int, int | None] | None = None  # (new pair max, job, to, swap job)
        s_l = speeds[last]
        for c, i in jobs[last]:
            rest = load[last] - c
            for j in range(m):
                if j == last:
                    continue
                s_j = speeds[j]
                moved = max(rest / s_l, (load[j] + c) / s_j)
                if moved < f_last - eps and (best is None or moved < best[0] - eps):
                    best = (moved, i, j, None)
                # Swap c for a smaller d on j: the best d balances the two finishes.
                lst = jobs[j]
                if not lst:
                    continue
                d_star = ((load[j] + c) / s_j - rest / s_l) / (1 / s_l + 1 / s_j)
                k = bisect.bisect_left(lst, (d_star, -1))
                below_c = bisect.bisect_left(lst, (c, -1)) - 1
                for idx in (k - 1, k, below_c):
                    if not 0 <= idx < len(lst) or lst[idx][0] >= c:
                        continue
                    d, other = lst[idx]
                    swapped = max((rest + d) / s_l, (load[j] - d + c) / s_j)
                    if swapped < f_last - eps and (best is None or swapped < best[0] - eps):
                        best = (swapped, i, j, other)
        if best is None:
            return
        _, job, to, partner = best
        _move(jobs, load, assign, costs, job, last, to)
        if partner is not None:
            _move(jobs, load, assign, costs, partner, to, last)


def _move(jobs: list[list[tuple[float, int]]], load: list[float], assign: list[int],
          costs: Sequence[float], i: int, src: int, dst: int) -> None:
    jobs[src].remove((costs[i], i))
    bisect.insort(jobs[dst], (costs[i], i))
    load[src] -= costs[i]
    load[dst] += costs[i]
    assign[i] = dst
