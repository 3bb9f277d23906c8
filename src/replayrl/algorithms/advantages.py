"""Advantage estimators in a registry: each entry is a function the loop actually calls.

Two kinds: group estimators run once at generation (the producer calls them; the advantage is
stored on the rollout, as paper 1 and GRPO), token estimators run in the learner at every
step with the current critic (as ReMix-PPO for replayed data). Registering a new name with
`ADVANTAGES.add(name, AdvantageSpec(group=fn))` is the whole edit: the config accepts it, the
producer calls it (RLOO below is registered exactly so).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from replayrl.registry import Registry


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


def group_means(rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Each item's group mean reward (stored on the rollout whatever the estimator)."""
    return group_advantages(rewards, group_ids, scale_rewards=False)[1]


def grpo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale_rewards: bool = True
) -> torch.Tensor:
    """GRPO's group-relative advantage (`group_advantages`), the registry's signature."""
    return group_advantages(rewards, group_ids, scale_rewards)[0]


def rloo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale_rewards: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """RLOO (Ahmadian et al., arXiv 2402.14740, eq. for the leave-one-out baseline):
    A_i = r_i - 1/(G-1) sum_{j != i} r_j = G/(G-1) (r_i - mean(r_group)).

    `scale_rewards` divides by the group's sample std as GRPO does (the optional advantage
    normalisation; `algorithm.scale_rewards=false` gives the paper's plain estimator). A
    single-member group has no other sample: A = 0.
    """
    rewards = rewards.to(torch.float64)
    adv = torch.zeros_like(rewards)
    for g in torch.unique(group_ids):
        idx = group_ids == g
        r = rewards[idx]
        n = r.numel()
        if n < 2:
            continue
        others_mean = (r.sum() - r) / (n - 1)
        centred = r - others_mean
        if scale_rewards:
            centred = centred / (r.std() + eps)
        adv[idx] = centred
    return adv.float()


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
    last = values.new_zeros(values.size(0))
    next_value = values.new_zeros(values.size(0))
    for t in reversed(range(values.size(1))):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        last = (delta + gamma * lam * last) * m
        adv[:, t] = last
        next_value = values[:, t] * m + next_value * (1 - m)  # right padding: V after end = 0
    return adv, adv + values


# sums a number over the learner ranks (each holds its share of the step's batch)
SumOverRanks = Callable[[float], float]


def whiten(
    x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8, reduce_sum: SumOverRanks | None = None
) -> torch.Tensor:
    """(x - mean) / std over masked entries: PPO's advantage normalisation of GAE advantages
    (as in ReMix-PPO's PPO set-up, arXiv 2507.06892). With `reduce_sum` (several learner
    ranks) the mean and the (unbiased) std are those of every rank's entries together, as one
    learner holding the whole batch computes them: two passes, each one sum over the ranks."""
    m = mask.bool()
    vals = x[m]
    if reduce_sum is None:
        if vals.numel() < 2:
            return x * mask
        return ((x - vals.mean()) / (vals.std() + eps)) * mask
    n = reduce_sum(float(vals.numel()))  # every rank calls each sum, whatever it holds
    mean = reduce_sum(float(vals.double().sum())) / max(n, 1.0)
    squares = reduce_sum(float(((vals.double() - mean) ** 2).sum()))
    if n < 2:
        return x * mask
    return ((x - mean) / (math.sqrt(squares / (n - 1)) + eps)) * mask


def whitened_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    reduce_sum: SumOverRanks | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's token estimator: `gae` advantages, whitened over the batch (`whiten`; over every
    learner rank's share with `reduce_sum`); returns (advantages, returns) with the returns of
    the unwhitened advantages (the critic's target)."""
    adv, ret = gae(rewards, values, mask, gamma, lam)
    return whiten(adv, mask, reduce_sum=reduce_sum), ret


# (rewards (N,), group ids (N,), scale_rewards) -> advantages (N,)
GroupEstimator = Callable[[torch.Tensor, torch.Tensor, bool], torch.Tensor]
# (rewards, values, mask: (B, T), gamma, lam) -> (advantages, returns), both (B, T). To an
# estimator whose signature has a `reduce_sum` parameter (or **kwargs), a learner that is one
# of several ranks also passes `reduce_sum=` (a sum over the ranks, which every rank calls the
# same number of times) for statistics over the whole step's batch; one without it sees only
# its rank's rows
TokenEstimator = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def takes_keyword(fn: Callable[..., Any], name: str) -> bool:
    """Whether `fn` accepts the keyword argument `name` (by name or through **kwargs)."""
    params = inspect.signature(fn).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


@dataclass(frozen=True)
class AdvantageSpec:
    """An estimator: `group` runs once at generation (the producer stores its value on the
    rollout), `token` runs in the learner at every step on the current critic's values.
    Exactly one of them is set."""

    group: GroupEstimator | None = None
    token: TokenEstimator | None = None

    def __post_init__(self) -> None:
        if (self.group is None) == (self.token is None):
            raise ValueError("an advantage estimator has exactly one of `group` or `token`")

    @property
    def at_generation(self) -> bool:
        return self.group is not None

    @property
    def needs_critic(self) -> bool:
        return self.token is not None


ADVANTAGES: Registry[AdvantageSpec] = Registry("advantage estimator", "algorithm.advantage")
ADVANTAGES.add("grpo", AdvantageSpec(group=grpo_advantages))
ADVANTAGES.add("rloo", AdvantageSpec(group=rloo_advantages))
ADVANTAGES.add("gae", AdvantageSpec(token=whitened_gae))
