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

Fit: the mean duration, by iteratively reweighted least squares with weights 1 / predicted^2 (the
noise is multiplicative: a Gamma-type quasi-likelihood, whose fixed point is unbiased for the MEAN
of lognormal noise, where weighting by the observed 1 / seconds^2 would sit exp(1.5 sigma^2) below
the median), by alternating closed forms, at most LEARN_ROUNDS rounds from overhead 0 and the
declared speeds (stopping once no figure moves by 1e-7 relative):
  1. per task: scale = sum(w x (y - o_h)) / sum(w x^2), x = cost / speed_h (through the origin);
  2. per host: intercept o_h and slope 1/speed_h of y on x = cost * scale_t, the intercept pulled
     towards the pooled overhead by OVERHEAD_PRIOR pseudo-observations (so a host with one cell,
     or cells of one size, keeps the pooled overhead), o_h within [0, 0.9 x its shortest cell];
  3. pooled overhead = weighted mean of y - x / speed_h, within [0, 0.9 x the shortest cell];
  4. w = 1 / (o_h + x / speed_h)^2 for the next round.
Outliers (a stuck run, a cell killed and restarted by hand): with 3 or more cells, a cell whose
log(seconds / predicted) is beyond 3 robust sigma (1.4826 x MAD) of the median and a factor 2 is
left out and the rest refitted; the residuals of all cells are taken again against the refit (a
cell the skewed first fit left out comes back), at most OUTLIER_PASSES refits. Then the free
scale (every speed and scale times the same k) is pinned: the median over the hosts seen of
learned / declared speed is 1, so when most hosts run as declared they keep their declared speed
and the odd one out is learned. O(rounds x cells): a draining runner fits once per steal, the
controller (`ablate.plan.cost`: plan, status, estimates.tsv) once per command.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

LEARN_ROUNDS = 30  # an upper bound: the fit stops when it has converged (a few rounds)
OVERHEAD_PRIOR = 2.0
OUTLIER_PASSES = 3  # refits at most, each on the cells the last fit does not call outliers
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
    outliers: int = 0  # ended cells left out of the fit
    host_cells: Mapping[str, int] = field(default_factory=dict)  # cells used, per host
    task_cells: Mapping[str, int] = field(default_factory=dict)  # cells used, per task

    def seconds(self, host: str, task: str, cost: float, declared_speed: float) -> float:
        return (self.overhead.get(host, self.pooled_overhead)
                + cost * self.scale.get(task, self.pooled_scale) / self.speed.get(host, declared_speed))


DECLARED = Rates({}, {}, {}, 1.0, 0.0, 0)
_MIN_OUTLIER = math.log(2.0)  # never call a run an outlier for being within 2x of the fit
_TOL = 1e-7


def median(values: Sequence[float]) -> float:
    """statistics.median's answer, without its import (fractions, decimal: ~3 ms of every start)."""
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def learn_rates(ended: Sequence[Observation], declared: Mapping[str, float],
                running: Sequence[Observation] = (), rounds: int = LEARN_ROUNDS) -> Rates:
    if not ended:
        return DECLARED
    fit, kept = _Fit(ended, declared, rounds), list(ended)
    for _ in range(OUTLIER_PASSES if len(ended) >= 3 else 0):
        # Residuals of every cell against the current fit: a cell left out by a fit that the
        # outlier itself had skewed comes back once the refit no longer is.
        resid = [math.log(o[3] / fit.predict(o)) if o[0] in fit.hi and o[1] in fit.ti else math.inf
                 for o in ended]
        med = median(resid)
        limit = max(3 * 1.4826 * median([abs(r - med) for r in resid]), _MIN_OUTLIER)
        now = [o for o, r in zip(ended, resid, strict=True) if abs(r - med) <= limit]
        if not now or now == kept:
            break
        fit, kept = _Fit(now, declared, rounds), now
    hosts, tasks, n = fit.hosts, fit.tasks, len(kept)
    pinned = [1.0 / (fit.inv[k] * declared[h]) for k, h in enumerate(hosts) if h in declared]
    k = median(pinned) if pinned else 1.0
    counts = [len(ix) for ix in fit.by_task]
    pooled_scale = math.exp(sum(math.log(s / k) * m for s, m in zip(fit.scale, counts, strict=True)) / n)
    speed = {h: 1.0 / (fit.inv[i] * k) for i, h in enumerate(hosts)}
    scales = {t: fit.scale[i] / k for i, t in enumerate(tasks)}
    for host, task, cost, elapsed in running:
        if host in fit.hi:
            continue
        work = cost * scales.get(task, pooled_scale)
        v = speed.get(host, declared.get(host, 1.0))
        if fit.pooled + work / v < elapsed:
            speed[host] = work / max(OVERDUE * elapsed - fit.pooled, 1e-9)
    return Rates(speed, {h: fit.over[i] for i, h in enumerate(hosts)}, scales, pooled_scale, fit.pooled, n,
                 len(ended) - n, {h: len(ix) for h, ix in zip(hosts, fit.by_host, strict=True)},
                 dict(zip(tasks, counts, strict=True)))


class _Fit:
    """The alternating fit of the module docstring on one set of cells (unpinned)."""

    def __init__(self, ended: Sequence[Observation], declared: Mapping[str, float], rounds: int) -> None:
        self.hosts = hosts = sorted({o[0] for o in ended})
        self.tasks = tasks = sorted({o[1] for o in ended})
        self.hi = hi = {h: k for k, h in enumerate(hosts)}
        self.ti = ti = {t: k for k, t in enumerate(tasks)}
        oh = [hi[o[0]] for o in ended]
        ot = [ti[o[1]] for o in ended]
        c = [o[2] for o in ended]
        y = [o[3] for o in ended]
        w = [1.0 / (v * v) for v in y]
        n = len(ended)
        by_host: list[list[int]] = [[] for _ in hosts]
        by_task: list[list[int]] = [[] for _ in tasks]
        self.by_host, self.by_task = by_host, by_task
        for i in range(n):
            by_host[oh[i]].append(i)
            by_task[ot[i]].append(i)
        self.inv = inv = [1.0 / declared.get(h, 1.0) for h in hosts]  # 1 / speed
        self.over = over = [0.0] * len(hosts)
        cap = [0.9 * min(y[i] for i in ix) for ix in by_host]
        pooled, pooled_cap = 0.0, 0.9 * min(y)
        self.scale = scale = [1.0] * len(tasks)
        for _ in range(rounds):
            before = [*scale, *inv, *over]
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
            w = [1.0 / max(over[oh[i]] + c[i] * scale[ot[i]] * inv[oh[i]], 1e-9) ** 2 for i in range(n)]
            if all(abs(a - b) <= _TOL * max(abs(a), abs(b), 1e-9)
                   for a, b in zip(before, [*scale, *inv, *over], strict=True)):
                break
        self.pooled = pooled

    def predict(self, o: Observation) -> float:
        h, t = self.hi[o[0]], self.ti[o[1]]
        return max(self.over[h] + o[2] * self.scale[t] * self.inv[h], 1e-9)


# --------------------------------------------------------------------------- a draining runner's figures
#
# What the runner's steal decision fits before its pick (`ablate/remote/queue/runner.py`, `drained`), and
# `python3 learn.py ROOT` prints (scripts/bench_learn.py times it): reads ROOT/estimates.tsv (the
# controller's: `host H SLOT SPEED_MILLI`, `cell NAME MS`, `cost NAME TASK UNITS`) and the sweep's
# events (ROOT/events/*.jsonl, one read), fits `learn_rates` on the cells that ended (rc 0, not
# resumed) with the estimates' speeds as the declared ones, and prints the same format with the
# learned figures: each runner's speed, `over H SLOT MS` (its fixed seconds per cell) and each
# cell's MS = UNITS x its task's scale (seconds x 1000 on a speed-1.0 runner). A runner is
# `H SLOT` (SLOT `-` without one). Exit 3 when nothing has ended yet: the steal then goes by the
# controller's file.


def runner_key(host: str, slot: object) -> str:
    return f"{host} {'-' if slot is None or slot == '' else slot}"


def read_estimates(text: str) -> tuple[dict[str, float], dict[str, int], dict[str, tuple[str, float]]]:
    """(runner -> declared speed, cell -> ms, cell -> (task, declared units)) of an estimates file."""
    speeds: dict[str, float] = {}
    cells: dict[str, int] = {}
    costs: dict[str, tuple[str, float]] = {}
    for line in text.splitlines():
        f = line.split("\t")
        try:
            if f[0] == "host" and len(f) == 4:
                speeds[f"{f[1]} {f[2]}"] = int(f[3]) / 1000
            elif f[0] == "cell" and len(f) == 3:
                cells[f[1]] = int(f[2])
            elif f[0] == "cost" and len(f) == 4 and float(f[3]) > 0:
                costs[f[1]] = (f[2], float(f[3]))
        except ValueError:
            continue
    return speeds, cells, costs


def ended_cells(events: Sequence[Mapping[str, object]],
                costs: Mapping[str, tuple[str, float]]) -> list[Observation]:
    """One observation per cell that ended with rc 0 from a start without resume, on its runner."""
    slots: dict[tuple[object, object], object] = {}
    resumed: dict[tuple[object, object, object], object] = {}
    out: list[Observation] = []
    for e in events:
        where = (e.get("host"), e.get("queue"))
        ev = e.get("ev")
        if ev == "queue_start":
            slots[where] = e.get("slot")
        elif ev == "start":
            resumed[(*where, e.get("cell"))] = e.get("resume")
        elif ev == "end" and e.get("rc") == 0:
            cell, dur = e.get("cell"), e.get("dur")
            if (not isinstance(cell, str) or cell not in costs or not isinstance(dur, (int, float))
                    or dur <= 0 or resumed.get((*where, cell)) not in (0, "0")):
                continue
            task, units = costs[cell]
            out.append((runner_key(str(where[0]), slots.get(where)), task, units, float(dur)))
    return out


def learned_text(estimates: str, events: Sequence[Mapping[str, object]], now: float) -> str | None:
    """The learned estimates file (module section above); None when nothing has ended."""
    speeds, cells, costs = read_estimates(estimates)
    ended = ended_cells(events, costs)
    if not ended or not speeds:
        return None
    r = learn_rates(ended, speeds)
    rows = [f"# ablate estimates {int(now)} learned-by-runner {r.cells}"]
    for key, declared in speeds.items():
        host, slot = key.split(" ", 1)
        rows.append(f"host\t{host}\t{slot}\t{max(1, round(r.speed.get(key, declared) * 1000))}")
        rows.append(f"over\t{host}\t{slot}\t{round(r.overhead.get(key, r.pooled_overhead) * 1000)}")
    for name in sorted(set(cells) | set(costs)):
        if name in costs:
            task, units = costs[name]
            ms = max(1, round(units * r.scale.get(task, r.pooled_scale) * 1000))
        else:
            ms = cells[name]
        rows.append(f"cell\t{name}\t{ms}")
    return "".join(row + "\n" for row in rows)


def read_events(root: str) -> list[Mapping[str, object]]:
    """Every event of the sweep (`events/*.jsonl`), one read each; a torn or damaged line is skipped."""
    import glob
    import json
    import os

    events: list[Mapping[str, object]] = []
    for path in sorted(glob.glob(os.path.join(root, "events", "*.jsonl"))):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue  # a line being appended, or damaged: never fatal
                    if isinstance(e, dict):
                        events.append(e)
        except OSError:
            continue
    return events


def main(argv: Sequence[str]) -> int:
    import os
    import sys
    import time

    if len(argv) != 1:
        print("usage: learn.py SWEEP_ROOT", file=sys.stderr)
        return 2
    root = argv[0]
    try:
        with open(os.path.join(root, "estimates.tsv"), encoding="utf-8") as f:
            estimates = f.read()
    except OSError as err:
        print(f"learn: {err}", file=sys.stderr)
        return 2
    text = learned_text(estimates, read_events(root), time.time())
    if text is None:
        return 3
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    import sys as _sys

    raise SystemExit(main(_sys.argv[1:]))
