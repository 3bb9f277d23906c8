"""Sharded learners (`train.sharding: fsdp`): the policy's parameters, gradients and AdamW
state split across the learner ranks with FSDP2 (`torch.distributed.fsdp.fully_shard`).

Each rank trains on its own B / T rollouts like the data-parallel learners (ddp.py): FSDP's
reduce-scatter averages the gradients, and the loss normaliser counts over every rank, so a
sharded step equals the unsharded step on the whole batch (tests/test_fsdp.py). Each decoder
layer is one shard group (all-gathered for its forward and backward, then freed); the
embeddings, final norm and output head form the root group.

The learner's forward goes through `model(...)` (full logits): FSDP gathers a group's weights
in that module's forward hook, which the lean forward and the chunked head, reading weights
directly, would skip. Whatever leaves the learner (the generators' weights, an evaluation's
model, a checkpoint's HF folder and optimizer state) is gathered once into full tensors
(`full_model`, `full_learner_state`). Every function here is a collective: every rank calls it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from replayrl.distributed.ddp import average_gradients, sum_over_ranks
from replayrl.learner.frozen import is_lora
from replayrl.learner.lr_schedule import StepSchedule, warmup_steps

_FULL = StateDictOptions(full_state_dict=True)


def _unsupported(learner: Any) -> str | None:
    if is_lora(learner.model):
        return "LoRA adapters"
    if learner.base_model is not None or learner.cfg.kl.beta > 0:
        return "the KL terms' frozen policies (kl.beta > 0)"
    return None


def shard_policy(model: torch.nn.Module) -> None:
    """FSDP2 over the ranks of the default process group: one group per decoder layer, the
    rest (embeddings, tied head, final norm) in the root group. In place."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(
            f"train.sharding=fsdp: {type(model).__name__} has no model.layers (decoder "
            "layers) to shard"
        )
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)


def _replicated_mean(params: list[torch.nn.Parameter]) -> None:
    """The data-parallel mean of the parameters FSDP does not reduce (the critic's); the
    policy's sharded gradients are already averaged by FSDP's reduce-scatter."""
    replicated = [p for p in params if not isinstance(p, DTensor)]
    if replicated:
        average_gradients(replicated)


def shard_learner(learner: Any, world: int) -> None:
    """Make a learner one of `world` sharded ranks (the process group already joined).

    FSDP replaces the parameters with sharded ones, so the optimizer and its learning-rate
    schedule are rebuilt over them; call this before any step or state load."""
    what = _unsupported(learner)
    if what is not None:
        raise ValueError(f"train.sharding=fsdp does not support {what} yet")
    if learner.updates:
        raise ValueError("train.sharding=fsdp: shard the learner before its first step")
    shard_policy(learner.model)
    t = learner.cfg.train
    learner.optimizer = torch.optim.AdamW(
        [p for p in learner.model.parameters() if p.requires_grad],
        lr=t.lr,
        weight_decay=t.weight_decay,
    )
    learner.lr_schedule = StepSchedule(
        learner.optimizer,
        t.lr_scheduler,
        t.steps,
        warmup_steps(t.steps, t.warmup_steps, t.warmup_ratio),
    )
    learner.full_logprobs = True  # through model(...): see the module docstring
    learner.grad_hook = _replicated_mean
    learner.count_reducer = sum_over_ranks
    learner.world_size = world


def full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer as a full CPU tensor, on every rank (one all-gather)."""
    sd = get_model_state_dict(model, options=_FULL)
    return {k: v.detach().to("cpu", copy=True) for k, v in sd.items()}


def _unsharded_class(model: torch.nn.Module) -> type:
    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def full_model(model: torch.nn.Module) -> torch.nn.Module:
    """An unsharded CPU copy of a sharded policy, for the generators, evaluation and
    `save_pretrained`: the weights gathered once."""
    state = full_state(model)
    with torch.device("meta"):
        copy = _unsharded_class(model)(model.config)  # type: ignore[attr-defined]
    copy.load_state_dict(state, assign=True, strict=False)
    # buffers outside the state dict (rotary inv_freq) are whole on every rank: copied over
    for name, buf in model.named_buffers():
        owner, _, leaf = name.rpartition(".")
        mod = copy.get_submodule(owner)
        if mod._buffers[leaf] is not None and mod._buffers[leaf].is_meta:
            mod._buffers[leaf] = buf.detach().to("cpu", copy=True)
    missing = [n for n, t in [*copy.named_parameters(), *copy.named_buffers()] if t.is_meta]
    if missing:
        raise KeyError(f"train.sharding=fsdp: the gathered state lacks {missing[0]!r}")
    copy.tie_weights()
    return copy.eval()


def full_learner_state(learner: Any) -> dict[str, object]:
    """`learner.state_dict()` with the optimizer state gathered to full tensors (keyed by
    parameter name), as a checkpoint stores it."""
    state = learner.state_dict()
    optim: Any = get_optimizer_state_dict(learner.model, learner.optimizer, options=_FULL)
    # copies: the unsharded entries (each parameter's step count) are the live tensors
    state["optimizer"] = {
        "state": {
            name: {
                k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v
                for k, v in s.items()
            }
            for name, s in optim["state"].items()
        },
        "param_groups": [dict(g) for g in optim["param_groups"]],
    }
    return state


def load_full_learner_state(learner: Any, state: dict[str, object]) -> None:
    """Restore `full_learner_state` output into a sharded learner: each rank keeps its part."""
    full: Any = state["optimizer"]
    # torch swaps the given tensors for sharded ones in place: hand it copies of the mappings
    optim = {
        "state": {name: dict(s) for name, s in full["state"].items()},
        "param_groups": [dict(g) for g in full["param_groups"]],
    }
    set_optimizer_state_dict(learner.model, learner.optimizer, optim, options=_FULL)
    learner.load_state_dict({**state, "optimizer": learner.optimizer.state_dict()})


def load_full_model(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Full tensors (an HF folder's weights) into a sharded policy: each rank keeps its part."""
    set_model_state_dict(model, dict(state), options=_FULL)  # dict(): see above
