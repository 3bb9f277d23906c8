"""Policy losses as pure functions of tensors, in a registry (verl's core_algos style).

Every loss takes per-token `logprobs` (current policy, with grad), `old_logprobs` (behaviour
policy), per-sequence `advantages`, a token `mask`, and keyword knobs; it returns the scalar
loss to minimise and a dict of float metrics. `normaliser` lets gradient-accumulated
micro-batches reproduce the full mini-batch's mean exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    def deco(fn: PolicyLoss) -> PolicyLoss:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        POLICY_LOSSES[name] = fn
        return fn

    return deco


def get_policy_loss(name: str) -> PolicyLoss:
    if name not in POLICY_LOSSES:
        raise ValueError(
            f"algorithm.loss_type: unknown loss {name!r} "
            f"(known: {', '.join(sorted(POLICY_LOSSES))})"
        )
    return POLICY_LOSSES[name]


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, loss_agg: str, normaliser: float | None = None
) -> torch.Tensor:
    """token_mean: sum / #tokens (DAPO); seq_mean: mean over sequences of each token mean (GRPO)."""
    mask = mask.to(per_token.dtype)
    if loss_agg == "token_mean":
        denom = normaliser if normaliser is not None else mask.sum().clamp(min=1)
        return (per_token * mask).sum() / denom
    if loss_agg == "seq_mean":
        seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        denom = normaliser if normaliser is not None else per_token.size(0)
        return seq.sum() / denom
    raise ValueError(f"algorithm.loss_agg: unknown aggregation {loss_agg!r}")


def importance_ess(seq_log_ratios: torch.Tensor) -> float:
    """Normalised effective sample size (sum w)^2 / (n sum w^2) of sequence ratios w (in (0, 1])."""
    if seq_log_ratios.numel() == 0:
        return 1.0
    w = torch.exp(seq_log_ratios.double() - seq_log_ratios.double().max())  # scale-free
    return float(w.sum() ** 2 / (w.numel() * (w**2).sum()))


def _per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-sequence (B,) advantages broadcast over tokens; per-token (B, T) ones as they are."""
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    return adv.to(like.dtype)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.to(x.dtype)
    return float((x * m).sum() / m.sum().clamp(min=1))


@register_policy_loss("grpo_clip")
def grpo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    loss_agg: str = "token_mean",
    normaliser: float | None = None,
    **_: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """-E[min(rho A, clip(rho, 1-eps_low, 1+eps_high) A)], rho = pi/pi_old (paper 1, GRPO clip)."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    adv = _per_token(advantages, logprobs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    loss = aggregate(per_token, mask, loss_agg, normaliser)
    with torch.no_grad():
        is_clipped = (clipped < unclipped).to(logprobs.dtype)
        metrics = {
            "clip_frac": _masked_mean(is_clipped, mask),
            "approx_kl": _masked_mean(ratio - 1 - log_ratio, mask),  # k3 of pi_old || pi
            "ratio_mean": _masked_mean(ratio, mask),
            "ratio_max": float(ratio[mask.bool()].max()) if mask.any() else 1.0,
        }
    return loss, metrics


@register_policy_loss("asymre")
def asymre_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    rewards: torch.Tensor,
    baselines: torch.Tensor,
    delta_v: float = -0.1,
    loss_agg: str = "token_mean",
    normaliser: float | None = None,
    **_: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """AsymRE: -E[(r - (V + dV)) log pi(z|q)], V = group mean reward, no ratio (paper 1)."""
    weight = (rewards - (baselines + delta_v)).unsqueeze(-1).to(logprobs.dtype)
    per_token = -weight * logprobs
    loss = aggregate(per_token, mask, loss_agg, normaliser)
    with torch.no_grad():
        log_ratio = logprobs - old_logprobs
        metrics = {
            "clip_frac": 0.0,
            "approx_kl": _masked_mean(torch.exp(log_ratio) - 1 - log_ratio, mask),
            "ratio_mean": _masked_mean(torch.exp(log_ratio), mask),
            "ratio_max": float(torch.exp(log_ratio)[mask.bool()].max()) if mask.any() else 1.0,
        }
    return loss, metrics


@register_policy_loss("mix_ppg")
def mix_ppg_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    anchor_logprobs: torch.Tensor | None = None,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    loss_agg: str = "token_mean",
    normaliser: float | None = None,
    **_: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """-E[min(r A, clip(r, c-eps, c+eps) A)], r = pi/pi_beh, c = pi_k/pi_beh (paper 2, Mix-PPG).

    `old_logprobs` are the behaviour policy's; `anchor_logprobs` are log pi_k (no grad) for
    stale data. Where anchor is None (or equals the behaviour) c = 1: plain PPO clipping.
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    if anchor_logprobs is None:
        centre = torch.ones_like(ratio)
    else:
        centre = torch.exp(anchor_logprobs - old_logprobs).detach()
    adv = _per_token(advantages, logprobs)
    unclipped = ratio * adv
    clipped = torch.minimum(torch.maximum(ratio, centre - epsilon), centre + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    loss = aggregate(per_token, mask, loss_agg, normaliser)
    with torch.no_grad():
        metrics = {
            "clip_frac": _masked_mean((clipped < unclipped).to(logprobs.dtype), mask),
            "approx_kl": _masked_mean(ratio - 1 - log_ratio, mask),
            "ratio_mean": _masked_mean(ratio, mask),
            "ratio_max": float(ratio[mask.bool()].max()) if mask.any() else 1.0,
        }
    return loss, metrics


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float | None = 0.5,
    loss_agg: str = "token_mean",
    normaliser: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2) (PPO value clipping, paper 2)."""
    unclipped = (values - returns) ** 2
    if clip is None:
        per_token = 0.5 * unclipped
        frac = 0.0
    else:
        v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped = (v_clipped - returns) ** 2
        per_token = 0.5 * torch.maximum(unclipped, clipped)
        frac = _masked_mean((clipped > unclipped).to(values.dtype), mask)
    loss = aggregate(per_token, mask, loss_agg, normaliser)
    return loss, {"value_clip_frac": frac, "value_mse": _masked_mean(unclipped.detach(), mask)}


def clip_stats(
    ratio: torch.Tensor,
    centre: torch.Tensor,
    stale: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> dict[str, float]:
    """Mean ratio and share of tokens outside [c - eps_low, c + eps_high], fresh vs stale."""
    outside = (ratio < centre - eps_low) | (ratio > centre + eps_high)
    out = {}
    for name, sel in (("on_policy", ~stale), ("off_policy", stale)):
        n = int(sel.sum())
        out[f"{name}/ratio_mean"] = float(ratio[sel].mean()) if n else math.nan
        out[f"{name}/clip_frac"] = float(outside[sel].float().mean()) if n else math.nan
        out[f"{name}/tokens"] = float(n)
    return out
