"""The Generator interface shared by the HF backend (and later vLLM / remote workers)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8
    greedy: bool = False
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off; over the prompt's and completion's tokens


@dataclass
class Sample:
    """One completion of one prompt."""

    prompt_index: int  # index into the prompts passed to generate()
    prompt_ids: torch.Tensor  # (P,) int64, no padding
    completion_ids: torch.Tensor  # (C,) int64, up to and including the first EOS
    logprobs: torch.Tensor  # (C,) float32: log softmax(logits / temperature) of each token
    text: str  # decoded completion without special tokens
    truncated: bool  # no EOS within max_new_tokens
    policy_version: int


class Generator(Protocol):
    policy_version: int

    def generate(
        self, prompts: list[str], num_samples: int, params: SamplingParams
    ) -> list[Sample]:
        """`num_samples` completions per prompt, grouped prompt by prompt."""
        ...


class WeightOwner(Generator, Protocol):
    """A backend whose spec says it owns weights (`BackendSpec.owns_weights`: vLLM): it holds
    its own copy of the policy, so every new policy version is pushed into it."""

    def load_weights(self, params: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """The policy's parameters of `version` (plain model names)."""
        ...
