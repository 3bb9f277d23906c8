"""Tests for replayrl.design.theory (arXiv 2604.08706, "Theory (synchronous model)")."""

from __future__ import annotations

import functools
import itertools
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayrl.design.theory import (
    DesignReport,
    buffer_design,
    closed_form_power_law,
    constrained_optimum,
    cost_ratio,
    design,
    estimate_mu,
    feasible_design,
    fit_alpha_rho,
    format_report,
    gamma,
    interpolated_variance,
    numerical_optimum,
    objective,
    optimal_y,
    power_law_variance,
    reduced_objective,
)
from tiny import produce_fresh_of

SWEEP = settings(max_examples=60, deadline=None, derandomize=True)
mus = st.floats(0.5, 20.0)
alphas = st.floats(0.05, 0.45)
rhos = st.floats(0.05, 1.0)


def paper_closed_form(mu: float, alpha: float, rho: float) -> tuple[float, float]:
    """The formula exactly as arXiv 2604.08706 states it (rho > 0 only)."""
    y = (-alpha + math.sqrt(alpha**2 + mu * rho * (1 - 2 * alpha))) / rho
    return y**2 / (mu - rho * y**2), y


# ----------------------------------------------------------------- worked examples (by hand)


def test_worked_example_mu4_alpha_quarter_rho_half():
    # alpha^2 = 0.0625; mu*rho*(1-2alpha) = 4*0.5*0.5 = 1.0; sqrt(1.0625) = sqrt(17)/4 = 1.0307764
    # y* = (-0.25 + 1.0307764)/0.5 = 0.7807764/0.5 = 1.5615528   (= (sqrt(17) - 1)/2)
    # y*^2 = (18 - 2 sqrt(17))/4 = 2.4384472; rho*y*^2 = 1.2192236; mu - rho y*^2 = 2.7807764
    # x* = 2.4384472/2.7807764 = 0.8768944   (simplifies exactly to 5 - sqrt(17))
    x, y = closed_form_power_law(4.0, 0.25, 0.5)
    assert y == pytest.approx(1.5615528, abs=1e-7)
    assert x == pytest.approx(0.8768944, abs=1e-7)
    assert y == pytest.approx((math.sqrt(17) - 1) / 2, rel=1e-12)
    assert x == pytest.approx(5 - math.sqrt(17), rel=1e-12)


def test_worked_example_mu5_alpha_tenth_rho_one():
    # alpha^2 = 0.01; mu*rho*(1-2alpha) = 5*1*0.8 = 4; sqrt(4.01) = 2.0024984
    # y* = (-0.1 + 2.0024984)/1 = 1.9024984
    # y*^2 = 3.61 + 2*1.9*0.0024984 + 0.0024984^2 = 3.61 + 0.0094941 + 0.0000062 = 3.6195003
    # mu - rho y*^2 = 5 - 3.6195003 = 1.3804997; x* = 3.6195003/1.3804997 = 2.621877
    x, y = closed_form_power_law(5.0, 0.1, 1.0)
    assert y == pytest.approx(1.9024984, abs=1e-7)
    assert x == pytest.approx(2.621877, abs=1e-6)


def test_worked_example_rho_zero_limit():
    # rho = 0: the first-order condition of g(x) = x^(2a) (1/sqrt(mu) + x^(-1/2))^2 is
    # 2a (sqrt(x/mu) + 1) = 1  =>  sqrt(x) = sqrt(mu)(1-2a)/(2a)  =>  x* = mu (1-2a)^2 / (4a^2),
    # y* = sqrt(mu x*) = mu (1-2a)/(2a), i.e. x* = y*^2/mu.
    # mu = 6, alpha = 0.25: y* = 6*0.5/0.5 = 6; x* = 36/6 = 6.
    x, y = closed_form_power_law(6.0, 0.25, 0.0)
    assert (x, y) == pytest.approx((6.0, 6.0), rel=1e-12)
    xn, yn = numerical_optimum(6.0, 0.0, power_law_variance(0.25))
    assert (xn, yn) == pytest.approx((6.0, 6.0), rel=1e-6)


def test_alpha_zero_with_correlation_gives_unbounded_horizon():
    # alpha = 0: g(x) = (1/sqrt(mu) + sqrt(rho + 1/x))^2 decreases in x, so x* = inf and
    # y* = sqrt(mu/rho); mu = 4, rho = 0.25: y* = sqrt(16) = 4.
    x, y = closed_form_power_law(4.0, 0.0, 0.25)
    assert math.isinf(x)
    assert y == pytest.approx(4.0, rel=1e-12)
    assert optimal_y(math.inf, 4.0, 0.25) == pytest.approx(4.0)


def test_alpha_zero_rho_zero_raises():
    with pytest.raises(ValueError, match="no finite optimum"):
        closed_form_power_law(4.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("mu", "alpha", "rho", "name"),
    [
        (0.0, 0.25, 0.5, "mu"),
        (-1.0, 0.25, 0.5, "mu"),
        (math.nan, 0.25, 0.5, "mu"),
        (4.0, 0.5, 0.5, "alpha"),
        (4.0, -0.1, 0.5, "alpha"),
        (4.0, 0.25, -0.1, "rho"),
        (4.0, 0.25, 1.5, "rho"),
    ],
)
def test_closed_form_bad_input(mu, alpha, rho, name):
    with pytest.raises(ValueError, match=rf"^{name} .*got"):
        closed_form_power_law(mu, alpha, rho)


# ----------------------------------------------------------------- closed form vs argmin


@SWEEP
@given(mu=mus, alpha=alphas, rho=rhos)
def test_closed_form_matches_numerical_argmin(mu, alpha, rho):
    x, y = closed_form_power_law(mu, alpha, rho)
    xn, yn = numerical_optimum(mu, rho, power_law_variance(alpha))
    assert xn == pytest.approx(x, rel=1e-3)
    assert yn == pytest.approx(y, rel=1e-3)


@SWEEP
@given(mu=mus, alpha=alphas)
def test_rho_zero_limit_matches_numerical_argmin(mu, alpha):
    x, y = closed_form_power_law(mu, alpha, 0.0)
    assert x == pytest.approx(y**2 / mu, rel=1e-12)
    assert y == pytest.approx(mu * (1 - 2 * alpha) / (2 * alpha), rel=1e-12)
    xn, yn = numerical_optimum(mu, 0.0, power_law_variance(alpha))
    assert xn == pytest.approx(x, rel=1e-3)
    assert yn == pytest.approx(y, rel=1e-3)


@SWEEP
@given(mu=mus, alpha=alphas, rho=rhos)
def test_stable_form_equals_paper_form(mu, alpha, rho):
    assert closed_form_power_law(mu, alpha, rho) == pytest.approx(
        paper_closed_form(mu, alpha, rho), rel=1e-9
    )


def test_rho_to_zero_is_continuous():
    x0, y0 = closed_form_power_law(3.0, 0.2, 0.0)
    x1, y1 = closed_form_power_law(3.0, 0.2, 1e-12)
    assert (x1, y1) == pytest.approx((x0, y0), rel=1e-9)


@pytest.mark.parametrize(("mu", "alpha", "rho"), [(4.0, 0.25, 0.5), (0.7, 0.4, 0.1), (15, 0.05, 1)])
def test_closed_form_is_local_minimum_of_g(mu, alpha, rho):
    s2 = power_law_variance(alpha, tau=2.5)  # tau only rescales g: the argmin is unchanged
    x, _ = closed_form_power_law(mu, alpha, rho)
    g0 = reduced_objective(x, mu, rho, s2)
    for f in (0.9, 0.99, 1.01, 1.1):
        assert reduced_objective(x * f, mu, rho, s2) > g0


def test_mu_to_zero_stays_on_policy():
    xs = [closed_form_power_law(mu, 0.25, 0.5)[0] for mu in (1.0, 1e-1, 1e-2, 1e-4, 1e-6)]
    assert all(a > b for a, b in itertools.pairwise(xs))
    assert xs[-1] < 1e-5
    # small-mu asymptotics: y* ~ mu(1-2a)/(2a) = mu, x* ~ y*^2/(2a(y*+mu)) ~ mu^2/(0.5*2mu) = mu
    assert xs[-1] == pytest.approx(1e-6, rel=1e-3)
    assert closed_form_power_law(1e-6, 0.25, 0.5)[1] == pytest.approx(1e-6, rel=1e-3)


# ----------------------------------------------------------------- objective / optimal_y


@pytest.mark.parametrize(
    ("x", "mu", "rho"), [(0.5, 4.0, 0.5), (3.0, 5.3, 0.0), (10.0, 0.8, 1.0), (1.0, 20.0, 0.2)]
)
def test_optimal_y_minimises_objective_on_dense_grid(x, mu, rho):
    s2 = power_law_variance(0.3)
    ys = np.geomspace(1e-3, 1e3, 200_001)
    j = objective(x, ys, mu, rho, s2)
    y_grid = ys[np.argmin(j)]
    y_star = optimal_y(x, mu, rho)
    assert y_star == pytest.approx(y_grid, rel=1e-4)
    assert objective(x, y_star, mu, rho, s2) <= j.min() * (1 + 1e-12)


def test_objective_at_optimal_y_is_reduced_objective():
    s2 = power_law_variance(0.2)
    x = np.geomspace(0.01, 100, 50)
    y = optimal_y(x, 5.0, 0.3)
    assert objective(x, y, 5.0, 0.3, s2) == pytest.approx(reduced_objective(x, 5.0, 0.3, s2))


def test_objective_hand_value():
    # x = 2, y = 1, mu = 4, rho = 0.5, sigma^2 = 3: 3 * (1 + 1/4) * (1 + 1/2 + 0.5) = 3*1.25*2 = 7.5
    assert objective(2.0, 1.0, 4.0, 0.5, 3.0) == pytest.approx(7.5)
    # callable variance: sigma^2(2) = 2^(2*0.5)... use alpha = 0.25: (2/1)^0.5 = 1.41421356
    assert objective(2.0, 1.0, 4.0, 0.5, power_law_variance(0.25)) == pytest.approx(
        1.41421356 * 2.5, rel=1e-8
    )


def test_objective_and_optimal_y_bad_input():
    with pytest.raises(ValueError, match="x"):
        optimal_y(0.0, 4.0, 0.5)
    with pytest.raises(ValueError, match="mu"):
        optimal_y(1.0, 0.0, 0.5)
    with pytest.raises(ValueError, match="y"):
        objective(1.0, -1.0, 4.0, 0.5, 1.0)
    with pytest.raises(ValueError, match="unbounded"):
        optimal_y(math.inf, 4.0, 0.0)


# ----------------------------------------------------------------- numerical optimum


def test_numerical_optimum_general_curve_matches_brute_force():
    # A variance curve that is not a power law: sigma^2(x) = (1 + x)^0.6
    def s2(x):
        return (1.0 + np.asarray(x)) ** 0.6

    mu, rho = 5.0, 0.3
    xn, yn = numerical_optimum(mu, rho, s2)
    xs = np.geomspace(1e-3, 1e3, 400_001)
    x_brute = xs[np.argmin(reduced_objective(xs, mu, rho, s2))]
    assert xn == pytest.approx(x_brute, rel=1e-4)
    assert yn == pytest.approx(optimal_y(xn, mu, rho))


def test_interpolated_power_law_is_exact_and_gives_closed_form():
    xs = np.geomspace(0.1, 100.0, 7)
    s2 = interpolated_variance(xs, xs**0.5)  # sigma = x^0.25
    q = np.array([0.01, 0.3, 7.0, 5e3])  # includes extrapolation on both sides
    assert s2(q) == pytest.approx(q**0.5, rel=1e-12)
    x, y = closed_form_power_law(4.0, 0.25, 0.5)
    assert numerical_optimum(4.0, 0.5, s2) == pytest.approx((x, y), rel=1e-3)


def test_interpolated_variance_measured_curve():
    xs = [1.0, 2.0, 4.0]
    s2 = interpolated_variance(xs, [1.0, 4.0, 4.0])
    # log-log midpoint between (1,1) and (2,4): x = sqrt(2) -> sigma^2 = 2
    assert s2(np.array([math.sqrt(2.0)])) == pytest.approx([2.0])
    clamped = interpolated_variance(xs, [1.0, 4.0, 4.0], extrapolate=False)
    assert clamped(np.array([0.5, 10.0])) == pytest.approx([1.0, 4.0])
    assert s2(np.array([0.5])) == pytest.approx([0.25])  # slope 2 extended below x = 1


@pytest.mark.parametrize(
    ("xs", "ys"),
    [
        ([1.0], [1.0]),
        ([1.0, 2.0], [1.0]),
        ([2.0, 1.0], [1.0, 1.0]),
        ([0.0, 1.0], [1.0, 1.0]),
        ([1.0, 2.0], [1.0, 0.0]),
    ],
)
def test_interpolated_variance_bad_input(xs, ys):
    with pytest.raises(ValueError):
        interpolated_variance(xs, ys)


def test_numerical_optimum_warns_on_boundary_and_bad_bounds():
    # rho = 0, alpha = 0.01, mu = 10: x* = 10*0.98^2/(4e-4) = 24010 > x_max = 1e3
    with pytest.warns(RuntimeWarning, match="boundary"):
        x, _ = numerical_optimum(10.0, 0.0, power_law_variance(0.01), x_max=1e3)
    assert x == pytest.approx(1e3)
    with pytest.raises(ValueError, match="x_min"):
        numerical_optimum(4.0, 0.5, power_law_variance(0.25), x_min=10.0, x_max=1.0)


# ----------------------------------------------------------------- buffer, gamma, mu


def test_buffer_design_hand_values():
    # x* = 0.8768944, y* = 1.5615528, R = 64: x R = 56.121 -> 56; y R = 99.939 -> 100
    x, y = closed_form_power_law(4.0, 0.25, 0.5)
    assert buffer_design(x, y, 64) == (56, 100)
    assert buffer_design(2.5, 0.5, 1) == (3, 1)  # half rounds up
    assert buffer_design(1e-4, 1e-4, 10) == (1, 1)  # never below 1


@pytest.mark.parametrize(
    ("x", "y", "r", "match"),
    [
        (1.0, 1.0, 0, "rollouts_per_step"),
        (1.0, 1.0, 1.5, "rollouts_per_step"),
        (math.inf, 1.0, 8, "x_star"),
        (1.0, 0.0, 8, "y_star"),
    ],
)
def test_buffer_design_bad_input(x, y, r, match):
    with pytest.raises(ValueError, match=match):
        buffer_design(x, y, r)


def test_gamma_hand_values():
    assert gamma(4.0, 4, 4) == pytest.approx(0.4)  # (1 + 4/4)/(1 + 4) = 2/5
    assert gamma(5.3, 6, 2) == pytest.approx(0.6349206, abs=1e-7)  # (1 + 3)/6.3
    assert gamma(6.8, 0, 8) == pytest.approx(1 / 7.8)  # (1 + 0)/(1 + 6.8)
    assert gamma(0.0, 7, 1) == pytest.approx(8.0)  # (1 + 7)/1
    with pytest.raises(ValueError, match="trainers"):
        gamma(4.0, 4, 0)
    with pytest.raises(ValueError, match="workers"):
        gamma(4.0, -1, 4)
    with pytest.raises(ValueError, match="mu"):
        gamma(-1.0, 4, 4)


def test_cost_ratio_is_seconds_per_generated_over_seconds_per_trained_sample():
    # 10 s for 100 generated (0.1 s each) vs 4 s for 200 trained (0.02 s each): mu = 5
    assert cost_ratio(10.0, 100, 4.0, 200) == pytest.approx(5.0)
    # the same seconds with twice the training passes (epochs = 2) halve the training cost
    assert cost_ratio(10.0, 100, 4.0, 400) == pytest.approx(10.0)
    assert cost_ratio(0.0, 8, 1.0, 8) == 0.0  # free generation is a measurement (mu = 0)


@pytest.mark.parametrize(
    "args",
    [
        (1.0, 0, 1.0, 8),  # nothing generated
        (1.0, 8, 1.0, 0),  # nothing trained
        (1.0, 8, 0.0, 8),  # no training time: the ratio is undefined
        (-1.0, 8, 1.0, 8),  # a negative duration is a clock error, not a cost
        (math.nan, 8, 1.0, 8),
        (1.0, 8, math.inf, 8),
    ],
)
def test_cost_ratio_is_none_when_the_span_measured_nothing(args):
    assert cost_ratio(*args) is None


def test_estimate_mu_is_median_of_per_step_ratios():
    # per-step ratios 5, 6, 6, 7 -> median 6
    assert estimate_mu([5.0, 6.0, 7.0, 6.0]) == pytest.approx(6.0)
    # steps (gen 3 s, train 1 s), (8, 1), (4, 4) -> ratios 3, 8, 1: median 3, where the ratio
    # of totals would be 15 / 6 = 2.5
    steps = [cost_ratio(3.0, 1, 1.0, 1), cost_ratio(8.0, 1, 1.0, 1), cost_ratio(4.0, 1, 4.0, 1)]
    assert estimate_mu(steps) == pytest.approx(3.0)
    assert cost_ratio(15.0, 3, 6.0, 3) == pytest.approx(2.5)
    assert estimate_mu([1.0, 3.0]) == pytest.approx(2.0)  # even count: mean of the middle two


def test_estimate_mu_skips_bad_steps_and_is_none_without_any():
    assert estimate_mu([4.0, math.nan, 5.0, -1.0, 8.0, math.inf]) == pytest.approx(5.0)
    assert estimate_mu([math.nan, -2.0]) is None
    assert estimate_mu([]) is None


# ----------------------------------------------------------------- design / report


def test_design_report_and_text():
    rep = design(4.0, 0.25, 0.5, rollouts_per_step=64, workers=4, trainers=4)
    assert isinstance(rep, DesignReport)
    assert rep.x_star == pytest.approx(5 - math.sqrt(17))
    assert rep.x_star_num == pytest.approx(rep.x_star, rel=1e-3)
    assert rep.y_star_num == pytest.approx(rep.y_star, rel=1e-3)
    assert (rep.N, rep.B) == (56, 100)
    assert rep.gamma == pytest.approx(0.4)
    text = format_report(rep)
    assert "N/R" in text and "B/R" in text
    assert "0.8769" in text and "1.562" in text and "N = round(x* R) = 56" in text
    assert "gamma" in text and "0.4" in text
    assert len(text.splitlines()) >= 6


def test_design_without_optional_parts():
    rep = design(6.8, 0.2, 0.3)
    assert rep.N is None and rep.B is None and rep.gamma is None
    assert "gamma" not in format_report(rep)


def test_design_alpha_zero():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rep = design(5.3, 0.0, 0.5)
    assert math.isinf(rep.x_star)
    assert "unbounded" in format_report(rep)
    with pytest.raises(ValueError, match="x_star"):
        design(5.3, 0.0, 0.5, rollouts_per_step=64)


def test_design_bad_input():
    with pytest.raises(ValueError, match="workers"):
        design(4.0, 0.25, 0.5, workers=4)
    with pytest.raises(ValueError, match="alpha"):
        design(4.0, 0.6, 0.5)
    with pytest.raises(ValueError, match="tau"):
        design(4.0, 0.25, 0.5, tau=0.0)


# --------------------------------------------------------------------------- feasible design
# Hand values: J(x, y) = sqrt(x) (1 + y/mu) (1/y + 1/x + rho) at alpha = 1/4, rho = 1/2.


def test_issue_example_mu_0_6_stays_on_policy_not_a_buffer_smaller_than_a_step():
    # unconstrained: x* = 0.35, y* = 0.42, i.e. N = 22 < R = 64
    fd = feasible_design(0.6, 0.25, 0.5, 64)
    assert fd.x_unconstrained == pytest.approx(0.3484, abs=1e-4)
    assert fd.y_unconstrained == pytest.approx(0.4220, abs=1e-4)
    # for x >= 1 and y >= 1: y*(x) = sqrt(0.6 / (0.5 + 1/x)) < 1 until x = 10, and
    # J(x, 1) = (8/3)(1.5 sqrt(x) + 1/sqrt(x)) grows for x > 2/3: the optimum is x = y = 1
    assert fd.on_policy and (fd.N, fd.B) == (64, 64) and fd.saving == 0.0
    assert "stay on-policy" in fd.reason and "0.0%" in fd.reason


def test_issue_example_mu_5_3_keeps_n_at_least_r():
    # unconstrained x* = 0.9626 -> N = 62 < R = 64. With B > N allowed (paper 1's J alone):
    # x = 1, y*(1) = sqrt(5.3/1.5) = 1.8797 -> B = round(120.3) = 120; J(1, 1.875) =
    # (1 + 1.875/5.3)(1/1.875 + 1.5) = 2.752673, J(1, 1) = (1 + 1/5.3)(2.5) = 2.971698: 7.370%
    fd = feasible_design(5.3, 0.25, 0.5, 64, allow_b_above_n=True)
    assert fd.x_unconstrained == pytest.approx(0.96261, abs=1e-4)
    assert not fd.on_policy and (fd.N, fd.B) == (64, 120)
    assert fd.saving == pytest.approx(1 - 2.7526730 / 2.9716981, abs=1e-6)
    # the same case with a 10% bar: reuse does not pay, stay on-policy
    strict = feasible_design(5.3, 0.25, 0.5, 64, min_saving=0.10, allow_b_above_n=True)
    assert strict.on_policy and (strict.N, strict.B) == (64, 64)
    assert "7.4%" in strict.reason


def test_by_default_a_batch_never_exceeds_the_buffer():
    # B <= N (y <= x): at mu = 5.3, alpha = 0.25, rho = 0.5, y*(x) > x for every x near 1, so
    # the optimum is on y = x: J(x, x) = sqrt(x) (1 + x/5.3)(2/x + 0.5), least at x = 1.53
    # -> N = B = round(98.0) = 98; J(98/64, 98/64) = 2.879, J(1, 1) = 2.971698: saving 3.1%,
    # below the 5% bar: stay on-policy (the 7.4% above came from B = 1.9 N)
    def j(x: float) -> float:
        return math.sqrt(x) * (1 + x / 5.3) * (2 / x + 0.5)

    xs = np.linspace(1, 3, 20001)
    assert xs[np.argmin([j(x) for x in xs])] == pytest.approx(1.53, abs=0.01)
    fd = feasible_design(5.3, 0.25, 0.5, 64, min_saving=0.0)
    assert (fd.N, fd.B) == (98, 98) and not fd.on_policy
    assert fd.saving == pytest.approx(1 - j(98 / 64) / 2.9716981, abs=1e-6)
    assert fd.saving == pytest.approx(0.0306, abs=1e-3)
    fd = feasible_design(5.3, 0.25, 0.5, 64)
    assert fd.on_policy and (fd.N, fd.B) == (64, 64) and "3.1%" in fd.reason
    # where y*(x) <= x already (alpha 0.12, rho 0.8: x = 2.48, y = 2.11) nothing changes
    a = feasible_design(5.3, 0.12, 0.797, 64, min_saving=0.0)
    b = feasible_design(5.3, 0.12, 0.797, 64, min_saving=0.0, allow_b_above_n=True)
    assert (a.N, a.B) == (b.N, b.B) == (159, 135)


def test_y_below_one_only_when_allowed():
    # mu = 0.6, allowed: y*(1) = sqrt(0.6/1.5) = 0.6325 -> B = round(40.5) = 40, y = 0.625;
    # J(1, 0.625) = (1 + 0.625/0.6)(1.6 + 1.5) = 6.329167, J(1, 1) = 20/3: saving 5.0625%
    fd = feasible_design(0.6, 0.25, 0.5, 64, allow_y_below_one=True, min_saving=0.0)
    assert (fd.N, fd.B) == (64, 40)
    assert fd.saving == pytest.approx(1 - 6.3291667 / (20 / 3), abs=1e-6)


@pytest.mark.parametrize(
    ("mu", "alpha", "rho", "r"),
    [(0.6, 0.25, 0.5, 64), (5.3, 0.25, 0.5, 64), (5.3, 0.1, 0.1, 4), (20, 0.3, 1.0, 8)],
)
def test_feasible_design_never_below_one_step_and_beats_every_feasible_grid_cell(mu, alpha, rho, r):
    fd = feasible_design(mu, alpha, rho, r, min_saving=0.0)
    assert fd.N >= r and fd.B >= r and fd.B <= fd.N
    s2 = power_law_variance(alpha)
    xs, ys = np.meshgrid(np.linspace(1, 30, 300), np.linspace(1, 30, 300))
    x, y = constrained_optimum(mu, rho, s2)
    assert objective(x, y, mu, rho, s2) <= np.min(objective(xs, ys, mu, rho, s2)) + 1e-9
    # with y <= x: below every grid cell on or under the diagonal, and on its own side
    x, y = constrained_optimum(mu, rho, s2, y_at_most_x=True)
    below = ys <= xs
    assert y <= x + 1e-12
    assert objective(x, y, mu, rho, s2) <= np.min(objective(xs, ys, mu, rho, s2)[below]) + 1e-9


def test_unconstrained_optimum_inside_the_feasible_set_is_kept():
    # mu = 10: closed form x* = 1.1492, y* = 2.7016 are feasible when B > N is allowed;
    # N = round(73.55) = 74
    fd = feasible_design(10, 0.25, 0.5, 64, allow_b_above_n=True)
    assert fd.x_unconstrained == pytest.approx(1.14922, abs=1e-4)
    assert (fd.N, fd.B) == (74, round(2.70156 * 64))


def test_feasible_design_bad_input():
    with pytest.raises(ValueError, match="rollouts_per_step"):
        feasible_design(5.3, 0.25, 0.5, 0)
    with pytest.raises(ValueError, match="min_saving"):
        feasible_design(5.3, 0.25, 0.5, 64, min_saving=1.0)
    with pytest.raises(ValueError, match="no finite optimum"):
        feasible_design(5.3, 0.0, 0.0, 64)


def test_cli_design_prints_the_feasible_decision(capsys):
    from replayrl.cli.main import main

    main(["design", "--mu", "0.6", "--rollouts-per-step", "64"])
    out = capsys.readouterr().out
    assert "stay on-policy" in out and "N = B = R = 64" in out
    main(["design", "--mu", "5.3", "--rollouts-per-step", "64", "--allow-b-above-n"])
    out = capsys.readouterr().out
    assert "N = 64, B = 120" in out and "7.4%" in out
    main(["design", "--mu", "5.3", "--rollouts-per-step", "64"])
    out = capsys.readouterr().out
    assert "stay on-policy" in out and "x = 1.53, y = 1.53" in out and "3.1%" in out


def test_auto_run_never_resolves_a_buffer_smaller_than_a_step(tmp_path):
    from replayrl.run.start import train
    from tiny import tiny_config

    for bar in (0.0, 0.99):  # 0.99: no design saves that much, so the run stays on-policy
        cfg = tiny_config(
            tmp_path,
            f"logging.name=auto{bar}",
            "method.name=replay",
            "buffer.capacity=auto",
            "train.batch_size=auto",
            "train.steps=1",
            "design.warmup_steps=1",
            f"design.min_saving={bar}",
            "design.alpha=0.25",
            "design.rho=0.5",
        )
        d = train(cfg)["design"]
        assert d["N"] >= 8 and d["B"] >= 8  # R = 8
        assert d["alpha"] == 0.25 and d["rho"] == 0.5  # the config's, reported as such
        assert d["alpha_source"] == d["rho_source"] == "config" and "probe_samples" not in d
        if bar == 0.99:
            assert d["on_policy"] and d["N"] == d["B"] == 8 and d["predicted_saving"] == 0.0


def test_fit_alpha_rho_recovers_the_parameters_of_synthetic_costs():
    # costs made from J itself at alpha = 0.2, rho = 0.3 (scale 7): the fit recovers them
    xs, ys = np.meshgrid([1.0, 2.0, 4.0, 8.0], [1.0, 2.0, 4.0])
    xs, ys = xs.ravel(), ys.ravel()
    costs = 7.0 * objective(xs, ys, 5.3, 0.3, power_law_variance(0.2))
    costs[0] = math.inf  # a cell that never reached the target is left out
    alpha, rho, rms = fit_alpha_rho(xs, ys, costs, 5.3)
    assert (alpha, rho) == pytest.approx((0.2, 0.3), abs=1e-9) and rms < 1e-9
    with pytest.raises(ValueError, match="at least 3 cells"):
        fit_alpha_rho([1, 2, 4], [1, 1, 1], [1.0, math.inf, -1.0], 5.3)


@pytest.mark.parametrize("half", [["buffer.capacity=auto"], ["train.batch_size=auto"]])
def test_half_auto_is_refused(half: list[str]) -> None:
    from replayrl.config.schema import ConfigError, load_config

    with pytest.raises(ConfigError, match="go together"):
        load_config("replay", half)
    load_config("replay", ["buffer.capacity=auto", "train.batch_size=auto"])  # both: fine


# -- alpha and rho measured on the run's own warm-up (run/loops/design_probe.py) -----------------
def _auto_cli(tmp_path, name: str, *extra: str) -> tuple[dict, str]:
    """A tiny `auto` run through the CLI: R = 8 prompts x 4 = 32, one training step; the
    digits_format reward varies within groups even for a barely warm-started model (the
    gradient signal the probe needs). Returns the summary and the run's log."""
    import contextlib
    import io
    import json

    from replayrl.cli.main import main
    from tiny import TINY_RUN

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(
            [
                "train",
                *TINY_RUN,
                f"logging.run_dir={tmp_path}",
                f"logging.name={name}",
                "rollout.prompts_per_step=8",
                "rewards=[{name: digits_format}]",
                "method.name=replay",
                "buffer.capacity=auto",
                "train.batch_size=auto",
                "train.steps=1",
                *extra,
            ]
        )
    assert rc == 0
    return json.loads((tmp_path / name / "summary.json").read_text()), out.getvalue()


def test_auto_run_measures_alpha_and_rho_on_its_warmup(tmp_path):
    # default design.alpha = design.rho = measured; 2 warm-up steps -> staleness 0, 1, 2
    summary, log = _auto_cli(tmp_path, "measured", "design.warmup_steps=2")
    d = summary["design"]
    assert d["alpha_source"] == d["rho_source"] == "measured", d.get("measure_failed")
    assert 0.0 <= d["alpha"] <= 0.49 and 0.0 <= d["rho"] <= 1.0
    assert (d["alpha"], d["rho"]) != (0.25, 0.5)  # not the fallback
    assert d["staleness_horizons"] == [1.0, 2.0, 3.0] and len(d["staleness_sigma2"]) == 3
    # one measured batch (design.probe_batches) at each of the three policies
    assert d["probe_samples"] == 3 * 32
    # the probe's policies are undone: only the first (version 0) warm-up batch is kept, and
    # every generated rollout is counted (2 warm-up + 3 measured + 1 training step); the
    # second warm-up batch and the measured ones are a ledger term of their own
    assert d["probe_rollouts_not_kept"] == 4 * 32
    assert summary["rollouts_generated"] == 6 * 32
    led = summary["accounting"]["ledger"]
    assert led["discarded_probe"] == 4 * 32 and led["balanced"], led
    assert "discarded by the design probe 128" in log and "NOT BALANCED" not in log
    assert f"alpha = {d['alpha']:.3g} (measured), rho = {d['rho']:.3g} (measured)" in log
    from replayrl.config.schema import load_config

    saved = load_config(tmp_path / "measured" / "config.yaml")
    assert (saved.buffer.capacity, saved.train.batch_size) == (d["N"], d["B"])


def test_too_short_a_warmup_falls_back_and_says_so(tmp_path):
    summary, log = _auto_cli(tmp_path, "short", "design.warmup_steps=1", "design.rho=0.7")
    d = summary["design"]
    assert (d["alpha"], d["alpha_source"]) == (0.25, "fallback")
    assert (d["rho"], d["rho_source"]) == (0.7, "config")  # a number is never replaced
    assert "design.warmup_steps >= 2" in d["measure_failed"]
    assert "auto design: alpha not measured (design.warmup_steps = 1" in log
    assert "using alpha = 0.25 (fallback)" in log
    assert summary["rollouts_generated"] == 2 * 32  # no probe batch


def _auto_session(tmp_path, *extra):
    from replayrl.run.session import Session
    from tiny import tiny_config

    cfg = tiny_config(
        tmp_path,
        "rollout.prompts_per_step=8",
        "rewards=[{name: digits_format}]",
        "method.name=replay",
        "buffer.capacity=auto",
        "train.batch_size=auto",
        *extra,
    )
    (tmp_path / "run").mkdir(parents=True)
    return Session(cfg, tmp_path / "run", log=lambda _: None)


def test_the_probe_leaves_the_policy_and_learner_as_they_were(tmp_path):
    import torch

    from replayrl.run.loops.probe import WarmupProbe

    s = _auto_session(tmp_path, "design.warmup_steps=2")
    before = {k: v.clone() for k, v in s.learner.model.state_dict().items()}
    probe = WarmupProbe(s)
    for _ in range(2):
        probe.update(produce_fresh_of(s)[0])
    assert s.learner.version == 2 and s.learner.updates == 2
    moved = any(not torch.equal(before[k], v) for k, v in s.learner.model.state_dict().items())
    assert moved  # the probe's updates really changed the policy ...
    probe.finish()
    after = s.learner.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # ... and were undone
    assert s.learner.version == 0 and s.learner.updates == 0
    assert s.learner.optimizer.state_dict()["state"] == {}  # no Adam moments carried over
    # the whole warm-up: only the first (version 0) batch goes on into the buffer
    from replayrl.run.loops import auto as design_auto

    _, warmup, record = design_auto.auto_design(s)
    assert len(warmup) == 32 and {r.policy_version for r in warmup} == {0}
    assert record["probe_rollouts_not_kept"] == 4 * 32 and s.learner.version == 0
    assert s.counters.rollouts_discarded_probe == 4 * 32
    after = s.learner.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_the_probe_updates_at_the_learning_rate_after_the_lr_warm_up(tmp_path):
    # inside a 5-step LR warm-up the first probe update would have lr 0 (staleness 0 and 1
    # from one policy) and the second 0.2 lr: the probe takes steps 6, 7 instead (full lr)
    from replayrl.run.loops.probe import WarmupProbe, probe_lr_steps
    from replayrl.run.session import Session
    from tiny import tiny_config

    cfg = tiny_config(
        tmp_path,
        "rollout.prompts_per_step=8",
        "rewards=[{name: digits_format}]",
        "method.name=replay",
        "buffer.capacity=auto",
        "train.batch_size=auto",
        "design.warmup_steps=2",
        "train.steps=20",
        "train.warmup_steps=5",
        "train.lr=3e-4",
    )
    assert probe_lr_steps(cfg) == [6, 7]
    (tmp_path / "probe").mkdir()
    s = Session(cfg, tmp_path / "probe", log=lambda _: None)
    probe = WarmupProbe(s)
    lrs = []
    for _ in range(2):
        probe.update(produce_fresh_of(s)[0])
        lrs.append(s.learner.optimizer.param_groups[0]["lr"])
    assert lrs == pytest.approx([3e-4, 3e-4])
    probe.restore()


@pytest.mark.parametrize(
    ("extra", "steps", "blocked"),
    [
        ([], [1, 2], False),  # no LR warm-up: steps 1, 2 as before
        (["train.warmup_ratio=0.5"], [6, 7], False),  # ceil(0.5 x 10) = 5 steps of warm-up
        (["train.warmup_steps=10"], [11, 12], False),  # constant: lr after the warm-up
        (["train.warmup_steps=10", "train.lr_scheduler=linear"], [11, 12], True),  # 0 by then
        (["train.lr_scheduler=linear", "train.steps=1"], [1, 2], True),  # decayed to 0 at 2
        # step k's update uses 0-based schedule index k - 1: 1 and 2/3 of the lr, not 0
        (["train.lr_scheduler=linear", "train.steps=3"], [1, 2], False),
    ],
)
def test_a_probe_update_at_learning_rate_zero_blocks_the_measurement(extra, steps, blocked):
    from replayrl.config.schema import load_config
    from replayrl.run.loops.probe import probe_blocker, probe_lr_steps

    cfg = load_config("replay", ["train.steps=10", "design.warmup_steps=2", *extra])
    assert probe_lr_steps(cfg) == steps
    why = probe_blocker(cfg, advantage_at_generation=True)
    assert (why is not None) == blocked, why
    if blocked:
        assert "learning rate of the probe's update at schedule step" in why


def test_feasible_design_is_bounded_by_the_run_length():
    # measured alpha and rho near 0 (sub6, seed 0 of the held-out suite) sent x to the grid's
    # 1e6: N = 64,000,000 for a 120-step run. x_max (the run's steps) bounds N at x_max R
    free = feasible_design(0.84, 0.01, 0.001, 64)
    assert free.N > 120 * 64  # what the unbounded design picks
    fd = feasible_design(0.84, 0.01, 0.001, 64, x_max=120.0)
    assert not fd.on_policy and fd.x <= 120.0 and fd.N <= 120 * 64
    with pytest.raises(ValueError, match="x_max"):
        feasible_design(0.84, 0.01, 0.001, 64, x_max=1.0)


def _replace_produce(monkeypatch, fn) -> None:
    """Every caller of the step's generation (the warm-up, the probe) gets `fn()` instead."""
    import replayrl.run.loops.auto as design_auto
    import replayrl.run.loops.probe as design_probe

    for module in (design_auto, design_probe):
        monkeypatch.setattr(module, "produce_fresh", lambda *parts: fn())


def test_the_probe_counts_its_generation_time_without_reward_time(tmp_path, monkeypatch):
    # the measured batches are generated inside update() and finish(): their seconds count as
    # generation, less the reward functions' share (the producer reports it as
    # time/reward_s), and the rest of finish() (per-sample gradients) adds to the probe's own
    # seconds
    import time

    from replayrl.run.loops.probe import WarmupProbe

    s = _auto_session(tmp_path, "design.warmup_steps=2")
    produce = functools.partial(produce_fresh_of, s)
    reward_s = {"value": 7.0}

    def produce_reporting_reward_time():
        rollouts, stats = produce()
        if reward_s["value"] is None:
            stats.pop("time/reward_s", None)
        else:
            stats["time/reward_s"] = reward_s["value"]
        return rollouts, stats

    _replace_produce(monkeypatch, produce_reporting_reward_time)
    for reported in (7.0, None):  # with and without a reward-time figure
        reward_s["value"] = reported
        probe = WarmupProbe(s)
        for _ in range(2):
            batch = produce()[0]
            s.counters.generation_seconds = 1000.0
            t0 = time.perf_counter()
            probe.update(batch)  # one measured batch, then the update
            wall = time.perf_counter() - t0
            delta = s.counters.generation_seconds - 1000.0
            # clamped at 0: a reward share larger than the call itself counts no generation
            assert 0.0 <= delta <= max(wall - (reported or 0.0), 0.0), (reported, delta)
        s.counters.generation_seconds = 1000.0
        probe.seconds = 50.0
        t0 = time.perf_counter()
        probe.finish()
        wall = time.perf_counter() - t0
        delta = s.counters.generation_seconds - 1000.0
        less = reported or 0.0
        assert 0.0 <= delta <= max(wall - less, 0.0), (reported, delta, wall)
        assert 50.0 <= probe.seconds <= 50.0 + wall
        assert probe.measured_rollouts == 3 * 32


def test_the_probe_keeps_an_engine_copy_in_step_and_leaves_no_gradients(tmp_path):
    # an engine with its own weights (vLLM: the session's `engine`) gets every probe policy and then
    # the restored one; an empty warm-up batch still advances the version (a staleness level);
    # the restored learner holds no gradients (None, as a fresh optimizer's zero_grad leaves)
    import time

    from replayrl.run.loops.probe import WarmupProbe

    s = _auto_session(tmp_path, "design.warmup_steps=2")
    loads: list[tuple[list[str], int]] = []

    class Engine:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def load_weights(self, named_parameters, version):
            loads.append(([n for n, _ in named_parameters], version))

    s.generator = s.engine = Engine(s.generator)  # type: ignore[assignment]
    names = [n for n, _ in s.model.named_parameters()]
    probe = WarmupProbe(s)
    probe.seconds = 10.0
    t0 = time.perf_counter()
    probe.update(produce_fresh_of(s)[0])
    probe.update([])  # every rollout of a batch dropped: the policy version still moves on
    wall = time.perf_counter() - t0
    assert s.learner.version == 2 and [v for _, v in loads] == [1, 2]
    assert all(n == names for n, _ in loads)
    assert 10.0 <= probe.seconds <= 10.0 + wall
    probe.finish()
    assert s.learner.version == 0 and loads[-1] == (names, 0)
    assert all(p.grad is None for p in s.learner.model.parameters())


def test_probe_blocker_says_why_in_full():
    from replayrl.config.schema import load_config
    from replayrl.run.loops.probe import probe_blocker

    short = load_config("replay", ["design.warmup_steps=1"])
    assert probe_blocker(short, advantage_at_generation=True) == (
        "design.warmup_steps = 1 gives staleness 0 .. 1; the fit needs 0 .. 2 "
        "(design.warmup_steps >= 2)"
    )
    ok = load_config("replay", ["design.warmup_steps=2"])
    assert probe_blocker(ok, advantage_at_generation=True) is None
    assert probe_blocker(ok, advantage_at_generation=False) == (
        "per-sample gradients need advantages stored at generation (grpo, rloo), not gae"
    )
    zero = load_config(
        "replay",
        [
            "design.warmup_steps=2",
            "train.warmup_steps=5",
            "train.lr_scheduler=linear",
            "train.steps=5",
        ],
    )
    assert probe_blocker(zero, advantage_at_generation=True) == (
        "the learning rate of the probe's update at schedule step 6 is 0 "
        "(train.lr_scheduler = linear, 5 steps, LR warm-up 5): "
        "two staleness levels would share one policy"
    )


def test_auto_design_refuses_when_every_warm_up_rollout_was_dropped(tmp_path, monkeypatch):
    from replayrl.run.loops import auto as design_auto

    s = _auto_session(tmp_path, "design.alpha=0.25", "design.rho=0.5")
    _replace_produce(monkeypatch, lambda: ([], {}))
    with pytest.raises(ValueError) as err:
        design_auto.auto_design(s)
    assert str(err.value) == ("auto design: every warm-up rollout was dropped; cannot measure mu")
    # a given mu needs no measurement but still rollouts (the alpha / rho probe, the buffer):
    # the same clear refusal, not a failure deep in the probe
    s = _auto_session(tmp_path / "given", "design.mu=5.3")
    with pytest.raises(ValueError) as err:
        design_auto.auto_design(s)
    assert str(err.value) == "auto design: every warm-up rollout was dropped; nothing to start from"


def test_the_probe_hands_the_estimator_staleness_clusters_and_the_runs_seed(tmp_path, monkeypatch):
    # what finish() passes on: per-sample gradients at the last policy taken on the
    # coordinate subset of train.seed, of the measured batches only (design.probe_batches at
    # each policy, never the batches the updates trained on); staleness = last version - the
    # rollout's version; one cluster per (batch, group) pair (batches reuse group ids 0..)
    from replayrl.run.loops import probe as design_probe

    s = _auto_session(
        tmp_path,
        "rollout.prompts_per_step=4",
        "design.warmup_steps=2",
        "design.probe_batches=2",
        "train.seed=3",
    )
    seen: dict = {}
    real = design_probe.sample_gradients

    def spy_gradients(learner, rows, seed):
        seen["rows"], seen["seed"] = list(rows), seed
        return real(learner, rows, seed=seed)

    def spy_estimate(grads, staleness, clusters):
        seen["staleness"], seen["clusters"] = staleness, clusters
        return design_probe.AlphaRhoEstimate(None, None, reason="spied")

    monkeypatch.setattr(design_probe, "sample_gradients", spy_gradients)
    monkeypatch.setattr(design_probe, "estimate_alpha_rho", spy_estimate)
    took: list[list] = []  # what the probe's updates trained on
    train_step = s.learner.train_step

    def spy_train_step(rollouts, *a, **kw):
        took.append(list(rollouts))
        return train_step(rollouts, *a, **kw)

    monkeypatch.setattr(s.learner, "train_step", spy_train_step)
    probe = design_probe.WarmupProbe(s)
    trained = []
    for _ in range(2):
        trained.append(produce_fresh_of(s)[0])
        probe.update(trained[-1])
    assert probe.finish().reason == "spied"
    rows = seen["rows"]
    assert seen["seed"] == 3 and len(rows) == 3 * 2 * 16  # 3 policies x 2 batches x 16
    # the updates trained on the warm-up batches, exactly, and on nothing that was measured
    assert [[id(r) for r in b] for b in took] == [[id(r) for r in b] for b in trained]
    assert not {id(r) for b in trained for r in b} & {id(r) for r in rows}
    assert probe.measured_rollouts == len(rows)  # every measured batch counted
    assert [r.policy_version for r in rows] == [v for v in (0, 1, 2) for _ in range(32)]
    assert list(seen["staleness"]) == [2 - r.policy_version for r in rows]
    assert sorted(set(seen["staleness"])) == [0, 1, 2]
    batch = [i // 16 for i in range(len(rows))]  # the two batches of one policy: 2 clusters
    pairs = [(b, r.group_id) for b, r in zip(batch, rows, strict=True)]
    assert len(set(pairs)) == 6 * 4 == len(set(seen["clusters"].tolist()))
    for i in range(len(rows)):  # same pair <-> same cluster
        for j in range(len(rows)):
            assert (pairs[i] == pairs[j]) == (seen["clusters"][i] == seen["clusters"][j])


def test_probe_batches_are_counted_as_generated_and_not_kept(tmp_path):
    # design.probe_batches = 2 at W = 2: (W + 1) x 2 measured batches plus the second warm-up
    # batch are generated and discarded; only the first warm-up batch (version 0) is kept
    from replayrl.run.loops import auto as design_auto

    s = _auto_session(tmp_path, "design.warmup_steps=2", "design.probe_batches=2")
    _, warmup, record = design_auto.auto_design(s)
    assert len(warmup) == 32 and {r.policy_version for r in warmup} == {0}
    assert record["probe_rollouts_not_kept"] == (1 + 3 * 2) * 32
    assert s.counters.rollouts_discarded_probe == (1 + 3 * 2) * 32
    assert record["probe_samples"] == 3 * 2 * 32


def test_a_probe_whose_measured_batches_all_come_back_empty_falls_back(tmp_path, monkeypatch):
    # every measured rollout dropped (e.g. reward errors): no gradients to take, so alpha and
    # rho fall back with the reason instead of an error, and the policy is still restored
    import torch

    from replayrl.run.loops.probe import WarmupProbe

    s = _auto_session(tmp_path, "design.warmup_steps=2")
    before = {k: v.clone() for k, v in s.learner.model.state_dict().items()}
    produce = functools.partial(produce_fresh_of, s)
    probe = WarmupProbe(s)
    _replace_produce(monkeypatch, lambda: ([], produce()[1]))
    for _ in range(2):
        probe.update(produce()[0])  # the warm-up batches themselves are real
    est = probe.finish()
    assert not est.ok and "every measured batch came back empty" in est.reason
    assert probe.measured_rollouts == 0 and s.learner.version == 0
    after = s.learner.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_the_probe_is_reproducible(tmp_path):
    # two sessions from the same config measure the same alpha / rho, bit for bit: the probe's
    # shuffle generator is seeded from train.seed (not fresh entropy)
    from replayrl.run.loops import auto as design_auto

    records = []
    for name in ("a", "b"):
        # several shuffled mini-batches per probe update
        s = _auto_session(tmp_path / name, "design.warmup_steps=2", "train.mini_batch_size=8")
        records.append(design_auto.auto_design(s)[2])
    keys = ("alpha", "rho", "staleness_sigma2")  # N, B also depend on the timed mu
    assert [records[0][k] for k in keys] == [records[1][k] for k in keys]


def test_warm_up_mu_is_generation_less_reward_time_over_the_timed_backward(tmp_path, monkeypatch):
    import time

    from replayrl.run.loops import auto as design_auto

    s = _auto_session(tmp_path, "design.alpha=0.25", "design.rho=0.5", "design.warmup_steps=3")
    produce, backward = functools.partial(produce_fresh_of, s), s.learner.measure_backward
    gen, train = [], []

    def slow_produce():
        t0 = time.perf_counter()
        time.sleep(0.6)
        rollouts, stats = produce()
        stats["time/reward_s"] = 0.4  # as if the reward functions took 0.4 s of it
        gen.append(time.perf_counter() - t0)
        return rollouts, stats

    def slow_backward(rollouts):
        t0 = time.perf_counter()
        time.sleep(0.3)
        backward(rollouts)
        train.append(time.perf_counter() - t0)

    _replace_produce(monkeypatch, slow_produce)
    s.learner.measure_backward = slow_backward  # type: ignore[method-assign]
    s.counters.generation_seconds = 100.0
    mus, produced = design_auto._warmup(s, None)
    assert len(mus) == 3 and len(produced) == 3 * 32
    # tolerances for a loaded machine's pauses; dropping the reward time moves mu by >= 40%
    for mu, g, t in zip(mus, gen, train, strict=True):
        assert mu == pytest.approx((g - 0.4) / t, rel=0.2), (mu, g, t)
    assert s.counters.generation_seconds == pytest.approx(100.0 + sum(gen) - 1.2, abs=0.3)


def test_auto_design_record_and_the_bounds_it_passes_on(tmp_path, monkeypatch):
    from replayrl.run.loops import auto as design_auto

    # measured: the probe's seconds are recorded and its discarded rollouts add to the counter
    s = _auto_session(tmp_path / "m", "design.warmup_steps=2")
    s.counters.rollouts_discarded_probe = 5
    _, _, rec = design_auto.auto_design(s)
    assert rec["probe_seconds"] > 0 and rec["probe_rollouts_not_kept"] == 4 * 32
    assert s.counters.rollouts_discarded_probe == 5 + 4 * 32
    assert {"x_star", "y_star", "x", "y", "N", "B", "mu", "alpha", "rho"} <= set(rec)
    # configured alpha, rho that want a huge buffer: x is capped by train.steps (1 -> N = R)
    s = _auto_session(
        tmp_path / "c",
        "design.alpha=0.01",
        "design.rho=0.001",
        "train.steps=1",
        "design.min_saving=0",
    )
    _, _, rec = design_auto.auto_design(s)
    assert rec["N"] == 32 and rec["x"] == 1.0
    # design.allow_y_below_one, min_saving and the run's steps (x_max) reach the design
    import replayrl.design.theory as design_module

    seen = []
    real = design_module.feasible_design

    def spy(*args, **kwargs):
        seen.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(design_auto, "feasible_design", spy)
    extra = ("design.alpha=0.25", "design.rho=0.5", "train.steps=7")
    design_auto.auto_design(
        _auto_session(
            tmp_path / "y",
            *extra,
            "design.allow_y_below_one=true",
            "design.min_saving=0.2",
            "design.allow_b_above_n=true",
        )
    )
    (args, kwargs) = seen[-1]
    assert args[1:] == (0.25, 0.5, 32, True, 0.2)
    assert kwargs == {"x_max": 7.0, "allow_b_above_n": True}


def test_a_given_mu_replaces_the_measured_one_and_both_are_recorded(tmp_path):
    from replayrl.design.theory import feasible_design
    from replayrl.run.loops import auto as design_auto

    fixed = ("design.alpha=0.25", "design.rho=0.5", "design.min_saving=0")
    # measured (the default): the design's mu is the warm-up's
    _, _, rec = design_auto.auto_design(_auto_session(tmp_path / "m", *fixed))
    assert rec["mu_source"] == "measured" and rec["mu"] == rec["mu_measured"] > 0
    # given: designed for mu = 5.3 whatever this machine measured, which is still recorded
    new, _, rec = design_auto.auto_design(_auto_session(tmp_path / "g", *fixed, "design.mu=5.3"))
    assert rec["mu_source"] == "config" and rec["mu"] == 5.3
    assert rec["mu_measured"] is not None and rec["mu_measured"] > 0
    want = feasible_design(5.3, 0.25, 0.5, 32, min_saving=0.0, x_max=float(new.train.steps))
    assert (rec["N"], rec["B"]) == (want.N, want.B) == (new.buffer.capacity, new.batch_size)
    # by hand at alpha = 0.25, rho = 0.5 (test_by_default_a_batch_never_exceeds_the_buffer):
    # x = y = 1.53 -> N = B = round(49.0) = 49; at the measured mu (< 1 here) it would be 32
    assert (rec["N"], rec["B"]) == (49, 49)


def test_on_fallback_values_auto_stays_on_policy_unless_told_to_reuse(tmp_path):
    from replayrl.run.loops import auto as design_auto

    # one warm-up step cannot measure alpha (fallback 0.25); rho given (0.5); mu = 5.3 given;
    # no saving bar: the design on those values reuses (by hand for R = 32, B > N allowed:
    # N = 32, B = 60, saving 7.4%)
    base = (
        "design.warmup_steps=1",
        "design.rho=0.5",
        "design.mu=5.3",
        "design.min_saving=0",
        "design.allow_b_above_n=true",
    )
    new, _, rec = design_auto.auto_design(_auto_session(tmp_path / "default", *base))
    assert rec["alpha_source"] == "fallback" and rec["on_policy"]
    assert (rec["N"], rec["B"], rec["predicted_saving"]) == (32, 32, 0.0)
    assert (new.buffer.capacity, new.batch_size) == (32, 32)
    assert rec["fallback_saving"] == pytest.approx(0.0737, abs=5e-4)
    new, _, rec = design_auto.auto_design(
        _auto_session(tmp_path / "reuse", *base, "design.reuse_on_fallback=true")
    )
    assert not rec["on_policy"] and (rec["N"], rec["B"]) == (32, 60)
    assert rec["predicted_saving"] == pytest.approx(0.0737, abs=5e-4)
    # measured-or-given values are not a fallback: alpha given, the design is used as is
    _, _, rec = design_auto.auto_design(
        _auto_session(tmp_path / "given", *base, "design.alpha=0.25")
    )
    assert not rec["on_policy"] and (rec["N"], rec["B"]) == (32, 60)
    assert "fallback_saving" not in rec
    # and design.allow_b_above_n reaches the design: without it B <= N (N = B = 49)
    _, _, rec = design_auto.auto_design(
        _auto_session(tmp_path / "b_le_n", *base[:-1], "design.alpha=0.25")
    )
    assert (rec["N"], rec["B"]) == (49, 49)


def test_design_mu_must_be_positive_or_measured():
    from replayrl.config.schema import ConfigError, load_config

    for bad in ("0", "-1", "fast"):
        with pytest.raises(ConfigError, match="design.mu"):
            load_config(None, [f"design.mu={bad}"])
    assert load_config(None, ["design.mu=5.3"]).design.mu == 5.3


def test_before_the_design_a_session_has_no_buffers_and_a_balanced_ledger(tmp_path):
    # `auto` builds its buffer only once the design resolves N and B: until then the ledger
    # (an interrupt during the warm-up writes it) sees no buffer instead of failing
    s = _auto_session(tmp_path)
    assert s.source is None and s.buffers() == []
    assert s.accounting()["ledger"]["balanced"]


# -- how sure the measured design is: bootstrap draws of alpha, rho (design.confidence) ----


def test_design_confidence_counts_the_draws_under_which_the_buffer_saves():
    from replayrl.design.theory import design_confidence

    # x = y = 2 at mu = 5.3, saving = 1 - J(2, 2) / J(1, 1), J = x^(2a) (1 + y/mu)(1/y + 1/x + rho):
    #   (a, rho) = (0, 0):      J(2,2) = 1.37736 x 1.0,            J(1,1) = 1.18868 x 2 -> 42.1%
    #   (0.25, 0.5):            J(2,2) = 1.41421 x 1.37736 x 1.5,  J(1,1) = 1.18868 x 2.5 -> 1.68%
    #   (0.45, 1.0):            J(2,2) = 1.86607 x 1.37736 x 2.0,  J(1,1) = 1.18868 x 3 -> -44.2%
    #   None (an ill-conditioned resample): counts as not saving
    draws = [(0.0, 0.0), (0.25, 0.5), None, (0.45, 1.0)]
    assert design_confidence(2.0, 2.0, 5.3, draws, min_saving=0.05) == 0.25
    assert design_confidence(2.0, 2.0, 5.3, draws, min_saving=0.0167) == 0.5
    assert design_confidence(2.0, 2.0, 5.3, draws, min_saving=0.0169) == 0.25
    assert design_confidence(2.0, 2.0, 5.3, draws, min_saving=0.42) == 0.25
    assert design_confidence(2.0, 2.0, 5.3, draws, min_saving=0.422) == 0.0
    assert design_confidence(2.0, 2.0, 5.3, [], min_saving=0.05) == 0.0
    # on-policy itself saves nothing under any draw
    assert design_confidence(1.0, 1.0, 5.3, [(0.1, 0.1)], min_saving=0.0) == 1.0
    assert design_confidence(1.0, 1.0, 5.3, [(0.1, 0.1)], min_saving=0.01) == 0.0
    with pytest.raises(ValueError, match="x >= 1"):
        design_confidence(0.5, 1.0, 5.3, draws, min_saving=0.05)
    with pytest.raises(ValueError, match="alpha"):
        design_confidence(2.0, 2.0, 5.3, [(0.5, 0.1)], min_saving=0.05)


def _measured_probe(monkeypatch, alpha, rho, draws):
    """The probe measures (alpha, rho) and its bootstrap returns `draws` (None: failed)."""
    from replayrl.design.staleness import AlphaRhoEstimate
    from replayrl.run.loops import probe as design_probe

    est = AlphaRhoEstimate(alpha, rho, (1.0, 2.0, 3.0), (1.0, 1.1, 1.2), 96)
    boot = [
        AlphaRhoEstimate(None, None, reason="x") if d is None else AlphaRhoEstimate(*d)
        for d in draws
    ]
    seen = []

    def bootstrap(grads, staleness, clusters, n, seed=0):
        seen.append((n, seed, len(grads)))
        return boot

    monkeypatch.setattr(design_probe, "estimate_alpha_rho", lambda *a: est)
    monkeypatch.setattr(design_probe, "bootstrap_alpha_rho", bootstrap)
    return seen


def test_a_measured_design_reuses_only_when_its_saving_survives_the_bootstrap(
    tmp_path, monkeypatch
):
    from replayrl.design.theory import feasible_design
    from replayrl.run.loops import auto as design_auto

    # at mu = 5.3, alpha = 0.1, rho = 0.1 the design reuses; 9 of 10 draws agree, 1 does not
    sure = [(0.1, 0.1)] * 9 + [(0.45, 1.0)]
    seen = _measured_probe(monkeypatch, 0.1, 0.1, sure)
    s = _auto_session(tmp_path / "a", "design.mu=5.3", "design.bootstrap=10", "train.seed=3")
    new, _, rec = design_auto.auto_design(s)
    want = feasible_design(5.3, 0.1, 0.1, 32, x_max=float(new.train.steps))
    assert not want.on_policy and (rec["N"], rec["B"]) == (want.N, want.B)
    assert rec["confidence"] == 0.9 and rec["confidence_draws"] == 10 and not rec["on_policy"]
    assert seen[-1][:2] == (10, 3)  # design.bootstrap draws, seeded by the run's seed
    # 8 of 10: below design.confidence = 0.9 -> on-policy, saying why
    _measured_probe(monkeypatch, 0.1, 0.1, [(0.1, 0.1)] * 8 + [None, (0.45, 1.0)])
    lines = []
    s = _auto_session(tmp_path / "b", "design.mu=5.3", "design.bootstrap=10")
    s.log = lines.append
    new, _, rec = design_auto.auto_design(s)
    assert rec["on_policy"] and (rec["N"], rec["B"]) == (32, 32) and rec["confidence"] == 0.8
    assert rec["unconfident_saving"] == pytest.approx(want.saving)
    assert any("in only 80% of 10 half-sample re-estimates" in line for line in lines), lines
    assert any("(1 of them not estimable" in line for line in lines), lines
    assert rec["confidence_failed_draws"] == 1
    assert (new.buffer.capacity, new.batch_size) == (32, 32)
    # design.confidence = 0.8 accepts the same draws; 0 trusts the point estimate unasked
    for extra, asked in (("design.confidence=0.8", True), ("design.confidence=0", False)):
        seen = _measured_probe(monkeypatch, 0.1, 0.1, [(0.1, 0.1)] * 8 + [None, (0.45, 1.0)])
        s = _auto_session(tmp_path / extra, "design.mu=5.3", "design.bootstrap=10", extra)
        _, _, rec = design_auto.auto_design(s)
        assert not rec["on_policy"] and (rec["N"], rec["B"]) == (want.N, want.B)
        assert ("confidence" in rec) == asked


def test_a_given_alpha_or_rho_stays_fixed_in_every_bootstrap_draw(tmp_path, monkeypatch):
    from replayrl.run.loops import auto as design_auto

    # rho given as 0.1: draws that measured rho = 1.0 are judged at rho = 0.1 (they save)
    _measured_probe(monkeypatch, 0.1, 1.0, [(0.1, 1.0)] * 10)
    s = _auto_session(tmp_path / "r", "design.mu=5.3", "design.rho=0.1", "design.bootstrap=10")
    _, _, rec = design_auto.auto_design(s)
    assert rec["rho"] == 0.1 and rec["rho_source"] == "config" and rec["alpha_source"] == "measured"
    assert not rec["on_policy"] and rec["confidence"] == 1.0
    # measured rho = 1.0 in every draw (nothing given): the same buffer does not save
    _measured_probe(monkeypatch, 0.1, 0.1, [(0.1, 1.0)] * 10)
    _, _, rec = design_auto.auto_design(
        _auto_session(tmp_path / "m", "design.mu=5.3", "design.bootstrap=10")
    )
    assert rec["on_policy"] and rec["confidence"] == 0.0
