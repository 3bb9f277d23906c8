"""ReMix's whole objective (arXiv 2507.06892) as pure functions of per-token tensors.

    t <= T:  L = L_MixPPG - c * H[pi] + beta * L_KLC(pi_base = initial policy)
    t >  T:  L = L_PPO    - c * H[pi] + beta * L_KLC(pi_base = pi_T)

(arXiv 2507.06892: the Mix-PPG objective, the KL-Convex constraint, policy reincarnation;
restated in the module docstrings of `losses` and `kl`). Paper 1 (arXiv 2604.08706) is the
special case c = beta = 0 with the GRPO clip loss. The learner collates batches, calls
`policy_objective` / `critic_objective` and steps the optimizers; nothing else decides a term.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from replayrl.algorithms.aggregation import aggregate
from replayrl.algorithms.kl import kl_convex
from replayrl.algorithms.losses import call_policy_loss, clipped_value_loss


@dataclass(frozen=True)
class ObjectiveWeights:
    """Coefficients of one step: KL weights on pi_base and pi_{k-1} (beta * lambda(t) and
    beta * (1 - lambda(t))), entropy bonus c, and how per-token terms are aggregated."""

    kl_base: float = 0.0
    kl_prev: float = 0.0
    entropy_coef: float = 0.0
    kl_estimator: str = "k3"
    loss_agg: str = "token_mean"


@dataclass
class ObjectiveTerms:
    total: torch.Tensor  # what to backpropagate
    policy_loss: torch.Tensor
    kl_loss: torch.Tensor | None = None
    entropy: torch.Tensor | None = None  # aggregated entropy (the bonus is -c times it)
    metrics: dict[str, float] = field(default_factory=dict)


def kl_term(
    logprobs: torch.Tensor,
    base_logprobs: torch.Tensor | None,
    prev_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    w: ObjectiveWeights,
    normaliser: float | None,
) -> torch.Tensor:
    """beta * L_KLC = (w_base + w_prev) * agg[lambda KL(pi||pi_base) + (1-lambda) KL(pi||pi_{k-1})]
    with lambda = w_base / (w_base + w_prev) (arXiv 2507.06892, KL-Convex constraint)."""
    kl_tok = kl_convex(
        logprobs, base_logprobs, prev_logprobs, w.kl_base / (w.kl_base + w.kl_prev), w.kl_estimator
    )
    return (w.kl_base + w.kl_prev) * aggregate(kl_tok, mask, w.loss_agg, normaliser)


def policy_objective(
    loss_type: str,
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    inputs: dict[str, Any],
    knobs: dict[str, Any],
    w: ObjectiveWeights,
    normaliser: float | None,
) -> ObjectiveTerms:
    """L_policy + beta * L_KLC - c * H (arXiv 2507.06892, full objective).

    `loss_type` is a registered policy loss (mix_ppg before reincarnation, grpo_clip = PPO's
    clip after it, or any other); `inputs` are the batch tensors it may declare
    (anchor_logprobs = log pi_k for the Mix-PPG clip centre, rewards, baselines, and for the
    KL term base_logprobs / prev_logprobs).
    """
    loss, metrics = call_policy_loss(
        loss_type, logprobs, old_logprobs, advantages, mask, inputs, knobs, w.loss_agg, normaliser
    )
    total = loss
    out = ObjectiveTerms(total=loss, policy_loss=loss, metrics=metrics)
    if w.kl_base > 0 or w.kl_prev > 0:
        out.kl_loss = kl_term(
            logprobs,
            inputs.get("base_logprobs"),
            inputs.get("prev_logprobs"),
            mask,
            w,
            normaliser,
        )
        total = total + out.kl_loss
    if w.entropy_coef > 0:
        out.entropy = aggregate(entropy, mask, w.loss_agg, normaliser)
        total = total - w.entropy_coef * out.entropy  # a bonus: higher entropy, lower loss
    out.total = total
    return out


def critic_objective(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    value_clip: float | None,
    loss_agg: str,
    normaliser: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss 0.5 max((V - R)^2, (V_old + clip(V - V_old) - R)^2), the critic
    of ReMix-PPO (arXiv 2507.06892, PPO set-up: value clip 0.5, GAE gamma = lambda = 1)."""
    return clipped_value_loss(values, old_values, returns, mask, value_clip, loss_agg, normaliser)
