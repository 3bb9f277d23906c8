"""Held-out evaluation: greedy pass@1 and, optionally, pass@k at a sampling temperature."""

from __future__ import annotations

from collections.abc import Callable
from math import comb
from typing import Any

from replayrl.rollout.generation import Generator, SamplingParams
from replayrl.rollout.tasks import Task
from replayrl.rollout.tasks.base import Row


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k = 1 - C(n-c, k) / C(n, k), n samples with c correct (Chen et al. 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def evaluate(
    generator: Generator,
    task: Task,
    rows: list[Row],
    max_new_tokens: int,
    pass_k: int = 0,
    temperature: float = 1.0,
    render: Callable[[Any], str] | None = None,
) -> dict[str, float]:
    """Accuracy of greedy decoding (pass@1) and pass@k with k samples per prompt.

    `render` turns a row's prompt into the text generated from (chat template, see
    `replayrl.rollout.prompts`); None sends the prompt as it is.
    """
    prompts = [render(r["prompt"]) if render else r["prompt"] for r in rows]
    greedy = generator.generate(
        prompts, 1, SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
    )
    correct = [task.is_correct(s.text, rows[s.prompt_index]) for s in greedy]
    out = {
        "eval/accuracy": sum(correct) / len(rows),
        "eval/completion_length": sum(s.completion_ids.numel() for s in greedy) / len(greedy),
    }
    if pass_k > 1:
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
        samples = generator.generate(prompts, pass_k, params)
        hits = [0] * len(rows)
        for s in samples:
            hits[s.prompt_index] += task.is_correct(s.text, rows[s.prompt_index])
        out[f"eval/pass@{pass_k}"] = sum(pass_at_k(pass_k, c, pass_k) for c in hits) / len(rows)
    return out
