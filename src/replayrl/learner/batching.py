"""Rollouts -> padded tensors for the learner's forward passes (and back)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from replayrl.data.rollout import Rollout

TokenFields = dict[str, Sequence[torch.Tensor]]


def collate(
    rollouts: Sequence[Rollout],
    pad_id: int,
    token_fields: TokenFields | None = None,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """Right-padded [prompt + completion] rows; `mask` marks completion tokens of `targets`.

    Per-token fields (behaviour log-probs, and any `token_fields`: one 1-D tensor per rollout
    over its completion tokens) are laid out like `mask`. `device`: where the batch goes (the
    model's device); None keeps it on the CPU, where it is built.
    """
    lengths = [r.prompt_ids.numel() + r.completion_ids.numel() for r in rollouts]
    width = max(lengths)
    n = len(rollouts)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, width - 1), dtype=torch.float32)
    fields = {"old_logprobs": [r.behaviour_logprobs for r in rollouts], **(token_fields or {})}
    placed = {k: torch.zeros((n, width - 1), dtype=torch.float32) for k in fields}
    for i, r in enumerate(rollouts):
        p, c = r.prompt_ids.numel(), r.completion_ids.numel()
        ids[i, :p] = r.prompt_ids
        ids[i, p : p + c] = r.completion_ids
        attn[i, : p + c] = 1
        # the token at position t is predicted by logits at t-1
        mask[i, p - 1 : p - 1 + c] = 1
        for k, values in fields.items():
            # a field computed on the model's device (frozen log-probs) lands on the CPU here
            placed[k][i, p - 1 : p - 1 + c] = values[i].to(placed[k].device)
    batch = {
        "input_ids": ids,
        "attention_mask": attn,
        "mask": mask,
        **placed,
        "advantages": torch.tensor([r.advantage for r in rollouts], dtype=torch.float32),
        "rewards": torch.tensor([r.reward for r in rollouts], dtype=torch.float32),
        "baselines": torch.tensor([r.group_mean_reward for r in rollouts], dtype=torch.float32),
    }
    if device is None:
        return batch
    return {k: v.to(device) for k, v in batch.items()}


def unpad(tokens: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Per-row 1-D tensors of the masked (completion) positions."""
    return [row[m.bool()].detach().clone() for row, m in zip(tokens, mask, strict=True)]


def micro_batches(n: int, size: int) -> list[slice]:
    """Consecutive slices of at most `size` items covering range(n)."""
    return [slice(start, start + size) for start in range(0, n, size)]


def shared_prompt_order(rollouts: Sequence[Rollout]) -> list[int]:
    """A permutation of `rollouts` that puts rollouts of the same prompt next to each other
    (longest prompts first, longest completions first within a prompt), so that consecutive
    micro-batches share prompts (the lean forward runs a shared prompt once) and pad less.

    Regrouping the micro-batches of one optimizer step changes only the order in which
    per-micro-batch gradients are summed: the step is the same up to float rounding.
    """
    first: dict[tuple[int, ...], int] = {}
    keys = []
    for i, r in enumerate(rollouts):
        key = tuple(r.prompt_ids.tolist())
        first.setdefault(key, i)
        keys.append((-r.prompt_ids.numel(), first[key], -r.completion_ids.numel(), i))
    return [k[-1] for k in sorted(keys)]
