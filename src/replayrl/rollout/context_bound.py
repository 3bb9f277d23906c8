"""The longest prompt a run will generate from: what bounds a vLLM engine's context
(`vllm.max_model_len` unset), so it reserves KV memory for prompt + completion only, not the
model's whole context."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# generated tasks have no list of prompts: their length is bounded by construction, and this
# many draws (a private stream: the run's own draws are untouched) find the longest in practice;
# a longer prompt later is skipped and counted by the producer, never sent to the engine
SAMPLED_PROMPTS = 2048


def longest_prompt_tokens(
    task: Any,
    render: Callable[[Any], str],
    tokenizer: Any,
    max_positions: int | None,
    max_new_tokens: int,
    seed: int = 0,
) -> int:
    """Tokens of the longest rendered training or held-out prompt that fits the model's
    `max_positions` with `max_new_tokens` (every prompt of a task that lists its rows; a
    seeded sample of SAMPLED_PROMPTS for generated tasks)."""
    train_rows = getattr(task, "train_rows", None)
    if callable(train_rows):
        rows = list(train_rows())
    else:
        rows = task.sample_train(SAMPLED_PROMPTS, np.random.default_rng(seed))
    rows += list(task.eval_rows())
    longest = 1
    for row in rows:
        n = len(tokenizer(render(row["prompt"]), add_special_tokens=False)["input_ids"])
        if max_positions is None or n + max_new_tokens <= max_positions:
            longest = max(longest, n)
    return longest
