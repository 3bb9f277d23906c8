"""Claims over the methods of one table, with Holm's step-down control of the family-wise
error (Holm 1979), fixed before the runs.

The rule for one method alone is `intervals.claim`: "k x fewer rollouts" only when the
ratio's upper end is <= 1/k, "no loss" only when the final difference's lower end is
>= -0.02, each end one side of a two-sided 90% interval (a one-sided 5% error). A table
tests several methods, and with each at 5% one of them is likely to pass by chance; so each
kind of claim is a family over the table's methods (the placebo, a check on the noise, is
not in it), controlled by Holm at ALPHA = 5% one-sided:

- saving: "no saving the rule names" (the ratio above 1/1.1) is rejected for a method when
  its upper end at a one-sided level a is <= 1/1.1; "more rollouts": its lower end at a is
  above 1; "no loss": the difference's lower end at a is >= -0.02; "lower final": its upper
  end at a is below 0.
- Holm: order the methods by the share of bootstrap resamples on the null's side (the
  bootstrap p-value); the j-th of m (from 1) is tested at a = ALPHA / (m - j + 1) and the
  procedure stops at the first that fails (the rest are "not resolved").
- the k of a saving is read at the level it passed at: the largest k (one decimal) with the
  upper end at one-sided level a <= 1/k. With one method (m = 1) this is `intervals.claim`.

A claim combining a saving and no loss needs both, so the pair needs no further correction
(an intersection-union test). Each scope (a task, over the tasks) and each target (a
fraction of the baseline's gain) is its own family; the headline is the over-task claim at
the 90% target, the others stand beside it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from replayrl.bench.intervals import LEVEL, NO_LOSS, fewer_rollouts_factor

ALPHA = (1 - LEVEL) / 2  # one side of the two-sided interval: 5% at the 90% level
SMALLEST_SAVING = 1 / 1.1  # the smallest saving the rule names ("1.1x fewer")
Estimate = tuple[float, np.ndarray | None]  # (point estimate, bootstrap distribution)


def _q(dist: np.ndarray, p: float) -> float:
    return float(np.quantile(dist, p, method="inverted_cdf"))


def holm(
    pvalues: dict[str, float], passes: dict[str, Callable[[float], bool]], alpha: float = ALPHA
) -> dict[str, float | None]:
    """Holm's step-down: the level each hypothesis was rejected at, None when it was not.
    Hypotheses go in order of `pvalues` (ties by name, so the order never depends on dict
    order); the j-th of m (from 0) is rejected when `passes[name](alpha / (m - j))`, and the
    first that is not stops the procedure."""
    order = sorted(pvalues, key=lambda n: (pvalues[n], n))
    out: dict[str, float | None] = dict.fromkeys(pvalues)
    for j, name in enumerate(order):
        level = alpha / (len(order) - j)
        if not passes[name](level):
            break
        out[name] = level
    return out


def _family(
    dists: dict[str, np.ndarray | None],
    null_share: Callable[[np.ndarray], float],
    passes: Callable[[np.ndarray, float], bool],
    alpha: float,
) -> dict[str, float | None]:
    """Holm over one kind of claim; a method without a distribution (one run) counts in m
    and never passes."""
    p = {n: (1.0 if d is None else null_share(d)) for n, d in dists.items()}
    ok = {n: (lambda a, d=d: d is not None and passes(d, a)) for n, d in dists.items()}
    return holm(p, ok, alpha)


def holm_claims(
    ratios: dict[str, Estimate | None], differences: dict[str, Estimate], alpha: float = ALPHA
) -> dict[str, dict[str, object]]:
    """Per method (every method of the table but the placebo): its claim under Holm's
    control (the module docstring) and the one-sided levels its claims passed at. A method
    whose ratio is None (no target) gets a final-difference claim only."""
    rd = {n: r[1] for n, r in ratios.items() if r is not None}
    dd = {n: d[1] for n, d in differences.items()}
    saving = _family(
        rd,
        lambda d: float(np.mean(d > SMALLEST_SAVING * (1 + 1e-9))),
        lambda d, a: fewer_rollouts_factor(_q(d, 1 - a)) is not None,
        alpha,
    )
    more = _family(rd, lambda d: float(np.mean(d <= 1)), lambda d, a: _q(d, a) > 1, alpha)
    no_loss = _family(
        dd,
        lambda d: float(np.mean(d < -NO_LOSS - 1e-12)),
        lambda d, a: _q(d, a) >= -NO_LOSS - 1e-12,
        alpha,
    )
    lower = _family(dd, lambda d: float(np.mean(d >= 0)), lambda d, a: _q(d, 1 - a) < 0, alpha)
    out: dict[str, dict[str, object]] = {}
    for name in differences:
        parts = []
        if name in rd:
            if saving[name] is not None:
                k = fewer_rollouts_factor(_q(rd[name], 1 - saving[name]))  # type: ignore[arg-type]
                parts.append(f"{k:g}x fewer rollouts")
            elif more[name] is not None:
                parts.append("more rollouts")
            else:
                parts.append("saving not resolved")
        if no_loss[name] is not None:
            parts.append("no loss")
        elif lower[name] is not None:
            parts.append("lower final")
        else:
            parts.append("loss not resolved")
        out[name] = {
            "claim": "; ".join(parts),
            "family": len(dd),
            "saving_level": saving.get(name),
            "no_loss_level": no_loss[name],
        }
    return out


def family_size_note(m: int) -> str:
    """The Holm levels of a family of m, for the text under a table."""
    levels = ", ".join(f"{ALPHA / (m - j):.4g}" for j in range(m))
    return f"Holm over {m} methods: one-sided levels {levels} in turn"


RULE_HOLM = (
    f'Claims (fixed before the runs): "k x fewer rollouts" only when the rollouts ratio\'s '
    f'upper end is <= 1/k, "more rollouts" when its lower end is above 1, "no loss" only '
    f'when the final difference\'s lower end is >= -{NO_LOSS:g}, "lower final" when its upper '
    "end is below 0, otherwise not resolved; each end read at a one-sided level set by "
    f"Holm's step-down over the table's methods (the placebo aside): {ALPHA:.0%} / m for the "
    f"first, {ALPHA:.0%} / (m - 1) for the next, and so on, stopping at the first that fails "
    f"(with one method: the {LEVEL:.0%} interval's ends)."
)
