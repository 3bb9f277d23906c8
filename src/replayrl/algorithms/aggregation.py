"""Loss aggregations: how per-token terms become one scalar, in a registry.

`normaliser` is the denominator a whole mini-batch (all micro-batches, all data-parallel
ranks) shares, so gradient-accumulated micro-batches and several learners reproduce the full
batch's loss exactly (see `batch_normaliser`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from replayrl.registry import Registry

Reducer = Callable[[float], float]  # sum of a count over data-parallel ranks


@dataclass(frozen=True)
class Aggregation:
    """`reduce(per_token, mask, normaliser)`; `count(tokens, sequences, max_len)` is what its
    normaliser counts over a mini-batch (summed over ranks)."""

    reduce: Callable[[torch.Tensor, torch.Tensor, float | None], torch.Tensor]
    count: Callable[[int, int, int], float]


AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation", "algorithm.loss_agg")


def _token_mean(per_token: torch.Tensor, mask: torch.Tensor, normaliser: float | None):
    """sum / #tokens (DAPO, arXiv 2503.14476: token-level policy-gradient loss)."""
    denom = normaliser if normaliser is not None else mask.sum().clamp(min=1)
    return (per_token * mask).sum() / denom


def _seq_mean(per_token: torch.Tensor, mask: torch.Tensor, normaliser: float | None):
    """Mean over sequences of each sequence's token mean (GRPO, arXiv 2402.03300)."""
    seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    denom = normaliser if normaliser is not None else per_token.size(0)
    return seq.sum() / denom


def _dr_grpo(per_token: torch.Tensor, mask: torch.Tensor, normaliser: float | None):
    """sum / (batch * max_completion_length), a constant (Dr.GRPO, arXiv 2503.20783):
    no length bias from dividing by each sequence's own length."""
    if normaliser is None:
        raise ValueError("loss_agg=dr_grpo needs normaliser = batch size * max completion length")
    return (per_token * mask).sum() / normaliser


AGGREGATIONS.add("token_mean", Aggregation(_token_mean, lambda tok, seq, max_len: float(tok)))
AGGREGATIONS.add("seq_mean", Aggregation(_seq_mean, lambda tok, seq, max_len: float(seq)))
AGGREGATIONS.add("dr_grpo", Aggregation(_dr_grpo, lambda tok, seq, max_len: float(seq * max_len)))


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, loss_agg: str, normaliser: float | None = None
) -> torch.Tensor:
    """token_mean: sum / #tokens (DAPO); seq_mean: mean over sequences of each token mean
    (GRPO); dr_grpo: sum / (B * max completion length) (Dr.GRPO)."""
    return AGGREGATIONS.get(loss_agg).reduce(per_token, mask.to(per_token.dtype), normaliser)


def batch_normaliser(
    loss_agg: str,
    tokens: int,
    sequences: int,
    max_len: int,
    reduce_sum: Reducer | None = None,
    world_size: int = 1,
) -> float:
    """The shared denominator of a mini-batch split over micro-batches and `world_size` ranks.

    Each rank counts its own share; `reduce_sum` sums the count over ranks (all-reduce).
    Gradients are then averaged over ranks (a mean, as DDP does), so each rank divides by
    global count / world size: the average of the ranks' gradients is then the gradient of
    sum over all ranks' tokens / global count, the mean over every token of every rank (as
    TRL's "dapo" loss), not an average of per-rank means.
    """
    count = AGGREGATIONS.get(loss_agg).count(tokens, sequences, max_len)
    if reduce_sum is None or world_size == 1:
        return count
    return reduce_sum(count) / world_size
