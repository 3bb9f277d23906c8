"""Per-batch replay metrics (age, diversity, reuse) for logging."""

from __future__ import annotations

from collections.abc import Sequence

from replayrl.data.rollout_record import Rollout

__all__ = ["batch_stats"]


def batch_stats(batch: Sequence[Rollout], current_version: int) -> dict[str, float]:
    """Age (``current_version - policy_version``), diversity and reuse of one training batch.

    Keys: ``batch_size``; ``age_mean``, ``age_max``; ``distinct_frac`` (distinct rollout
    objects / batch size, 1.0 = no duplicates); ``times_sampled_mean``, ``times_sampled_max``
    (as stored on the rollouts, i.e. including this batch if it came from ``sample``). An empty
    batch gives ``batch_size = 0`` and 0.0 everywhere else.
    """
    n = len(batch)
    if n == 0:
        keys = ("age_mean", "age_max", "distinct_frac", "times_sampled_mean", "times_sampled_max")
        return {"batch_size": 0.0, **dict.fromkeys(keys, 0.0)}
    ages = [current_version - r.policy_version for r in batch]
    reuse = [r.times_sampled for r in batch]
    return {
        "batch_size": float(n),
        "age_mean": sum(ages) / n,
        "age_max": float(max(ages)),
        "distinct_frac": len({id(r) for r in batch}) / n,
        "times_sampled_mean": sum(reuse) / n,
        "times_sampled_max": float(max(reuse)),
    }
