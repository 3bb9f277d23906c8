"""Data-parallel learners: gradients averaged with torch.distributed (gloo on CPU, nccl on GPU).

Each learner computes gradients on its own B / T rollouts (sampled from its own buffer
shard), then all ranks average them before clipping, so every rank takes the same optimizer
step and the replicas stay identical.
"""

from __future__ import annotations

import hashlib
import socket

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def init_group(rank: int, world: int, address: str, port: int, timeout_s: float = 600) -> None:
    from datetime import timedelta

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(
        backend,
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )


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


def weights_digest(model: torch.nn.Module) -> str:
    """A hash of the trainable weights: equal digests = replicas in sync."""
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        if p.requires_grad:
            h.update(name.encode())
            h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]
