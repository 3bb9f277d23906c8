"""alpha and rho measured on per-sample gradients (replayrl.design.staleness, arXiv 2604.08706)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from replayrl.design.staleness import (
    ALPHA_MAX,
    bootstrap_alpha_rho,
    estimate_alpha_rho,
    fit_power_alpha,
    horizon_variance,
)


def synthetic(
    alpha: float,
    rho: float,
    seed: int,
    levels: int = 6,
    groups: int = 16,
    size: int = 4,
    d: int = 400,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-sample gradients with known alpha and rho, by the module's definitions.

    Item variance v(s) = 2 ((s+1)^(2a+1) - s^(2a+1)), so the buffer mean sigma^2(x) =
    (1/x) sum_{s<x} v(s) = 2 x^(2a) exactly; every buffer item's error is sqrt(rho) u +
    sqrt(1 - rho) z_i (u shared, z_i its own; both standard normal, scaled by sqrt(v(s)/d)),
    so two items' errors have correlation rho. The reference half of the fresh clusters (even
    indices in sorted order: k % 2 == 0 below) is fresh noise around the true mean m only.
    """
    rng = np.random.default_rng(seed)
    m, u = rng.normal(size=d), rng.normal(size=d)
    s_idx = np.arange(levels, dtype=float)
    v = 2.0 * ((s_idx + 1) ** (2 * alpha + 1) - s_idx ** (2 * alpha + 1))
    grads, stale, clusters = [], [], []
    for s in range(levels):
        for k in range(groups):
            for _ in range(size):
                z = rng.normal(size=d)
                ref = s == 0 and k % 2 == 0
                e = z if ref else math.sqrt(rho) * u + math.sqrt(1 - rho) * z
                grads.append(m + math.sqrt(v[s] / d) * e)
                stale.append(s)
                clusters.append(s * 1000 + k)
    return np.array(grads), np.array(stale), np.array(clusters)


def test_horizon_variance_is_the_running_mean_of_item_variances():
    # v = (1, 3, 8): sigma^2(1) = 1, sigma^2(2) = (1 + 3)/2 = 2, sigma^2(3) = 12/3 = 4
    assert horizon_variance(np.array([1.0, 3.0, 8.0])).tolist() == [1.0, 2.0, 4.0]
    with pytest.raises(ValueError, match="non-empty"):
        horizon_variance(np.array([]))


def test_fit_power_alpha_is_half_the_log_log_slope_clipped():
    # sigma^2 = (1, 2, 4) at x = (1, 2, 4): slope of log sigma^2 on log x is 1, alpha = 0.5 ->
    # clipped to ALPHA_MAX; sigma^2 = x^0.6 gives alpha = 0.3; a falling curve gives 0
    assert fit_power_alpha(np.array([1.0, 2, 4]), np.array([1.0, 2, 4])) == ALPHA_MAX
    xs = np.array([1.0, 2, 3, 5])
    assert fit_power_alpha(xs, xs**0.6) == pytest.approx(0.3, abs=1e-12)
    assert fit_power_alpha(xs, 1 / xs) == 0.0
    with pytest.raises(ValueError, match="sigma"):
        fit_power_alpha(xs, np.array([1.0, 0.0, 1, 1]))


@pytest.mark.parametrize(
    ("alpha", "rho"), [(0.25, 0.5), (0.1, 0.0), (0.4, 0.9), (0.0, 0.3), (0.3, 1.0)]
)
def test_estimates_recover_known_alpha_and_rho(alpha: float, rho: float):
    # tolerance: |alpha error| <= 0.03 and |rho error| <= 0.06 at 6 levels x 64 items, d = 400
    # (10 seeds measured: at most 0.009 and 0.024)
    for seed in range(3):
        est = estimate_alpha_rho(*synthetic(alpha, rho, seed))
        assert est.ok, est.reason
        assert est.alpha == pytest.approx(alpha, abs=0.03)
        assert est.rho == pytest.approx(rho, abs=0.06)
        assert est.horizons == (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
        # sigma^2(x) = 2 x^(2 alpha) up to the shared component's realised size
        ratio = np.array(est.sigma2) / (2.0 * np.array(est.horizons) ** (2 * alpha))
        assert np.ptp(ratio) < 0.1 * ratio.mean()


def test_a_fresh_reference_keeps_uncorrelated_items_at_zero():
    # rho = 0: independent items; the sample's own mean as reference would read -1/(n-1) < 0,
    # and a reference without its noise correction would read V / v(s) > 0 (here ~0.06)
    est = estimate_alpha_rho(*synthetic(0.2, 0.0, 7, groups=8))
    assert est.rho == pytest.approx(0.0, abs=0.02)


def test_the_reference_means_own_noise_is_taken_out():
    # 2 reference clusters of 2: m_hat's noise V = v(0)/4 inflates every ||g - m_hat||^2 and
    # every pair's product; uncorrected, alpha reads ~0.05 low and rho ~0.09 low here (10 seeds
    # measured; corrected: at most 0.015 and 0.013)
    for seed in range(3):
        est = estimate_alpha_rho(*synthetic(0.4, 0.9, seed, groups=4, size=2))
        assert est.alpha == pytest.approx(0.4, abs=0.03)
        assert est.rho == pytest.approx(0.9, abs=0.05)


def test_ill_conditioned_inputs_give_no_estimate_and_say_why():
    g, s, c = synthetic(0.25, 0.5, 0, levels=2)
    est = estimate_alpha_rho(g, s, c)
    assert not est.ok and est.alpha is None and "need 0 .. 2" in est.reason
    g, s, c = synthetic(0.25, 0.5, 0, levels=4)
    keep = s != 2  # a missing level in the middle
    assert "none missing" in estimate_alpha_rho(g[keep], s[keep], c[keep]).reason
    g, s, c = synthetic(0.25, 0.5, 0, levels=3, groups=3)
    assert "3 fresh prompt groups" in estimate_alpha_rho(g, s, c).reason
    # no gradient signal: every sample's gradient is the same (e.g. all advantages zero)
    g, s, c = synthetic(0.25, 0.5, 0, levels=3)
    est = estimate_alpha_rho(np.zeros_like(g), s, c)
    assert not est.ok and "no signal" in est.reason


def test_bad_input_is_a_clear_error():
    g, s, c = synthetic(0.25, 0.5, 0, levels=3)
    with pytest.raises(ValueError, match="one per sample"):
        estimate_alpha_rho(g[:-1], s, c)
    with pytest.raises(ValueError, match="whole numbers"):
        estimate_alpha_rho(g, s - 0.5, c)
    bad = g.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        estimate_alpha_rho(bad, s, c)


# -- the run's side: per-sample gradients and how the config's values combine with them ---------
def test_sample_gradients_are_each_rollouts_own_policy_gradient(tiny_model, char_tokenizer):
    import copy
    import dataclasses

    import torch

    from replayrl.config.schema import load_config
    from replayrl.data.rollout_record import Rollout
    from replayrl.learner.grad_probe import sample_gradients
    from replayrl.learner.learner import Learner
    from replayrl.rollout.generation import HFGenerator, SamplingParams

    torch.manual_seed(0)
    (s,) = HFGenerator(tiny_model, char_tokenizer).generate(
        ["12+34="], 1, SamplingParams(max_new_tokens=4)
    )
    base = Rollout(s.prompt_ids, s.completion_ids, s.logprobs, 1.0, 1.0, True, 0, 0, 0)
    rows = [dataclasses.replace(base, advantage=a) for a in (1.0, 2.0, 0.0, -1.0)]
    cfg = load_config(None, ["algorithm.loss_type=grpo_clip"])
    learner = Learner(copy.deepcopy(tiny_model), char_tokenizer.pad_token_id, cfg)
    learner.model.train()
    g = sample_gradients(learner, rows, dims=256)
    assert g.shape == (4, 256) and np.abs(g[0]).max() > 0
    # on-policy (ratio 1, inside the clip) the loss is -A * mean log pi: linear in A
    np.testing.assert_allclose(g[1], 2 * g[0], rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(g[3], -g[0], rtol=1e-5, atol=1e-9)
    assert not np.any(g[2])
    assert learner.model.training  # mode and gradients left as they were
    assert all(p.grad is None for p in learner.model.parameters())


def test_measured_values_replace_only_the_keys_that_ask_for_them():
    from replayrl.config.schema import load_config
    from replayrl.design.staleness import AlphaRhoEstimate
    from replayrl.run.loops.probe import resolve_alpha_rho

    est = AlphaRhoEstimate(0.1, 0.2, (1.0, 2.0, 3.0), (1.0, 1.1, 1.2), 96)
    both = load_config(None, [])
    a, r, rec, line = resolve_alpha_rho(both, est, None)
    assert (a, r, rec["alpha_source"], rec["rho_source"], line) == (
        0.1, 0.2, "measured", "measured", None
    )  # fmt: skip
    assert rec["staleness_sigma2"] == [1.0, 1.1, 1.2] and rec["probe_samples"] == 96
    one = load_config(None, ["design.rho=0.7"])
    a, r, rec, _ = resolve_alpha_rho(one, est, None)
    assert (a, r, rec["rho_source"]) == (0.1, 0.7, "config")
    numbers = load_config(None, ["design.alpha=0.3", "design.rho=0.4"])
    assert resolve_alpha_rho(numbers, None, None)[:2] == (0.3, 0.4)
    # ill-conditioned, or the degenerate alpha = rho = 0 (no finite optimum): the fallback
    for bad in (AlphaRhoEstimate(None, None, reason="too few"), AlphaRhoEstimate(0.0, 0.0)):
        a, r, rec, line = resolve_alpha_rho(both, bad, None)
        assert (a, r, rec["alpha_source"]) == (0.25, 0.5, "fallback")
        assert line is not None and "alpha and rho not measured" in line
        assert "using alpha = 0.25, rho = 0.5 (fallback)" in line
    # the reason, word for word: the estimator's, the blocker's, or the degenerate optimum's
    rec = resolve_alpha_rho(both, AlphaRhoEstimate(None, None, reason="too few"), None)[2]
    assert rec["measure_failed"] == "too few"
    rec = resolve_alpha_rho(both, None, "needs grpo")[2]
    assert rec["measure_failed"] == "needs grpo"
    rec = resolve_alpha_rho(both, AlphaRhoEstimate(0.0, 0.0), None)[2]
    assert rec["measure_failed"] == "measured alpha = rho = 0: the design has no finite optimum"
    assert "measure_failed" not in resolve_alpha_rho(both, est, None)[2]


def test_sample_gradients_serve_every_registered_loss_and_mark_stale_rollouts(
    tiny_model, char_tokenizer
):
    """The probe gives each loss every input and knob it declares (review: `exgrpo` crashed
    without `stale` and `shaping_beta`), and marks a rollout of an earlier policy as a training
    step does: on exgrpo, at ratio w = 1 the shaped term -f(w) A, f(w) = w / (w + beta), has
    gradient f'(1) = beta / (1 + beta)^2 times the clipped (fresh) term's."""
    import copy
    import dataclasses

    import torch

    from replayrl.algorithms.losses import POLICY_LOSSES
    from replayrl.config.schema import load_config
    from replayrl.data.rollout_record import Rollout
    from replayrl.learner.grad_probe import sample_gradients
    from replayrl.learner.learner import Learner
    from replayrl.rollout.generation import HFGenerator, SamplingParams

    torch.manual_seed(0)
    (s,) = HFGenerator(tiny_model, char_tokenizer).generate(
        ["12+34="], 1, SamplingParams(max_new_tokens=4)
    )
    fresh = Rollout(s.prompt_ids, s.completion_ids, s.logprobs, 1.0, 1.0, True, 0, 1, 0)
    stale = dataclasses.replace(fresh, policy_version=0)  # same tokens, one version older
    cfg = load_config("exgrpo", ["method.exgrpo.shaping_beta=0.25"])
    learner = Learner(copy.deepcopy(tiny_model), char_tokenizer.pad_token_id, cfg)
    learner.version = 1
    for name in POLICY_LOSSES:
        learner.loss_type = name
        g = sample_gradients(learner, [fresh, stale], dims=256)
        assert g.shape == (2, 256) and np.all(np.isfinite(g)) and np.abs(g[0]).max() > 0, name
    learner.loss_type = "exgrpo"
    g = sample_gradients(learner, [fresh, stale], dims=256)
    np.testing.assert_allclose(g[1], 0.25 / 1.25**2 * g[0], rtol=1e-4, atol=1e-9)


def test_a_spread_that_falls_with_staleness_is_not_read_as_alpha_zero():
    # held-out sub6, seed 0: sigma^2(x) = 0.49, 0.27, 0.18 at x = 1, 2, 3 (falling); clipped,
    # that read alpha = 0, and the design then asked for x = 120, y = 8 ("staleness is free").
    # A clear fall is now no estimate (the run falls back, saying why); a flat curve is alpha 0
    from replayrl.design.staleness import FALL_TOL, falls_with_staleness

    xs = np.array([1.0, 2.0, 3.0])
    assert falls_with_staleness(xs, np.array([0.49, 0.27, 0.18]))
    assert not falls_with_staleness(xs, np.array([2.03, 2.01, 2.01]))  # flat: noise
    assert not falls_with_staleness(xs, 2.0 * xs**0.5)  # rising: the power law's shape
    # the threshold: a half-slope just above -FALL_TOL is kept, just below it is not
    assert not falls_with_staleness(xs, xs ** (-2 * FALL_TOL + 1e-3))
    assert falls_with_staleness(xs, xs ** (-2 * FALL_TOL - 1e-3))
    # end to end: item variances that shrink with staleness give no estimate, with the reason
    g, s, c = synthetic(0.25, 0.5, 0, levels=4)
    m = g[s == 0].mean(axis=0)
    shrink = np.where(s == 0, 1.0, 1.0 / (1.0 + s) ** 2)[:, None]  # stale items: smaller errors
    est = estimate_alpha_rho(m + (g - m) * np.sqrt(shrink), s, c)
    assert not est.ok and "falls with staleness" in est.reason, est


def test_a_level_whose_gradients_are_all_zero_is_no_signal_not_a_measurement():
    # sub6 seed 4 (held-out suite): one prompt group of the fresh batch had unequal rewards,
    # the stale levels none; the reference took that group, the buffer items were all 0, and
    # E||g - m_hat||^2 - V cancelled to ~1e-18, which the fit read as alpha = 0.3
    g, s, c = synthetic(0.25, 0.5, 0, levels=3)
    g[s > 0] = 0.0  # every stale item's group had equal rewards
    est = estimate_alpha_rho(g, s, c)
    assert not est.ok and est.reason.startswith("no signal at staleness 1")
    # one group with signal at a level is not enough either (a spread needs two)
    g, s, c = synthetic(0.25, 0.5, 0, levels=3)
    lone = c[s == 2][0]
    g[(s == 2) & (c != lone)] = 0.0
    assert "no signal at staleness 2" in estimate_alpha_rho(g, s, c).reason
    # two groups with signal at every level: measured
    g, s, c = synthetic(0.25, 0.5, 0, levels=3)
    keep = np.isin(c, [0, 1, 2, 3, 1000, 1001, 2000, 2001])
    assert estimate_alpha_rho(g[keep], s[keep], c[keep]).ok
    # every item the same nonzero vector: spreads cancel to float noise, not to a fit
    g, s, c = synthetic(0.25, 0.5, 0, levels=3)
    est = estimate_alpha_rho(np.ones_like(g) * 0.3, s, c)
    assert not est.ok and "not above the reference's noise" in est.reason


def _clustered(rng: np.random.Generator, groups: int = 8, d: int = 100):
    """Three staleness levels of `groups` prompt groups x 4 items: a common mean, a bias per
    stale level, a shared error per group and item noise (every group interchangeable)."""
    base = np.random.default_rng(123)
    m = base.normal(size=d) * 0.3
    bias = [np.zeros(d)] + [base.normal(size=d) * math.sqrt(s * 0.5 / d) for s in (1, 2)]
    grads, stale, clusters = [], [], []
    for s in range(3):
        for k in range(groups):
            shared = rng.normal(size=d) * math.sqrt(0.5 / d)
            for _ in range(4):
                grads.append(m + bias[s] + shared + rng.normal(size=d) * math.sqrt(1.0 / d))
                stale.append(s)
                clusters.append(s * 1000 + k)
    return np.array(grads), np.array(stale), np.array(clusters)


def test_resampled_estimates_are_centred_and_as_spread_as_the_estimator_over_data_sets():
    # calibration: the draws of one data set should spread as much as the estimate does over
    # independent data sets (the noise the design wants to survive), centred on the estimate
    rng = np.random.default_rng(0)
    over_sets = np.array(
        [
            (e.alpha, e.rho)
            for e in (estimate_alpha_rho(*_clustered(rng)) for _ in range(120))
            if e.ok
        ]
    )
    assert len(over_sets) == 120
    sd_truth = over_sets.std(axis=0)
    sds, shifts = [], []
    for seed in range(4):
        g, s, c = _clustered(rng)
        est = estimate_alpha_rho(g, s, c)
        draws = bootstrap_alpha_rho(g, s, c, draws=100, seed=seed)
        a = np.array([(d.alpha, d.rho) for d in draws if d.ok])
        assert len(a) == 100
        sds.append(a.std(axis=0))
        shifts.append(a.mean(axis=0) - (est.alpha, est.rho))
    ratio = np.mean(sds, axis=0) / sd_truth
    # measured here: 1.18 for alpha and 1.87 for rho (rho's draws are conservative)
    assert 0.7 < ratio[0] < 1.6 and 0.7 < ratio[1] < 2.0, ratio
    assert np.abs(shifts).max() < 0.1 * sd_truth.min()  # recentred (no clipping here)
    # deterministic given the seed; another seed draws other half-samples
    g, s, c = _clustered(np.random.default_rng(5), groups=6)
    few = bootstrap_alpha_rho(g, s, c, draws=30, seed=0)
    assert [d.alpha for d in bootstrap_alpha_rho(g, s, c, draws=30, seed=0)] == [
        d.alpha for d in few
    ]
    assert [d.alpha for d in bootstrap_alpha_rho(g, s, c, 30, seed=1)] != [d.alpha for d in few]
    assert bootstrap_alpha_rho(g, s, c, draws=0) == []
    with pytest.raises(ValueError, match="draws"):
        bootstrap_alpha_rho(g, s, c, draws=-1)


def test_the_fresh_buffer_half_needs_signal_of_its_own():
    # every fresh group with a nonzero gradient in the reference half: each fresh buffer
    # item's error is then -m_hat, not a spread (the reviewer's case: it read alpha = 0.49)
    g, s, c = synthetic(0.25, 0.5, 0, levels=3)
    ref = np.unique(c[s == 0])[::2]
    g[(s == 0) & ~np.isin(c, ref[:2])] = 0.0
    est = estimate_alpha_rho(g, s, c)
    assert not est.ok and est.reason.startswith("no signal at staleness 0:"), est.reason
    # and the reference half likewise
    g, s, c = synthetic(0.25, 0.5, 0, levels=3)
    g[(s == 0) & np.isin(c, ref[1:])] = 0.0
    assert "staleness 0 (reference half)" in estimate_alpha_rho(g, s, c).reason


def test_resamples_keep_half_of_each_stratum_whole_and_the_reference_split():
    # strata: fresh reference half (clusters 0, 2, 4, 6), fresh buffer half (1, 3, 5, 7), each
    # stale level (8 clusters): every draw keeps 2, 2, 4, 4 of them, whole and without
    # duplicates, and passes its kept reference clusters as the reference
    import replayrl.design.staleness as st

    # d = 20 < n = 72 rows: no change of basis, so the rows seen are original rows
    g, s, c = synthetic(0.25, 0.5, 0, levels=3, groups=8, size=3, d=20)
    seen = []

    def record(grads, staleness, clusters, reference=None):
        seen.append((grads, staleness, clusters, reference))
        return st.AlphaRhoEstimate(None, None, reason="recorded")

    real = st.estimate_alpha_rho
    st.estimate_alpha_rho = record
    try:
        st.bootstrap_alpha_rho(g, s, c, draws=5, seed=3)
    finally:
        st.estimate_alpha_rho = real
    assert len(seen) == 1 + 5  # the full estimate, then one per draw
    assert seen[0][3].tolist() == [0, 2, 4, 6]
    kept_sets = set()
    for grads, staleness, clusters, reference in seen[1:]:
        ids, counts = np.unique(clusters, return_counts=True)
        assert set(counts.tolist()) == {3}  # whole clusters, none twice
        fresh = ids[ids < 1000]
        assert np.isin(reference, [0, 2, 4, 6]).all() and reference.size == 2
        assert np.setdiff1d(fresh, reference).size == 2 and np.isin(fresh, reference).sum() == 2
        assert (ids // 1000 == 1).sum() == 4 and (ids // 1000 == 2).sum() == 4
        for row, k, lev in zip(grads, clusters, staleness, strict=True):  # original rows
            i = np.flatnonzero((g == row).all(axis=1))[0]
            assert c[i] == k and s[i] == lev
        kept_sets.add(tuple(ids.tolist()))
    assert len(kept_sets) > 1  # draws differ


def test_a_spread_equal_to_the_reference_noise_up_to_rounding_is_no_signal():
    # buffer items at distance exactly sqrt(V) from m_hat, so v(s) = E||g - m_hat||^2 - V is
    # 0 in exact arithmetic and +-1e-17 after rounding (positive in about 4 of 10 draws here):
    # the REL_NOISE guard, not a power-law fit, must answer every one
    rng = np.random.default_rng(0)
    for _ in range(20):
        d = 8
        # reference cluster means (a, b, 0, 0) (clusters 0, 2, 4, 6): m_hat = (a + b)/4 and
        # V = sum_k |r_k - m_hat|^2 / (4 x 3)
        a, b = rng.normal(size=d), rng.normal(size=d)
        refs = {0: a, 2: b, 4: np.zeros(d), 6: np.zeros(d)}
        m_hat = (a + b) / 4.0
        v = sum(float((r - m_hat) @ (r - m_hat)) for r in refs.values()) / 12.0
        u = rng.normal(size=d)
        u *= math.sqrt(v / (u @ u))  # |u|^2 = V
        grads, stale, clusters = [], [], []
        for level in range(3):
            for k in range(8):
                for sign in (1.0, -1.0):
                    if level == 0 and k % 2 == 0:  # reference clusters 0, 2, 4, 6
                        g = refs[k]
                    else:
                        g = m_hat + sign * u
                    grads.append(g)
                    stale.append(level)
                    clusters.append(level * 100 + k)
        est = estimate_alpha_rho(np.array(grads), np.array(stale), np.array(clusters))
        assert not est.ok and "not above the reference's noise" in est.reason, est


def test_bootstrap_in_the_rows_own_basis_gives_the_draws_of_the_full_gradients(monkeypatch):
    # wide gradients (d = 400 > n = 96) are replaced by their coordinates in an orthonormal
    # basis of the rows' span: the same draws as on the full vectors, up to rounding
    g, s, c = synthetic(0.2, 0.3, 2, levels=3, groups=8, size=4)
    fast = bootstrap_alpha_rho(g, s, c, draws=20, seed=5)
    monkeypatch.setattr(np.linalg, "qr", lambda a, mode: (None, a))  # basis change: none
    full = bootstrap_alpha_rho(g, s, c, draws=20, seed=5)
    assert sum(d.ok for d in full) >= 15
    for a, b in zip(fast, full, strict=True):
        assert a.ok == b.ok
        if a.ok:
            assert a.alpha == pytest.approx(b.alpha, abs=1e-9)
            assert a.rho == pytest.approx(b.rho, abs=1e-9)
