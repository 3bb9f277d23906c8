"""PPO's value model: the policy's transformer backbone with a scalar head."""

from __future__ import annotations

import torch
from transformers import AutoModel

from replayrl.learner.batching import TokenRows


def policy_frozen(step: int, warmup_steps: int, has_critic: bool) -> bool:
    """Whether update `step` (1-based) trains only the critic: the first `critic.warmup_steps`
    updates of a run with one. Every data-parallel rank asks this same question, since a rank
    that trains the policy makes an all-reduce the others do not (NCCL then hangs)."""
    return has_critic and step <= warmup_steps


class ValueModel(torch.nn.Module):
    """PPO critic: a transformer backbone (initialised from the policy) + a scalar head."""

    def __init__(self, backbone: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    @classmethod
    def from_pretrained(cls, path: str) -> ValueModel:
        backbone = AutoModel.from_pretrained(path, dtype=torch.float32)
        return cls(backbone, backbone.config.hidden_size)

    def forward(self, batch: TokenRows) -> torch.Tensor:
        """V(state before each target token), laid out like `mask`."""
        hidden = self.backbone(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask
        ).last_hidden_state
        return self.head(hidden[:, :-1].float()).squeeze(-1)
