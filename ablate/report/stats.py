"""The statistics of the grouped ablation table, in the standard library alone (scipy is not a
dependency): mean and sample standard deviation over a group's seeds, and the difference of two
groups' means with Welch's confidence interval (unequal variances, Welch-Satterthwaite degrees of
freedom, Student-t quantile).

The t quantile inverts the t CDF by Newton steps kept inside a bisection bracket; the CDF is the
regularized incomplete beta function I_x(df/2, 1/2), evaluated by its continued fraction (modified
Lentz), as in Numerical Recipes 6.4.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

LEVEL = 0.95  # the confidence level of every interval in the report
_NORMAL_DF = 1e7  # beyond this many degrees of freedom the t quantile is the normal one (< 1e-7 off)


def _beta_cf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 100_000):
        for aa in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            return h
    raise ArithmeticError(f"incomplete beta: no convergence for a={a}, b={b}, x={x}")


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
                     + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):  # the fraction converges fast on this side; else by symmetry
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def t_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` (> 0, not necessarily whole) degrees of freedom, t >= 0."""
    return 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))


def t_cdf(t: float, df: float) -> float:
    tail = t_tail(abs(t), df)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (df > 0, may be fractional)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    if df >= _NORMAL_DF:
        return statistics.NormalDist().inv_cdf(p)
    want = 1.0 - p  # solve P(T > t) = 1 - p on the tail, which keeps its precision far out
    lo, hi = 0.0, 2.0
    while t_tail(hi, df) > want:
        lo, hi = hi, hi * 2.0
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    t = (lo + hi) / 2.0
    for _ in range(200):  # Newton on the tail (its slope is -pdf), bisection when it leaves [lo, hi]
        f = t_tail(t, df) - want
        if f > 0:
            lo = t
        else:
            hi = t
        pdf = math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))
        step = t + f / pdf if pdf > 0 else hi + 1.0
        t_next = step if lo < step < hi else (lo + hi) / 2.0
        if abs(t_next - t) <= 1e-14 * max(1.0, t) or hi - lo <= 1e-14 * hi:
            return t_next
        t = t_next
    return t


@dataclass(frozen=True)
class Summary:
    """One metric over one group's cells that have it."""

    n: int
    mean: float | None  # None when n == 0
    std: float | None  # the sample standard deviation (n - 1); None when n < 2

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        xs = [float(v) for v in values]
        if not xs:
            return cls(0, None, None)
        return cls(len(xs), statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else None)


@dataclass(frozen=True)
class Diff:
    """A group's mean minus the baseline group's mean, with Welch's interval at `LEVEL` when both
    groups have n >= 2 and some spread; else `why` says what is missing."""

    delta: float
    low: float | None = None
    high: float | None = None
    df: float | None = None  # Welch-Satterthwaite degrees of freedom
    se: float | None = None  # the standard error of the difference
    why: str | None = None  # why there is no interval

    @property
    def excludes_zero(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)


def welch(group: Summary, base: Summary, level: float = LEVEL) -> Diff | None:
    """group - base with Welch's confidence interval; None when either mean is unknown."""
    if group.mean is None or base.mean is None:
        return None
    delta = group.mean - base.mean
    if group.std is None or base.std is None:
        why = f"n={group.n}" if group.std is None else f"baseline n={base.n}"
        return Diff(delta, why=why)
    v1, v2 = group.std ** 2 / group.n, base.std ** 2 / base.n
    se = math.sqrt(v1 + v2)
    if se == 0.0:
        return Diff(delta, se=0.0, why="std 0")
    df = (v1 + v2) ** 2 / (v1 ** 2 / (group.n - 1) + v2 ** 2 / (base.n - 1))
    half = t_quantile(0.5 + level / 2.0, df) * se
    return Diff(delta, delta - half, delta + half, df, se)
