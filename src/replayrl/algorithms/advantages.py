"""Group-relative advantages, computed once at generation time and stored on the rollout."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replayrl.algorithms.registry import Registry


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale_rewards: bool = True, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: A_i = (r_i - mean(r_group)) / std(r_group) (arXiv 2604.08706); Dr.GRPO without /std.

    std is the unbiased sample std (TRL's convention); a single-member group has A = 0.
    Returns (advantages, group mean reward per item).
    """
    rewards = rewards.to(torch.float64)
    adv = torch.zeros_like(rewards)
    means = torch.zeros_like(rewards)
    for g in torch.unique(group_ids):
        idx = group_ids == g
        r = rewards[idx]
        mean = r.mean()
        means[idx] = mean
        centred = r - mean
        if scale_rewards:
            std = r.std() if r.numel() > 1 else torch.zeros((), dtype=r.dtype)
            centred = centred / (std + eps)
        adv[idx] = centred
    return adv.float(), means.float()


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE A_t = sum_l (gamma lam)^l delta_(t+l), delta_t = r_t + gamma V_(t+1) - V_t (paper 2).

    Returns (advantages, returns = A + V).

    rewards, values, mask: (B, T) over completion tokens (mask 0 on padding); V after the
    last valid token is 0 (episode ends).
    """
    mask = mask.to(values.dtype)
    values = values * mask
    adv = torch.zeros_like(values)
    last = torch.zeros(values.size(0), dtype=values.dtype)
    next_value = torch.zeros(values.size(0), dtype=values.dtype)
    for t in reversed(range(values.size(1))):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = (delta + gamma * lam * last) * m
        adv[:, t] = last
        next_value = values[:, t] * m + next_value * (1 - m)  # right padding: V after end = 0
    return adv, adv + values


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over masked entries: PPO's advantage normalisation of GAE advantages
    (as in ReMix-PPO's PPO set-up, arXiv 2507.06892)."""
    m = mask.bool()
    vals = x[m]
    if vals.numel() < 2:
        return x * mask
    return ((x - vals.mean()) / (vals.std() + eps)) * mask


@dataclass(frozen=True)
class AdvantageSpec:
    """Where an estimator runs: once at generation (stored on the rollout, as paper 1) or by
    the learner at every step with the current critic (as ReMix-PPO for replayed data)."""

    at_generation: bool
    needs_critic: bool


ADVANTAGES: Registry[AdvantageSpec] = Registry("advantage estimator", "algorithm.advantage")
ADVANTAGES.add("grpo", AdvantageSpec(at_generation=True, needs_critic=False))  # group_advantages
ADVANTAGES.add("gae", AdvantageSpec(at_generation=False, needs_critic=True))  # gae + whiten
