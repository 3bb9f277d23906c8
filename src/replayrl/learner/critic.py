"""PPO's value model: the policy's transformer backbone with a scalar head."""

from __future__ import annotations

import torch
from transformers import AutoModel


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

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """V(state before each target token), laid out like `mask`."""
        hidden = self.backbone(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        return self.head(hidden[:, :-1].float()).squeeze(-1)
