"""Which GPU each process of a run uses: one per learner rank and one per generator worker
where the machine has enough, and none for a process that was given none."""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch


def hide_gpus_unless_given(gpu_ids: Sequence[int | str]) -> None:
    """In a Ray actor, before anything touches CUDA: an actor given no GPU (num_gpus=0) must
    see none (Ray leaves CUDA_VISIBLE_DEVICES alone then, so it would see every GPU and
    `train.device=auto` would put it on GPU 0 beside the processes that were given it).
    `gpu_ids`: ray.get_gpu_ids() of the actor."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_ids)


def generator_device(learner_device: torch.device | str, worker_id: int, gpu_count: int) -> str:
    """The device of async-local generator worker `worker_id` (a process on the learner's
    machine): the CPU when the learner trains there; else the GPUs other than the learner's,
    one per worker in turn; with a single GPU, the learner's (shared, as in TRL's colocate)."""
    learner = torch.device(learner_device)
    if learner.type != "cuda":
        return "cpu"
    own = learner.index or 0
    others = [i for i in range(gpu_count) if i != own]
    if not others:
        return f"cuda:{own}"
    return f"cuda:{others[worker_id % len(others)]}"
