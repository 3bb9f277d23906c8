"""Intervals and rule-based claims for a method against its baseline (Agarwal et al., NeurIPS
2021, "Deep RL at the edge of the statistical precipice": per-task intervals, a stratified
bootstrap over seeds, the probability of improvement).

Resampling is scipy.stats.bootstrap's (percentile method, two independent samples per task:
the method's seeds and the baseline's). The interval's ends are read from scipy's bootstrap
distribution as observed values (`inverted_cdf`), so that a resample whose median never
crosses (+inf) gives +inf instead of an interpolated NaN.

Censoring (runs that never reach the target are kept, not dropped): a run that never crosses
counts as +inf rollouts, and a median over seeds is +inf when at least half of them never
cross. The ratio of medians is then:

- the method's median is +inf: +inf (no saving can be shown);
- only the baseline's median is +inf: the method's median over the baseline's budget (its
  generated rollouts): the baseline needs more than its budget, so this is an upper bound
  of the true ratio, never an optimistic one.

The rollouts ratio's target (a fraction of the baseline's median gain) is itself estimated
from the baseline's runs, so its bootstrap resamples run indices and refits the target on
each resample (`crossing_ratio_interval`): the interval carries the target's uncertainty.

Over tasks, two resampling levels:

- hierarchical (the default, `HIERARCHICAL`): tasks are a sample of tasks. Each resample
  draws as many tasks as there are, with replacement, and for each drawn task one of that
  task's own bootstrap resamples over seeds, drawn independently, so a task drawn twice gets
  two resamples of its seeds (a two-stage bootstrap);
- stratified (`STRATIFIED`, as rliable's StratifiedBootstrap): seeds resampled within each
  task, the tasks fixed. Narrower, and it says nothing about tasks not run.

Claims follow `claim` (see its docstring) for one interval alone; a table of several methods
makes its claims with Holm's step-down control over them (bench/claims.py).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from replayrl.bench.robust import final_mean, trailing_means
from replayrl.bench.targets import HEADLINE

LEVEL = 0.9  # two-sided: 5% below, 5% above
RESAMPLES = 4000
NO_LOSS = 0.02  # "no loss": the final difference's lower end is at least -0.02
Pair = tuple[Sequence[float], Sequence[float]]  # (method's values, baseline's values)


SCIPY_MIN = (1, 15)  # scipy.stats.bootstrap takes `rng` (a Generator) from scipy 1.15 on


def scipy_version(text: str) -> tuple[int, int]:
    """(major, minor) of a version string such as `1.15.2`, `1.16.0rc1` or `1.17.0.dev0`."""
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"not a version: {text!r}")
    return int(match[1]), int(match[2])


def _stats() -> Any:
    """scipy.stats, or an ImportError that says what to install (no scipy, or one older than
    `SCIPY_MIN`, whose bootstrap would fail on the `rng` keyword)."""
    need = f"scipy>={SCIPY_MIN[0]}.{SCIPY_MIN[1]}"
    try:
        import scipy
        import scipy.stats
    except ImportError as exc:  # a clear message, not a bare ModuleNotFoundError
        raise ImportError(
            f"intervals need {need}: pip install 'replayrl[bench]' (or pip install '{need}')"
        ) from exc
    if scipy_version(scipy.__version__) < SCIPY_MIN:
        raise ImportError(
            f"intervals need {need} (scipy.stats.bootstrap's rng), found {scipy.__version__}: "
            f"pip install -U '{need}'"
        )
    return scipy.stats


def _median_ratio(v: np.ndarray, b: np.ndarray, budget: float) -> np.ndarray:
    """median(v) / median(b) over the last axis with the censoring rule of the module."""
    mv, mb = np.median(v, axis=-1), np.median(b, axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.isinf(mv), np.inf, mv / np.where(np.isinf(mb), budget, mb))


def ratio_of_medians(variant: Sequence[float], baseline: Sequence[float], budget: float) -> float:
    """Point estimate: the method's median rollouts to the target over the baseline's
    (+inf marks a run that never crossed; see the module docstring)."""
    v, b = _finite_or_inf(variant), _finite_or_inf(baseline)
    return float(_median_ratio(v, b, budget))


def _finite_or_inf(xs: Sequence[float]) -> np.ndarray:
    a = np.asarray([math.inf if x is None else float(x) for x in xs], dtype=float)
    if a.size == 0 or np.isnan(a).any():
        raise ValueError(f"need at least one value and no NaN, got {list(xs)}")
    return a


def _bootstrap(
    samples: list[np.ndarray],
    statistic: Callable[..., np.ndarray],
    n_resamples: int,
    seed: int,
) -> tuple[float, np.ndarray | None]:
    """(estimate, bootstrap distribution): scipy's bootstrap, each sample resampled on its
    own; the distribution is None when a sample has one value (nothing to resample)."""
    estimate = float(statistic(*samples, axis=-1))
    if any(s.size < 2 for s in samples):
        return estimate, None  # one run cannot be resampled: no interval
    if all(s.size == 1 or np.all(s == s[0]) for s in samples):
        return estimate, np.full(n_resamples, estimate)  # nothing varies
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # inf in a resample: scipy's own ends may be NaN
        res = _stats().bootstrap(
            tuple(samples),
            statistic,
            n_resamples=n_resamples,
            paired=False,
            vectorized=True,
            method="percentile",
            confidence_level=LEVEL,  # the ends are read from the distribution
            rng=np.random.default_rng(seed),
        )
    dist = np.asarray(res.bootstrap_distribution, dtype=float)
    return estimate, np.where(np.isnan(dist), np.inf, dist)  # undefined resample: the worse end


def ends(dist: np.ndarray | None, level: float) -> tuple[float, float]:
    """(low, high) of the two-sided `level` percentile interval of a bootstrap distribution,
    read as observed values (`inverted_cdf`: +inf stays +inf); NaN without a distribution."""
    if dist is None:
        return math.nan, math.nan
    alpha = (1 - level) / 2
    low = float(np.quantile(dist, alpha, method="inverted_cdf"))
    high = float(np.quantile(dist, 1 - alpha, method="inverted_cdf"))
    return low, high


def _interval(
    samples: list[np.ndarray],
    statistic: Callable[..., np.ndarray],
    level: float,
    n_resamples: int,
    seed: int,
) -> tuple[float, float, float]:
    """(estimate, low, high): scipy's percentile bootstrap, each sample resampled on its own."""
    estimate, dist = _bootstrap(samples, statistic, n_resamples, seed)
    return (estimate, *ends(dist, level))


def _as_dict(t: tuple[float, float, float]) -> dict[str, float]:
    return {"estimate": t[0], "low": t[1], "high": t[2]}


Curve = tuple[Sequence[float], Sequence[float]]  # (generated rollouts, accuracy) per evaluation


class _Runs:
    """One arm's runs as arrays: the running best of each run's trailing mean (a crossing of
    target T is the first evaluation where it is >= T) and the rollouts at each evaluation,
    padded to the longest run (-inf / +inf: never a crossing); each run's start and final."""

    def __init__(self, curves: Sequence[Curve]) -> None:
        if not curves:
            raise ValueError("need at least one run")
        width = max(len(x) for x, _ in curves)
        self.best = np.full((len(curves), width), -np.inf)
        self.rollouts = np.full((len(curves), width), np.inf)
        for i, (x, y) in enumerate(curves):
            if not len(y):
                raise ValueError(f"run {i} has no evaluations")
            if len(x) != len(y) or np.isnan(np.asarray(y, dtype=float)).any():
                raise ValueError(f"run {i}: need as many rollouts as accuracies, no NaN")
            means = np.nan_to_num(np.asarray(trailing_means(list(y)), dtype=float), nan=-np.inf)
            self.best[i, : len(y)] = np.maximum.accumulate(means)
            self.rollouts[i, : len(x)] = np.asarray(x, dtype=float)
        self.start = np.asarray([float(y[0]) for _, y in curves])
        self.final = np.asarray([final_mean(list(y)) for _, y in curves])

    def crossings(self, targets: np.ndarray) -> np.ndarray:
        """Rollouts at which each run's trailing mean first reaches each target (+inf:
        never), shape (*targets.shape, runs); `robust.smoothed_crossing`, vectorized."""
        hit = self.best >= np.asarray(targets, dtype=float)[..., None, None] - 1e-9
        first = hit.argmax(axis=-1)
        at = self.rollouts[np.arange(len(self.best)), first]
        return np.where(hit.any(axis=-1), at, np.inf)


def _refit_ratio(
    v: _Runs, b: _Runs, fraction: float, budget: float
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The ratio of medians as a function of resampled run indices: the target (the
    baseline's median start plus `fraction` of its median gain) is refit on each resample of
    the baseline's runs, so the interval carries the target's own uncertainty."""

    def ratio(vi: np.ndarray, bi: np.ndarray) -> np.ndarray:
        vi, bi = vi.astype(int), bi.astype(int)
        start = np.median(b.start[bi], axis=-1)
        target = start + fraction * (np.median(b.final[bi], axis=-1) - start)
        cv = np.take_along_axis(v.crossings(target), vi, axis=-1)
        cb = np.take_along_axis(b.crossings(target), bi, axis=-1)
        return _median_ratio(cv, cb, budget)

    return ratio


def _indices(*arms: _Runs) -> list[np.ndarray]:
    """What the bootstrap resamples: each arm's run indices (as floats, scipy's dtype)."""
    return [np.arange(len(a.best), dtype=float) for a in arms]


def crossing_ratio_distribution(
    variant: Sequence[Curve],
    baseline: Sequence[Curve],
    budget: float,
    fraction: float = HEADLINE,
    n_resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, np.ndarray | None]:
    """(estimate, bootstrap distribution) of `crossing_ratio_interval`'s ratio: what Holm's
    control and the hierarchical bootstrap over tasks read."""
    v, b = _Runs(variant), _Runs(baseline)
    f = _refit_ratio(v, b, fraction, budget)
    stat = lambda vi, bi, axis=-1: f(vi, bi)  # noqa: E731
    return _bootstrap(_indices(v, b), stat, n_resamples, seed)


def final_difference_distribution(
    variant: Sequence[float], baseline: Sequence[float], n_resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, np.ndarray | None]:
    """(estimate, bootstrap distribution) of `final_difference_interval`'s difference."""
    v, b = np.asarray(variant, dtype=float), np.asarray(baseline, dtype=float)
    stat = lambda v, b, axis=-1: v.mean(axis=axis) - b.mean(axis=axis)  # noqa: E731
    return _bootstrap([v, b], stat, n_resamples, seed)


def crossing_ratio_interval(
    variant: Sequence[Curve],
    baseline: Sequence[Curve],
    budget: float,
    fraction: float = HEADLINE,
    level: float = LEVEL,
    n_resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict[str, float]:
    """Ratio of median rollouts to the target (method / baseline) with a `level` interval.

    The target is the baseline's median start plus `fraction` of its median gain (the robust
    target of bench/robust.py); runs that never reach it are +inf (censored, see the module
    docstring). The bootstrap resamples both arms' runs and refits the target on each
    resample of the baseline, so the interval includes the target's uncertainty: a fixed
    target would treat the baseline's median final as known."""
    estimate, dist = crossing_ratio_distribution(
        variant, baseline, budget, fraction, n_resamples, seed
    )
    return _as_dict((estimate, *ends(dist, level)))


def final_difference_interval(
    variant: Sequence[float],
    baseline: Sequence[float],
    level: float = LEVEL,
    n_resamples: int = RESAMPLES,
    seed: int = 0,
) -> dict[str, float]:
    """Mean final accuracy (each run's mean of its last evaluations) of the method minus the
    baseline's, with a `level` interval."""
    estimate, dist = final_difference_distribution(variant, baseline, n_resamples, seed)
    return _as_dict((estimate, *ends(dist, level)))


def takeoff_interval(taken_off: int, runs: int, level: float = LEVEL) -> dict[str, float]:
    """Share of runs that take off, with the exact (Clopper-Pearson) binomial interval."""
    if not 0 <= taken_off <= runs or runs < 1:
        raise ValueError(f"need 0 <= taken_off <= runs and runs >= 1, got {taken_off}/{runs}")
    ci = _stats().binomtest(taken_off, runs).proportion_ci(confidence_level=level, method="exact")
    return {"estimate": taken_off / runs, "low": float(ci.low), "high": float(ci.high)}


def _prob_greater(v: np.ndarray, b: np.ndarray) -> np.ndarray:
    """P(X > Y) + P(X = Y) / 2 for X from v, Y from b (the Mann-Whitney U over n m)."""
    gt = (v[..., :, None] > b[..., None, :]).mean(axis=(-2, -1))
    eq = (v[..., :, None] == b[..., None, :]).mean(axis=(-2, -1))
    return gt + 0.5 * eq


def _per_task(
    pairs: list[Pair], f: Callable[[np.ndarray, np.ndarray], np.ndarray], over: str
) -> tuple[list[np.ndarray], Callable[..., np.ndarray]]:
    """Flattened samples [v1, b1, v2, b2, ...] and a statistic combining f over tasks."""
    if not pairs:
        raise ValueError("need at least one task")
    samples = [a for v, b in pairs for a in (_finite_or_inf(v), _finite_or_inf(b))]
    combine = np.median if over == "median" else np.mean

    def stat(*xs: np.ndarray, axis: int = -1) -> np.ndarray:
        vals = [f(xs[2 * i], xs[2 * i + 1]) for i in range(len(xs) // 2)]
        return combine(np.stack(vals, axis=0), axis=0)

    return samples, stat


def probability_of_improvement(
    pairs: list[Pair], level: float = LEVEL, n_resamples: int = RESAMPLES, seed: int = 0
) -> dict[str, float]:
    """Mean over tasks of P(method's final > baseline's final) (ties count half), with a
    stratified bootstrap interval over seeds (Agarwal et al. 2021, probability of
    improvement); 0.5: no difference."""
    samples, stat = _per_task(pairs, _prob_greater, "mean")
    return _as_dict(_interval(samples, stat, level, n_resamples, seed))


HIERARCHICAL = "hierarchical"  # tasks, then seeds within each drawn task
STRATIFIED = "stratified"  # seeds within each task, the tasks fixed
RESAMPLING = (HIERARCHICAL, STRATIFIED)


def hierarchical_distribution(
    estimates: Sequence[float],
    dists: Sequence[np.ndarray | None],
    combine: Callable[..., np.ndarray],
    seed: int = 0,
) -> tuple[float, np.ndarray | None]:
    """(estimate, distribution) of `combine` over tasks, tasks treated as a sample: each
    resample draws len(tasks) tasks with replacement and, for each draw, one of that task's
    own resamples over seeds (`dists[t]`), drawn independently of every other draw, so a task
    drawn twice contributes two different resamples of its seeds. The estimate is `combine`
    over the tasks' own estimates. None when a task has no distribution (one run)."""
    if not dists:
        raise ValueError("need at least one task")
    estimate = float(combine(np.asarray(estimates, dtype=float)))
    if any(d is None for d in dists):
        return estimate, None
    per_task = np.stack([np.asarray(d, dtype=float) for d in dists])  # (tasks, resamples)
    k, n = per_task.shape
    rng = np.random.default_rng([seed, k, n])  # its own stream, not the seeds' resamples'
    tasks = rng.integers(0, k, size=(n, k))
    inner = rng.integers(0, n, size=(n, k))
    with np.errstate(invalid="ignore"):
        dist = np.asarray(combine(per_task[tasks, inner], axis=1), dtype=float)
    return estimate, np.where(np.isnan(dist), np.inf, dist)


def _check_resampling(resampling: str) -> None:
    if resampling not in RESAMPLING:
        raise ValueError(f"resampling is one of {RESAMPLING}, got {resampling!r}")


def ratio_over_tasks_distribution(
    pairs: list[tuple[Sequence[Curve], Sequence[Curve]]],
    budgets: Sequence[float],
    fraction: float = HEADLINE,
    n_resamples: int = RESAMPLES,
    seed: int = 0,
    resampling: str = HIERARCHICAL,
) -> tuple[float, np.ndarray | None]:
    """(estimate, distribution) of the median over tasks of the per-task ratio of median
    rollouts to the target (the target refit on each resample, as in
    `crossing_ratio_interval`), resampled at `resampling`'s level (module docstring)."""
    _check_resampling(resampling)
    if len(budgets) != len(pairs):
        raise ValueError(f"{len(pairs)} tasks but {len(budgets)} budgets")
    if not pairs:
        raise ValueError("need at least one task")
    if resampling == HIERARCHICAL:
        per_task = [
            # each task its own seed: tasks with as many runs must not share resamples
            crossing_ratio_distribution(v, b, m, fraction, n_resamples, seed + i)
            for i, ((v, b), m) in enumerate(zip(pairs, budgets, strict=True))
        ]
        return hierarchical_distribution(
            [e for e, _ in per_task], [d for _, d in per_task], np.median, seed
        )
    arms = [(_Runs(v), _Runs(b)) for v, b in pairs]
    ratios = [_refit_ratio(v, b, fraction, m) for (v, b), m in zip(arms, budgets, strict=True)]

    def stat(*xs: np.ndarray, axis: int = -1) -> np.ndarray:
        vals = [f(xs[2 * i], xs[2 * i + 1]) for i, f in enumerate(ratios)]
        return np.median(np.stack(vals, axis=0), axis=0)

    samples = [a for v, b in arms for a in _indices(v, b)]
    return _bootstrap(samples, stat, n_resamples, seed)


def ratio_over_tasks_interval(
    pairs: list[tuple[Sequence[Curve], Sequence[Curve]]],
    budgets: Sequence[float],
    fraction: float = HEADLINE,
    level: float = LEVEL,
    n_resamples: int = RESAMPLES,
    seed: int = 0,
    resampling: str = HIERARCHICAL,
) -> dict[str, float]:
    """Median over tasks of the per-task ratio of median rollouts to the target, with a
    `level` interval resampled at `resampling`'s level (hierarchical: tasks, then seeds)."""
    estimate, dist = ratio_over_tasks_distribution(
        pairs, budgets, fraction, n_resamples, seed, resampling
    )
    return _as_dict((estimate, *ends(dist, level)))


def difference_over_tasks_distribution(
    pairs: list[Pair], n_resamples: int = RESAMPLES, seed: int = 0, resampling: str = HIERARCHICAL
) -> tuple[float, np.ndarray | None]:
    """(estimate, distribution) of the mean over tasks of the per-task final difference."""
    _check_resampling(resampling)
    if resampling == HIERARCHICAL:
        if not pairs:
            raise ValueError("need at least one task")
        per_task = [
            final_difference_distribution(
                _finite_or_inf(v), _finite_or_inf(b), n_resamples, seed + i
            )
            for i, (v, b) in enumerate(pairs)
        ]
        return hierarchical_distribution(
            [e for e, _ in per_task], [d for _, d in per_task], np.mean, seed
        )
    diff = lambda v, b: v.mean(axis=-1) - b.mean(axis=-1)  # noqa: E731
    samples, stat = _per_task(pairs, diff, "mean")
    return _bootstrap(samples, stat, n_resamples, seed)


def difference_over_tasks_interval(
    pairs: list[Pair],
    level: float = LEVEL,
    n_resamples: int = RESAMPLES,
    seed: int = 0,
    resampling: str = HIERARCHICAL,
) -> dict[str, float]:
    """Mean over tasks of the per-task final difference, with a `level` interval resampled
    at `resampling`'s level (hierarchical: tasks, then seeds)."""
    estimate, dist = difference_over_tasks_distribution(pairs, n_resamples, seed, resampling)
    return _as_dict((estimate, *ends(dist, level)))


def fewer_rollouts_factor(ratio_high: float) -> float | None:
    """The k of "k times fewer rollouts" the interval supports: the largest k (one decimal,
    rounded down) with upper end <= 1/k; None when it supports no k > 1."""
    if not math.isfinite(ratio_high) or ratio_high <= 0:
        return None
    k = math.floor(10 / ratio_high + 1e-9) / 10
    return k if k > 1 else None


def claim(ratio: dict[str, float] | None, difference: dict[str, float]) -> str:
    """The rule, printed under every table:

    - "k x fewer rollouts" only when the ratio interval's upper end is <= 1/k (k > 1);
    - "more rollouts" when its lower end is above 1;
    - "no loss" only when the final difference's lower end is >= -NO_LOSS;
    - "lower final" when its upper end is below 0;
    - otherwise "not resolved" for that part.
    """
    parts = []
    if ratio is not None:
        k = fewer_rollouts_factor(ratio["high"])
        if k is not None:
            parts.append(f"{k:g}x fewer rollouts")
        elif ratio["low"] > 1:
            parts.append("more rollouts")
        else:
            parts.append("saving not resolved")
    if difference["low"] >= -NO_LOSS - 1e-12:
        parts.append("no loss")
    elif difference["high"] < 0:
        parts.append("lower final")
    else:
        parts.append("loss not resolved")
    return "; ".join(parts)


RULE = (
    f'Claims: "k x fewer rollouts" only when the {LEVEL:.0%} interval of the rollouts ratio '
    'has its upper end <= 1/k; "more rollouts" when its lower end is above 1; "no loss" '
    f'only when the final difference\'s lower end is >= -{NO_LOSS:g}; "lower final" when its '
    "upper end is below 0; otherwise not resolved."
)


def placebo_consistent(ratio: dict[str, float], difference: dict[str, float]) -> bool | None:
    """A placebo (the baseline again on other sampling seeds) must look like noise: its ratio
    interval contains 1 and its final-difference interval contains 0 (None: no interval)."""
    if any(math.isnan(x) for x in (ratio["low"], difference["low"])):
        return None
    return ratio["low"] <= 1 <= ratio["high"] and difference["low"] <= 0 <= difference["high"]
