"""Rollouts -> one padded batch on the learner's device, and its micro-batches.

A step collates its rollouts once (`collate`) into a `TrainBatch`; every frozen per-token
field (pi_old, reference and previous policies, critic values) is added to that batch, and
each mini- and micro-batch is a row selection of it (`TrainBatch.take`), trimmed to its own
longest row, so no tensor crosses between host and device after the first copy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from replayrl.data.rollout_record import Rollout


@dataclass(frozen=True)
class TokenRows:
    """Right-padded [prompt + completion] rows: what a forward pass reads.

    `mask` marks the completion tokens among the targets (`input_ids[:, 1:]`): 1 where the
    logits at position t - 1 predict a completion token at t."""

    input_ids: torch.Tensor  # [rows, width] token ids, padded on the right
    attention_mask: torch.Tensor  # [rows, width] 1 on real tokens
    mask: torch.Tensor  # [rows, width - 1] 1 on completion targets


@dataclass(frozen=True)
class TrainBatch(TokenRows):
    """A step's padded batch: the rollouts' rows, per-rollout values ([rows]) and per-token
    fields laid out like `mask` ([rows, width - 1], zero off the completion tokens).

    The fields after `old_logprobs` are added by the learner's passes (`replace`): None until
    a pass that needs them sets them. Frozen: a pass that adds a field makes a new batch;
    the learner's pi_old refresh writes rows of `old_logprobs` in place."""

    advantages: torch.Tensor  # [rows] the rollout's advantage (stored at generation)
    rewards: torch.Tensor  # [rows]
    baselines: torch.Tensor  # [rows] the group's mean reward
    truncated: torch.Tensor  # [rows] 1 where the completion hit max_new_tokens without EOS
    old_logprobs: torch.Tensor  # log pi_old: the sampler's, or the learner's refreshed values
    sampler_logprobs: torch.Tensor | None = None  # the sampler's (truncated IS weighs them)
    fuse: torch.Tensor | None = None  # 1 on rows whose log pi_old the first update sets
    anchor_logprobs: torch.Tensor | None = None  # log pi_k: Mix-PPG's clip centre
    base_logprobs: torch.Tensor | None = None  # log pi_base (KL)
    prev_logprobs: torch.Tensor | None = None  # log pi_{k-1} (KL-Convex)
    stale: torch.Tensor | None = None  # 1 on the tokens of rollouts of older weights
    tis_weights: torch.Tensor | None = None  # truncated importance-sampling weights
    token_advantages: torch.Tensor | None = None  # a critic's per-token advantages (GAE)
    returns: torch.Tensor | None = None  # the critic's targets
    old_values: torch.Tensor | None = None  # the critic's values before the step

    @property
    def rows(self) -> int:
        return int(self.mask.shape[0])

    def tensors(self) -> dict[str, torch.Tensor]:
        """The fields that are set, by name (for row selection and device moves)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = v
        return out

    def replace(self, **changes: torch.Tensor | None) -> TrainBatch:
        """This batch with `changes` (a pass's added fields, or None to drop one)."""
        # callers set None only on the optional fields (mypy cannot tell which ones a call names)
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def take(self, rows: Sequence[int], width: int) -> TrainBatch:
        """Rows `rows`, trimmed to `width` tokens (their longest row): the same tensors
        `collate` builds from those rollouts alone, selected on the batch's device."""
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.mask.device)
        out = {}
        for k, v in self.tensors().items():
            v = v.index_select(0, index)
            if v.dim() == 2:
                v = v[:, : width if k in FULL_WIDTH else width - 1].contiguous()
            out[k] = v
        return dataclasses.replace(self, **out)

    def to(self, device: torch.device | str) -> TrainBatch:
        return dataclasses.replace(self, **{k: v.to(device) for k, v in self.tensors().items()})

    def loss_inputs(self) -> dict[str, torch.Tensor | None]:
        """The tensors a registered policy loss may declare (`losses.LOSS_INPUTS`) and the
        KL term's references, under the names they are declared by: the one place where a
        loss's declared inputs meet the batch's fields."""
        return {
            "anchor_logprobs": self.anchor_logprobs,
            "base_logprobs": self.base_logprobs,
            "prev_logprobs": self.prev_logprobs,
            "rewards": self.rewards,
            "baselines": self.baselines,
            "stale": self.stale,
        }


# the [rows, width] tensors; the other token fields are [rows, width - 1] (targets' layout)
FULL_WIDTH = ("input_ids", "attention_mask")


def collate(
    rollouts: Sequence[Rollout],
    pad_id: int,
    old_logprobs: Sequence[torch.Tensor] | None = None,
    sampler_logprobs: Sequence[torch.Tensor] | None = None,
    device: torch.device | str | None = None,
) -> TrainBatch:
    """Right-padded [prompt + completion] rows; `mask` marks completion tokens of `targets`.

    Per-token fields (one 1-D tensor per rollout over its completion tokens) are laid out
    like `mask`: `old_logprobs` (default: the rollouts' behaviour log-probs) and, if given,
    `sampler_logprobs`. `device`: where the batch goes (the model's device); None keeps it
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
    fields = _TokenFields(n, width, tgt_pos, dev)
    if old_logprobs is None:
        old_logprobs = [r.behaviour_logprobs for r in rollouts]
    old = fields.place("old_logprobs", old_logprobs)
    sampler = None
    if sampler_logprobs is not None:
        sampler = fields.place("sampler_logprobs", sampler_logprobs)

    def per_rollout(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32).to(dev)

    return TrainBatch(
        input_ids=ids.view(n, width).to(dev),
        attention_mask=attn.view(n, width).to(dev),
        mask=mask.view(n, width - 1).to(dev),
        advantages=per_rollout([r.advantage for r in rollouts]),
        rewards=per_rollout([r.reward for r in rollouts]),
        baselines=per_rollout([r.group_mean_reward for r in rollouts]),
        # 1 where the completion hit max_new_tokens without EOS (mask_truncated_completions)
        truncated=per_rollout([float(r.truncated) for r in rollouts]),
        old_logprobs=old,
        sampler_logprobs=sampler,
    )


class _TokenFields:
    """Lays per-rollout 1-D values over the completion targets of a [n, width - 1] batch."""

    def __init__(self, n: int, width: int, tgt_pos: torch.Tensor, dev: torch.device) -> None:
        self.n, self.width, self.tgt_pos, self.dev = n, width, tgt_pos, dev
        self.positions: dict[torch.device, torch.Tensor] = {}  # the targets', per device

    def place(self, name: str, values: Sequence[torch.Tensor]) -> torch.Tensor:
        n, dev = self.n, self.dev
        if len(values) != n:
            raise ValueError(f"token field {name!r} has {len(values)} rows for {n} rollouts")
        flat = torch.cat([v.reshape(-1) for v in values]).to(dev, torch.float32)
        if flat.numel() != self.tgt_pos.numel():
            raise ValueError(
                f"token field {name!r} has {flat.numel()} values for {self.tgt_pos.numel()} "
                "completion tokens"
            )
        if dev not in self.positions:
            self.positions[dev] = self.tgt_pos.to(dev)
        placed = torch.zeros(n * (self.width - 1), dtype=torch.float32, device=dev)
        placed[self.positions[dev]] = flat
        return placed.view(n, self.width - 1)


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
