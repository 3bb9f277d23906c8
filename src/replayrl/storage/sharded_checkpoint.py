"""Sharded learners' checkpoints with `torch.distributed.checkpoint` (DCP): each rank writes
its own shards of the policy and its AdamW state, and a load reshards them to whatever
number of ranks reads them (the same, another, or one unsharded learner).

Layout of `folder`: DCP's files (`.metadata` and one `__<rank>_0.distcp` per rank), plus
`rng/rank_<r>.{json,safetensors}`, each rank's random generators (Python, numpy, torch),
so that a resume at the same number of ranks draws what the uninterrupted run would have.
Nothing is unpickled on load: DCP's tensors are read by its own reader and the RNG states
are safe_state files. `save_sharded` and `load_sharded` are collectives: every rank calls them.

In a run's checkpoint (storage/checkpoint.py) this folder is `step_NNNNNN/learner_shards/`
(`SHARDED_DIR`), written into the checkpoint's temp folder before its manifest, so the
manifest lists and hashes every rank's files and the rename publishes them all at once.

The Hugging Face folder of a checkpoint comes from `gathered_state`: one parameter at a
time all-gathered and moved to rank 0's CPU, so no device ever holds the whole model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from replayrl.storage.checkpoint import rng_state, set_rng_state
from replayrl.storage.safe_state import load_state_files, save_state

SHARDED_DIR = "learner_shards"  # a checkpoint's sharded learner state (policy, AdamW, critic)


def is_sharded_checkpoint(ckpt: Path) -> bool:
    """Whether checkpoint `ckpt` keeps its learner's tensors as DCP shards (`SHARDED_DIR`)
    instead of whole in its state file."""
    return (ckpt / SHARDED_DIR / ".metadata").is_file()


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


# PPO's value model and its optimizer, sharded like the policy
Critic = tuple[torch.nn.Module, Any]


def _state(
    model: torch.nn.Module,
    optimizer: Any,
    reference: torch.nn.Module | None,
    critic: Critic | None,
) -> dict[str, Any]:
    state = {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optimizer),
    }
    if reference is not None:  # kl.beta > 0's frozen reference, sharded like the policy
        state["reference"] = get_model_state_dict(reference)
    if critic is not None:
        state["critic"] = get_model_state_dict(critic[0])
        state["critic_optim"] = get_optimizer_state_dict(critic[0], critic[1])
    return state


def save_sharded(
    folder: Path,
    model: torch.nn.Module,
    optimizer: Any,
    reference: torch.nn.Module | None = None,
    critic: Critic | None = None,
) -> None:
    """Each rank writes its shards of `model`, `optimizer`'s state, the frozen `reference`
    and the `critic` with its optimizer (if any), and its RNG states."""
    folder.mkdir(parents=True, exist_ok=True)
    state = _state(model, optimizer, reference, critic)
    dcp.save(state, checkpoint_id=str(folder))
    (folder / "rng").mkdir(exist_ok=True)
    save_state(folder / "rng", f"rank_{_rank()}", rng_state())
    if dist.is_initialized():
        dist.barrier()  # the folder is whole once every rank has written


def load_sharded(
    folder: Path,
    model: torch.nn.Module,
    optimizer: Any,
    restore_rng: bool = True,
    reference: torch.nn.Module | None = None,
    critic: Critic | None = None,
) -> bool:
    """Load a `save_sharded` folder into `model`, `optimizer`, `reference` and `critic` as
    they are now (sharded over any number of ranks, or whole); returns whether this rank's
    RNG states were restored (only where the saving run had this rank: at another rank count
    they cannot match). A folder written before critics were sharded has none: the critic is
    then left as it is (its checkpoint's state file held it whole)."""
    if critic is not None and not _holds(folder, "critic"):
        critic = None
    state = _state(model, optimizer, reference, critic)
    dcp.load(state, checkpoint_id=str(folder))
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])
    if reference is not None:
        set_model_state_dict(reference, state["reference"])
    if critic is not None:
        set_model_state_dict(critic[0], state["critic"])
        set_optimizer_state_dict(critic[0], critic[1], state["critic_optim"])
    saved = folder / "rng" / f"rank_{_rank()}.json"
    if restore_rng and saved.exists():
        set_rng_state(load_state_files(folder / "rng", f"rank_{_rank()}"))
        return True
    return False


def _holds(folder: Path, part: str) -> bool:
    """Whether a `save_sharded` folder has entries under `part` (its DCP metadata's keys)."""
    keys = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    return any(k == part or k.startswith(f"{part}.") for k in keys)


@torch.no_grad()
def gathered_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict on rank 0's CPU (other ranks: empty), gathered one tensor at a
    time: each all-gather's result is moved to the CPU before the next one starts, so a
    device holds one full parameter at most beside its shards."""
    out: dict[str, torch.Tensor] = {}
    root = _rank() == 0
    for name, t in model.state_dict().items():
        full = t.full_tensor() if isinstance(t, DTensor) else t
        if root:
            out[name] = full.detach().to("cpu", copy=True)
        del full
    return out
