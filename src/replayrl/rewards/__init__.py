"""Reward functions with TRL's signature: f(prompts, completions, **columns) -> list[float|None]."""

from replayrl.rewards.builtin import BUILTIN_REWARDS, correctness_reward, digits_format_reward
from replayrl.rewards.scoring import RewardFunction, ScoreResult, WeightedReward, score

__all__ = [
    "BUILTIN_REWARDS",
    "RewardFunction",
    "ScoreResult",
    "WeightedReward",
    "correctness_reward",
    "digits_format_reward",
    "resolve_rewards",
    "score",
]


def resolve_rewards(specs: list[tuple[str, float]]) -> list[WeightedReward]:
    """Look up built-in reward names; unknown names are a clear error."""
    out = []
    for name, weight in specs:
        if name not in BUILTIN_REWARDS:
            known = ", ".join(sorted(BUILTIN_REWARDS))
            raise ValueError(f"rewards: unknown reward function {name!r} (known: {known})")
        out.append(WeightedReward(name=name, fn=BUILTIN_REWARDS[name], weight=weight))
    return out
