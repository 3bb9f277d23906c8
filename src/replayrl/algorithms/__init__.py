"""Advantage estimators, policy losses, aggregations and the objective (pure tensor functions
in registries)."""

from replayrl.algorithms import exgrpo_loss  # noqa: F401  (registers loss "exgrpo")
from replayrl.algorithms.advantages import ADVANTAGES, group_advantages
from replayrl.algorithms.aggregation import AGGREGATIONS, aggregate, batch_normaliser
from replayrl.algorithms.losses import (
    POLICY_LOSSES,
    call_policy_loss,
    get_policy_loss,
    importance_ess,
    register_policy_loss,
)

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "POLICY_LOSSES",
    "aggregate",
    "batch_normaliser",
    "call_policy_loss",
    "get_policy_loss",
    "group_advantages",
    "importance_ess",
    "register_policy_loss",
]
