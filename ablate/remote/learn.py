"""What a sweep's own finished cells say about its hosts and tasks: the learned figures a draining
runner steals by (issue 13). Stdlib only: shipped to the instances with the probe (`ablate/remote/`)
and the same code `scripts/bench_balance.py` simulates with.

Contract. learn_rates(ended, declared_speeds, running=()) -> Rates
  ended: one (host, task, declared_cost, seconds) per cell that has ENDED (rc 0, not resumed),
    `host` the runner that ran it (the thief for a stolen cell; "host/slot" for a slot's runner);
    cost > 0, seconds > 0.
  declared_speeds: host -> declared speed (pins the free scale; the speed of an unseen host).
  running: (host, task, declared_cost, elapsed seconds) of the cells running now; used only for a
    host with no ended cell whose running cell is already past its prediction: that host's speed
    is lowered so the cell is predicted to take OVERDUE x its elapsed time.
  Rates.seconds(host, task, cost, declared_speed): the expected seconds of a cell on a host, by
    seconds = overhead[host] + cost * scale[task] / speed[host].
  Nothing ended -> speed = declared, scale 1, overhead 0 (the declared figures, in cost units).
  An unseen host: its declared speed (on the learned scale) and the pooled overhead; an unseen
  task: the pooled scale (geometric mean over the cells seen).

Fit: least squares on relative errors (weights 1/seconds^2: the noise is multiplicative), by
alternating closed forms, LEARN_ROUNDS rounds from overhead 0 and the declared speeds:
  1. per task: scale = sum(w x (y - o_h)) / sum(w x^2), x = cost / speed_h (through the origin);
  2. per host: intercept o_h and slope 1/speed_h of y on x = cost * scale_t, the intercept pulled
     towards the pooled overhead by OVERHEAD_PRIOR pseudo-observations (so a host with one cell,
     or cells of one size, keeps the pooled overhead), o_h within [0, 0.9 x its shortest cell];
  3. pooled overhead = weighted mean of y - x / speed_h, within [0, 0.9 x the shortest cell].
Then the free scale (every speed and scale times the same k) is pinned as in cost.py: the median
over the hosts seen of learned / declared speed is 1. O(LEARN_ROUNDS x cells), no iteration to
convergence (more rounds change nothing measurable here): a draining runner fits once per steal.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LEARN_ROUNDS = 8
OVERHEAD_PRIOR = 2.0
OVERDUE = 1.25  # a cell already past its prediction: expected to take this x its elapsed time

Observation = tuple[str, str, float, float]  # (host, task, declared cost, seconds)


@dataclass(frozen=True)
class Rates:
    speed: Mapping[str, float]  # hosts seen (or overdue), on the declared speeds' scale
    overhead: Mapping[str, float]  # hosts seen, seconds per cell
    scale: Mapping[str, float]  # tasks seen, seconds per declared unit on a speed-1.0 host
    pooled_scale: float
    pooled_overhead: float
    cells: int  # ended cells used; 0 = the declared figures

    def seconds(self, host: str, task: str, cost: float, declared_speed: float) -> float:
        return (self.overhead.get(host, self.pooled_overhead)
                + cost * self.scale.get(task, self.pooled_scale) / self.speed.get(host, declared_speed))


DECLARED = Rates({}, {}, {}, 1.0, 0.0, 0)


def learn_rates(ended: Sequence[Observation], declared: Mapping[str, float],
                running: Sequence[Observation] = (), rounds: int = LEARN_ROUNDS) -> Rates:
    if not ended:
        return DECLARED
    hosts = sorted({o[0] for o in ended})
    tasks = sorted({o[1] for o in ended})
    hi = {h: k for k, h in enumerate(hosts)}
    ti = {t: k for k, t in enumerate(tasks)}
    oh = [hi[o[0]] for o in ended]
    ot = [ti[o[1]] for o in ended]
    c = [o[2] for o in ended]
    y = [o[3] for o in ended]
    w = [1.0 / (v * v) for v in y]
    n = len(ended)
    by_host: list[list[int]] = [[] for _ in hosts]
    by_task: list[list[int]] = [[] for _ in tasks]
    for i in range(n):
        by_host[oh[i]].append(i)
        by_task[ot[i]].append(i)
    inv = [1.0 / declared.get(h, 1.0) for h in hosts]  # 1 / speed
    over = [0.0] * len(hosts)
    cap = [0.9 * min(y[i] for i in ix) for ix in by_host]
    pooled, pooled_cap = 0.0, 0.9 * min(y)
    scale = [1.0] * len(tasks)
    for _ in range(rounds):
        for t, ix in enumerate(by_task):
            num = sum(w[i] * c[i] * inv[oh[i]] * (y[i] - over[oh[i]]) for i in ix)
            scale[t] = num / sum(w[i] * (c[i] * inv[oh[i]]) ** 2 for i in ix)
        for h, ix in enumerate(by_host):
            x = [c[i] * scale[ot[i]] for i in ix]
            sw = sum(w[i] for i in ix)
            lam = OVERHEAD_PRIOR * sw / len(ix)
            sx = sum(w[i] * xi for i, xi in zip(ix, x, strict=True))
            sxx = sum(w[i] * xi * xi for i, xi in zip(ix, x, strict=True))
            sy = sum(w[i] * y[i] for i in ix) + lam * pooled
            sxy = sum(w[i] * xi * y[i] for i, xi in zip(ix, x, strict=True))
            det = (sw + lam) * sxx - sx * sx
            o = (sy * sxx - sx * sxy) / det if det > 1e-12 * (sw + lam) * sxx else pooled
            over[h] = o = min(max(o, 0.0), cap[h])
            inv[h] = sum(w[i] * xi * (y[i] - o) for i, xi in zip(ix, x, strict=True)) / sxx
        pooled = sum(w[i] * (y[i] - c[i] * scale[ot[i]] * inv[oh[i]]) for i in range(n)) / sum(w)
        pooled = min(max(pooled, 0.0), pooled_cap)
    pinned = [1.0 / (inv[hi[h]] * declared[h]) for h in hosts if h in declared]
    k = statistics.median(pinned) if pinned else 1.0
    counts = [len(ix) for ix in by_task]
    pooled_scale = math.exp(sum(math.log(s / k) * m for s, m in zip(scale, counts, strict=True)) / n)
    speed = {h: 1.0 / (inv[hi[h]] * k) for h in hosts}
    scales = {t: scale[ti[t]] / k for t in tasks}
    for host, task, cost, elapsed in running:
        if host in hi:
            continue
        work = cost * scales.get(task, pooled_scale)
        v = speed.get(host, declared.get(host, 1.0))
        if pooled + work / v < elapsed:
            speed[host] = work / max(OVERDUE * elapsed - pooled, 1e-9)
    return Rates(speed, {h: over[hi[h]] for h in hosts}, scales, pooled_scale, pooled, n)
