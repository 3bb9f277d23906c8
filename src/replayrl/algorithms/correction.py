"""Truncated importance sampling (TIS) for the sampler / learner log-prob mismatch.

Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
(the fix they call truncated importance sampling): when rollouts are sampled by an engine
whose numerics differ from the learner's (here: a bf16 copy of the policy, or the learner
under bf16 autocast), the tokens are drawn from pi_sampler(. | theta_old), not from the
learner's pi_learner(. | theta_old) that the policy gradient assumes. Each token's gradient
term is re-weighted by the truncated ratio

    w_t = min( pi_learner(a_t | s_t, theta_old) / pi_sampler(a_t | s_t, theta_old), C )

so that the PPO/GRPO surrogate becomes E_{a ~ pi_sampler}[ w_t * min(r_t A_t, clip(r_t) A_t) ]
with r_t = pi_learner(theta) / pi_learner(theta_old). The weight is a constant (no gradient);
truncating at C (the paper uses C = 2) bounds the variance that rare tokens with a tiny
sampler probability would bring. Since w_t > 0, w_t * min(r A, clip(r) A) =
min(r (w A), clip(r) (w A)): the weight can be applied by scaling each token's advantage
(`apply_token_weights`), which leaves the loss functions themselves untouched.
"""

from __future__ import annotations

import math

import torch


def truncated_is_weights(
    learner_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """w = min(exp(log pi_learner - log pi_sampler), cap) per token, without gradient.

    Both inputs are log-probs of the same sampled tokens under theta_old (any shape, equal);
    `cap` is C > 0 of Yao et al. 2025. Non-finite log-probs are an error, not a silent 0/inf.
    """
    if cap <= 0:
        raise ValueError(f"truncated IS cap must be positive, got {cap}")
    if learner_logprobs.shape != sampler_logprobs.shape:
        raise ValueError(
            f"truncated IS: learner log-probs {tuple(learner_logprobs.shape)} and sampler "
            f"log-probs {tuple(sampler_logprobs.shape)} differ in shape"
        )
    diff = learner_logprobs.detach().float() - sampler_logprobs.detach().float()
    if not bool(torch.isfinite(diff).all()):
        raise ValueError("truncated IS: non-finite log-probs (a token of probability 0?)")
    # clamp before exp (no overflow), then exactly at the cap (exp(log C) may round below C)
    return diff.clamp(max=math.log(cap) + 1.0).exp().clamp(max=cap)


def apply_token_weights(advantages: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Advantages scaled per token: (B,) sequence or (B, T) token advantages times (B, T)
    weights -> (B, T). Valid for losses that are positively homogeneous in the advantage
    per token (PPO/GRPO clip, Mix-PPG: w * min(r A, clip(r) A) = min(r wA, clip(r) wA))."""
    if bool((weights < 0).any()):
        raise ValueError("token weights must be non-negative")
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    if adv.shape[0] != weights.shape[0] or (adv.shape[1] not in (1, weights.shape[1])):
        raise ValueError(
            f"advantages {tuple(advantages.shape)} do not match weights {tuple(weights.shape)}"
        )
    return adv.to(weights.dtype) * weights


def weight_stats(weights: torch.Tensor, mask: torch.Tensor, cap: float) -> dict[str, float]:
    """Mean weight and the share of tokens truncated at the cap, over `mask`."""
    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        return {"tis/mean_weight": float("nan"), "tis/truncated_share": float("nan")}
    w = weights[m]
    return {
        "tis/mean_weight": float(w.mean()),
        "tis/truncated_share": float((w >= cap).float().mean()),
    }
