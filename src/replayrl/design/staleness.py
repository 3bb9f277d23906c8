"""alpha and rho of arXiv 2604.08706's design objective, measured on per-sample gradients.

The theory section of arXiv 2604.08706 models the replay buffer's gradient estimate with

    J(x, y) = sigma^2(x) * (1 + y/mu) * (1/y + 1/x + rho),   sigma(x) = (x/tau)^alpha,

where sigma^2(x) is the variance of one buffer item's gradient estimate when the buffer holds
the last x = N/R steps, and rho the correlation between buffer items (the part of the
variance that more items do not average away). The paper states neither how to measure them
(not specified: our choice), so this module gives them an operational definition on
per-sample policy-gradient vectors g_i (a fixed low-dimensional projection is fine: both
quantities are ratios, unchanged by a common scale), each computed with the *current* policy's
loss on a rollout of staleness s_i (the number of policy updates since it was generated) and
tagged with its cluster (one prompt's group of one batch).

Definitions (m = expected fresh-rollout gradient, e_i = g_i - m):

* per-item variance at staleness s: v(s) = E ||e_i||^2 over items of staleness s (spread and
  staleness bias together: the error of a stale sample against the on-policy gradient);
* sigma^2(x) = (1/x) sum_{s < x} v(s): the mean item error in a FIFO buffer of horizon x,
  which holds one step of each staleness 0 .. x-1 (the synchronous model);
* alpha = half the least-squares slope of log sigma^2(x) against log x, x = 1 .. S+1,
  clipped into [0, ALPHA_MAX] (the power law needs 0 <= alpha < 1/2);
* rho = the mean over pairs i != j of buffer items of E<e_i, e_j> / (sqrt(v(s_i) v(s_j))),
  clipped into [0, 1]: the exchangeable correlation that makes the variance of a mean of n
  items sigma^2 (rho + (1 - rho)/n), i.e. the floor the objective's `+ rho` term stands for.
  Items share error through a common staleness bias (all items of one old policy) and a
  common prompt (one group).

Estimation: m is unknown, so the fresh items are split by cluster into a reference half (every
other cluster in sorted order) whose mean of cluster means is m_hat, and the rest (the
"buffer": the other fresh clusters and every stale item). Against m_hat, E||g_i - m_hat||^2 =
v(s_i) + V and E<g_i - m_hat, g_j - m_hat> = c_ij + V for buffer items (independent of the
reference), with V = E||m_hat - m||^2 estimated from the spread of the reference cluster means
(clusters are independent; items within one are not). Subtracting V makes both unbiased.
Using a fresh reference rather than all items keeps the fresh buffer items' errors from
being forced to sum to zero (the centred-Gram trap: a sample's own mean makes the
off-diagonal mean exactly -1/(n-1) whatever the truth).

Ill-conditioned (returns no estimate, with the reason): fewer than MIN_LEVELS staleness levels
(0, 1, 2, ... contiguous), a level with fewer than 2 items, fewer than 4 fresh clusters, or a
sigma^2(x) not above the reference noise (no gradient signal to fit a power law on), or a
sigma^2(x) that falls with x (the power law, which grows with x, does not fit: clipping its
slope to alpha = 0 would tell the design that staleness is free; seen on the held-out task
sub6, where it asked for x = 120, y = 8), or a level with fewer than two prompt groups
whose gradients are not 0 (groups with equal rewards have advantage 0: seen on sub6, where a
level of zero gradients gave float-cancellation spreads of 1e-18 and a "measured" alpha of
0.3).

How sure: `bootstrap_alpha_rho` re-estimates on stratified half-samples of the same prompt
groups, recentred on the full estimate, so the design can ask whether its predicted saving
survives the sampling noise of this warm-up's gradients (design/theory.py
`design_confidence`). That is not the spread between seeds, whose policy updates differ (on
the held-out tasks measured alpha ranged from 0 to 0.18 across seeds and tasks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

ALPHA_MAX = 0.49  # the power law needs alpha < 1/2; the design's optimum diverges at 1/2
MIN_LEVELS = 3  # staleness 0, 1, 2 at least: two points always fit a line exactly
MIN_FRESH_CLUSTERS = 4  # two for the reference mean's spread, the rest in the buffer
# a fitted half-slope below -FALL_TOL is a falling sigma^2(x), not noise around alpha = 0
# (the estimator's error on synthetic gradients: at most 0.009 over 10 seeds). Our choice,
# calibrated on synthetic gradients only: a real three-level probe is noisier, so a flat
# truth may fall back more often than it reads alpha = 0 (logged; rho is then not used)
FALL_TOL = 0.05
# squared norm of a projected per-sample gradient at or below which it carries no signal (an
# item whose group's rewards are all equal has advantage 0 and a gradient of exactly 0; real
# ones measured 1e-4 .. 10 on our probes)
MIN_SIGNAL = 1e-12
# a level's spread v(s) = E||g - m_hat||^2 - V must exceed this share of E||g - m_hat||^2:
# below it the difference is float cancellation (seen on sub6: 1e-18 "spreads" from a level
# whose every gradient was 0 gave a measured alpha = 0.3)
REL_NOISE = 1e-6

__all__ = [
    "ALPHA_MAX",
    "FALL_TOL",
    "MIN_LEVELS",
    "MIN_SIGNAL",
    "REL_NOISE",
    "AlphaRhoEstimate",
    "bootstrap_alpha_rho",
    "estimate_alpha_rho",
    "falls_with_staleness",
    "fit_power_alpha",
    "horizon_variance",
    "reference_clusters",
]


@dataclass(frozen=True)
class AlphaRhoEstimate:
    """alpha, rho and the curve they came from; `reason` says why they are None."""

    alpha: float | None
    rho: float | None
    horizons: tuple[float, ...] = ()  # x = 1 .. S+1
    sigma2: tuple[float, ...] = ()  # sigma^2(x), on the projection's scale
    samples: int = 0
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.alpha is not None and self.rho is not None


def horizon_variance(item_variance: np.ndarray) -> np.ndarray:
    """sigma^2(x) = (1/x) sum_{s<x} v(s), x = 1 .. len(v): a FIFO of horizon x holds one step of
    each staleness 0 .. x-1 (arXiv 2604.08706, synchronous model)."""
    v = np.asarray(item_variance, dtype=float)
    if v.ndim != 1 or v.size == 0:
        raise ValueError("item_variance must be a non-empty 1-D array (one value per staleness)")
    return np.cumsum(v) / np.arange(1, v.size + 1)


def fit_power_alpha(xs: np.ndarray, sigma2: np.ndarray) -> float:
    """alpha of sigma(x) = (x/tau)^alpha (arXiv 2604.08706): half the least-squares slope of
    log sigma^2 on log x, clipped into [0, ALPHA_MAX] (tau drops out of the design)."""
    x, s2 = np.asarray(xs, dtype=float), np.asarray(sigma2, dtype=float)
    ok = x.shape == s2.shape and x.ndim == 1 and x.size >= 2
    if not ok or not np.all(np.isfinite(x) & np.isfinite(s2) & (x > 0) & (s2 > 0)):
        raise ValueError("need >= 2 points with x > 0 and sigma^2 > 0 to fit a power law")
    lx, ls = np.log(x), np.log(s2)
    if np.ptp(lx) == 0:
        raise ValueError("all x are equal: the slope is undefined")
    slope = float(np.polyfit(lx, ls, 1)[0])
    return min(max(slope / 2.0, 0.0), ALPHA_MAX)


def falls_with_staleness(xs: np.ndarray, sigma2: np.ndarray) -> bool:
    """Is half the least-squares slope of log sigma^2 on log x below -FALL_TOL? Then the
    measured spread clearly shrinks as the buffer grows staler, the opposite of paper 1's
    power law (sigma grows with x): clipping to alpha = 0 ("staleness is free") would rest on
    a model that does not fit. A flat curve (true alpha = 0 plus noise) stays alpha = 0."""
    lx, ls = np.log(np.asarray(xs, dtype=float)), np.log(np.asarray(sigma2, dtype=float))
    return float(np.polyfit(lx, ls, 1)[0]) / 2.0 < -FALL_TOL


def _check(grads: np.ndarray, staleness: np.ndarray, clusters: np.ndarray) -> None:
    if grads.ndim != 2 or grads.shape[0] != staleness.shape[0] or staleness.ndim != 1:
        raise ValueError("grads must be (n, d) and staleness (n,), one per sample")
    if clusters.shape != staleness.shape:
        raise ValueError("clusters must be (n,), one per sample")
    if not np.all(np.isfinite(grads)):
        raise ValueError("grads must be finite")
    if np.any(staleness < 0) or np.any(staleness != np.round(staleness)):
        raise ValueError("staleness must be whole numbers >= 0")


def reference_clusters(staleness: np.ndarray, clusters: np.ndarray) -> np.ndarray:
    """The fresh clusters whose mean is the reference m_hat: every other fresh cluster id in
    sorted order (the rest of the fresh clusters join the buffer)."""
    return np.unique(np.asarray(clusters)[np.asarray(staleness) == 0])[::2]


def _reference(
    grads: np.ndarray, fresh: np.ndarray, clusters: np.ndarray, ref_ids: np.ndarray
) -> tuple[np.ndarray, float, np.ndarray] | str:
    """(m_hat, V_hat, reference mask) from the fresh clusters `ref_ids`, or why not."""
    ids = np.unique(clusters[fresh])
    if ids.size < MIN_FRESH_CLUSTERS:
        return f"{ids.size} fresh prompt groups, need {MIN_FRESH_CLUSTERS}"
    if ref_ids.size < 2 or ids.size - ref_ids.size < 2 or not np.isin(ref_ids, ids).all():
        return "the reference half needs >= 2 fresh prompt groups and leaves >= 2 in the buffer"
    ref = fresh & np.isin(clusters, ref_ids)
    means = np.stack([grads[ref & (clusters == k)].mean(axis=0) for k in ref_ids])
    m_hat = means.mean(axis=0)
    k = means.shape[0]
    v_hat = float(((means - m_hat) ** 2).sum() / (k * (k - 1)))
    return m_hat, v_hat, ref


def _no_signal(
    live: np.ndarray, staleness: np.ndarray, clusters: np.ndarray, in_ref: np.ndarray, levels: int
) -> str | None:
    """Why the spreads cannot be measured: a part with fewer than 2 prompt groups whose
    gradients are not 0 (the fresh reference half and the fresh buffer half each, and every
    stale level), else None."""
    parts = [("staleness 0 (reference half)", in_ref), ("staleness 0", ~in_ref & (staleness == 0))]
    parts += [(f"staleness {k}", staleness == k) for k in range(1, levels)]
    for name, part in parts:
        if np.unique(clusters[live & part]).size < 2:
            return (
                f"no signal at {name}: fewer than 2 prompt groups with a nonzero gradient "
                "(unequal rewards), so its spread is not measured"
            )
    return None


def _rho(err: np.ndarray, level_of: np.ndarray, v_level: np.ndarray, v_ref: float) -> float:
    """mean_{i != j} (<e_i, e_j> - V) / sqrt(v(s_i) v(s_j)), clipped into [0, 1]."""
    n = err.shape[0]
    w = 1.0 / np.sqrt(v_level[level_of])  # 1 / sigma of each item's level
    z = err * w[:, None]
    cross = float((z.sum(axis=0) ** 2).sum() - (z**2).sum())  # sum over i != j of <z_i, z_j>
    ref = v_ref * float(w.sum() ** 2 - (w**2).sum())  # sum over i != j of V w_i w_j
    return min(max((cross - ref) / (n * (n - 1)), 0.0), 1.0)


def estimate_alpha_rho(
    grads: np.ndarray,
    staleness: np.ndarray,
    clusters: np.ndarray,
    reference: np.ndarray | None = None,
) -> AlphaRhoEstimate:
    """alpha and rho from per-sample gradients (definitions and estimator: module docstring,
    after arXiv 2604.08706's theory); None for both, with the reason, when ill-conditioned.
    `reference`: the fresh cluster ids of the reference half (default `reference_clusters`)."""
    g = np.asarray(grads, dtype=float)
    s = np.asarray(staleness, dtype=float)
    cl = np.asarray(clusters)
    _check(g, s, cl)
    n = g.shape[0]
    levels = int(s.max()) + 1 if n else 0
    counts = np.bincount(s.astype(int), minlength=levels) if n else np.zeros(0, int)
    if levels < MIN_LEVELS or np.any(counts == 0):
        return AlphaRhoEstimate(
            None,
            None,
            samples=n,
            reason=f"staleness levels {sorted(set(s.astype(int)))}, "
            f"need 0 .. {MIN_LEVELS - 1} at least, none missing",
        )
    ref_ids = reference_clusters(s, cl) if reference is None else np.asarray(reference)
    ref = _reference(g, s == 0, cl, ref_ids)
    if isinstance(ref, str):
        return AlphaRhoEstimate(None, None, samples=n, reason=ref)
    m_hat, v_ref, in_ref = ref
    live = (g**2).sum(axis=1) > MIN_SIGNAL  # items whose group had unequal rewards
    why = _no_signal(live, s, cl, in_ref, levels)
    if why is not None:
        return AlphaRhoEstimate(None, None, samples=n, reason=why)
    buf = ~in_ref
    err, lev = g[buf] - m_hat, s[buf].astype(int)
    per_level = np.bincount(lev, minlength=levels)
    if np.any(per_level < 2):
        return AlphaRhoEstimate(None, None, samples=n, reason="a staleness level has < 2 items")
    sq = np.bincount(lev, weights=(err**2).sum(axis=1), minlength=levels) / per_level
    v_level = sq - v_ref
    xs = np.arange(1, levels + 1, dtype=float)
    sig = horizon_variance(v_level)
    # above the reference's noise by more than float cancellation (sq and V nearly equal)
    if np.any(v_level <= REL_NOISE * sq) or not math.isfinite(float(sig.sum())):
        return AlphaRhoEstimate(
            None, None, tuple(xs), tuple(sig), n,
            "a level's gradient spread is not above the reference's noise (no signal)",
        )  # fmt: skip
    if falls_with_staleness(xs, sig):
        return AlphaRhoEstimate(
            None, None, tuple(map(float, xs)), tuple(map(float, sig)), n,
            "the gradient spread falls with staleness (sigma^2(x) = "
            + ", ".join(f"{v:.3g}" for v in sig)
            + "): paper 1's power law, growing with x, does not fit",
        )  # fmt: skip
    alpha = fit_power_alpha(xs, sig)
    rho = _rho(err, lev, v_level, v_ref)
    return AlphaRhoEstimate(alpha, rho, tuple(float(x) for x in xs), tuple(map(float, sig)), n)


def bootstrap_alpha_rho(
    grads: np.ndarray,
    staleness: np.ndarray,
    clusters: np.ndarray,
    draws: int,
    seed: int = 0,
) -> list[AlphaRhoEstimate]:
    """How far `estimate_alpha_rho` (module docstring, after arXiv 2604.08706's J(x, y)) moves
    with the warm-up's sampling noise: `draws` re-estimates on stratified half-samples of the
    prompt groups, recentred on the full estimate (the resampling is our choice).

    Strata: the fresh reference half, the fresh buffer half and each stale level; each draw
    keeps half of every stratum's clusters (at least 2), without replacement, whole (one
    prompt's items share a prompt and a policy, so they are not independent), and the
    reference stays the reference. For a mean-like statistic the half-sample's deviation from
    the full-sample value has the full estimator's sampling spread (s^2 (1/m - 1/n) = s^2/n at
    m = n/2), with no duplicated cluster (a with-replacement bootstrap's copies would straddle
    the reference/buffer split and add perfectly correlated pairs, biasing alpha and rho up).
    Each draw is returned as full + (half-sample - mean of the half-samples), clipped into
    alpha's [0, ALPHA_MAX] and rho's [0, 1]: the half-samples' own small-sample bias removed.
    A half-sample that cannot be estimated (no signal, a falling spread) is returned as it is,
    with its reason; so are all draws when the full data cannot be estimated.
    """
    g = np.asarray(grads, dtype=float)
    s = np.asarray(staleness, dtype=float)
    cl = np.asarray(clusters)
    _check(g, s, cl)
    if draws < 0:
        raise ValueError(f"draws must be >= 0, got {draws}")
    if g.shape[1] > g.shape[0]:
        # the rows' coordinates in an orthonormal basis of their span (g^T = Q R -> g Q = R^T):
        # every inner product, norm and mean the estimator takes is unchanged, at n columns
        # instead of d (4,096 projected coordinates for ~200 rollouts: ~10x faster draws)
        g = np.linalg.qr(g.T, mode="reduced")[1].T
    ref_ids = reference_clusters(s, cl)
    full = estimate_alpha_rho(g, s, cl, ref_ids)
    fresh_ids = np.unique(cl[s == 0])
    strata = [ref_ids, np.setdiff1d(fresh_ids, ref_ids)]
    strata += [np.unique(cl[s == k]) for k in np.unique(s) if k > 0]
    rng = np.random.default_rng(seed)
    halves = []
    for _ in range(draws):
        kept = [
            rng.choice(ids, size=min(ids.size, max(2, ids.size // 2)), replace=False)
            for ids in strata
        ]
        rows = np.isin(cl, np.concatenate(kept))
        halves.append(estimate_alpha_rho(g[rows], s[rows], cl[rows], kept[0]))
    ok = [h for h in halves if h.ok]
    if not full.ok or not ok:
        return halves
    shift_a = float(full.alpha) - float(np.mean([h.alpha for h in ok]))  # type: ignore[arg-type]
    shift_r = float(full.rho) - float(np.mean([h.rho for h in ok]))  # type: ignore[arg-type]
    return [
        replace(
            h,
            alpha=min(max(h.alpha + shift_a, 0.0), ALPHA_MAX),  # type: ignore[operator]
            rho=min(max(h.rho + shift_r, 0.0), 1.0),  # type: ignore[operator]
        )
        if h.ok
        else h
        for h in halves
    ]
