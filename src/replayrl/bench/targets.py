"""Time-to-quality below the plateau: the cost to reach fractions of the baseline's gain.

MLPerf-style targets: the baseline's gain is its median final accuracy minus
its median starting accuracy (the eval before any update); the target for fraction f is
``start + f (final - start)``. For each variant: generated rollouts, modelled compute (paper
1's cost model, arXiv 2604.08706: mu x generated + trained rollouts, at mu = 5.3 and at the
run's measured mu) and wall seconds to first reach each target; the area under accuracy vs
generated rollouts; final accuracy with a non-inferiority verdict (median final within
`MARGIN` of the baseline's). The headline is rollouts to 90% of the gain.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np

FRACTIONS = (0.5, 0.8, 0.9, 0.95)
HEADLINE = 0.9
MARGIN = 0.01  # non-inferior: median final accuracy at most one point below the baseline's
PAPER_MU = 5.3  # paper 1's measured generation / training cost per rollout (arXiv 2604.08706)


def stats(xs: list[float]) -> dict[str, float]:
    """Median and quartiles; an unreached target (inf) counts as the largest value."""
    a = np.asarray([x for x in xs if x is not None and not math.isnan(x)], dtype=float)
    if a.size == 0:
        return {"median": math.nan, "q25": math.nan, "q75": math.nan, "n": 0}
    # with an unreached target (inf) take the upper neighbour: never an optimistic median
    method = "higher" if np.isinf(a).any() else "linear"
    q25, med, q75 = np.percentile(a, [25, 50, 75], method=method)
    return {"median": float(med), "q25": float(q25), "q75": float(q75), "n": int(a.size)}


def trained_rollouts_at(summary: dict[str, Any], e: dict[str, Any]) -> float:
    """Rollouts trained on (counting repeats and epochs) by the time of eval `e`: recorded in
    the eval when the loop records it, else its trained tokens x the run's trained rollouts
    per trained token (from the run's learner accounting)."""
    if e.get("rollouts_trained") is not None:
        return float(e["rollouts_trained"])
    roles = (summary.get("accounting") or {}).get("roles") or {}
    learners = [r for k, r in roles.items() if k.startswith("learner")]
    n, tokens = sum(r["rollouts"] for r in learners), sum(r["tokens"] for r in learners)
    if not tokens or e.get("tokens_trained") is None:
        return math.nan
    return float(e["tokens_trained"]) * n / tokens


def start_accuracy(summary: dict[str, Any]) -> float:
    """Accuracy at the run's first eval (step 0, before any update; NaN without evals)."""
    evals = summary.get("evals") or []
    return float(evals[0]["eval/accuracy"]) if evals else math.nan


def gain_targets(baseline_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Start, final and the accuracy for each fraction of the baseline's median gain.

    start / final: medians over the baseline's seeds of the first-eval and final accuracies;
    target(f) = start + f (final - start). `gain` <= 0 (the baseline did not improve) is kept
    and reported: every target then sits at or below the start.
    """
    start = statistics.median(start_accuracy(s) for s in baseline_runs)
    final = statistics.median(float(s["final_eval_accuracy"]) for s in baseline_runs)
    return {
        "start": start,
        "final": final,
        "gain": final - start,
        "targets": {f: start + f * (final - start) for f in FRACTIONS},
    }


def cost_to(summary: dict[str, Any], target: float, mu: float | None) -> dict[str, float]:
    """Generated rollouts, wall seconds and modelled compute at the first eval with accuracy
    >= target (inf: never; compute NaN without a mu). `mu` None: the run's measured mu."""
    m = summary.get("mu_median") if mu is None else mu
    m = float(m) if m is not None and math.isfinite(m) else math.nan  # NaN: no measured mu
    for e in summary.get("evals", []):
        if e["eval/accuracy"] >= target - 1e-9:
            gen = float(e["rollouts_generated"])
            return {
                "rollouts": gen,
                "wall_seconds": float(e["wall_seconds"]),
                "compute": m * gen + trained_rollouts_at(summary, e),
            }
    return {"rollouts": math.inf, "wall_seconds": math.inf, "compute": math.inf}


def area_under_curve(summary: dict[str, Any], horizon: float) -> float:
    """Mean accuracy over the first `horizon` generated rollouts: the trapezoid area under
    accuracy vs generated rollouts on [0, horizon], divided by horizon (an accuracy, 0-1).

    The curve is linear between evals and held at its last value past the last eval; a
    common horizon (the shortest run of the task) compares runs of different budgets fairly.
    """
    evals = summary.get("evals") or []
    if not evals or not (horizon > 0 and math.isfinite(horizon)):
        return math.nan
    xs = np.asarray([float(e["rollouts_generated"]) for e in evals])
    ys = np.asarray([float(e["eval/accuracy"]) for e in evals])
    grid = np.union1d(xs[xs < horizon], [0.0, horizon])
    vals = np.interp(grid, xs, ys)  # held at the ends
    return float(np.trapezoid(vals, grid) / horizon)


HEADROOM_CEILING = 0.9  # a task "does not saturate" when GRPO ends at or below this
HEADROOM_MIN_GAIN = 0.1  # ... and it learns: the median gain is at least ten points
RISING_MIN_SLOPE = 1e-6  # accuracy per 1,000 rollouts above which a fitted slope is "rising"


def last_quarter_slope(summary: dict[str, Any]) -> float:
    """Least-squares slope of accuracy against generated rollouts over the evals in the last
    quarter of the rollouts the run generated (up to its last eval), in accuracy per 1,000
    rollouts (NaN with fewer than two such evals). A fitted line rather than end minus start:
    one noisy eval moves it less."""
    evals = summary.get("evals") or []
    if not evals:
        return math.nan
    xs = np.asarray([float(e["rollouts_generated"]) for e in evals])
    ys = np.asarray([float(e["eval/accuracy"]) for e in evals])
    keep = xs >= 0.75 * xs.max()
    if keep.sum() < 2 or np.ptp(xs[keep]) == 0:
        return math.nan
    return float(np.polyfit(xs[keep], ys[keep], 1)[0] * 1000.0)


def headroom(baseline_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether a task leaves room to compare methods below the plateau:
    the baseline's median final accuracy at or below `HEADROOM_CEILING`, its median
    last-quarter slope above zero (still rising when the budget ends), and a median gain of at
    least `HEADROOM_MIN_GAIN` (a run that collapses and ticks up at the end leaves targets at
    fractions of a tiny gain: noise)."""
    g = gain_targets(baseline_runs)
    slope = stats([last_quarter_slope(s) for s in baseline_runs])["median"]
    # a flat curve fits a slope of +-1e-19 (rounding): that is not rising; NaN is not either
    rising = bool(slope > RISING_MIN_SLOPE)
    below = g["final"] <= HEADROOM_CEILING + 1e-12  # NaN (no evals): not below
    learns = g["gain"] >= HEADROOM_MIN_GAIN
    return {
        "final": g["final"],
        "gain": g["gain"],
        "last_quarter_slope_per_1k": slope,
        "below_ceiling": below,
        "rising": rising,
        "learns": learns,
        "qualifies": below and rising and learns,
    }


def non_inferior(final: float, baseline_final: float, margin: float = MARGIN) -> bool:
    """True when the median final accuracy is at most `margin` below the baseline's."""
    return final >= baseline_final - margin - 1e-12


def score_against_gain(
    runs: list[dict[str, Any]],
    base_runs: list[dict[str, Any]],
    horizon: float,
) -> dict[str, Any]:
    """One variant's gain-target block: per fraction f of the baseline's median gain, the
    median [IQR] over seeds of rollouts / wall / modelled compute to reach it and their ratios
    to the baseline's medians (lower is better; an unreached seed counts as the largest); AUC
    over the first `horizon` rollouts; final accuracy minus the baseline's; the verdict."""
    g = gain_targets(base_runs)
    block: dict[str, Any] = {}
    for f, acc in g["targets"].items():
        cell: dict[str, Any] = {"accuracy": acc}
        for who, rs in (("", runs), ("baseline_", base_runs)):
            for mu_name, mu in (("paper_mu", PAPER_MU), ("measured_mu", None)):
                reach = [cost_to(s, acc, mu) for s in rs]
                cell[f"{who}compute_{mu_name}"] = stats([r["compute"] for r in reach])
            cell[f"{who}rollouts"] = stats([r["rollouts"] for r in reach])
            cell[f"{who}wall_seconds"] = stats([r["wall_seconds"] for r in reach])
            cell[f"{who}reached"] = sum(math.isfinite(r["rollouts"]) for r in reach)
        for key in ("rollouts", "wall_seconds", "compute_paper_mu", "compute_measured_mu"):
            num, den = cell[key]["median"], cell[f"baseline_{key}"]["median"]
            cell[f"{key}_ratio"] = num / den if den and math.isfinite(den) else math.nan
        block[str(f)] = cell
    final = statistics.median(float(s["final_eval_accuracy"]) for s in runs)
    return {
        "start": g["start"],
        "final": g["final"],
        "gain": g["gain"],
        "to_gain": block,
        "auc_horizon": horizon,
        "auc": stats([area_under_curve(s, horizon) for s in runs]),
        "final_minus_baseline": final - g["final"],
        "non_inferior": non_inferior(final, g["final"]),
    }


def _num(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return "never" if math.isinf(x) else f"{x:.3g}"


def _ratio(x: Any) -> str:
    return "n/a" if _num(x) == "n/a" else ("never" if _num(x) == "never" else f"{x:.2f}")


def gain_table(variants: dict[str, dict[str, Any]]) -> str:
    """Markdown: each variant's costs to 50 / 80 / 90 / 95% of its baseline's gain (the
    headline: generated rollouts to 90%), AUC and the non-inferiority verdict."""
    h = str(HEADLINE)
    lines = [
        "Below the plateau: targets at 50 / 80 / 90 / 95% of the baseline's median gain "
        "(start + f x (final - start)). Cells: median over seeds (unreached seeds count as the "
        f"largest); ratios to the baseline's median. Modelled compute at mu = {PAPER_MU} is "
        "paper 1's cost model (mu x generated + trained rollouts), not a measurement. AUC: mean "
        "accuracy over the first H generated rollouts (H: the task's shortest run). Verdict: "
        f"non-inferior when the median final accuracy is within {MARGIN:g} of the baseline's.",
        "",
        "| variant | baseline start -> final | **rollouts to 90% gain** | ratio | compute "
        f"mu={PAPER_MU} ratio | compute measured-mu ratio | wall ratio | rollouts to 50% / 80% "
        "/ 95% | AUC (H) | final - baseline | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in variants.items():
        c = r["to_gain"][h]
        others = " / ".join(
            _num(r["to_gain"][str(f)]["rollouts"]["median"]) for f in FRACTIONS if f != HEADLINE
        )
        lines.append(
            f"| {name} | {r['start']:.3f} -> {r['final']:.3f} | {_num(c['rollouts']['median'])} "
            f"({c['reached']}/{r['final_eval_accuracy']['n']}) | {_ratio(c['rollouts_ratio'])} | "
            f"{_ratio(c['compute_paper_mu_ratio'])} | {_ratio(c['compute_measured_mu_ratio'])} | "
            f"{_ratio(c['wall_seconds_ratio'])} | {others} | {_num(r['auc']['median'])} "
            f"({r['auc_horizon']:.0f}) | {r['final_minus_baseline']:+.3f} | "
            f"{'non-inferior' if r['non_inferior'] else 'INFERIOR'} |"
        )
    return "\n".join(lines) + "\n"


def over_tasks(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One variant's gain-target figures over tasks: medians of its per-task ratios at 90% of
    the gain, of its AUCs, and the non-inferiority of the median (over tasks) final gap."""
    h = str(HEADLINE)
    gaps = [r["final_minus_baseline"] for r in rows.values()]
    out: dict[str, Any] = {
        f"gain{int(HEADLINE * 100)}_{key}": stats(
            [math.nan if (v := r["to_gain"][h][key]) is None else float(v) for r in rows.values()]
        )
        for key in (
            "rollouts_ratio",
            "wall_seconds_ratio",
            "compute_paper_mu_ratio",
            "compute_measured_mu_ratio",
        )
    }
    out["auc"] = stats([r["auc"]["median"] for r in rows.values()])
    out["non_inferior_tasks"] = sum(bool(r["non_inferior"]) for r in rows.values())
    out["non_inferior"] = non_inferior(statistics.median(gaps), 0.0) if gaps else False
    return out


def tuning_choice(
    variants: dict[str, dict[str, Any]], margin: float = MARGIN
) -> dict[str, dict[str, Any]]:
    """Per method (the variant name before the first `.`: `grpo.lr2e-4` is method `grpo`),
    the setting a tuning suite picks: among the method's settings whose median final accuracy
    is within `margin` of the method's best (the final-accuracy guard), the one with the
    fewest median generated rollouts to 90% of the baseline's gain (ties: the higher final).
    Every method gets the same number of settings in the suite; this rule is the same for
    all of them."""
    by_method: dict[str, list[str]] = {}
    for name in variants:
        by_method.setdefault(name.split(".")[0], []).append(name)
    out = {}
    for method, names in by_method.items():
        finals = {n: _headline(variants[n])[0] for n in names}
        top = max(finals.values())
        keep = [n for n in names if finals[n] >= top - margin - 1e-12]
        best = min(keep, key=lambda n: (_headline(variants[n])[1], -finals[n]))
        out[method] = {
            "setting": best,
            "settings_tried": len(names),
            "final": finals[best],
            "rollouts_to_90_gain": _headline(variants[best])[1],
        }
    return out


def _headline(row: dict[str, Any]) -> tuple[float, float]:
    """(median final, median rollouts to 90% of the gain): the robust figures (bench/robust.py:
    mean of the last 3 evals, 3-eval trailing-mean crossing) when the row has them, else the
    last eval and the first eval at the target."""
    rb = row.get("robust")
    if rb is not None:
        return rb["final_mean"]["median"], rb["to_gain"][str(HEADLINE)]["rollouts"]["median"]
    return row["final_eval_accuracy"]["median"], row["to_gain"][str(HEADLINE)]["rollouts"]["median"]


def tuning_lines(choice: dict[str, dict[str, Any]]) -> str:
    """Markdown lines: each method's chosen setting and how many it tried."""
    lines = [
        "",
        "Tuning choice (per method: fewest rollouts to 90% of the baseline's gain among its "
        f"settings whose final is within {MARGIN:g} of its best):",
        "",
    ]
    for method, c in choice.items():
        lines.append(
            f"- {method}: `{c['setting']}` of {c['settings_tried']} settings (final "
            f"{c['final']:.3f}, rollouts to 90% gain {_num(c['rollouts_to_90_gain'])})"
        )
    return "\n".join(lines) + "\n"
