"""Moving policy weights from the learner to generator workers, stamped with a version.

Only trainable tensors travel (all of them for full fine-tuning, the adapters with LoRA):
the frozen rest is identical in every process because all load it from the same path.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

import torch


def trainable_state(
    model: torch.nn.Module, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """A detached CPU copy of the trainable parameters (what a weight sync sends), in `dtype`
    (the generation dtype: a bf16 sampler needs no more) or their own."""
    return {
        n: p.detach().to("cpu", dtype=dtype, copy=True)
        for n, p in model.named_parameters()
        if p.requires_grad
    }


@torch.no_grad()
def load_trainable(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy synced tensors into `model`; a name mismatch is an error, never a silent skip."""
    params = dict(model.named_parameters())
    missing = [n for n in state if n not in params]
    if missing:
        raise KeyError(f"weight sync: the worker's model has no parameter {missing[0]!r}")
    for n, t in state.items():
        if params[n].shape != t.shape:
            raise ValueError(
                f"weight sync: {n!r} has shape {tuple(t.shape)} from the learner but "
                f"{tuple(params[n].shape)} in the worker's model"
            )
        params[n].copy_(t)


class SharedWeights:
    """One shared-memory copy of the trainable weights plus a version number (async-local).

    A sequence lock, not a mutex: the learner makes `seq` odd while it writes, and a worker
    copies, then retries if `seq` moved. A worker killed mid-copy therefore cannot leave
    anything locked. Passing this object to a spawned process shares the memory.
    """

    def __init__(self, model: torch.nn.Module, ctx: Any | None = None) -> None:
        ctx = ctx or mp.get_context("spawn")
        self.tensors = {n: t.share_memory_() for n, t in trainable_state(model).items()}
        self.version = ctx.Value("q", -1, lock=False)
        self.seq = ctx.Value("q", 0, lock=False)

    def publish(self, model: torch.nn.Module, version: int) -> None:
        params = dict(model.named_parameters())
        self.seq.value += 1  # odd: writing
        with torch.no_grad():
            for n, t in self.tensors.items():
                t.copy_(params[n].detach())
        self.version.value = version
        self.seq.value += 1  # even: consistent

    def pull(self, model: torch.nn.Module, have: int) -> int:
        """Load the published weights if newer than `have`; returns the version now held."""
        return self.read(have, lambda tensors, _: load_trainable(model, tensors))

    def read(self, have: int, load: Callable[[dict[str, torch.Tensor], int], None]) -> int:
        """`load(tensors, version)` with the published weights if newer than `have` (a model
        copies them; an engine reads them straight from shared memory); returns the version
        now held. A load that overlapped a write is done again."""
        while True:
            s1 = self.seq.value
            if s1 % 2:
                time.sleep(0.001)
                continue
            version = int(self.version.value)
            if version == have:
                return have
            load(self.tensors, version)
            if self.seq.value == s1:  # nothing was written meanwhile: a consistent copy
                return version
