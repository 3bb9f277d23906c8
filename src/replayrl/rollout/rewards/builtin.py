"""Built-in verifiable rewards (TRL signature), registered by name (`REWARDS`)."""

from __future__ import annotations

import re
from typing import Any

from replayrl.config.registries import REWARDS
from replayrl.rollout.rewards.math import (
    answer_tag_format_reward,
    boxed_format_reward,
    completion_text,
    math_reward,
)
from replayrl.rollout.rewards.reasoning_gym import reasoning_gym_reward


def correctness_reward(
    prompts: list[str], completions: list[str], answer: list[Any], **_: Any
) -> list[float | None]:
    """1.0 when the stripped completion equals the answer column, else 0.0."""
    return [
        float(completion_text(c).strip() == str(a).strip())
        for c, a in zip(completions, answer, strict=True)
    ]


_NUMBER = re.compile(r"-?\d+")


def digits_format_reward(
    prompts: list[str], completions: list[str], **_: Any
) -> list[float | None]:
    """1.0 when the completion is a single integer and nothing else."""
    return [float(bool(_NUMBER.fullmatch(completion_text(c).strip()))) for c in completions]


ANSWER_MARK = "#"  # the written-out reasoning task's final answer follows the last `#`


def final_answer(completion: str) -> str | None:
    """The digits after the last `#` (leading zeros dropped); None without a clean number."""
    if ANSWER_MARK not in completion:
        return None
    tail = completion.rsplit(ANSWER_MARK, 1)[1].strip()
    if not tail.isdigit():
        return None
    return str(int(tail))


def final_answer_reward(
    prompts: list[str], completions: list[str], answer: list[Any], **_: Any
) -> list[float | None]:
    """1.0 when the number after the completion's last `#` equals the answer column (the
    written-out reasoning task's answer format, `...;#633`), else 0.0."""
    return [
        float(final_answer(completion_text(c)) == str(a).strip())
        for c, a in zip(completions, answer, strict=True)
    ]


REWARDS.add("correctness", correctness_reward)
REWARDS.add("digits_format", digits_format_reward)
REWARDS.add("final_answer", final_answer_reward)
REWARDS.add("math", math_reward)
REWARDS.add("boxed_format", boxed_format_reward)
REWARDS.add("answer_tag_format", answer_tag_format_reward)
REWARDS.add("reasoning_gym", reasoning_gym_reward)
