"""Data-parallel learners: gradients averaged with torch.distributed (gloo for CPU parameters,
nccl for CUDA ones).

Each learner computes gradients on its own B / T rollouts (sampled from its own buffer
shard), then all ranks average them before clipping, so every rank takes the same optimizer
step and the replicas stay identical.
"""

from __future__ import annotations

import hashlib
import socket

import torch
import torch.distributed as dist

from replayrl.learner.context import Ranks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def process_group_backend(device: torch.device | str) -> str:
    """nccl where the parameters (and so the gradients all-reduced) are CUDA tensors, gloo for
    CPU ones: whether the machine has a GPU says nothing about where a learner trains."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


# where sum_over_ranks puts its count: the device the group's backend reduces on
_group_device = torch.device("cpu")


def init_group(
    rank: int,
    world: int,
    address: str,
    port: int,
    timeout_s: float = 600,
    device: torch.device | str = "cpu",
) -> None:
    """Join the learners' process group; `device`: where this rank's parameters live."""
    from datetime import timedelta

    global _group_device
    _group_device = torch.device(device)
    backend = process_group_backend(device)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )


def leave_group() -> None:
    """Leave the default group once every rank is done with it: a rank that shuts its gloo
    pairs down while a peer is still finishing a collective can abort either process at exit
    ("terminate called without an active exception") after all its work succeeded."""
    dist.barrier()
    dist.destroy_process_group()


def average_gradients(params: list[torch.nn.Parameter]) -> None:
    """Mean of every rank's gradient (a missing gradient counts as zeros), in one bucket."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= dist.get_world_size()
    offset = 0
    for p in params:
        n = p.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
        offset += n


def sum_over_ranks(count: float) -> float:
    """A number summed over every rank (the loss normaliser's token / sequence count)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return count
    t = torch.tensor([count], dtype=torch.float64, device=_group_device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def max_over_ranks(n: int) -> int:
    """The largest `n` of all ranks (sharded learners: every rank runs that many
    micro-batches, its own then idle ones, since each sharded pass is a collective)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return n
    t = torch.tensor([n], dtype=torch.int64, device=_group_device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def data_parallel_ranks(world: int) -> Ranks:
    """How a data-parallel rank works with the others (a learner `join`s them): gradients
    averaged over ranks, and the loss normalised by the count over all ranks (token_mean =
    the mean over every rank's tokens, not an average of per-rank means; see
    algorithms.aggregation.batch_normaliser)."""
    return Ranks(world_size=world, grad_hook=average_gradients, count_reducer=sum_over_ranks)


def weights_digest(model: torch.nn.Module) -> str:
    """A hash of the trainable weights: equal digests = replicas in sync. Hashes the raw bytes,
    since numpy has no bfloat16 (`.numpy()` on a bf16 tensor raises)."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        if p.requires_grad:
            h.update(name.encode())
            h.update(p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
