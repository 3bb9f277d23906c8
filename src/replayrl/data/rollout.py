"""The Rollout record: one prompt + one sampled completion, travelling the whole loop.

Everything the learner needs is fixed when the completion is generated (arXiv 2604.08706:
behaviour log-probs and the group-normalised advantage are never recomputed for GRPO).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(eq=False)
class Rollout:
    prompt_ids: torch.Tensor  # (P,) int64, the prompt tokens exactly as generated from
    completion_ids: torch.Tensor  # (C,) int64, sampled tokens (incl. EOS if emitted)
    behaviour_logprobs: torch.Tensor  # (C,) float32, log pi_old(token) under the sampler used
    reward: float  # combined (weighted) reward
    # the estimator's advantage, fixed at generation (grpo, rloo); 0 for one the learner
    # computes per step with its critic (gae)
    advantage: float
    correct: bool  # task correctness (used by positive-bias sampling and accuracy)
    group_id: int  # rollouts from the same prompt in the same step share it
    policy_version: int  # version of the weights that generated it
    step: int  # learner step at creation
    completion_text: str = ""
    prompt_text: str = ""
    truncated: bool = False  # hit max_new_tokens without EOS
    times_sampled: int = 0  # how many training batches it has been in
    group_mean_reward: float = 0.0  # V, the group's mean reward (AsymRE's baseline)
    extras: dict[str, Any] = field(default_factory=dict)  # per-rollout reward details etc.

    @property
    def num_completion_tokens(self) -> int:
        return int(self.completion_ids.numel())

    def nbytes(self) -> int:
        """Bytes held by this rollout's tensors (for memory accounting)."""
        return sum(
            t.numel() * t.element_size()
            for t in (self.prompt_ids, self.completion_ids, self.behaviour_logprobs)
        )
