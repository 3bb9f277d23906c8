"""Score completions with several weighted reward functions, robust to faulty functions.

A function that raises, returns the wrong length, or returns NaN/inf for an item must not
crash the run: the affected rollouts are dropped and counted, and the first error is kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

RewardFunction = Callable[..., Sequence[float | None]]


@dataclass
class WeightedReward:
    name: str
    fn: RewardFunction
    weight: float = 1.0


@dataclass
class ScoreResult:
    rewards: list[float | None]  # None: the rollout must be dropped (a reward function failed)
    per_function: dict[str, list[float | None]]
    errors: int = 0  # rollouts dropped because of a failing reward function
    first_error: str | None = None
    error_counts: dict[str, int] = field(default_factory=dict)

    def means(self) -> dict[str, float]:
        """Mean of each function's valid values (for per-function reward metrics)."""
        out = {}
        for name, vals in self.per_function.items():
            ok = [v for v in vals if v is not None]
            out[name] = sum(ok) / len(ok) if ok else float("nan")
        return out


def _columns(rows: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    keys = [k for k in rows[0] if k != "prompt"] if rows else []
    return {k: [r.get(k) for r in rows] for k in keys}


def _check_value(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return float(v)
    f = float(v)  # raises on non-numbers
    if not math.isfinite(f):
        raise ValueError(f"returned non-finite reward {v!r}")
    return f


def _call(
    wr: WeightedReward, prompts: list[str], completions: list[str], rows: Sequence[dict[str, Any]]
) -> list[float | None]:
    out = wr.fn(prompts=prompts, completions=completions, **_columns(rows))
    if out is None or len(out) != len(completions):
        got = "None" if out is None else f"{len(out)} values"
        raise ValueError(f"returned {got} for {len(completions)} completions")
    return [_check_value(v) for v in out]


def score(
    fns: Sequence[WeightedReward],
    prompts: list[str],
    completions: list[str],
    rows: Sequence[dict[str, Any]],
) -> ScoreResult:
    """Weighted sum of reward functions (None = not applicable, as in TRL's nansum)."""
    n = len(completions)
    failed = [False] * n
    result = ScoreResult(rewards=[None] * n, per_function={})
    for wr in fns:
        try:
            values = _call(wr, prompts, completions, rows)
        except Exception:  # noqa: BLE001 - isolate the failing items one by one
            values = []
            for i in range(n):
                try:
                    values.append(
                        _call(wr, prompts[i : i + 1], completions[i : i + 1], rows[i : i + 1])[0]
                    )
                except Exception as exc:  # noqa: BLE001
                    values.append(None)
                    failed[i] = True
                    result.error_counts[wr.name] = result.error_counts.get(wr.name, 0) + 1
                    if result.first_error is None:
                        result.first_error = (
                            f"reward function {wr.name!r}: {type(exc).__name__}: {exc}"
                        )
        result.per_function[wr.name] = values
    for i in range(n):
        if failed[i]:
            continue
        vals = [(wr.weight, result.per_function[wr.name][i]) for wr in fns]
        result.rewards[i] = sum(w * v for w, v in vals if v is not None)
    result.errors = sum(failed)
    return result
