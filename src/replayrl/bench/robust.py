"""Crossings that one noisy evaluation cannot win, and a final accuracy that one cannot move.

`targets.py` counts the generated rollouts at the FIRST evaluation at or above a target and
takes the LAST evaluation as the final accuracy. On curves whose evaluations scatter by a few
points (200 held-out prompts: a binomial standard error of ~3.5 points at 0.5), a run that
touches the target once and falls back is scored as if it had arrived. Here instead:

- smoothed crossing: the generated rollouts at evaluation i, the first whose trailing mean of
  `WINDOW` consecutive evaluations (i - WINDOW + 1 .. i) reaches the target;
- held crossing: the first evaluation i from which that trailing mean stays at or above the
  target for the rest of the run ("reached and held");
- final accuracy: the mean of the last `LAST` evaluations.

Gain targets are as in `targets.py` (start + f x (final - start), medians over the
baseline's seeds), with the baseline's final taken as the mean of its last `LAST`
evaluations. Unreached seeds count as the largest value (`stats`).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import numpy as np

from replayrl.bench.targets import FRACTIONS, HEADLINE, MARGIN, non_inferior, stats

WINDOW = 3  # evaluations in the trailing mean a crossing needs
LAST = 3  # evaluations averaged into the final accuracy


def trailing_means(accuracies: list[float], window: int = WINDOW) -> list[float]:
    """Mean of each `window` consecutive accuracies ending at i (NaN for i < window - 1)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    a = np.asarray(accuracies, dtype=float)
    out = [math.nan] * len(a)
    for i in range(window - 1, len(a)):
        out[i] = float(a[i - window + 1 : i + 1].mean())
    return out


def smoothed_crossing(
    rollouts: list[float], accuracies: list[float], target: float, window: int = WINDOW
) -> float:
    """Generated rollouts at the first evaluation whose trailing mean of `window` evaluations
    is >= target (inf: never)."""
    for x, m in zip(rollouts, trailing_means(accuracies, window), strict=True):
        if not math.isnan(m) and m >= target - 1e-9:
            return float(x)
    return math.inf


def held_crossing(
    rollouts: list[float], accuracies: list[float], target: float, window: int = WINDOW
) -> float:
    """Generated rollouts at the first evaluation from which the trailing mean stays >= target
    to the end of the run (inf: it ends below, or never has `window` evaluations)."""
    means = trailing_means(accuracies, window)
    first = math.inf
    for x, m in zip(rollouts, means, strict=True):
        if math.isnan(m):
            continue
        if m >= target - 1e-9:
            first = min(first, float(x))
        else:
            first = math.inf  # fell below: the hold starts again
    return first


def final_mean(accuracies: list[float], last: int = LAST) -> float:
    """Mean of the last `last` evaluations (all of them when fewer; NaN without any)."""
    if not accuracies:
        return math.nan
    return float(np.mean(accuracies[-last:]))


def curve(summary: dict[str, Any]) -> tuple[list[float], list[float]]:
    """(generated rollouts, accuracy) at each evaluation of a run's summary."""
    evals = summary.get("evals") or []
    return (
        [float(e["rollouts_generated"]) for e in evals],
        [float(e["eval/accuracy"]) for e in evals],
    )


def robust_gain_targets(baseline_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The baseline's median start (first eval), median final (mean of its last `LAST`
    evals) and the accuracy at each fraction f of that gain."""
    start = statistics.median(curve(s)[1][0] for s in baseline_runs)
    final = statistics.median(final_mean(curve(s)[1]) for s in baseline_runs)
    return {
        "start": start,
        "final": final,
        "gain": final - start,
        "targets": {f: start + f * (final - start) for f in FRACTIONS},
    }


def _ratio(num: float, den: float) -> float:
    if math.isinf(num):
        return math.inf  # the variant's median seed never got there
    return num / den if den and math.isfinite(den) else math.nan


def robust_score(runs: list[dict[str, Any]], base_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's robust block against its baseline: per gain fraction, smoothed and held
    crossings (median [IQR] over seeds, ratios of medians to the baseline's), the final as
    the mean of the last evaluations and its non-inferiority."""
    g = robust_gain_targets(base_runs)
    block: dict[str, Any] = {}
    for f, acc in g["targets"].items():
        cell: dict[str, Any] = {"accuracy": acc}
        for who, rs in (("", runs), ("baseline_", base_runs)):
            curves = [curve(s) for s in rs]
            smooth = [smoothed_crossing(x, y, acc) for x, y in curves]
            held = [held_crossing(x, y, acc) for x, y in curves]
            cell[f"{who}rollouts"] = stats(smooth)
            cell[f"{who}rollouts_held"] = stats(held)
            cell[f"{who}reached"] = sum(math.isfinite(v) for v in smooth)
            cell[f"{who}held"] = sum(math.isfinite(v) for v in held)
        for key in ("rollouts", "rollouts_held"):
            cell[f"{key}_ratio"] = _ratio(cell[key]["median"], cell[f"baseline_{key}"]["median"])
        block[str(f)] = cell
    finals = [final_mean(curve(s)[1]) for s in runs]
    final = statistics.median(finals)
    return {
        "robust": {
            "start": g["start"],
            "final": g["final"],
            "gain": g["gain"],
            "to_gain": block,
            "final_mean": stats(finals),
            "final_minus_baseline": final - g["final"],
            "non_inferior": non_inferior(final, g["final"]),
        }
    }


def robust_over_tasks(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One variant's robust figures over tasks: medians of its per-task ratios at 90% of the
    gain (smoothed, held), its final gaps and on how many tasks it is non-inferior."""
    h = str(HEADLINE)
    robust = [r["robust"] for r in rows.values() if "robust" in r]
    gaps = [r["final_minus_baseline"] for r in robust]
    return {
        "robust_gain90_rollouts_ratio": stats([r["to_gain"][h]["rollouts_ratio"] for r in robust]),
        "robust_gain90_held_ratio": stats([r["to_gain"][h]["rollouts_held_ratio"] for r in robust]),
        "robust_final_minus_baseline": stats(gaps),
        "robust_non_inferior_tasks": sum(bool(r["non_inferior"]) for r in robust),
        "robust_non_inferior": non_inferior(statistics.median(gaps), 0.0) if gaps else False,
    }


def robust_table(variants: dict[str, dict[str, Any]]) -> str:
    """Markdown: per variant the robust headline (rollouts to 90% of the gain, trailing mean
    of three evaluations), the held crossing, and the final as the mean of the last three."""
    h = str(HEADLINE)
    lines = [
        f"Robust figures: a target counts as reached when the mean of {WINDOW} consecutive "
        "evaluations first reaches it (held: and stays there to the end of the run); final = "
        f"mean of the last {LAST} evaluations; gain targets from the baseline's robust final. "
        f"Verdict: non-inferior when that median final is within {MARGIN:g} of the baseline's.",
        "",
        "| variant | baseline start -> final (mean of last 3) | **rollouts to 90% gain (mean of "
        "3)** | ratio | held: rollouts | held ratio | final (mean of last 3) | final - baseline "
        "| verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in variants.items():
        rb = r.get("robust")
        if rb is None:
            continue
        c = rb["to_gain"][h]
        n = rb["final_mean"]["n"]
        lines.append(
            f"| {name} | {rb['start']:.3f} -> {rb['final']:.3f} | {_num(c['rollouts']['median'])} "
            f"({c['reached']}/{n}) | {_fmt_ratio(c['rollouts_ratio'])} | "
            f"{_num(c['rollouts_held']['median'])} ({c['held']}/{n}) | "
            f"{_fmt_ratio(c['rollouts_held_ratio'])} | {_num(rb['final_mean']['median'])} | "
            f"{rb['final_minus_baseline']:+.3f} | "
            f"{'non-inferior' if rb['non_inferior'] else 'INFERIOR'} |"
        )
    return "\n".join(lines) + "\n"


def _num(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return "never" if math.isinf(x) else f"{x:.3g}"


def _fmt_ratio(x: Any) -> str:
    s = _num(x)
    return s if s in ("n/a", "never") else f"{x:.2f}"
