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

`importance_weights` adds the variants TRL's GRPOTrainer offers (its
`vllm_importance_sampling_mode`): the ratio per token or per sequence (the product of the
sequence's token ratios, rho = exp(sum_t (log pi_learner - log pi_sampler))), and past C
either truncated (min(rho, C)) or masked (rho if rho <= C, else 0: the token or sequence
drops out of the gradient).
"""

from __future__ import annotations

import math

import torch


def _log_ratios(
    learner: torch.Tensor,
    sampler: torch.Tensor,
    cap: float,
    what: str,
    dtype: torch.dtype,
    one_rollout: bool = False,
) -> torch.Tensor:
    """log pi_learner - log pi_sampler per token, detached, in `dtype`, once the inputs are
    checked: a positive cap, equal shapes (1-D with `one_rollout`), finite values."""
    if cap <= 0:
        raise ValueError(f"{what}: the cap must be positive, got {cap}")
    if learner.shape != sampler.shape or (one_rollout and learner.dim() != 1):
        need = "must be one rollout's (1-D, equal)" if one_rollout else "differ in shape"
        raise ValueError(
            f"{what}: learner log-probs {tuple(learner.shape)} and sampler log-probs "
            f"{tuple(sampler.shape)} {need}"
        )
    diff = learner.detach().to(dtype) - sampler.detach().to(dtype)
    if not bool(torch.isfinite(diff).all()):
        raise ValueError(f"{what}: non-finite log-probs (a token of probability 0?)")
    return diff


def truncated_is_weights(
    learner_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """w = min(exp(log pi_learner - log pi_sampler), cap) per token, without gradient.

    Both inputs are log-probs of the same sampled tokens under theta_old (any shape, equal);
    `cap` is C > 0 of Yao et al. 2025. Non-finite log-probs are an error, not a silent 0/inf.
    """
    diff = _log_ratios(learner_logprobs, sampler_logprobs, cap, "truncated IS", torch.float32)
    # clamp before exp (no overflow), then exactly at the cap (exp(log C) may round below C)
    return diff.clamp(max=math.log(cap) + 1.0).exp().clamp(max=cap)


IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def importance_weights(
    learner_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, cap: float, mode: str
) -> torch.Tensor:
    """Per-token IS weights of one rollout's tokens (1-D, equal shapes), without gradient.

    token_*: rho_t = pi_learner(a_t) / pi_sampler(a_t) each; sequence_*: one rho =
    prod_t rho_t for every token of the sequence. *_truncate: min(rho, C) (Yao et al. 2025,
    the equation of `truncated_is_weights`); *_mask: rho where rho <= C, else 0 (TRL's
    sequence_mask / token_mask). Non-finite log-probs and unknown modes are errors."""
    if mode not in IS_MODES:
        raise ValueError(f"importance sampling mode {mode!r}: one of {', '.join(IS_MODES)}")
    if mode == "token_truncate":
        return truncated_is_weights(learner_logprobs, sampler_logprobs, cap)
    diff = _log_ratios(
        learner_logprobs, sampler_logprobs, cap, "IS weights", torch.float64, one_rollout=True
    )
    log_rho = diff.sum().expand_as(diff) if mode.startswith("sequence") else diff
    log_cap = math.log(cap)
    if mode.endswith("truncate"):
        w = log_rho.clamp(max=log_cap + 1.0).exp().clamp(max=cap)
    else:  # mask: compared in log space, so a huge ratio is 0, never inf
        w = torch.where(log_rho <= log_cap, log_rho.clamp(max=log_cap).exp(), 0.0)
    return w.float()


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
    """Mean weight and the share of tokens truncated at the cap or masked (0), over `mask`."""
    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        return {"tis/mean_weight": float("nan"), "tis/truncated_share": float("nan")}
    w = weights[m]
    return {
        "tis/mean_weight": float(w.mean()),
        "tis/truncated_share": float(((w >= cap) | (w == 0)).float().mean()),
    }
