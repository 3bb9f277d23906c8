"""What a reward call may return: one number (or None) per completion, finite in float32.

Shared by the in-process scorer and the reward worker processes (rewards/isolation.py),
so that a value is judged the same way wherever the function ran.
"""

from __future__ import annotations

import math
from typing import Any

FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32 (torch.finfo(float32).max)


class RewardCallError(Exception):
    """One reward call's failure and its reason (timeout, error, wrong_length, ...)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def check_value(v: Any) -> float | None:
    """A reward value as a float; None stays None (not applicable). Numbers (bool counts as
    0/1, numpy scalars, one-element tensors) are accepted; text such as "1.0" is not a
    number and raises RewardCallError, as does NaN or inf. A RewardCallError given as the
    value (a worker process judged it already) is raised as it is."""
    if v is None:
        return None
    if isinstance(v, RewardCallError):
        raise v
    if isinstance(v, (str, bytes)) or not hasattr(v, "__float__"):
        raise RewardCallError("non_numeric", f"returned {type(v).__name__} {v!r}, not a number")
    try:
        f = float(v)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise RewardCallError("non_numeric", f"returned {v!r}, not a number ({exc})") from None
    if not math.isfinite(f) or abs(f) > FLOAT32_MAX:
        what = "non-finite" if not math.isfinite(f) else "float32-overflowing (inf in training)"
        raise RewardCallError("non_finite", f"returned {what} reward {v!r}")
    return f


def check_shape(out: Any, expected: int) -> list[Any]:
    """`out` as a list of `expected` values. RewardCallError("not_a_list") when it is no
    sequence at all (None, one number, text: a missing `return` is the usual cause, so the
    message says how to mean "not applicable"), RewardCallError("wrong_length") giving the
    real lengths when it is a sequence of another length."""
    try:
        n = len(out)
    except TypeError:
        n = None
    if out is None or n is None or isinstance(out, (str, bytes)):
        raise RewardCallError(
            "not_a_list",
            f"returned {type(out).__name__} {_short(out)}, not a list with one value for each "
            f"of the {expected} completions (for 'not applicable', return "
            "[None] * len(completions))",
        )
    if n != expected:
        raise RewardCallError(
            "wrong_length",
            f"returned {type(out).__name__} of {n} values for {expected} completions",
        )
    return list(out)


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."
