"""Reward functions with TRL's signature: f(prompts, completions, **columns) -> list[float|None]."""

from replayrl.rollout.rewards.builtin import (
    BUILTIN_REWARDS,
    correctness_reward,
    digits_format_reward,
)
from replayrl.rollout.rewards.loading import load_reward_function
from replayrl.rollout.rewards.scoring import (
    RewardFunction,
    ScoreResult,
    WeightedReward,
    prepare_isolation,
    score,
)

__all__ = [
    "BUILTIN_REWARDS",
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
    """Built-in reward names, or `file.py:function` / `package.module:function` of the user's
    (only the user's run in a worker process under `rollout.reward_isolation=process`)."""
    out = []
    for name, weight in specs:
        builtin = name in BUILTIN_REWARDS
        if builtin:
            fn = BUILTIN_REWARDS[name]
        elif ":" in name:
            fn = load_reward_function(name)
        else:
            known = ", ".join(sorted(BUILTIN_REWARDS))
            raise ValueError(
                f"rewards: unknown reward function {name!r} (built-in: {known}; or give your "
                f"own as path/to/file.py:function)"
            )
        out.append(WeightedReward(name=name, fn=fn, weight=weight, builtin=builtin))
    return out
