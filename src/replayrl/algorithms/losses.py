"""Policy losses as pure functions of tensors, in a registry (verl's core_algos style).

Every loss takes per-token `logprobs` (current policy, with grad), `old_logprobs` (behaviour
policy), per-sequence `advantages`, a token `mask`, and keyword knobs; it returns the scalar
loss to minimise and a dict of float metrics. `normaliser` lets gradient-accumulated
micro-batches reproduce the full mini-batch's mean exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from replayrl.algorithms.aggregation import aggregate
from replayrl.registry import Registry

PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, float]]]

# tensors a loss may ask for besides (logprobs, old_logprobs, advantages, mask)
LOSS_INPUTS = ("anchor_logprobs", "rewards", "baselines", "stale")
# the knobs every loss may take by name, and the config key each reads; a loss with settings
# of its own declares them as {keyword: dotted config key} (loss exgrpo: its shaping beta)
SHARED_KNOBS = {
    "epsilon": "algorithm.epsilon",
    "epsilon_high": "algorithm.epsilon_high",
    "delta_v": "algorithm.asymre_delta_v",
}


@dataclass(frozen=True)
class LossSpec:
    """`knobs`: keyword -> the dotted config key it is read from; `requires`: config keys
    that must hold these values for the loss to mean what it says (`why`: the reason)."""

    fn: PolicyLoss
    inputs: tuple[str, ...] = ()
    knobs: dict[str, str] = field(default_factory=dict)
    requires: dict[str, str] = field(default_factory=dict)
    why: str = ""


POLICY_LOSSES: Registry[LossSpec] = Registry("loss", "algorithm.loss_type")


def register_policy_loss(
    name: str,
    inputs: tuple[str, ...] = (),
    knobs: tuple[str, ...] | dict[str, str] = (),
    requires: dict[str, str] | None = None,
    why: str = "",
) -> Callable[[PolicyLoss], PolicyLoss]:
    """Register `fn(logprobs, old_logprobs, advantages, mask, *, loss_agg, normaliser,
    **declared inputs and knobs)`; undeclared names are errors, not silently dropped.
    `knobs`: names of `SHARED_KNOBS`, or {keyword: config key} for the loss's own settings."""
    own = dict(knobs) if isinstance(knobs, dict) else {}
    shared = [k for k in knobs if k not in own]
    unknown = [k for k in inputs if k not in LOSS_INPUTS] + [
        k for k in shared if k not in SHARED_KNOBS
    ]
    if unknown:
        raise ValueError(f"policy loss {name!r}: unknown inputs/knobs {unknown}")
    resolved = {k: SHARED_KNOBS[k] for k in shared} | own

    def deco(fn: PolicyLoss) -> PolicyLoss:
        POLICY_LOSSES.add(name, LossSpec(fn, tuple(inputs), resolved, dict(requires or {}), why))
        return fn

    return deco


def get_policy_loss(name: str) -> PolicyLoss:
    return POLICY_LOSSES.get(name).fn


def call_policy_loss(
    name: str,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    available: dict[str, Any],
    knobs: dict[str, Any],
    loss_agg: str,
    normaliser: float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Call a registered loss with the inputs and knobs it declares (a missing one is an
    error naming it)."""
    spec = POLICY_LOSSES.get(name)
    missing = [k for k in spec.inputs if k not in available]
    if missing:
        raise ValueError(f"loss {name!r} needs {missing}, which the batch does not carry")
    kwargs = {k: available[k] for k in spec.inputs} | {k: knobs[k] for k in spec.knobs}
    return spec.fn(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        loss_agg=loss_agg,
        normaliser=normaliser,
        **kwargs,
    )


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


def ratio_metrics(
    log_ratio: torch.Tensor, mask: torch.Tensor, is_clipped: torch.Tensor | None = None
) -> dict[str, float]:
    """Diagnostics of the ratio rho = exp(log_ratio) over the masked tokens: the share clipped
    (`is_clipped`, 0/1 per token; 0.0 for a loss without clipping), approx_kl (k3 of
    pi_old || pi: rho - 1 - log rho), the mean ratio and the largest (1.0 with no tokens)."""
    ratio = torch.exp(log_ratio)
    return {
        "clip_frac": 0.0 if is_clipped is None else _masked_mean(is_clipped, mask),
        "approx_kl": _masked_mean(ratio - 1 - log_ratio, mask),
        "ratio_mean": _masked_mean(ratio, mask),
        "ratio_max": float(ratio[mask.bool()].max()) if mask.any() else 1.0,
    }


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's length-normalised sequence log-ratio (arXiv 2507.18071, eq. 7): the mean over a
    completion's tokens of log pi/pi_old, the same for each of its tokens (B, T)."""
    m = mask.to(log_ratio.dtype)
    per_seq = (log_ratio * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    return per_seq.expand_as(log_ratio)


@register_policy_loss(
    "grpo_clip",
    knobs={
        "epsilon": "algorithm.epsilon",
        "epsilon_high": "algorithm.epsilon_high",
        "importance_sampling_level": "algorithm.importance_sampling_level",
    },
)
def grpo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    importance_sampling_level: str = "token",
    loss_agg: str = "token_mean",
    normaliser: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """-E[min(rho A, clip(rho, 1-eps_low, 1+eps_high) A)], rho = pi/pi_old (paper 1, GRPO clip);
    `importance_sampling_level="sequence"`: rho is GSPO's sequence ratio for every token."""
    eps_high = epsilon if epsilon_high is None else epsilon_high
    log_ratio = logprobs - old_logprobs
    if importance_sampling_level == "sequence":
        log_ratio = sequence_log_ratio(log_ratio, mask)
    elif importance_sampling_level != "token":
        raise ValueError(f"importance_sampling_level={importance_sampling_level!r}: token|sequence")
    ratio = torch.exp(log_ratio)
    adv = _per_token(advantages, logprobs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + eps_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    loss = aggregate(per_token, mask, loss_agg, normaliser)
    with torch.no_grad():
        metrics = ratio_metrics(log_ratio, mask, (clipped < unclipped).to(logprobs.dtype))
        # TRL's clip_ratio/low_mean and /high_mean: the side that clipped (region = both)
        low = (ratio < 1 - epsilon) & (adv < 0)
        high = (ratio > 1 + eps_high) & (adv > 0)
        metrics["clip_low_frac"] = _masked_mean(low.to(logprobs.dtype), mask)
        metrics["clip_high_frac"] = _masked_mean(high.to(logprobs.dtype), mask)
    return loss, metrics


@register_policy_loss("asymre", inputs=("rewards", "baselines"), knobs=("delta_v",))
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
) -> tuple[torch.Tensor, dict[str, float]]:
    """AsymRE: -E[(r - (V + dV)) log pi(z|q)], V = group mean reward, no ratio (paper 1)."""
    weight = (rewards - (baselines + delta_v)).unsqueeze(-1).to(logprobs.dtype)
    per_token = -weight * logprobs
    loss = aggregate(per_token, mask, loss_agg, normaliser)
    with torch.no_grad():
        metrics = ratio_metrics(logprobs - old_logprobs, mask)
    return loss, metrics


@register_policy_loss("mix_ppg", inputs=("anchor_logprobs",), knobs=("epsilon", "epsilon_high"))
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
        metrics = ratio_metrics(log_ratio, mask, (clipped < unclipped).to(logprobs.dtype))
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


def normalised_ess(weights: torch.Tensor) -> float:
    """Kish's effective sample size of importance weights over N, ESS / N =
    (sum w)^2 / (N sum w^2), in (0, 1]: 1 when all weights are equal, 1 / N when one weight
    carries everything (the staleness measure of off-policy RL, e.g. paper 2's Mix-PPG
    weights w = pi_theta / pi_{k-i} per token). NaN without weights."""
    n = weights.numel()
    if n == 0:
        return math.nan
    w = weights.double()
    return float(w.sum() ** 2 / (n * (w**2).sum()))


def clip_stats(
    ratio: torch.Tensor,
    centre: torch.Tensor,
    stale: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> dict[str, float]:
    """Mean ratio, share of tokens outside [c - eps_low, c + eps_high] and ESS / N of the
    ratios (`normalised_ess`), fresh vs stale."""
    outside = (ratio < centre - eps_low) | (ratio > centre + eps_high)
    out = {}
    for name, sel in (("on_policy", ~stale), ("off_policy", stale)):
        n = int(sel.sum())
        out[f"{name}/ratio_mean"] = float(ratio[sel].mean()) if n else math.nan
        out[f"{name}/clip_frac"] = float(outside[sel].float().mean()) if n else math.nan
        out[f"{name}/ess"] = normalised_ess(ratio[sel])
        out[f"{name}/tokens"] = float(n)
    return out
