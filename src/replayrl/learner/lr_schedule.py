"""Learning-rate schedules over a run's learner steps (`train.lr_scheduler`).

TRL's GRPOTrainer (through transformers' Trainer) decays the learning rate linearly to 0 over
`max_steps` by default, after an optional linear warm-up; the papers' presets keep it
constant. `lr_multiplier` is the factor applied to `train.lr` at a 0-based step index, with the
same shape as transformers' `get_linear_schedule_with_warmup`, `get_cosine_schedule_with_warmup`
(half a cosine) and `get_constant_schedule_with_warmup`, so a ported script gets the same
per-step learning rate. The learner drives a torch `LambdaLR` with it.
"""

from __future__ import annotations

import math
import warnings

import torch

SCHEDULES = ("constant", "linear", "cosine")


def warmup_steps(total: int, steps: int, ratio: float) -> int:
    """Warm-up length: `steps` when set, else ceil(ratio * total) (transformers' rounding)."""
    return steps if steps > 0 else math.ceil(ratio * total)


def lr_multiplier(kind: str, index: int, total: int, warmup: int) -> float:
    """Factor on the base learning rate for the update at 0-based step `index` of `total`.

    warm-up (index < warmup): index / warmup (0 at the first step, as in transformers);
    then constant: 1; linear: (total - index) / (total - warmup), floored at 0;
    cosine: 0.5 * (1 + cos(pi * progress)), progress = (index - warmup) / (total - warmup).
    E.g. linear, total 2, no warm-up: 1.0 then 0.5 (TRL's 1e-5 -> 5e-6 at step 2 of 2).
    """
    if kind not in SCHEDULES:
        raise ValueError(f"train.lr_scheduler: unknown schedule {kind!r} (known: {SCHEDULES})")
    index = max(index, 0)
    if index < warmup:
        return index / max(1, warmup)
    if kind == "constant":
        return 1.0
    span = max(1, total - warmup)
    if kind == "linear":
        return max(0.0, (total - index) / span)
    progress = (index - warmup) / span
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


class StepSchedule:
    """A torch LambdaLR over an optimizer, set from the (1-based) learner step before each
    update, so resuming from a checkpoint needs no scheduler state of its own."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, kind: str, total: int, warmup: int
    ) -> None:
        self.kind, self.total, self.warmup = kind, total, warmup
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda i: lr_multiplier(kind, i, total, warmup)
        )

    def set_step(self, step: int) -> None:
        """The learning rate of learner step `step` (1-based): multiplier at index step - 1."""
        self.scheduler.last_epoch = max(step - 1, 0) - 1
        with warnings.catch_warnings():  # the step is set, not counted: order does not matter
            warnings.filterwarnings("ignore", "Detected call of `lr_scheduler.step", UserWarning)
            self.scheduler.step()
