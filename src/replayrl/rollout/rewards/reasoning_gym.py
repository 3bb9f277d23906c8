"""The reasoning-gym package's own answer scorers as a reward function (TRL signature).

Rows of `task.name: reasoning_gym` (tasks/reasoning_gym.py) carry the generated entry
(`rg_entry`: question, answer, metadata) and where it came from (`rg_dataset`, `rg_config`);
the completion's answer is the content of its last `<answer>...</answer>` tag, scored in
[0, 1] by that dataset's `score_answer` (some give partial credit).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from replayrl.rollout.rewards.math import completion_text

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def import_reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(
            "task.name=reasoning_gym needs the reasoning-gym package: pip install "
            "'reasoning-gym>=0.1.25' (or replayrl[reasoning])"
        ) from exc
    return reasoning_gym


def extract_tagged_answer(completion: str) -> str | None:
    """Content of the last <answer>...</answer> (stripped), None without one."""
    found = _ANSWER.findall(completion)
    return found[-1].strip() if found else None


@lru_cache(maxsize=64)
def scorer(name: str, config_json: str) -> Any:
    """A dataset object of `name` with this config, used only for its `score_answer`."""
    rg = import_reasoning_gym()
    return rg.create_dataset(name, size=1, seed=0, **json.loads(config_json))


def score_completion(completion: Any, name: str, config_json: str, entry: dict) -> float:
    answer = extract_tagged_answer(completion_text(completion))
    if answer is None:
        return 0.0
    return float(scorer(name, config_json).score_answer(answer, entry=entry))


def reasoning_gym_reward(
    prompts: list[Any],
    completions: list[Any],
    rg_dataset: list[str] | None = None,
    rg_config: list[str] | None = None,
    rg_entry: list[dict] | None = None,
    **_: Any,
) -> list[float | None]:
    """reasoning-gym's score of the last <answer> tag; None for rows of other tasks."""
    if rg_dataset is None or rg_config is None or rg_entry is None:
        return [None] * len(completions)
    return [
        None if name is None else score_completion(c, name, cfg, entry)
        for c, name, cfg, entry in zip(completions, rg_dataset, rg_config, rg_entry, strict=True)
    ]
