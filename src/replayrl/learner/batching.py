"""Rollouts -> one padded batch on the learner's device, and its micro-batches.

A step collates its rollouts once (`collate`); every frozen per-token field (pi_old,
reference and previous policies, critic values) is added to that batch, and each mini- and
micro-batch is a row selection of it (`take`), trimmed to its own longest row, so no tensor
crosses between host and device after the first copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from replayrl.data.rollout import Rollout

TokenFields = Mapping[str, Sequence[torch.Tensor]]
# the [rows, width] tensors; the other token fields are [rows, width - 1] (targets' layout)
FULL_WIDTH = ("input_ids", "attention_mask")


def collate(
    rollouts: Sequence[Rollout],
    pad_id: int,
    token_fields: TokenFields | None = None,
    device: torch.device | str | None = None,
) -> dict[str, torch.Tensor]:
    """Right-padded [prompt + completion] rows; `mask` marks completion tokens of `targets`.

    Per-token fields (behaviour log-probs, and any `token_fields`: one 1-D tensor per rollout
    over its completion tokens; an `old_logprobs` entry replaces the behaviour log-probs) are
    laid out like `mask`. `device`: where the batch goes (the model's device); None keeps it
    on the CPU. The rollouts' tensors are copied to it once; fields already there stay there.
    """
    n = len(rollouts)
    prompt = [r.prompt_ids.numel() for r in rollouts]
    comp = [r.completion_ids.numel() for r in rollouts]
    width = max(p + c for p, c in zip(prompt, comp, strict=True))
    dev = torch.device(device) if device is not None else torch.device("cpu")
    # flat positions of every token in the [n, width] ids and of every completion target in
    # the [n, width - 1] fields (the token at position t is predicted by logits at t-1)
    tok_pos = torch.cat(
        [
            torch.arange(i * width, i * width + p + c)
            for i, (p, c) in enumerate(zip(prompt, comp, strict=True))
        ]
    )
    tgt_pos = torch.cat(
        [
            torch.arange(p - 1, p - 1 + c) + i * (width - 1)
            for i, (p, c) in enumerate(zip(prompt, comp, strict=True))
        ]
    )
    flat_ids = torch.cat([t for r in rollouts for t in (r.prompt_ids, r.completion_ids)])
    ids = torch.full((n * width,), pad_id, dtype=torch.long)
    ids[tok_pos] = flat_ids.long()
    attn = torch.zeros(n * width, dtype=torch.long)
    attn[tok_pos] = 1
    mask = torch.zeros(n * (width - 1), dtype=torch.float32)
    mask[tgt_pos] = 1
    host = {
        "input_ids": ids.view(n, width),
        "attention_mask": attn.view(n, width),
        "mask": mask.view(n, width - 1),
        "advantages": torch.tensor([r.advantage for r in rollouts], dtype=torch.float32),
        "rewards": torch.tensor([r.reward for r in rollouts], dtype=torch.float32),
        "baselines": torch.tensor([r.group_mean_reward for r in rollouts], dtype=torch.float32),
        # 1 where the completion hit max_new_tokens without EOS (mask_truncated_completions)
        "truncated": torch.tensor([float(r.truncated) for r in rollouts], dtype=torch.float32),
    }
    batch = {k: v.to(dev) for k, v in host.items()}
    fields = {"old_logprobs": [r.behaviour_logprobs for r in rollouts], **(token_fields or {})}
    positions = {}  # the targets' positions, on each device a field lives on
    for k, values in fields.items():
        if len(values) != n:
            raise ValueError(f"token field {k!r} has {len(values)} rows for {n} rollouts")
        flat = torch.cat([v.reshape(-1) for v in values]).to(dev, torch.float32)
        if flat.numel() != tgt_pos.numel():
            raise ValueError(
                f"token field {k!r} has {flat.numel()} values for {tgt_pos.numel()} "
                "completion tokens"
            )
        if dev not in positions:
            positions[dev] = tgt_pos.to(dev)
        placed = torch.zeros(n * (width - 1), dtype=torch.float32, device=dev)
        placed[positions[dev]] = flat
        batch[k] = placed.view(n, width - 1)
    return batch


def take(
    batch: dict[str, torch.Tensor], rows: Sequence[int], width: int
) -> dict[str, torch.Tensor]:
    """Rows `rows` of a collated batch, trimmed to `width` tokens (their longest row): the
    same tensors `collate` builds from those rollouts alone, selected on the batch's device."""
    index = torch.as_tensor(list(rows), dtype=torch.long, device=batch["mask"].device)
    out = {}
    for k, v in batch.items():
        v = v.index_select(0, index)
        if v.dim() == 2:
            v = v[:, : width if k in FULL_WIDTH else width - 1].contiguous()
        out[k] = v
    return out


def put_rows(
    target: torch.Tensor, rows: Sequence[int], values: torch.Tensor, mask: torch.Tensor
) -> None:
    """Write a micro-batch's per-token `values` ([len(rows), w]) into `target`'s rows
    `rows` at the masked (completion) positions; the rest of `target` keeps its zeros."""
    index = torch.as_tensor(list(rows), dtype=torch.long, device=target.device)
    w = values.shape[1]
    block = torch.where(mask.bool(), values.detach().to(target.dtype), 0.0)
    target[index, :w] = block


def unpad(tokens: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Per-row 1-D tensors of the masked (completion) positions."""
    return [row[m.bool()].detach().clone() for row, m in zip(tokens, mask, strict=True)]


def micro_batches(n: int, size: int) -> list[slice]:
    """Consecutive slices of at most `size` items covering range(n)."""
    return [slice(start, start + size) for start in range(0, n, size)]


def token_micro_batches(lengths: Sequence[int], max_tokens: int, max_rows: int) -> list[slice]:
    """Consecutive slices of `lengths` (rows' prompt + completion tokens) whose padded size,
    rows x their longest row, stays within `max_tokens`, with at most `max_rows` rows each.

    Dynamic batch size as verl's (`train.max_tokens_per_micro_batch`): a micro-batch of short
    completions holds more rows than one of long ones, so the learner's memory is bounded by
    tokens, not rows. verl balances unpadded token counts over a computed number of
    partitions; here rows are padded, so the cost is the padded size the forward's tensors
    hold, and slices stay consecutive, so rollouts `shared_prompt_order` put next to each
    other (one prompt, similar lengths) stay together. A row longer than the budget alone
    cannot fit: an error, not a silent overrun.
    """
    out: list[slice] = []
    start, longest = 0, 0
    for i, n in enumerate(lengths):
        if n > max_tokens:
            raise ValueError(
                f"a rollout of {n} tokens (prompt + completion) does not fit "
                f"train.max_tokens_per_micro_batch={max_tokens}"
            )
        rows = i - start + 1
        if rows > max_rows or rows * max(longest, n) > max_tokens:
            out.append(slice(start, i))
            start, longest = i, 0
        longest = max(longest, n)
    if start < len(lengths):
        out.append(slice(start, len(lengths)))
    return out


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
