"""Replay-buffer design from the synchronous cost model of arXiv 2604.08706 (its theory).

Model: every step generates ``R`` rollouts into a FIFO buffer of capacity ``N`` and trains on
``B`` samples drawn from it.  ``mu`` is generation cost / training cost per sample, ``x = N/R``
is the staleness horizon, ``y = B/R`` the replay ratio (average uses of each rollout) and
``rho`` in [0, 1] the correlation between buffer items.  The design objective is

    J(x, y) = sigma^2(x) * (1 + y/mu) * (1/y + 1/x + rho).

Minimising in ``y`` gives ``y*(x) = sqrt(mu / (rho + 1/x))`` and, substituting back,

    J(x, y*(x)) = g(x) = sigma^2(x) * (1/sqrt(mu) + sqrt(rho + 1/x))^2.

Power-law variance ``sigma(x) = (x/tau)^alpha`` (0 <= alpha < 1/2).  Setting
d log g / dx = 0 gives ``2 alpha x s (1/sqrt(mu) + s) = 1`` with ``s = sqrt(rho + 1/x)``.
Writing ``s = sqrt(mu)/y`` (i.e. ``y = y*(x)``, hence ``x = y^2 / (mu - rho y^2)``) turns this
into the quadratic ``rho y^2 + 2 alpha y - mu (1 - 2 alpha) = 0``, whose positive root is the
paper's ``y* = (-alpha + sqrt(alpha^2 + mu rho (1 - 2 alpha))) / rho``.  So the restated
formula of arXiv 2604.08706 is correct (g -> inf at both ends for 0 < alpha < 1/2 and there is one
stationary point, so it is the global minimum).  We evaluate it in the algebraically
equivalent, cancellation-free forms

    y* = mu (1 - 2 alpha) / (alpha + sqrt(alpha^2 + mu rho (1 - 2 alpha))),
    x* = y*^2 / (2 alpha (y* + mu))          [= y*^2 / (mu - rho y*^2) by the quadratic],

which stay accurate for small ``rho`` and contain the ``rho = 0`` limit
(``y* = mu (1 - 2 alpha) / (2 alpha)``, ``x* = y*^2 / mu``) without special-casing.  For
``alpha = 0`` and ``rho > 0`` g decreases monotonically in x: ``x* = inf`` and
``y* = sqrt(mu / rho)``; for ``alpha = rho = 0`` the optimum is unbounded (ValueError).

Only the ratios x, y are determined; ``buffer_design`` turns them into (N, B) for a given R.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

__all__ = [
    "DesignReport",
    "FeasibleDesign",
    "buffer_design",
    "closed_form_power_law",
    "constrained_optimum",
    "constrained_y",
    "cost_ratio",
    "design",
    "design_confidence",
    "estimate_mu",
    "feasible_design",
    "fit_alpha_rho",
    "format_feasible",
    "format_report",
    "gamma",
    "interpolated_variance",
    "numerical_optimum",
    "objective",
    "on_policy_design",
    "optimal_y",
    "power_law_variance",
    "reduced_objective",
]

VarianceFn = Callable[[np.ndarray], np.ndarray]
ArrayLike = float | np.ndarray

_INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0  # 1/golden ratio


# --------------------------------------------------------------------------- validation


def _check_mu(mu: float) -> float:
    mu = float(mu)
    if not math.isfinite(mu) or mu <= 0.0:
        raise ValueError(f"mu (generation/training cost ratio) must be finite and > 0, got {mu!r}")
    return mu


def _check_rho(rho: float) -> float:
    rho = float(rho)
    if not math.isfinite(rho) or not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho (correlation between buffer items) must be in [0, 1], got {rho!r}")
    return rho


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not math.isfinite(alpha) or not 0.0 <= alpha < 0.5:
        raise ValueError(f"alpha (power-law variance exponent) must be in [0, 1/2), got {alpha!r}")
    return alpha


def _check_tau(tau: float) -> float:
    tau = float(tau)
    if not math.isfinite(tau) or tau <= 0.0:
        raise ValueError(f"tau (power-law variance scale) must be finite and > 0, got {tau!r}")
    return tau


# --------------------------------------------------------------------------- model


def power_law_variance(alpha: float, tau: float = 1.0) -> VarianceFn:
    """Power-law variance of arXiv 2604.08706, theory, sigma(x) = (x/tau)^alpha, as sigma^2(x)."""
    alpha = _check_alpha(alpha)
    tau = _check_tau(tau)

    def sigma2(x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=float) / tau) ** (2.0 * alpha)

    return sigma2


def objective(
    x: ArrayLike, y: ArrayLike, mu: float, rho: float, sigma2: ArrayLike | VarianceFn
) -> ArrayLike:
    """Design objective J(x, y) = sigma^2(x) * (1 + y/mu) * (1/y + 1/x + rho) (arXiv 2604.08706)."""
    mu = _check_mu(mu)
    rho = _check_rho(rho)
    x_arr = np.asarray(x, dtype=float)
    y_arr = np.asarray(y, dtype=float)
    if np.any(~(x_arr > 0)) or np.any(~(y_arr > 0)):
        raise ValueError("x (staleness horizon N/R) and y (replay ratio B/R) must be > 0")
    s2 = sigma2(x_arr) if callable(sigma2) else np.asarray(sigma2, dtype=float)
    out = s2 * (1.0 + y_arr / mu) * (1.0 / y_arr + 1.0 / x_arr + rho)
    return float(out) if np.ndim(out) == 0 else out


def optimal_y(x: ArrayLike, mu: float, rho: float) -> ArrayLike:
    """Optimal replay ratio for a horizon, y*(x) = sqrt(mu / (rho + 1/x)) (arXiv 2604.08706)."""
    mu = _check_mu(mu)
    rho = _check_rho(rho)
    x_arr = np.asarray(x, dtype=float)
    if np.any(~(x_arr > 0)):
        raise ValueError(f"x (staleness horizon N/R) must be > 0, got {x!r}")
    with np.errstate(divide="ignore"):
        c = rho + 1.0 / x_arr  # x = inf is allowed: c = rho
    if np.any(c <= 0):
        raise ValueError("y*(x) is unbounded for rho = 0 and x = inf")
    out = np.sqrt(mu / c)
    return float(out) if np.ndim(out) == 0 else out


def reduced_objective(x: ArrayLike, mu: float, rho: float, sigma2: VarianceFn) -> ArrayLike:
    """J min over y: g(x) = sigma^2(x) * (1/sqrt(mu) + sqrt(rho + 1/x))^2 (arXiv 2604.08706)."""
    mu = _check_mu(mu)
    rho = _check_rho(rho)
    x_arr = np.asarray(x, dtype=float)
    if np.any(~(x_arr > 0)):
        raise ValueError("x (staleness horizon N/R) must be > 0")
    out = (
        np.asarray(sigma2(x_arr), dtype=float)
        * (1.0 / math.sqrt(mu) + np.sqrt(rho + 1.0 / x_arr)) ** 2
    )
    return float(out) if np.ndim(out) == 0 else out


def closed_form_power_law(mu: float, alpha: float, rho: float) -> tuple[float, float]:
    """Power-law optimum y* = (-a + sqrt(a^2 + mu rho (1-2a)))/rho, x* = y*^2/(mu - rho y*^2)."""
    mu = _check_mu(mu)
    alpha = _check_alpha(alpha)
    rho = _check_rho(rho)
    if alpha == 0.0 and rho == 0.0:
        raise ValueError(
            "alpha = 0 and rho = 0: the objective decreases without bound in both x and y, "
            "so there is no finite optimum (use alpha > 0 or rho > 0)"
        )
    root = math.sqrt(alpha * alpha + mu * rho * (1.0 - 2.0 * alpha))
    # Rationalised root of rho y^2 + 2 alpha y - mu (1 - 2 alpha) = 0; equals the paper's form
    # for rho > 0 and gives the rho -> 0 limit mu (1 - 2 alpha) / (2 alpha) continuously.
    y_star = mu * (1.0 - 2.0 * alpha) / (alpha + root)
    if alpha == 0.0:
        # g(x) is decreasing in x: the buffer should be as large as possible.
        return math.inf, y_star
    # mu - rho y*^2 = 2 alpha (y* + mu) on the root; the right side has no cancellation.
    x_star = y_star * y_star / (2.0 * alpha * (y_star + mu))
    return x_star, y_star


def interpolated_variance(
    xs: Sequence[float] | np.ndarray,
    sigma2s: Sequence[float] | np.ndarray,
    extrapolate: bool = True,
) -> VarianceFn:
    """Log-log interpolant of a measured sigma^2(x) curve for the x* argmin (arXiv 2604.08706).

    Outside ``[xs[0], xs[-1]]`` the end segments are extended as power laws when
    ``extrapolate`` is true; otherwise the end values are held constant.
    """
    xa = np.asarray(xs, dtype=float)
    s = np.asarray(sigma2s, dtype=float)
    if xa.ndim != 1 or s.shape != xa.shape or xa.size < 2:
        raise ValueError("xs and sigma2s must be 1-D arrays of the same length >= 2")
    if not np.all(np.isfinite(xa)) or np.any(xa <= 0) or np.any(np.diff(xa) <= 0):
        raise ValueError("xs must be finite, > 0 and strictly increasing")
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ValueError("sigma2s must be finite and > 0")
    lx = np.log(xa)
    ls = np.log(s)
    slope_lo = (ls[1] - ls[0]) / (lx[1] - lx[0])
    slope_hi = (ls[-1] - ls[-2]) / (lx[-1] - lx[-2])

    def sigma2(x: np.ndarray) -> np.ndarray:
        lq = np.log(np.asarray(x, dtype=float))
        out = np.interp(lq, lx, ls)
        if extrapolate:
            out = np.where(lq < lx[0], ls[0] + slope_lo * (lq - lx[0]), out)
            out = np.where(lq > lx[-1], ls[-1] + slope_hi * (lq - lx[-1]), out)
        return np.exp(out)

    return sigma2


def numerical_optimum(
    mu: float,
    rho: float,
    sigma2: VarianceFn,
    x_min: float = 1e-3,
    x_max: float = 1e6,
    grid_points: int = 2001,
) -> tuple[float, float]:
    """Numerical x* = argmin_x sigma^2(x) (1/sqrt(mu) + sqrt(rho + 1/x))^2, y* = y*(x*) (§1).

    A log-spaced grid on ``[x_min, x_max]`` locates the best cell, then golden-section search
    on log x refines it.  Emits a RuntimeWarning if the minimum sits on the search boundary.
    """
    mu = _check_mu(mu)
    rho = _check_rho(rho)
    if not (0.0 < x_min < x_max < math.inf):
        raise ValueError(f"need 0 < x_min < x_max < inf, got x_min={x_min!r}, x_max={x_max!r}")
    if grid_points < 3:
        raise ValueError(f"grid_points must be >= 3, got {grid_points!r}")
    inv_sqrt_mu = 1.0 / math.sqrt(mu)

    def log_g(u: np.ndarray) -> np.ndarray:
        x = np.exp(u)
        s2 = np.asarray(sigma2(x), dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            val = np.log(s2) + 2.0 * np.log(inv_sqrt_mu + np.sqrt(rho + 1.0 / x))
        return np.where(np.isfinite(val) & (s2 > 0), val, np.inf)

    lo, hi = math.log(x_min), math.log(x_max)
    grid = np.linspace(lo, hi, grid_points)
    vals = log_g(grid)
    if not np.any(np.isfinite(vals)):
        raise ValueError("sigma2(x) is not finite and positive anywhere on [x_min, x_max]")
    i = int(np.argmin(vals))
    a = grid[max(i - 1, 0)]
    b = grid[min(i + 1, grid_points - 1)]

    def f(u: float) -> float:
        return float(log_g(np.array([u]))[0])

    # Golden-section search on [a, b] (log x).
    c = b - _INV_PHI * (b - a)
    d = a + _INV_PHI * (b - a)
    fc, fd = f(c), f(d)
    while b - a > 1e-12 * max(1.0, abs(a) + abs(b)):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - _INV_PHI * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + _INV_PHI * (b - a)
            fd = f(d)
    u_star = 0.5 * (a + b)
    # Keep the grid point if refinement did not improve on it (e.g. a non-smooth curve).
    if vals[i] < f(u_star):
        u_star = float(grid[i])
    x_star = float(min(max(math.exp(u_star), x_min), x_max))
    if i in (0, grid_points - 1):
        warnings.warn(
            f"numerical optimum x*={x_star:.6g} lies on the search boundary "
            f"[{x_min:g}, {x_max:g}]; the true optimum may lie outside it",
            RuntimeWarning,
            stacklevel=2,
        )
    return x_star, float(optimal_y(x_star, mu, rho))


def buffer_design(x_star: float, y_star: float, rollouts_per_step: int) -> tuple[int, int]:
    """Integer buffer size and batch from x = N/R, y = B/R: N = round(x R), B = round(y R) (§1)."""
    r = int(rollouts_per_step)
    if r != rollouts_per_step or r < 1:
        raise ValueError(
            f"rollouts_per_step (R) must be a positive integer, got {rollouts_per_step!r}"
        )
    for name, v in (("x_star", x_star), ("y_star", y_star)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(
                f"{name} must be finite and > 0, got {v!r}"
                + (" (alpha = 0 means no finite optimal buffer size)" if name == "x_star" else "")
            )
    n = max(1, math.floor(x_star * r + 0.5))
    b = max(1, math.floor(y_star * r + 0.5))
    return n, b


def gamma(mu: float, workers: int, trainers: int) -> float:
    """Compute per baseline update, gamma = (1 + W/T) / (1 + mu) (arXiv 2604.08706)."""
    mu = float(mu)
    if not math.isfinite(mu) or mu < 0:
        raise ValueError(f"mu must be finite and >= 0, got {mu!r}")
    if workers < 0:
        raise ValueError(f"workers (W) must be >= 0, got {workers!r}")
    if trainers <= 0:
        raise ValueError(f"trainers (T) must be > 0, got {trainers!r}")
    return (1.0 + workers / trainers) / (1.0 + mu)


def cost_ratio(
    gen_seconds: float, generated: float, train_seconds: float, trained: float
) -> float | None:
    """mu over one span of work: generation seconds per generated sample divided by training
    seconds per trained sample (arXiv 2604.08706, the compute model behind gamma = (1 + W/T) /
    (1 + mu): mu is the cost of generating a rollout relative to the cost of training on it).

    The span is one step for the per-step values `estimate_mu` takes the median of, or a whole
    run's busy time for the async accounting (`accounting.role_summary`). `trained` counts a
    rollout once per update pass (epochs). None when the span measured nothing: no samples on
    either side, no (or non-finite) training time, or a negative generation time.
    """
    if not (generated > 0 and trained > 0):
        return None
    if not (math.isfinite(gen_seconds) and gen_seconds >= 0.0):
        return None
    if not (math.isfinite(train_seconds) and train_seconds > 0.0):
        return None
    return (gen_seconds / generated) / (train_seconds / trained)


def estimate_mu(step_mus: Sequence[float]) -> float | None:
    """mu = the median over steps of the per-step `cost_ratio` (arXiv 2604.08706 estimates
    mu as inference time per sample vs trainer time per sample, median over a run).

    The median of per-step ratios, not the ratio of totals: a few slow steps (first-step
    compilation, a stalled reward call) do not move it. Non-finite or negative entries are
    skipped; None when no step is usable (the summary's "not measured").
    """
    vals = [float(m) for m in step_mus]
    ok = [m for m in vals if math.isfinite(m) and m >= 0.0]
    return float(np.median(ok)) if ok else None


# --------------------------------------------------------------------------- report


@dataclass(frozen=True)
class DesignReport:
    """Replay design for given (mu, alpha, rho): closed-form and numerical optima (§1)."""

    mu: float
    alpha: float
    rho: float
    x_star: float
    y_star: float
    x_star_num: float
    y_star_num: float
    tau: float = 1.0
    rollouts_per_step: int | None = None
    N: int | None = None
    B: int | None = None
    workers: int | None = None
    trainers: int | None = None
    gamma: float | None = None


def design(
    mu: float,
    alpha: float,
    rho: float,
    rollouts_per_step: int | None = None,
    workers: int | None = None,
    trainers: int | None = None,
    tau: float = 1.0,
) -> DesignReport:
    """Design for sigma = (x/tau)^alpha: closed-form/numerical x*, y*, (N, B), gamma (§1)."""
    x_star, y_star = closed_form_power_law(mu, alpha, rho)
    with warnings.catch_warnings():
        # For alpha = 0 the numerical optimum sits on x_max by construction.
        if alpha == 0.0:
            warnings.simplefilter("ignore", RuntimeWarning)
        x_num, y_num = numerical_optimum(mu, rho, power_law_variance(alpha, tau))
    n = b = None
    if rollouts_per_step is not None:
        n, b = buffer_design(x_star, y_star, rollouts_per_step)
    if (workers is None) != (trainers is None):
        raise ValueError("give both workers (W) and trainers (T), or neither")
    g = gamma(mu, workers, trainers) if workers is not None and trainers is not None else None
    return DesignReport(
        mu=float(mu),
        alpha=float(alpha),
        rho=float(rho),
        x_star=x_star,
        y_star=y_star,
        x_star_num=x_num,
        y_star_num=y_num,
        tau=float(tau),
        rollouts_per_step=rollouts_per_step,
        N=n,
        B=b,
        workers=workers,
        trainers=trainers,
        gamma=g,
    )


def format_report(report: DesignReport) -> str:
    """Human-readable explanation of a DesignReport (x = N/R, y = B/R; arXiv 2604.08706, theory)."""
    r = report
    lines = [
        "Replay-buffer design (synchronous model, arXiv 2604.08706)",
        f"  mu    = {r.mu:.4g}  generation cost / training cost per sample",
        f"  alpha = {r.alpha:.4g}  variance exponent, sigma(x) = (x/{r.tau:g})^alpha",
        f"  rho   = {r.rho:.4g}  correlation between buffer items",
        f"  x*    = {r.x_star:.4g}  staleness horizon x = N/R, buffer holds x steps [closed form]",
        f"  y*    = {r.y_star:.4g}  replay ratio y = B/R, average uses per rollout [closed form]",
        f"  x*num = {r.x_star_num:.4g}, y*num = {r.y_star_num:.4g}  numerical argmin (check)",
    ]
    if r.N is not None and r.B is not None:
        lines.append(
            f"  R = {r.rollouts_per_step}, unconstrained: N = round(x* R) = {r.N}, "
            f"batch B = round(y* R) = {r.B} samples per step"
        )
        if r.rollouts_per_step is not None and r.rollouts_per_step > r.N:
            lines.append(
                "    note: N < R, some fresh rollouts would be evicted before being sampled "
                "(not buildable: see the feasible design)"
            )
        if r.B > r.N:
            lines.append("    note: B > N, the batch must be drawn with replacement")
    if r.gamma is not None:
        lines.append(
            f"  gamma = (1 + W/T)/(1 + mu) = {r.gamma:.4g}  compute per baseline update "
            f"(W={r.workers} workers, T={r.trainers} trainers)"
        )
    if math.isinf(r.x_star):
        lines.append("  note: alpha = 0, x* is unbounded: use the largest buffer you can afford")
    return "\n".join(lines)


# --------------------------------------------------------------------------- feasible design


def constrained_y(
    x: ArrayLike, mu: float, rho: float, y_min: float, y_at_most_x: bool = False
) -> ArrayLike:
    """Best replay ratio for a horizon with y >= y_min (and y <= x when `y_at_most_x`):
    y*(x) clipped into that range (arXiv 2604.08706's y*(x) = sqrt(mu / (rho + 1/x))).

    For fixed x, J is (1 + y/mu)(1/y + c) with c = 1/x + rho, i.e. 1/y + c y/mu + const:
    convex in y > 0, so the constrained minimiser is the unconstrained one clipped. y <= x
    is B <= N: a batch of distinct rollouts (see `feasible_design`).
    """
    y = np.maximum(y_min, optimal_y(x, mu, rho))
    return np.minimum(y, np.maximum(x, y_min)) if y_at_most_x else y


def constrained_optimum(
    mu: float,
    rho: float,
    sigma2: VarianceFn,
    x_min: float = 1.0,
    y_min: float = 1.0,
    x_max: float = 1e6,
    grid_points: int = 2001,
    y_at_most_x: bool = False,
) -> tuple[float, float]:
    """argmin J(x, y) over x >= x_min, y >= y_min (and y <= x when `y_at_most_x`)
    (arXiv 2604.08706's objective, feasible set).

    A buffer must hold at least one step (x = N/R >= 1: otherwise fresh rollouts are evicted
    before they are sampled) and, unless the user allows it, train on at least the fresh
    rollouts (y = B/R >= 1). y is eliminated with `constrained_y`; the remaining 1-D problem
    in log x is solved by a log grid on [x_min, x_max] refined by golden-section search.
    """
    mu = _check_mu(mu)
    rho = _check_rho(rho)
    if not (0.0 < x_min < x_max < math.inf) or not (math.isfinite(y_min) and y_min > 0):
        raise ValueError(
            f"need 0 < x_min < x_max < inf and y_min > 0, got {x_min}, {x_max}, {y_min}"
        )

    def f(u: np.ndarray) -> np.ndarray:
        x = np.exp(u)
        y = constrained_y(x, mu, rho, y_min, y_at_most_x)
        return np.log(np.asarray(objective(x, y, mu, rho, sigma2)))

    grid = np.linspace(math.log(x_min), math.log(x_max), grid_points)
    vals = f(grid)
    i = int(np.argmin(vals))
    a, b = grid[max(i - 1, 0)], grid[min(i + 1, grid_points - 1)]
    for _ in range(200):  # golden section on [a, b]; 200 halvings reach float precision
        c, d = b - _INV_PHI * (b - a), a + _INV_PHI * (b - a)
        if f(np.array([c]))[0] <= f(np.array([d]))[0]:
            b = d
        else:
            a = c
        if b - a < 1e-13:
            break
    u = 0.5 * (a + b)
    if vals[i] < f(np.array([u]))[0]:
        u = float(grid[i])
    x = float(min(max(math.exp(u), x_min), x_max))
    return x, float(constrained_y(x, mu, rho, y_min, y_at_most_x))


@dataclass(frozen=True)
class FeasibleDesign:
    """The buffer `auto` should use, or the explicit decision to stay on-policy.

    `saving` is the predicted fraction of compute saved against on-policy training
    (x = y = 1) at the same gradient variance: 1 - J(x, y) / J(1, 1), evaluated at the
    integer (N, B) actually used. J is compute per step (mu R + B, i.e. R (mu + y)) times
    gradient variance, so for a fixed variance target compute scales with J.
    """

    on_policy: bool
    x: float  # N / R actually used
    y: float  # B / R actually used
    N: int
    B: int
    saving: float
    x_unconstrained: float
    y_unconstrained: float
    reason: str


def on_policy_design(design: FeasibleDesign, rollouts_per_step: int, reason: str) -> FeasibleDesign:
    """`design` turned into the explicit on-policy outcome (N = B = R, no predicted saving),
    keeping its unconstrained optimum for the record."""
    r = int(rollouts_per_step)
    return replace(design, on_policy=True, x=1.0, y=1.0, N=r, B=r, saving=0.0, reason=reason)


def feasible_design(
    mu: float,
    alpha: float,
    rho: float,
    rollouts_per_step: int,
    allow_y_below_one: bool = False,
    min_saving: float = 0.05,
    tau: float = 1.0,
    x_max: float = 1e6,
    allow_b_above_n: bool = False,
) -> FeasibleDesign:
    """Paper 1's design restricted to buildable buffers, with "stay on-policy" as an outcome.

    N >= R always (x >= 1) and N <= x_max R (a run passes its number of steps: a buffer larger
    than everything the run generates is never filled, and the theory's x -> inf at small
    alpha is not a buffer); B >= R (y >= 1) unless `allow_y_below_one` (then B >= 1); B <= N
    (y <= x) unless `allow_b_above_n`: a batch larger than the buffer repeats rollouts within
    one update, which adds compute and sampling noise but no rollout, while J credits its
    1/y term as if the B draws were more data (and rates the on-policy x = y = 1, which uses
    each fresh rollout exactly once, as if it drew them with replacement). At mu = 5.3 and
    alpha = 0.25, rho = 0.5 that unchecked case chose N = R, B = 1.9 R, "saving 7.4%", and
    ended below GRPO on three held-out tasks (BENCHMARKS.md, `auto` at mu = 5.3). When
    the best feasible (N, B) is predicted to save less than `min_saving` of the on-policy
    compute (the model is approximate: a small predicted gain does not pay for staleness),
    the result is on-policy: N = B = R, which a FIFO sampled without replacement trains on
    exactly the fresh rollouts once, i.e. the on-policy baseline.
    """
    r = int(rollouts_per_step)
    if r != rollouts_per_step or r < 1:
        raise ValueError(
            f"rollouts_per_step (R) must be a positive integer, got {rollouts_per_step!r}"
        )
    if not (math.isfinite(min_saving) and 0.0 <= min_saving < 1.0):
        raise ValueError(f"min_saving must be in [0, 1), got {min_saving!r}")
    sigma2 = power_law_variance(alpha, tau)
    rho = _check_rho(rho)
    if alpha == 0.0 and rho == 0.0:
        closed_form_power_law(mu, alpha, rho)  # raises the no-finite-optimum error
    try:
        xu, yu = closed_form_power_law(mu, alpha, rho)
    except ValueError:
        xu = yu = math.nan
    y_min = 1.0 / r if allow_y_below_one else 1.0
    if not x_max > 1.0:
        raise ValueError(f"x_max must be above 1 (N > R), got {x_max!r}")
    x, y = constrained_optimum(
        mu, rho, sigma2, x_min=1.0, y_min=y_min, x_max=x_max, y_at_most_x=not allow_b_above_n
    )
    n = max(r, min(math.floor(x * r + 0.5), math.floor(x_max * r)))
    b = max(math.ceil(y_min * r - 1e-9), math.floor(y * r + 0.5))
    if not allow_b_above_n:
        b = min(b, n)
    j_on = float(objective(1.0, 1.0, mu, rho, sigma2))
    saving = 1.0 - float(objective(n / r, b / r, mu, rho, sigma2)) / j_on
    if saving < min_saving:
        reason = (
            f"stay on-policy: the best feasible buffer (x = {n / r:.3g}, y = {b / r:.3g}) is "
            f"predicted to save {saving:.1%} of compute, below the {min_saving:.0%} that pays "
            "for staleness"
        )
        return FeasibleDesign(True, 1.0, 1.0, r, r, 0.0, xu, yu, reason)
    reason = f"replay: predicted to save {saving:.1%} of compute against on-policy"
    return FeasibleDesign(False, n / r, b / r, n, b, saving, xu, yu, reason)


def design_confidence(
    x: float,
    y: float,
    mu: float,
    draws: Sequence[tuple[float, float] | None],
    min_saving: float,
) -> float:
    """Share of (alpha, rho) draws under which the buffer (x, y) saves at least `min_saving`
    against on-policy: 1 - J(x, y) / J(1, 1) >= min_saving, with arXiv 2604.08706's
    J(x, y) = sigma^2(x) (1 + y/mu) (1/y + 1/x + rho), sigma^2(x) = x^(2 alpha).

    `draws` are bootstrap re-estimates of alpha and rho (design/staleness.py
    `bootstrap_alpha_rho`); a None draw (its resample could not be estimated) counts as not
    saving, so a design whose measurement is often ill-conditioned is not trusted either.
    With no draws the answer is 0.
    """
    mu = _check_mu(mu)
    if not (x >= 1.0 and y > 0.0):
        raise ValueError(f"need x >= 1 and y > 0, got x = {x!r}, y = {y!r}")
    if not draws:
        return 0.0
    hits = 0
    for d in draws:
        if d is None:
            continue
        alpha, rho = _check_alpha(d[0]), _check_rho(d[1])
        sigma2 = power_law_variance(alpha)
        saving = 1.0 - float(objective(x, y, mu, rho, sigma2)) / float(
            objective(1.0, 1.0, mu, rho, sigma2)
        )
        hits += saving >= min_saving
    return hits / len(draws)


def format_feasible(fd: FeasibleDesign, rollouts_per_step: int) -> str:
    """Lines `replayrl design` prints for the feasible design (N >= R; y >= 1 unless allowed)."""
    r = rollouts_per_step
    if fd.on_policy:
        return (
            f"  feasible (N >= R, B <= N unless allowed): {fd.reason}\n"
            f"    -> on-policy: N = B = R = {r} (each fresh rollout trained on once)"
        )
    return (
        f"  feasible (N >= R, B <= N unless allowed): x = {fd.x:.4g}, y = {fd.y:.4g} -> "
        f"N = {fd.N}, B = {fd.B} (R = {r})"
        f"\n    {fd.reason}"
    )


def fit_alpha_rho(
    xs: Sequence[float],
    ys: Sequence[float],
    costs: Sequence[float],
    mu: float,
    alphas: np.ndarray | None = None,
    rhos: np.ndarray | None = None,
) -> tuple[float, float, float]:
    """Fit the power-law exponent alpha and correlation rho of arXiv 2604.08706's objective to
    measured costs on an (x, y) grid: least squares on log cost = log c + log J(x, y).

    J is compute per step times gradient variance, so the compute a cell needs to reach a fixed
    accuracy is modelled as c J(x, y) with one unknown scale c (closed form for given alpha,
    rho: the mean log residual). alpha and rho are searched on a grid (default alpha in
    [0, 0.49] by 0.01, rho in [0, 1] by 0.01; alpha = rho = 0 is skipped: no finite optimum).
    Cells with a non-finite or non-positive cost (target never reached) are left out; at least
    three are needed. Returns (alpha, rho, rms of the log residuals).
    """
    mu = _check_mu(mu)
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    c = np.asarray(costs, dtype=float)
    if not (x.shape == y.shape == c.shape and x.ndim == 1):
        raise ValueError("xs, ys and costs must be 1-D and of the same length")
    ok = np.isfinite(c) & (c > 0)
    if ok.sum() < 3:
        raise ValueError(f"need at least 3 cells with a finite cost to fit, got {int(ok.sum())}")
    x, y, logc = x[ok], y[ok], np.log(c[ok])
    alphas = np.arange(0.0, 0.495, 0.01) if alphas is None else np.asarray(alphas, dtype=float)
    rhos = np.linspace(0.0, 1.0, 101) if rhos is None else np.asarray(rhos, dtype=float)
    best = (math.inf, math.nan, math.nan)
    for a in alphas:
        base = 2.0 * a * np.log(x) + np.log1p(y / mu)  # log sigma^2(x) (1 + y/mu)
        for r in rhos:
            if a == 0.0 and r == 0.0:
                continue
            resid = logc - base - np.log(1.0 / y + 1.0 / x + r)
            rms = float(np.sqrt(np.mean((resid - resid.mean()) ** 2)))
            if rms < best[0]:
                best = (rms, float(a), float(r))
    return best[1], best[2], best[0]
