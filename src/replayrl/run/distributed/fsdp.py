"""Sharded learners (`train.sharding: fsdp`): the policy's parameters, gradients and AdamW
state split across the learner ranks with FSDP2 (`torch.distributed.fsdp.fully_shard`) on a
`DeviceMesh` (one dimension, or two for HSDP: `train.sharding_replicas` replicas, each
sharded over the rest of the ranks).

Each rank trains on its own B / T rollouts like the data-parallel learners (ddp.py): FSDP's
reduce-scatter averages the gradients, and the loss normaliser counts over every rank, so a
sharded step equals the unsharded step on the whole batch (tests/test_fsdp.py). Each decoder
layer is one shard group (all-gathered for its forward and backward, then freed); the
embeddings, final norm and output head form the root group. A LoRA policy is sharded with its
frozen base (what sharding saves there), and AdamW holds its adapters only. With kl.beta > 0
the frozen reference is sharded the same way (LoRA's is the policy with adapters off), and
so is PPO's critic (`shard_critic`), its gradients and AdamW state with it.

The learner's forward is the unsharded one: the chunked output head (no rows x tokens x
vocabulary logits) and, for the architectures it covers, the lean forward. Both read weights
directly instead of calling each module, so FSDP's gather hooks are reached through
`register_fsdp_forward_method`: the whole log-prob computation runs as a forward method of the
root group (`run_sharded`), and the lean forward runs each decoder layer as a forward method
of that layer's group. Which path a model takes is checked once before sharding
(`logprobs.prepare`), on the whole model.

Precision: `MixedPrecisionPolicy` gathers parameters in `train.sharding_param_dtype` (auto:
bf16 on CUDA, fp32 on CPU) and reduces gradients in fp32; AdamW's master weights stay fp32.
Gradient checkpointing is on unless `model.gradient_checkpointing` says otherwise.

Whatever leaves the learner (the generators' weights, an evaluation's model, a checkpoint's HF
or adapter folder, optimizer state and reference) is gathered into full tensors (`full_model`,
`full_learner_state`). Every function here is a collective: every rank calls it.
"""

from __future__ import annotations

import copy as copy_module
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    FSDPModule,
    MixedPrecisionPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor

from replayrl.learner import logprobs
from replayrl.learner.context import Ranks
from replayrl.learner.frozen import AdapterSnapshot, is_lora
from replayrl.learner.learner import Learner
from replayrl.models.loading import unwrap_model
from replayrl.run.distributed.ddp import average_gradients, max_over_ranks, sum_over_ranks

_FULL = StateDictOptions(full_state_dict=True)


def _unsupported(learner: Learner) -> str | None:
    kl = learner.cfg.kl
    if learner.prev_model is not None or (kl.beta > 0 and kl.target != "reference"):
        return "KL-Convex's previous policy pi_{k-1} (kl.target=convex)"
    if isinstance(learner.base_model, AdapterSnapshot):
        return "a reincarnated LoRA reference (an adapter snapshot)"
    if kl.beta > 0 and learner.base_model is None:
        return "kl.beta > 0 without a reference policy to shard (a state saved with kl.beta=0)"
    return None


# the forward method through which a sharded group runs code that reads its weights directly
RUN = "replayrl_run"


def _run(self: torch.nn.Module, fn: Callable[..., Any], *args: Any) -> Any:
    del self  # the module is only the owner of the FSDP hooks around this call
    return fn(*args)


def hook_calls(module: torch.nn.Module) -> None:
    """Give a sharded `module` a `replayrl_run(fn, *args)` method that runs `fn(*args)` with the
    group's parameters gathered (FSDP's pre/post-forward hooks around it, and its backward
    hooks on the outputs), as `module(...)` would."""
    setattr(module, RUN, types.MethodType(_run, module))
    register_fsdp_forward_method(module, RUN)


def param_dtype(setting: str, device: torch.device) -> torch.dtype | None:
    """The dtype parameters are gathered (and computed) in: `auto` is bf16 on CUDA, fp32
    (None: the parameters' own) elsewhere: CPUs without native bf16 run it emulated."""
    if setting == "bfloat16" or (setting == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None


def make_mesh(world: int, replicas: int, device: torch.device) -> DeviceMesh:
    """The learner ranks as a mesh: 1-D (every rank holds 1 / world of each group), or 2-D for
    HSDP (`replicas` x world / replicas: sharded within a replica, e.g. one node, gradients
    all-reduced across replicas)."""
    if world % replicas:
        raise ValueError(
            f"train.sharding_replicas={replicas} does not divide the {world} learner ranks"
        )
    if replicas == 1:
        return init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    return init_device_mesh(
        device.type, (replicas, world // replicas), mesh_dim_names=("replicate", "shard")
    )


def _decoder_layers(owner: torch.nn.Module, path: str, what: str) -> torch.nn.ModuleList:
    """`owner.<path>.layers`: the decoder layers, one shard group each."""
    layers = getattr(getattr(owner, path, None), "layers", None)
    if layers is None:
        raise ValueError(
            f"train.sharding=fsdp: {what} {type(owner).__name__} has no {path}.layers (decoder "
            "layers) to shard"
        )
    return layers  # type: ignore[no-any-return]


def _shard_groups(
    layers: torch.nn.ModuleList,
    root: torch.nn.Module,
    mesh: DeviceMesh | None,
    dtype: torch.dtype | None,
    *,
    hooked: bool,
) -> None:
    """One FSDP2 group per layer, the rest of `root` in the root group; gathered in `dtype`,
    gradients reduced in fp32. `hooked`: each group also gets `replayrl_run` (`hook_calls`)
    for code that reads its weights directly; otherwise the root's inputs are left as they
    are (a batch of token rows, not tensors to cast)."""
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
        if hooked:
            hook_calls(layer)
    top = MixedPrecisionPolicy(
        param_dtype=dtype, reduce_dtype=torch.float32, cast_forward_inputs=hooked
    )
    fully_shard(root, mesh=mesh, mp_policy=top)
    if hooked:
        hook_calls(root)


def shard_policy(
    model: torch.nn.Module,
    mesh: DeviceMesh | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """FSDP2 over `mesh` (None: the default process group's ranks): one group per decoder
    layer, the rest (embeddings, tied head, final norm) in the root group; parameters
    gathered in `dtype` (None: their own), gradients reduced in fp32. In place.

    A LoRA policy (peft) is sharded as it is: each layer's group holds its frozen base weights
    and its adapters, and FSDP reduces gradients only for the parameters that train."""
    layers = _decoder_layers(unwrap_model(model), "model", "the policy")
    _shard_groups(layers, model, mesh, dtype, hooked=True)


def shard_critic(
    critic: torch.nn.Module, mesh: DeviceMesh | None = None, dtype: torch.dtype | None = None
) -> None:
    """FSDP2 over PPO's value model as over the policy: one group per backbone layer, the
    rest (embeddings, final norm, value head) in the root group. In place. Its forward is a
    plain module call, so FSDP's own hooks gather it."""
    _shard_groups(
        _decoder_layers(critic, "backbone", "the critic"), critic, mesh, dtype, hooked=False
    )


def _replicated_mean(params: list[torch.nn.Parameter]) -> None:
    """The data-parallel mean of parameters FSDP does not reduce (none today: the policy,
    its reference and the critic are sharded, and FSDP's reduce-scatter averages theirs)."""
    replicated = [p for p in params if not isinstance(p, DTensor)]
    if replicated:
        average_gradients(replicated)


def shard_learner(learner: Learner, world: int) -> None:
    """Make a learner one of `world` sharded ranks (the process group already joined; every
    rank calls it at once): its policy, with kl.beta > 0 its frozen reference, and PPO's
    critic.

    FSDP replaces the parameters with sharded ones, so the optimizers and the learning-rate
    schedule are rebuilt over them; AdamW state the learner already holds (a resumed run's,
    loaded unsharded by `learner.load_state_dict`), the policy's and the critic's, is carried
    over, each rank keeping its part.
    """
    what = _unsupported(learner)
    if what is not None:
        raise ValueError(f"train.sharding=fsdp does not support {what} yet")
    if learner.ctx.ranks.world_size != 1:
        raise ValueError("train.sharding=fsdp: this learner is already one of several ranks")
    carried = learner.optimizer.state_dict() if learner.optimizer.state else None
    critic = learner.critic
    critic_carried = None
    if critic is not None and learner.critic_pass is not None:
        opt = learner.critic_pass.optimizer
        critic_carried = opt.state_dict() if opt.state else None
    t = learner.cfg.train
    m = learner.cfg.model
    if m.gradient_checkpointing or "gradient_checkpointing" not in m.model_fields_set:
        # on by default where sharding is: what is sharded is large; an explicit false wins
        checkpointing = {"use_reentrant": False}
        unwrap_model(learner.model).gradient_checkpointing_enable(
            gradient_checkpointing_kwargs=checkpointing
        )
        if critic is not None:
            critic.backbone.gradient_checkpointing_enable(  # type: ignore[operator]
                gradient_checkpointing_kwargs=checkpointing
            )
    # which log-prob path each model takes, decided on the whole model (the checks run
    # transformers' forward, which sharded modules run only through their hooks)
    logprobs.prepare(learner.model)
    if isinstance(learner.base_model, torch.nn.Module):
        logprobs.prepare(learner.base_model)
    device = next(learner.model.parameters()).device
    mesh = make_mesh(world, t.sharding_replicas, device)
    dtype = param_dtype(t.sharding_param_dtype, device)
    shard_policy(learner.model, mesh, dtype)
    if isinstance(learner.base_model, torch.nn.Module):
        # full fine-tuning's frozen reference (kl.beta > 0), sharded the same way: its
        # no-grad forwards are collectives every rank joins in lockstep, as the policy's are.
        # LoRA's reference is the sharded policy itself with its adapters switched off.
        shard_policy(learner.base_model, mesh, dtype)
    if critic is not None:  # PPO's value model, sharded like the policy
        shard_critic(critic, mesh, dtype)
    # FSDP replaced the parameters: the optimizers and the schedule are built anew over
    # them; with a gather dtype the gathered parameters are already in the compute dtype,
    # and autocast would only re-cast them (and cache whole frozen weights per rank)
    learner.join(sharded_ranks(world), new_parameters=True, autocast=dtype is None)
    if carried is not None:
        load_full_optimizer_state(learner.model, learner.optimizer, carried)
    if critic is not None and critic_carried is not None:
        assert learner.critic_pass is not None
        load_full_optimizer_state(critic, learner.critic_pass.optimizer, critic_carried)


def sharded_ranks(world: int) -> Ranks:
    """How a sharded rank works with the others: FSDP's reduce-scatter averages the policy's
    gradients (`_replicated_mean` any that are not sharded), the normaliser's count is summed
    over ranks,
    and every forward and micro-batch runs on every rank in lockstep (each is a collective)."""
    return Ranks(
        world_size=world,
        grad_hook=_replicated_mean,
        count_reducer=sum_over_ranks,
        micro_count_sync=max_over_ranks,
        lockstep_forwards=True,
    )


@torch.no_grad()
def full_state(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every parameter and buffer as a full CPU tensor, on every rank: one all-gather per
    tensor, each moved to the CPU before the next starts, so a device never holds more than
    one whole parameter beside its shards (storage/sharded_checkpoint.py's `gathered_state`
    keeps them on rank 0 only). `dtype`: floating tensors cast to it on their device, before
    they reach the host (a bf16 weight sync never holds an fp32 copy of the model there)."""
    out = {}
    for name, t in model.state_dict().items():
        full = t.full_tensor() if isinstance(t, DTensor) else t
        cast = dtype if dtype is not None and full.is_floating_point() else None
        out[name] = full.detach().to(dtype=cast).to("cpu", copy=True)
        del full
    return out


def _unsharded_class(model: torch.nn.Module) -> type:
    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def _meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """An unsharded module of `model`'s architecture on the meta device (no memory): the
    HF model, or for a LoRA policy the same HF model wrapped in the same adapters."""
    inner = unwrap_model(model)
    with torch.device("meta"):
        copy = _unsharded_class(inner)(inner.config)  # type: ignore[attr-defined]
        if is_lora(model):
            from peft import get_peft_model  # lazy: the `lora` extra

            configs = model.peft_config  # type: ignore[attr-defined]
            if set(configs) != {"default"}:
                raise ValueError(
                    f"train.sharding=fsdp: a LoRA policy with one adapter named 'default' "
                    f"is supported (got {sorted(configs)})"
                )
            copy = get_peft_model(copy, copy_module.deepcopy(configs["default"]))
    return copy


def full_model(model: torch.nn.Module, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """An unsharded CPU copy of a sharded policy, for the generators, evaluation and
    `save_pretrained`: the weights gathered once (in `dtype`, see `full_state`). A LoRA
    policy's copy is a peft model like the unsharded learner's: the same trainable adapter
    tensors (what a weight sync sends) and `save_pretrained` writes the adapter folder."""
    state = full_state(model, dtype)
    copy = _meta_copy(model)
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


@torch.no_grad()
def full_trainable(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters as full CPU tensors, on every rank (LoRA: the adapters only,
    the frozen base is not gathered)."""
    # one all-gather per parameter, in the same order on every rank (DCP's
    # ignore_frozen_params would gather a frozen tied head as well)
    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().to("cpu", copy=True)
        for n, p in model.named_parameters()
        if p.requires_grad
    }


def adapters_model(model: torch.nn.Module) -> torch.nn.Module:
    """A sharded LoRA policy's unsharded peft model with only its adapters gathered, the base
    left on the meta device (no memory, never read): what a weight sync sends from, since a
    LoRA sync carries the adapters only (run/distributed/weights.py), so the frozen base is not
    all-gathered at every sync."""
    if not is_lora(model):
        raise ValueError("adapters_model: the policy has no LoRA adapters")
    copy = _meta_copy(model)
    adapters = full_trainable(model)
    copy.load_state_dict(adapters, assign=True, strict=False)
    names = {n for n, p in copy.named_parameters() if p.requires_grad}
    if names != set(adapters):
        raise KeyError(
            f"train.sharding=fsdp: the gathered adapters {sorted(set(adapters) ^ names)[:3]} "
            "do not match the policy's"
        )
    return copy


def _trainable_names(model: torch.nn.Module) -> list[str]:
    """The optimizer's parameters in its own order (the learner's AdamW takes them so)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def full_optimizer_state(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """A sharded AdamW's state gathered to full CPU tensors, in the layout of an unsharded
    `optimizer.state_dict()` (entries keyed by the parameter's index): an unsharded learner
    loads it as it is, and `shard_learner` splits it again over the ranks."""
    index = {name: i for i, name in enumerate(_trainable_names(model))}
    optim: Any = get_optimizer_state_dict(model, optimizer, options=_FULL)
    # copies: the unsharded entries (each parameter's step count) are the live tensors
    return {
        "state": {
            index[name]: {
                k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else v
                for k, v in s.items()
            }
            for name, s in optim["state"].items()
        },
        "param_groups": [
            {**g, "params": [index[n] for n in g["params"]]} for g in optim["param_groups"]
        ],
    }


def load_full_optimizer_state(model: torch.nn.Module, optimizer: Any, state: Any) -> None:
    """An unsharded `optimizer.state_dict()` into a sharded AdamW: each rank keeps its part."""
    names = _trainable_names(model)
    try:
        optim = {  # torch swaps the given tensors for sharded ones in place: new mappings
            "state": {names[int(i)]: dict(s) for i, s in state["state"].items()},
            "param_groups": [
                {**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]
            ],
        }
    except (IndexError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(
            f"train.sharding=fsdp: the optimizer state does not match the policy's "
            f"{len(names)} trainable parameters ({type(exc).__name__}: {exc})"
        ) from None
    set_optimizer_state_dict(model, optimizer, optim, options=_FULL)


def full_learner_state(learner: Learner) -> dict[str, object]:
    """`learner.state_dict()` with the optimizer state (`full_optimizer_state`) and a frozen
    reference gathered: the same layout as an unsharded learner's, so
    `learner.load_state_dict` before `shard_learner` resumes it."""
    state = {
        **learner.state_dict(),
        "optimizer": full_optimizer_state(learner.model, learner.optimizer),
    }
    if isinstance(learner.base_model, torch.nn.Module):  # a sharded frozen reference
        state["base_model"] = full_state(learner.base_model)
    if learner.critic is not None and learner.critic_pass is not None:  # the sharded critic
        state["critic"] = full_state(learner.critic)
        state["critic_optimizer"] = full_optimizer_state(
            learner.critic, learner.critic_pass.optimizer
        )
    return state
