"""Intervals and claims against the baseline: hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("scipy")

from replayrl.bench.intervals import (  # noqa: E402
    claim,
    crossing_ratio_interval,
    difference_over_tasks_interval,
    fewer_rollouts_factor,
    final_difference_interval,
    hierarchical_distribution,
    placebo_consistent,
    probability_of_improvement,
    ratio_of_medians,
    ratio_over_tasks_interval,
    takeoff_interval,
)
from replayrl.bench.robust import smoothed_crossing, trailing_means  # noqa: E402

INF = math.inf


def test_ratio_of_medians_censors_instead_of_dropping() -> None:
    # medians 200 / 300
    assert ratio_of_medians([100, 200, INF], [200, 300, 400], 1000) == pytest.approx(2 / 3)
    # dropping the never-crossing runs would give median 100: a saving that is not there
    assert ratio_of_medians([INF, INF, 100], [200, 300, 400], 1000) == INF
    # only the baseline's median never crosses: divided by its budget (an upper bound)
    assert ratio_of_medians([100, 100, 100], [INF, INF, 100], 1000) == pytest.approx(0.1)
    assert ratio_of_medians([INF, INF], [INF, INF], 1000) == INF
    with pytest.raises(ValueError, match="no NaN"):
        ratio_of_medians([math.nan], [1.0], 10)


def test_final_difference_interval_two_point_sample() -> None:
    # method [1, 3]: a resampled mean is 1, 2 or 3 with probability 1/4, 1/2, 1/4; the
    # baseline [2, 2] always 2: differences -1, 0, +1, so the 5% and 95% ends are -1 and +1
    d = final_difference_interval([1.0, 3.0], [2.0, 2.0], n_resamples=4000, seed=1)
    assert d == {"estimate": 0.0, "low": -1.0, "high": 1.0}
    const = final_difference_interval([0.5, 0.5], [0.4, 0.4])
    assert const["estimate"] == pytest.approx(0.1)
    assert const["low"] == pytest.approx(0.1) and const["high"] == pytest.approx(0.1)


def jump(first_one: int, evals: int = 8, every: float = 100) -> tuple[list, list]:
    """A run evaluated every `every` rollouts from 0: accuracy 0, then 1 from evaluation
    `first_one` on; its 3-eval trailing mean reaches 0.9 at (first_one + 2) x every."""
    ones = max(0, evals - first_one)
    return [i * every for i in range(evals)], [0.0] * (evals - ones) + [1.0] * ones


def test_crossing_ratio_interval_keeps_never_as_infinite_upper_end() -> None:
    # the baseline's runs are alike (start 0, final 1: target 0.9 on every resample) and
    # cross at 400; the method's at 300, 400 and never. Medians of 3 resampled from
    # [300, 400, inf]: inf with P(at least 2 of 3 draws are inf) = 7/27 > 5%
    never = ([i * 100.0 for i in range(8)], [0.0] * 8)
    r = crossing_ratio_interval([jump(1), jump(2), never], [jump(2)] * 3, 1000, seed=2)
    assert r["estimate"] == pytest.approx(1.0)
    assert r["high"] == INF
    assert r["low"] == pytest.approx(0.75)  # at least two draws 300: 7/27 > 5%


def test_crossing_ratio_interval_refits_the_target_on_each_baseline_resample() -> None:
    # evaluations every 100 rollouts; trailing means (3 evals):
    #   baseline b1 [0, 1, ...]:   0.667 at 200, 1 from 300 on; final 1
    #   baseline b2 [0, .5, ...]:  0.333 at 200, 0.5 from 300 on; final 0.5
    #   method (both runs) [0, .7, ...]: 0.467 at 200, 0.7 from 300 on
    x = [i * 100.0 for i in range(6)]
    b1, b2, m = (x, [0.0] + [1.0] * 5), (x, [0.0] + [0.5] * 5), (x, [0.0] + [0.7] * 5)
    r = crossing_ratio_interval([m, m], [b1, b2], 500, seed=4)
    # full sample: median final 0.75, target 0.675: method crosses at 300, baseline's median
    # of [300, never] is never, so the ratio is 300 over its budget 500
    assert r["estimate"] == pytest.approx(0.6)
    # baseline resamples: {b1, b2} (1/2) as above, 0.6; {b2, b2} (1/4): target 0.45, 200 over
    # 300; {b1, b1} (1/4): target 0.9, the method never gets there: +inf. A fixed target
    # (0.675) would give 1/4 of 300 / 300 and 3/4 of 0.6: the interval [0.6, 1.0]
    assert r["low"] == pytest.approx(0.6)
    assert r["high"] == INF


def random_curves(rng: np.random.Generator, runs: int) -> list[tuple[list, list]]:
    """Runs of 1-11 evaluations at irregular rollouts (not multiples of anything), accuracies
    continuous or on a coarse grid (many ties)."""
    out = []
    for _ in range(runs):
        n = int(rng.integers(1, 12))
        x = np.cumsum(rng.uniform(0.1, 137.3, n)).tolist()
        y = rng.uniform(0, 1, n) if rng.random() < 0.5 else rng.integers(0, 5, n) / 4
        out.append((x, y.tolist()))
    return out


def test_vectorized_crossing_is_smoothed_crossing_on_random_curves() -> None:
    # the bootstrap's crossings (padded arrays, running best of the trailing mean) must be
    # robust.smoothed_crossing's for any curves: runs of different lengths and grids, runs
    # shorter than the 3-eval window (never), targets on a trailing mean and within or just
    # outside its 1e-9 tolerance
    from replayrl.bench.intervals import _Runs

    rng = np.random.default_rng(7)
    for _ in range(300):
        curves = random_curves(rng, int(rng.integers(1, 6)))
        means = [m for _, y in curves for m in trailing_means(y) if not math.isnan(m)]
        targets = [*rng.uniform(-0.1, 1.1, 4), *means, *(m + 5e-10 for m in means)]
        targets += [m + 2e-9 for m in means]
        got = _Runs(curves).crossings(np.asarray(targets))
        want = [[smoothed_crossing(x, y, t) for x, y in curves] for t in targets]
        assert got.tolist() == want


def test_ratio_estimate_is_the_ratio_of_medians_at_the_full_sample_target() -> None:
    # the point estimate is the old one: the ratio of the medians of each run's crossing of
    # the baseline's robust target (median start + 0.9 median gain, finals of the last 3)
    from replayrl.bench.robust import robust_gain_targets

    rng = np.random.default_rng(11)
    for _ in range(40):
        v = random_curves(rng, int(rng.integers(1, 6)))
        b = random_curves(rng, int(rng.integers(1, 6)))  # one run: an estimate, no interval
        evals = [
            [{"rollouts_generated": x, "eval/accuracy": y} for x, y in zip(*c, strict=True)]
            for c in b
        ]
        runs = [{"evals": e} for e in evals]
        target = robust_gain_targets(runs)["targets"][0.9]
        cross = [[smoothed_crossing(x, y, target) for x, y in arm] for arm in (v, b)]
        r = crossing_ratio_interval(v, b, 777.0, n_resamples=50, seed=1)
        assert r["estimate"] == ratio_of_medians(*cross, 777.0)


def test_takeoff_interval_is_clopper_pearson() -> None:
    # exact ends at 90%: 0 of 5 -> [0, 1 - 0.05^(1/5)], 5 of 5 -> [0.05^(1/5), 1]
    none = takeoff_interval(0, 5)
    assert none["low"] == 0.0 and none["high"] == pytest.approx(1 - 0.05 ** (1 / 5))
    every = takeoff_interval(5, 5)
    assert every["low"] == pytest.approx(0.05 ** (1 / 5)) and every["high"] == 1.0
    assert takeoff_interval(3, 5)["estimate"] == 0.6
    with pytest.raises(ValueError):
        takeoff_interval(6, 5)


def test_probability_of_improvement_counts_ties_half() -> None:
    # task 1: 1 > 0.5 and 2 > 0.5: P = 1; task 2: 0.3 vs 0.3 ties: P = 0.5; mean 0.75
    p = probability_of_improvement([([1.0, 2.0], [0.5, 0.5]), ([0.3, 0.3], [0.3, 0.3])])
    assert p["estimate"] == pytest.approx(0.75)
    assert p["low"] == pytest.approx(0.75) and p["high"] == pytest.approx(0.75)
    p2 = probability_of_improvement([([1.0, 2.0], [1.5, 1.5])], seed=3)
    assert p2["estimate"] == pytest.approx(0.5)  # one of two above
    assert p2["low"] == 0.0 and p2["high"] == 1.0  # resamples [1, 1] and [2, 2]: 1/4 each


def test_over_tasks_figures() -> None:
    # per task (alike runs: fixed targets): 300 / 600, 300 / 300, 150 / 600
    pairs = [
        ([jump(1)] * 2, [jump(4)] * 2),
        ([jump(1)] * 2, [jump(1)] * 2),
        ([jump(1, every=50)] * 2, [jump(4)] * 2),
    ]
    # seeds alike: resampling seeds within the tasks moves nothing (stratified), resampling
    # the tasks themselves does (hierarchical: three draws of {0.5, 1, 0.25})
    r = ratio_over_tasks_interval(pairs, [1000, 1000, 1000], resampling="stratified")
    assert r == {"estimate": 0.5, "low": 0.5, "high": 0.5}  # median of 0.5, 1, 0.25
    r = ratio_over_tasks_interval(pairs, [1000, 1000, 1000])
    assert r == {"estimate": 0.5, "low": 0.25, "high": 1.0}
    d = difference_over_tasks_interval([([0.6, 0.6], [0.5, 0.5]), ([0.5, 0.5], [0.5, 0.5])])
    assert d["estimate"] == pytest.approx(0.05)
    with pytest.raises(ValueError):
        ratio_over_tasks_interval(pairs, [1000])


def test_over_tasks_pairs_each_task_with_its_own_curves_and_budget() -> None:
    # baselines of 2 evaluations never have a 3-eval mean (never), start 0, final 0.5:
    # target 0.45, so the ratio is the method's crossing over that task's own budget. Method
    # jump(k) reaches 0.45 at (k + 1) x 100: task 1 200 / 400, task 2 400 / 1000; median of
    # two 0.45 (budgets swapped: 200 / 1000 and 400 / 400, 0.6). Run counts differ per arm.
    short = ([0.0, 100.0], [0.0, 1.0])
    pairs = [([jump(1)] * 2, [short] * 3), ([jump(3)] * 4, [short] * 2)]
    r = ratio_over_tasks_interval(pairs, [400, 1000], n_resamples=200, resampling="stratified")
    assert r["estimate"] == pytest.approx(0.45)
    assert r["low"] == pytest.approx(0.45) and r["high"] == pytest.approx(0.45)
    # tasks resampled: {0.5, 0.5}, {0.4, 0.4} or one of each, medians 0.5, 0.4, 0.45
    r = ratio_over_tasks_interval(pairs, [400, 1000], n_resamples=200)
    assert r["estimate"] == pytest.approx(0.45)
    assert r["low"] == pytest.approx(0.4) and r["high"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="resampling is one of"):
        ratio_over_tasks_interval(pairs, [400, 1000], resampling="tasks")


def test_hierarchical_draws_tasks_then_an_independent_seed_resample_for_each_draw() -> None:
    n = 8000
    # task 0's seed resamples are all 0, task 1's all 1: a resample's mean over two drawn
    # tasks is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4 (tasks drawn with replacement)
    est, dist = hierarchical_distribution([0.0, 1.0], [np.zeros(n), np.ones(n)], np.mean, seed=3)
    assert est == 0.5 and dist is not None and dist.shape == (n,)
    shares = [np.mean(dist == v) for v in (0.0, 0.5, 1.0)]
    assert shares == pytest.approx([0.25, 0.5, 0.25], abs=0.03)
    # two alike tasks: each draw takes its own resample of the seeds, so the mean of two
    # draws has half a resample's variance (one resample shared by both draws: all of it)
    d = np.random.default_rng(0).normal(size=n)
    _, dist = hierarchical_distribution([0.0, 0.0], [d, d], np.mean, seed=1)
    assert np.var(dist) == pytest.approx(np.var(d) / 2, rel=0.1)
    # a task without a distribution (one run): no interval over the tasks either
    assert hierarchical_distribution([0.0, 1.0], [np.zeros(n), None], np.mean)[1] is None


def test_claims_follow_the_rule() -> None:
    assert fewer_rollouts_factor(0.5) == 2.0
    assert fewer_rollouts_factor(0.34) == 2.9  # 1 / 0.34 = 2.94, rounded down
    assert fewer_rollouts_factor(0.96) is None  # 1.04 rounds down to 1.0: no claim
    assert fewer_rollouts_factor(INF) is None
    ok = {"estimate": 0.0, "low": -0.02, "high": 0.03}
    assert claim({"estimate": 0.4, "low": 0.3, "high": 0.5}, ok) == "2x fewer rollouts; no loss"
    miss = {"estimate": 0.0, "low": -0.021, "high": 0.03}
    assert claim({"estimate": 0.8, "low": 0.5, "high": 1.2}, miss) == (
        "saving not resolved; loss not resolved"
    )
    low = {"estimate": -0.1, "low": -0.15, "high": -0.01}
    assert claim({"estimate": 2, "low": 1.5, "high": INF}, low) == "more rollouts; lower final"


def test_placebo_must_contain_one_and_zero() -> None:
    assert placebo_consistent({"low": 0.8, "high": 1.3}, {"low": -0.03, "high": 0.02})
    assert not placebo_consistent({"low": 0.5, "high": 0.9}, {"low": -0.03, "high": 0.02})
    assert not placebo_consistent({"low": 0.8, "high": 1.3}, {"low": 0.01, "high": 0.05})


def test_one_run_gives_no_interval_and_no_claim() -> None:
    d = final_difference_interval([0.5], [0.4, 0.6])
    assert d["estimate"] == pytest.approx(0.0) and math.isnan(d["low"]) and math.isnan(d["high"])
    r = crossing_ratio_interval([jump(0)], [jump(0), jump(1)], 1000)  # 200 over median 250
    assert r["estimate"] == pytest.approx(0.8) and math.isnan(r["high"])
    assert claim(r, d) == "saving not resolved; loss not resolved"
    assert placebo_consistent(r, d) is None


def test_scipy_too_old_for_the_bootstrap_is_a_clear_import_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """scipy.stats.bootstrap takes `rng` from scipy 1.15 on (older ones fail with a TypeError
    deep in the call): an older scipy is refused up front, and the extras ask for 1.15."""
    import re
    import tomllib
    from pathlib import Path

    import scipy

    from replayrl.bench import intervals

    assert intervals.scipy_version("1.14.1") == (1, 14)
    assert intervals.scipy_version("1.16.0rc1") == (1, 16)
    assert intervals.scipy_version("2.0.0.dev0+abc") == (2, 0)
    assert final_difference_interval([0.5, 0.6], [0.4, 0.5])["low"] <= 0.1  # the real scipy
    monkeypatch.setattr(scipy, "__version__", "1.14.1")
    with pytest.raises(ImportError, match=r"scipy>=1\.15.*found 1\.14\.1"):
        final_difference_interval([0.5, 0.6], [0.4, 0.5])
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    floors = [r for extra in ("test", "bench") for r in extras[extra] if r.startswith("scipy")]
    assert floors and all(re.fullmatch(r"scipy>=1\.15(\.\d+)?", r) for r in floors), floors
