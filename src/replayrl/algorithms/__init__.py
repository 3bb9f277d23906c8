"""Advantage estimators and policy losses (pure tensor functions, registry-based)."""

from replayrl.algorithms.advantages import group_advantages
from replayrl.algorithms.losses import (
    POLICY_LOSSES,
    aggregate,
    get_policy_loss,
    importance_ess,
    register_policy_loss,
)

__all__ = [
    "POLICY_LOSSES",
    "aggregate",
    "get_policy_loss",
    "group_advantages",
    "importance_ess",
    "register_policy_loss",
]
