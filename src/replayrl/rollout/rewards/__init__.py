"""Reward functions with TRL's signature: f(prompts, completions, **columns) -> list[float|None]."""

from replayrl.config.registries import REWARDS
from replayrl.rollout.rewards.builtin import correctness_reward, digits_format_reward
from replayrl.rollout.rewards.loading import load_reward_function
from replayrl.rollout.rewards.scoring import (
    RewardFunction,
    ScoreResult,
    WeightedReward,
    prepare_isolation,
    score,
)

__all__ = [
    "REWARDS",
    "RewardFunction",
    "ScoreResult",
    "WeightedReward",
    "correctness_reward",
    "digits_format_reward",
    "prepare_isolation",
    "resolve_rewards",
    "score",
]


def resolve_rewards(specs: list[tuple[str, float]]) -> list[WeightedReward]:
    """Registered reward names (`REWARDS`: the built-ins and plugins'), or `file.py:function` /
    `package.module:function` of the user's (only those run in a worker process under
    `rollout.reward_isolation=process`)."""
    out = []
    for name, weight in specs:
        builtin = ":" not in name
        fn = REWARDS.get(name) if builtin else load_reward_function(name)
        out.append(WeightedReward(name=name, fn=fn, weight=weight, builtin=builtin))
    return out
