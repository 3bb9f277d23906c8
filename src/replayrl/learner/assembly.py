"""The learner's batch assembly: a step's rollouts collated once on the learner's device, cut
into micro-batches of rollouts that share prompts, and no-grad passes run over them.

Micro-batches group rollouts of the same prompt (the lean forward runs a shared prompt once),
`train.micro_batch_size` rows each or packed by `train.max_tokens_per_micro_batch`. Sharded
ranks run as many micro-batches as the rank with the most (`idle_micro`): each pass is a
collective.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from replayrl.data.rollout_record import Rollout
from replayrl.learner.batching import (
    TrainBatch,
    collate,
    micro_batches,
    put_rows,
    shared_prompt_order,
    token_micro_batches,
    unpad,
)
from replayrl.learner.context import LearnerContext
from replayrl.learner.pi_old import PiOld


def micro_batch(b: TrainBatch, part: Sequence[int], lengths: Sequence[int]) -> TrainBatch:
    """Rows `part` of the step's batch, trimmed to their longest row."""
    return b.take(part, max(lengths[i] for i in part))


class Assembly:
    """Collates a step's rollouts (log pi_old: the learner's refreshed values where it has
    them; with truncated IS also the sampler's) and runs per-micro-batch passes over them."""

    def __init__(self, ctx: LearnerContext, pad_id: int, pi_old: PiOld, with_sampler: bool):
        self.ctx, self.pad_id, self.pi_old = ctx, pad_id, pi_old
        self.with_sampler = with_sampler  # truncated IS weighs pi_old against the sampler

    def collate(self, rollouts: Sequence[Rollout]) -> tuple[TrainBatch, list[int]]:
        """The padded batch of `rollouts` on the learner's device, and each row's length."""
        old = [self.pi_old.of(r) for r in rollouts]
        sampler = [self.pi_old.sampler(r) for r in rollouts] if self.with_sampler else None
        b = collate(rollouts, self.pad_id, old, sampler, device=self.ctx.device)
        lengths = [r.prompt_ids.numel() + r.completion_ids.numel() for r in rollouts]
        return b, lengths

    @staticmethod
    def shared_rows(rollouts: Sequence[Rollout], rows: Sequence[int]) -> list[int]:
        """`rows` of `rollouts` reordered so that rows of one prompt are adjacent."""
        return [rows[j] for j in shared_prompt_order([rollouts[i] for i in rows])]

    def micro(self, rows: Sequence[int], lengths: Sequence[int]) -> list[list[int]]:
        """`rows` (in order) cut into micro-batches: `train.micro_batch_size` rows each, or
        packed by `train.max_tokens_per_micro_batch` with that row cap."""
        t = self.ctx.cfg.train
        if t.max_tokens_per_micro_batch is None:
            slices = micro_batches(len(rows), t.micro_batch_size)
        else:
            slices = token_micro_batches(
                [lengths[i] for i in rows], t.max_tokens_per_micro_batch, t.micro_batch_size
            )
        return [list(rows[sl]) for sl in slices]

    def idle_micro(self, parts: Sequence[Sequence[int]]) -> int:
        """How many idle micro-batches this rank runs after its own `parts` (sharded ranks:
        as many as the rank with the most has more; 0 otherwise). An idle one repeats the
        last part and its result is dropped: the same collectives, nothing learnt."""
        sync = self.ctx.ranks.micro_count_sync
        if sync is None:
            return 0
        extra = sync(len(parts)) - len(parts)
        if extra and not parts:
            raise ValueError("a sharded learner rank has no rollouts to run its passes on")
        return extra

    def no_grad(
        self,
        fn: Callable[[TrainBatch], torch.Tensor],
        b: TrainBatch,
        lengths: Sequence[int],
        rows: Sequence[int],
    ) -> torch.Tensor:
        """`fn`'s per-token values of `rows`, run per micro-batch without grad, laid out like
        `b.mask` (zeros off the completion tokens and on other rows)."""
        out = torch.zeros_like(b.mask)
        parts = self.micro(rows, lengths)
        idle = self.idle_micro(parts)  # agreed before any pass: each pass is a collective
        with torch.no_grad():
            for part in parts:
                mb = micro_batch(b, part, lengths)
                put_rows(out, part, fn(mb), mb.mask)
            for _ in range(idle):  # the other ranks' extra passes
                fn(micro_batch(b, parts[-1], lengths))
        return out

    def logprobs_in(
        self, model: object, b: TrainBatch, lengths: Sequence[int], rows: Sequence[int]
    ) -> torch.Tensor:
        """log `model`(token) of `rows`, in micro-batches of rollouts sharing prompts (the lean
        forward runs each prompt once); `rows` must already be in `shared_prompt_order`."""
        return self.no_grad(lambda mb: self.ctx.logprobs(model, mb)[0], b, lengths, rows)

    def per_rollout(self, model: object, rollouts: Sequence[Rollout]) -> list[torch.Tensor]:
        """Per-token log-probs of each completion under `model` (no gradient)."""
        if not rollouts:
            return []
        b, lengths = self.collate(rollouts)
        rows = self.shared_rows(rollouts, range(len(rollouts)))
        return unpad(self.logprobs_in(model, b, lengths, rows), b.mask)

    def mean_entropies(self, model: object, rollouts: Sequence[Rollout]) -> list[float]:
        """Per rollout: `model`'s mean token entropy over its completion, no grad."""
        if not rollouts:
            return []
        b, lengths = self.collate(rollouts)
        ent = self.no_grad(
            lambda mb: self.ctx.logprobs(model, mb)[1], b, lengths, range(len(rollouts))
        )
        return [float(e.mean()) if e.numel() else 0.0 for e in unpad(ent, b.mask)]
