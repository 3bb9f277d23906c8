"""Measuring the papers' findings on finished runs: pure functions.

Everything here reads a run's per-step metrics (the rows of its `metrics.jsonl`, read with
`replayrl.run.metrics.read_metrics`) and returns numbers; `benchmarks/findings.py` draws the
figures and writes the report from them.

- whipping effect and policy reincarnation (arXiv 2507.06892, Sec. "whipping effect"):
  completion length per step, `window_mean` before and after the reincarnation step T;
- entropy with and without a replay buffer (arXiv 2604.08706): `window_mean` of
  `train/entropy` over a common window;
- pass@k vs pass@1 (arXiv 2604.08706): `gain` of each over the warm start;
- larger buffers slower but steadier (arXiv 2604.08706): `rollouts_to_target` and
  `volatility` of the eval accuracy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

Curve = tuple[list[float], list[float]]  # (x, y), x increasing


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def series(rows: Iterable[dict[str, Any]], key: str, x: str = "step") -> Curve:
    """(x, value) of every row that has a finite number under both `x` and `key`, in row order.

    Eval rows carry no `rollouts_generated`: pass `x="step"` for them and map with `at_x`."""
    xs: list[float] = []
    ys: list[float] = []
    for r in rows:
        a, b = _number(r.get(x)), _number(r.get(key))
        if a is not None and b is not None:
            xs.append(a)
            ys.append(b)
    return xs, ys


def at_x(curve: Curve, mapping: Curve) -> Curve:
    """Re-index `curve` through `mapping` (x -> new x, e.g. step -> rollouts generated); points
    whose x is not in the mapping are dropped. Step 0 maps to 0 when absent (no rollouts yet)."""
    table = dict(zip(*mapping, strict=True))
    table.setdefault(0.0, 0.0)
    xs, ys = [], []
    for a, b in zip(*curve, strict=True):
        if a in table:
            xs.append(table[a])
            ys.append(b)
    return xs, ys


def median_curve(curves: Sequence[Curve]) -> Curve:
    """Pointwise median over curves (one per seed) at the x values that every curve has."""
    if not curves:
        return [], []
    maps = [dict(zip(*c, strict=True)) for c in curves]
    common = sorted(set.intersection(*(set(m) for m in maps)))
    return common, [statistics.median(m[x] for m in maps) for x in common]


def window_mean(curve: Curve, lo: float, hi: float) -> float | None:
    """Mean of the values with lo < x <= hi (None when the window is empty)."""
    vals = [y for x, y in zip(*curve, strict=True) if lo < x <= hi]
    return statistics.fmean(vals) if vals else None


def rollouts_to_target(curve: Curve, target: float) -> float | None:
    """The first x (rollouts generated) at which the value reaches `target`, or None."""
    for x, y in zip(*curve, strict=True):
        if y >= target:
            return x
    return None


def volatility(values: Sequence[float]) -> float | None:
    """Mean absolute change between consecutive values (None with fewer than two): how much
    the eval accuracy jumps from one evaluation to the next ("steadier" = lower)."""
    if len(values) < 2:
        return None
    return statistics.fmean(abs(b - a) for a, b in zip(values[:-1], values[1:], strict=True))


def gain(before: float | None, after: float | None) -> float | None:
    """after - before, or None when either is missing."""
    if before is None or after is None:
        return None
    return after - before


def seed_of(run_name: str) -> tuple[str, int] | None:
    """`replay-posbias-s2` -> ("replay-posbias", 2); None for a name without `-s<int>`."""
    head, sep, tail = run_name.rpartition("-s")
    if not sep or not head or not tail.isdigit():
        return None
    return head, int(tail)


def finished_runs(task_dir: Path) -> dict[str, dict[int, Path]]:
    """variant -> seed -> run folder, for the runs of `task_dir` that have a summary.json
    (a run still going, or stopped, has none and is left out)."""
    out: dict[str, dict[int, Path]] = {}
    for d in sorted(p for p in task_dir.iterdir() if p.is_dir()):
        parsed = seed_of(d.name)
        if parsed is None or not (d / "summary.json").is_file():
            continue
        out.setdefault(parsed[0], {})[parsed[1]] = d
    return out


def moving_average(values: Sequence[float], width: int) -> list[float]:
    """Trailing mean over up to `width` values (fewer at the start), same length as `values`:
    smooths the noisy per-step curves of the figures without shifting them forward."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    out = []
    for i in range(len(values)):
        window = values[max(0, i - width + 1) : i + 1]
        out.append(statistics.fmean(window))
    return out
