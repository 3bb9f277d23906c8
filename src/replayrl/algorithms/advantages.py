"""Group-relative advantages, computed once at generation time and stored on the rollout."""

from __future__ import annotations

import torch


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale_rewards: bool = True, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: A_i = (r_i - mean(r_group)) / std(r_group) (papers.md, paper 1); Dr.GRPO without /std.

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
