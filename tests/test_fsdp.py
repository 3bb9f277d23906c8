"""Sharded learners (run/distributed/fsdp.py) on CPU with gloo and 2 spawned ranks: one sharded
step equals the unsharded step on the whole batch, the gathered weights and optimizer state
are full tensors, and a resume from them is exact."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from replayrl.config.schema import ModelConfig, load_config
from replayrl.data.rollout_record import Rollout
from replayrl.learner.frozen import frozen_copy
from replayrl.learner.learner import Learner
from replayrl.models.loading import (
    apply_lora,
    attach_adapter,
    build_tiny_model,
    is_adapter_folder,
    unwrap_model,
)
from replayrl.models.lora_merge import merged_lora_tensors
from replayrl.rollout.generation import HFGenerator, SamplingParams
from tiny import as_rollouts

WORLD = 2
# lr 1e-4 (the default): Adam's first step is lr * g / (|g| + eps), so a gradient element
# near eps turns the ranks' different fp32 summation order into up to ~lr * 1e-2 of change
OVERRIDES = ["rollout.prompts_per_step=3", "rollout.num_generations=4", "train.lr=1e-4"]
# the unsharded reference: the same chunked head (and lean forward) the sharded ranks take
REFERENCE = OVERRIDES


@pytest.fixture(scope="module")
def model(char_tokenizer):
    """A 2-layer tiny Llama: two decoder-layer shard groups besides the root."""
    cfg = ModelConfig.model_validate({"tiny": {"num_layers": 2, "hidden_size": 32}})
    return build_tiny_model(cfg, vocab_size=len(char_tokenizer), seed=0)


@pytest.fixture(scope="module")
def rollouts(model, char_tokenizer) -> list[Rollout]:
    gen = HFGenerator(model.eval(), char_tokenizer)
    torch.manual_seed(5)
    prompts = ["1+2=", "12+34=", "7+80=", "5+5=", "40+2=", "9+19="]
    samples = gen.generate(prompts, 4, SamplingParams(max_new_tokens=5))
    return as_rollouts(samples, np.random.default_rng(0).normal(size=len(samples)).tolist())


def _local_optimizer_state(learner: Learner) -> dict[str, torch.Tensor]:
    """This rank's part of the AdamW state (copies), keyed by parameter name and entry."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in learner.model.named_parameters():
        for k, v in learner.optimizer.state[p].items():
            local = v.to_local() if isinstance(v, DTensor) else v
            out[f"{name}.{k}"] = local.detach().clone()
    return out


def _lean_only() -> list[int]:
    """In this (spawned) rank: the full-logits path raises, and the returned list counts the
    lean forward's calls: a sharded step must take the chunked head and the lean forward."""
    from replayrl.learner import lean_forward, logprobs

    calls = [0]
    states = lean_forward.completion_states

    def refuse(*args, **kwargs):
        raise AssertionError("a sharded learner took the full-logits path")

    def counted(*args, **kwargs):
        calls[0] += 1
        return states(*args, **kwargs)

    logprobs.token_logprobs_full = refuse
    lean_forward.completion_states = counted
    return calls


def _sharded_rank(rank: int, port: int, model, pad_id: int, batches, out: str) -> None:
    """Rank `rank`: shard, one step per batch on its half (saving the full state after the
    first), then a fresh sharded learner resumed from that state takes the second step."""
    from safetensors.torch import save_file
    from torch.distributed.tensor import DTensor

    from replayrl.run.distributed import fsdp
    from replayrl.run.distributed.ddp import init_group

    torch.set_num_threads(1)
    init_group(rank, WORLD, "127.0.0.1", port)
    cfg = load_config(None, OVERRIDES)
    half = [b[rank::WORLD] for b in batches]
    lean_calls = _lean_only()

    def sharded() -> Learner:
        learner = Learner(copy.deepcopy(model), pad_id, cfg)
        fsdp.shard_learner(learner, WORLD)
        return learner

    def save(name: str, tensors: dict[str, torch.Tensor]) -> None:
        if rank == 0:
            save_file({k: v.clone() for k, v in tensors.items()}, f"{out}/{name}")

    learner = sharded()
    learner.train_step(half[0], np.random.default_rng(rank), step=0)
    weights = fsdp.full_state(learner.model)
    save("step1.safetensors", weights)
    # a bf16 weight sync gathers straight into bf16: each tensor cast before it reaches the host
    bf16 = fsdp.full_state(learner.model, torch.bfloat16)
    assert set(bf16) == set(weights)
    for k, v in bf16.items():
        assert v.dtype == torch.bfloat16 and torch.equal(v, weights[k].to(torch.bfloat16)), k
    hf = fsdp.full_model(learner.model)
    published = hf.state_dict()
    assert not any(isinstance(t, DTensor) or t.is_meta for t in published.values())
    with torch.no_grad():  # runs: no buffer left on the meta device
        assert torch.isfinite(hf(torch.tensor([[3, 4, 5]])).logits).all()
    save("published.safetensors", published)
    if rank == 0:  # a checkpoint's policy folder, loadable without torch.distributed
        hf.save_pretrained(f"{out}/policy")
    state = fsdp.full_learner_state(learner)
    # the gathered optimizer state: full tensors in an unsharded optimizer's layout
    names = [n for n, p in learner.model.named_parameters() if p.requires_grad]
    adam = state["optimizer"]["state"]  # type: ignore[index]
    save("adam.safetensors", {f"{names[i]}.{k}": v for i, s in adam.items() for k, v in s.items()})
    shards = _local_optimizer_state(learner)
    learner.train_step(half[1], np.random.default_rng(rank), step=1)
    save("step2.safetensors", fsdp.full_state(learner.model))

    # a resume as a run does it: the unsharded learner loads the checkpoint, then is sharded
    plain = copy.deepcopy(model)
    plain.load_state_dict(weights)
    resumed = Learner(plain, pad_id, cfg)
    resumed.load_state_dict(state)
    fsdp.shard_learner(resumed, WORLD)
    again = _local_optimizer_state(resumed)
    assert set(again) == set(shards) and shards
    for k, v in shards.items():  # each rank holds exactly the shard it held before
        assert torch.equal(again[k], v), (rank, k)
    resumed.train_step(half[1], np.random.default_rng(rank), step=1)
    save("resumed.safetensors", fsdp.full_state(resumed.model))
    assert lean_calls[0] > 0
    # checkpointing is on by default where sharding is
    assert unwrap_model(learner.model).model.gradient_checkpointing
    torch.distributed.destroy_process_group()


def test_sharded_step_equals_unsharded_and_resumes_exactly(
    model, rollouts, char_tokenizer, tmp_path: Path
):
    from safetensors.torch import load_file

    from replayrl.run.distributed.ddp import free_port

    pad = char_tokenizer.pad_token_id
    batches = [rollouts[:12], rollouts[12:]]  # two steps' batches of 12
    mp.spawn(
        _sharded_rank,
        args=(free_port(), model, pad, batches, str(tmp_path)),
        nprocs=WORLD,
        join=True,
    )
    ref = Learner(copy.deepcopy(model), pad, load_config(None, REFERENCE))
    # the same rollouts per rank, in the same order, as the sharded ranks saw them
    whole = [b[0::WORLD] + b[1::WORLD] for b in batches]
    ref.train_step(whole[0], np.random.default_rng(0), step=0)
    step1 = {k: v.detach().clone() for k, v in ref.model.state_dict().items()}
    moments = {
        f"{name}.{k}": ref.optimizer.state[p][k].clone()
        for name, p in ref.model.named_parameters()
        for k in ("step", "exp_avg", "exp_avg_sq")
    }
    ref.train_step(whole[1], np.random.default_rng(0), step=1)
    step2 = ref.model.state_dict()

    moved = 0.0
    for name, expected in [("step1", step1), ("published", step1), ("step2", step2)]:
        got = load_file(str(tmp_path / f"{name}.safetensors"))
        assert set(got) >= {n for n, _ in ref.model.named_parameters()}, name
        for k, v in got.items():
            assert v.shape == expected[k].shape, (name, k)
            torch.testing.assert_close(v, expected[k], atol=1e-6, rtol=0)
            moved = max(moved, float((v - model.state_dict()[k]).abs().max()))
    assert moved > 5e-5  # the steps changed the weights: the comparison is not vacuous
    adam = load_file(str(tmp_path / "adam.safetensors"))
    assert set(adam) == set(moments)
    for k, v in adam.items():
        torch.testing.assert_close(v, moments[k], atol=1e-9, rtol=1e-5)
    from transformers import AutoModelForCausalLM

    folder = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    ids = torch.tensor([[3, 4, 5, 6]])
    ref_step1 = copy.deepcopy(model)
    ref_step1.load_state_dict(step1)
    with torch.no_grad():
        torch.testing.assert_close(folder(ids).logits, ref_step1(ids).logits)
    resumed = load_file(str(tmp_path / "resumed.safetensors"))
    two = load_file(str(tmp_path / "step2.safetensors"))
    for k, v in resumed.items():
        assert torch.equal(v, two[k]), k  # resume from the gathered state is exact


# a collective one rank does not join (a gather's follower side out of step) fails, not hangs;
# long enough that a rank descheduled on a loaded 2-core machine is not taken for one
GROUP_TIMEOUT_S = 300
# LoRA on q/v (fp32, no dropout): the sharded groups hold frozen base weights and adapters
LORA = ["model.lora.enabled=true", "model.lora.r=4", "model.lora.alpha=8"]
needs_peft = pytest.mark.skipif(
    importlib.util.find_spec("peft") is None, reason="peft not installed (replayrl[lora])"
)


@pytest.fixture(scope="module")
def lora_policy(model):
    """The tiny Llama wrapped in LoRA adapters whose B is not zero: with B = 0 (peft's start)
    A's gradient is zero, and a step would leave half the adapters untested."""
    policy = apply_lora(copy.deepcopy(model), load_config(None, LORA).model)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return policy


def _plain_merged(policy: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a vLLM generator receives of a LoRA policy: plain HF names, adapters merged."""
    scaling = 8 / 4  # model.lora.alpha / model.lora.r
    named = unwrap_model(policy).named_parameters()
    return {n: t.detach().clone() for n, t in merged_lora_tensors(named, scaling)}


def _lora_rank(rank: int, port: int, base, policy, tok, batch, out: str) -> None:
    """Rank `rank` of a sharded LoRA learner: one step on its half of `batch`, then what
    leaves the learner (the published and merged weights, a checkpoint, the summed loss);
    then a learner resumed from that checkpoint is sharded again and holds the same shards."""
    from safetensors.torch import save_file

    from replayrl.models.precision import choose_for
    from replayrl.run.distributed import fsdp
    from replayrl.run.distributed.ddp import init_group
    from replayrl.run.distributed.fsdp_learner import follow_gather
    from replayrl.run.distributed.weights import trainable_state
    from replayrl.storage.checkpoint import load_state, save_checkpoint

    torch.set_num_threads(1)
    init_group(rank, WORLD, "127.0.0.1", port, timeout_s=GROUP_TIMEOUT_S)
    cfg = load_config(None, [*OVERRIDES, *LORA])
    learner = Learner(copy.deepcopy(policy), tok.pad_token_id, cfg)
    fsdp.shard_learner(learner, WORLD)
    trained = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    names = [n for n, p in learner.model.named_parameters() if id(p) in trained]
    assert names and all(".lora_" in n for n in names)  # AdamW holds the adapters only
    metrics = learner.train_step(batch[rank::WORLD], np.random.default_rng(rank), step=0)
    loss = torch.tensor([metrics["loss"]], dtype=torch.float64)
    # each rank's loss is normalised by the mean count per rank, as FSDP averages gradients:
    # the whole batch's loss is the ranks' mean
    torch.distributed.all_reduce(loss)
    loss /= WORLD
    hf = fsdp.full_model(learner.model)
    state = fsdp.full_learner_state(learner)
    if rank == 0:  # a weight sync as on Ray: rank 0 gathers the adapters, a follower joins
        synced = fsdp.adapters_model(learner.model)
        frozen = [p for p in synced.parameters() if not p.requires_grad]
        assert frozen and all(p.is_meta for p in frozen)  # the base was not gathered
        dtypes = [choose_for(cfg.precision, m).generation for m in (synced, hf)]
        assert dtypes[0] == dtypes[1]  # the generation dtype the sync sends in
        save_file(trainable_state(synced), f"{out}/synced.safetensors")
    else:
        follow_gather(learner, ("adapters",))
    if rank == 0:
        save_file(trainable_state(hf), f"{out}/published.safetensors")
        save_file(_plain_merged(hf), f"{out}/merged.safetensors")
        save_file({"loss": loss}, f"{out}/loss.safetensors")
        save_checkpoint(Path(out), 1, hf, tok, {"learner": state})
    torch.distributed.barrier()

    # a resume as a run does it: the adapter folder on the base, the state, then sharded
    ckpt = Path(out) / "checkpoints" / "step_000001"
    resumed = Learner(
        attach_adapter(copy.deepcopy(base), ckpt / "policy", trainable=True), tok.pad_token_id, cfg
    )
    resumed.load_state_dict(load_state(ckpt)["learner"])
    fsdp.shard_learner(resumed, WORLD)
    shards, again = _local_optimizer_state(learner), _local_optimizer_state(resumed)
    assert set(again) == set(shards) and shards
    for k, v in shards.items():
        assert torch.equal(again[k], v), (rank, k)
    for k, v in fsdp.full_state(resumed.model).items():
        assert torch.equal(v, fsdp.full_state(learner.model)[k]), (rank, k)
    torch.distributed.destroy_process_group()


@needs_peft
def test_a_sharded_lora_step_equals_the_unsharded_one(
    model, lora_policy, rollouts, char_tokenizer, tmp_path: Path
):
    from safetensors.torch import load_file

    from replayrl.run.distributed.ddp import free_port
    from replayrl.run.distributed.weights import trainable_state
    from replayrl.storage.checkpoint import load_state

    batch = rollouts[:12]
    mp.spawn(
        _lora_rank,
        args=(free_port(), model, lora_policy, char_tokenizer, batch, str(tmp_path)),
        nprocs=WORLD,
        join=True,
    )
    cfg = load_config(None, [*REFERENCE, *LORA])
    ref = Learner(copy.deepcopy(lora_policy), char_tokenizer.pad_token_id, cfg)
    metrics = ref.train_step(batch[0::WORLD] + batch[1::WORLD], np.random.default_rng(0), step=0)
    loss = load_file(str(tmp_path / "loss.safetensors"))["loss"]
    assert abs(float(loss) - metrics["loss"]) < 1e-6, (float(loss), metrics["loss"])

    adapters = trainable_state(ref.model)
    before = trainable_state(lora_policy)
    assert all(".lora_" in n for n in adapters)
    moved = {n: float((adapters[n] - before[n]).abs().max()) for n in adapters}
    assert min(moved.values()) > 5e-5, moved  # A and B both moved: not a vacuous comparison
    # what a weight sync sends (the adapters only) and the full copy's trainable tensors
    for name in ("synced", "published"):
        got = load_file(str(tmp_path / f"{name}.safetensors"))
        assert set(got) == set(adapters), name
        for k, t in got.items():
            torch.testing.assert_close(t, adapters[k], atol=1e-6, rtol=0)

    # the merged weights (what a vLLM engine loads) equal the unsharded learner's, and peft's
    # own merge of them
    merged = load_file(str(tmp_path / "merged.safetensors"))
    expected = _plain_merged(ref.model)
    plain = copy.deepcopy(ref.model).merge_and_unload().state_dict()
    assert set(merged) == set(expected) and set(merged) <= set(plain)
    for name, t in merged.items():
        torch.testing.assert_close(t, expected[name], atol=1e-6, rtol=0)
        torch.testing.assert_close(t, plain[name], atol=1e-6, rtol=0)

    # the sharded checkpoint, loaded unsharded: the adapter folder and AdamW's state
    ckpt = tmp_path / "checkpoints" / "step_000001"
    assert is_adapter_folder(ckpt / "policy")
    loaded = attach_adapter(copy.deepcopy(model), ckpt / "policy", trainable=True)
    resumed = Learner(loaded, char_tokenizer.pad_token_id, cfg)
    resumed.load_state_dict(load_state(ckpt)["learner"])
    for name, t in trainable_state(resumed.model).items():
        torch.testing.assert_close(t, adapters[name], atol=1e-6, rtol=0)
    params = dict(ref.model.named_parameters())
    own = dict(resumed.model.named_parameters())
    assert len(resumed.optimizer.state) == len(adapters)
    for name in adapters:
        got, want = resumed.optimizer.state[own[name]], ref.optimizer.state[params[name]]
        assert set(got) == set(want) == {"step", "exp_avg", "exp_avg_sq"}, name
        for k in want:
            torch.testing.assert_close(got[k], want[k], atol=1e-9, rtol=1e-5)


KL = ["kl.beta=0.5"]


@pytest.fixture(scope="module")
def reference(model):
    """A full fine-tuning reference away from the policy: the KL term and its gradient are
    not zero from the first step (LoRA's reference, the adapters switched off, is away from
    `lora_policy` already)."""
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    return ref


def _kl_learner(policy, reference, pad_id: int, cfg) -> Learner:
    learner = Learner(copy.deepcopy(policy), pad_id, cfg)
    if reference is not None:
        learner.base_model = frozen_copy(reference)
    return learner


def _kl_rank(
    rank: int, port: int, policy, reference, pad_id: int, batches, overrides, out: str
) -> None:
    """Rank `rank` with a frozen reference (kl.beta > 0): two steps on its halves, the
    ranks' mean losses saved; a learner resumed from the gathered state after the first step
    (the reference included) takes the second step to the same weights."""
    from safetensors.torch import save_file
    from torch.distributed.tensor import DTensor

    from replayrl.run.distributed import fsdp
    from replayrl.run.distributed.ddp import init_group
    from replayrl.run.distributed.fsdp_learner import follow_gather

    torch.set_num_threads(1)
    init_group(rank, WORLD, "127.0.0.1", port, timeout_s=GROUP_TIMEOUT_S)
    cfg = load_config(None, [*OVERRIDES, *overrides])
    half = [b[rank::WORLD] for b in batches]
    learner = _kl_learner(policy, reference, pad_id, cfg)
    fsdp.shard_learner(learner, WORLD)
    if reference is not None:  # no rank holds the reference whole
        assert all(isinstance(p, DTensor) for p in learner.base_model.parameters())
    losses, kls = [], []
    for step in (0, 1):
        m = learner.train_step(half[step], np.random.default_rng(rank), step=step)
        losses.append(m["loss"])
        kls.append(m["kl_to_base"])
        if step == 0:  # gathered as on Ray: rank 0 gathers, a follower joins, rank 0 sends
            weights = fsdp.full_state(learner.model)
            if rank == 0:
                state = fsdp.full_learner_state(learner)
            else:
                follow_gather(learner, ("optimizer",))
            sent = [state if rank == 0 else None]
            torch.distributed.broadcast_object_list(sent, src=0)
            state = sent[0]
    mean = torch.tensor(losses, dtype=torch.float64)
    torch.distributed.all_reduce(mean)  # the whole batch's loss: the ranks' mean
    final = fsdp.full_state(learner.model)
    if rank == 0:
        save_file({"loss": mean / WORLD, "kl": torch.tensor(kls)}, f"{out}/loss.safetensors")
        save_file({k: v.clone() for k, v in final.items()}, f"{out}/step2.safetensors")
        reference = state["base_model"]
        if isinstance(reference, dict):  # full fine-tuning: the gathered reference copy
            save_file(reference, f"{out}/reference.safetensors")

    plain = copy.deepcopy(policy)
    plain.load_state_dict(weights)
    resumed = Learner(plain, pad_id, cfg)
    resumed.load_state_dict(state)
    fsdp.shard_learner(resumed, WORLD)
    resumed.train_step(half[1], np.random.default_rng(rank), step=1)
    for k, v in fsdp.full_state(resumed.model).items():
        assert torch.equal(v, final[k]), (rank, k)  # the resumed reference is the same
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=needs_peft)])
def test_a_sharded_step_with_a_kl_reference_equals_the_unsharded_one(
    model, lora_policy, reference, rollouts, char_tokenizer, tmp_path: Path, lora: bool
):
    from safetensors.torch import load_file

    from replayrl.run.distributed.ddp import free_port

    policy, overrides = (lora_policy, [*KL, *LORA]) if lora else (model, KL)
    reference = None if lora else reference
    pad = char_tokenizer.pad_token_id
    batches = [rollouts[:12], rollouts[12:]]
    mp.spawn(
        _kl_rank,
        args=(free_port(), policy, reference, pad, batches, overrides, str(tmp_path)),
        nprocs=WORLD,
        join=True,
    )
    ref = _kl_learner(policy, reference, pad, load_config(None, [*REFERENCE, *overrides]))
    whole = [b[0::WORLD] + b[1::WORLD] for b in batches]
    losses = [ref.train_step(whole[s], np.random.default_rng(0), step=s)["loss"] for s in (0, 1)]
    got = load_file(str(tmp_path / "loss.safetensors"))
    assert float(got["kl"].min()) > 1e-4  # the policy is away from the reference
    torch.testing.assert_close(
        got["loss"], torch.tensor(losses, dtype=torch.float64), atol=1e-6, rtol=0
    )
    step2 = load_file(str(tmp_path / "step2.safetensors"))
    expected = ref.model.state_dict()
    for k, v in step2.items():
        torch.testing.assert_close(v, expected[k], atol=1e-6, rtol=0)
    if reference is not None:  # the checkpoint's reference, gathered whole
        saved = load_file(str(tmp_path / "reference.safetensors"))
        assert set(saved) == set(reference.state_dict())
        for k, v in saved.items():
            assert torch.equal(v, reference.state_dict()[k]), k


@pytest.mark.parametrize("runtime", ["sync", "async-local"])
def test_sharding_is_refused_where_no_runtime_runs_it(runtime: str) -> None:
    assert load_config(None, [f"runtime={runtime}"]).train.sharding == "none"
    with pytest.raises(ValueError, match="train.sharding=fsdp: it shards over learner ranks"):
        load_config(None, [f"runtime={runtime}", "train.sharding=fsdp"])


def test_ray_with_two_learners_accepts_sharding() -> None:
    sharded = ["runtime=ray", "workers.learners=2", "train.sharding=fsdp"]
    cfg = load_config(None, sharded)
    assert cfg.train.sharding == "fsdp"
    lora = load_config(None, [*sharded, *LORA])
    assert lora.train.sharding == "fsdp" and lora.model.lora.enabled  # the base is sharded
    kl = load_config(None, [*sharded, "kl.beta=0.1"])  # the reference is sharded too
    assert kl.kl.target == "reference"
    with pytest.raises(ValueError, match="train.sharding=fsdp: kl.target=convex keeps"):
        load_config(None, [*sharded, "kl.beta=0.1", "kl.target=convex"])


def test_float16_weights_are_refused_by_name_and_sharding_options_are_checked() -> None:
    """fp16 weights would train without a loss scaler: refused with the way out; HSDP's
    replicas must divide the learner ranks."""
    with pytest.raises(ValueError, match="model.dtype=float16 would train float16 weights"):
        load_config(None, ["model.dtype=float16"])
    assert load_config(None, ["model.dtype=bfloat16"]).model.dtype == "bfloat16"
    sharded = ["runtime=ray", "workers.learners=4", "train.sharding=fsdp"]
    assert load_config(None, [*sharded, "train.sharding_replicas=2"]).train.sharding_replicas == 2
    with pytest.raises(ValueError, match="sharding_replicas=3 must divide workers.learners=4"):
        load_config(None, [*sharded, "train.sharding_replicas=3"])
    # a token budget is accepted: every rank runs as many micro-batches (idle ones after)
    budget = load_config(None, [*sharded, "train.max_tokens_per_micro_batch=4096"])
    assert budget.train.max_tokens_per_micro_batch == 4096


# a pass only some ranks' rows ask for: Mix-PPG's anchors (log pi_k of stale rollouts) and
# the log pi_old recompute of fresh ones (in a pass of its own, not fused into the update)
ONE_RANK_PASSES = {
    "anchors": (["algorithm.loss_type=mix_ppg"], 0),  # rank 0's rows stale, rank 1's fresh
    "refresh": (["precision.recompute_behaviour_logprobs=always"], 1),  # the other way round
}


def _one_rank_pass(rank: int, port: int, model, pad_id: int, batch, overrides, out: str) -> None:
    """Rank `rank` of a sharded learner at version 1: one step on its half of `batch`."""
    from safetensors.torch import save_file

    from replayrl.run.distributed import fsdp
    from replayrl.run.distributed.ddp import init_group

    torch.set_num_threads(1)
    init_group(rank, WORLD, "127.0.0.1", port, timeout_s=GROUP_TIMEOUT_S)
    learner = Learner(copy.deepcopy(model), pad_id, load_config(None, [*OVERRIDES, *overrides]))
    learner.fuse_behaviour_recompute = False
    fsdp.shard_learner(learner, WORLD)
    learner.version = 1
    m = learner.train_step(batch[rank::WORLD], np.random.default_rng(rank), step=1)
    loss = torch.tensor([m["loss"]], dtype=torch.float64)
    torch.distributed.all_reduce(loss)
    final = fsdp.full_state(learner.model)
    if rank == 0:
        save_file({k: v.clone() for k, v in final.items()}, f"{out}/step.safetensors")
        save_file({"loss": loss / WORLD}, f"{out}/loss.safetensors")
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("case", list(ONE_RANK_PASSES))
def test_a_pass_one_ranks_rows_ask_for_runs_on_every_rank(
    model, rollouts, char_tokenizer, tmp_path: Path, case: str
):
    """A sharded forward is a collective: a no-grad pass that only one rank's rollouts need
    runs on every rank (else the ranks' all-gathers pair up out of step: a timeout or wrong
    weights), and the step equals the unsharded one."""
    import dataclasses

    from safetensors.torch import load_file

    from replayrl.run.distributed.ddp import free_port

    overrides, even = ONE_RANK_PASSES[case]
    pad = char_tokenizer.pad_token_id
    # rank 0 takes the even rows (of version `even`), rank 1 the odd ones (the other one)
    batch = [
        dataclasses.replace(r, policy_version=even if i % 2 == 0 else 1 - even)
        for i, r in enumerate(rollouts[:12])
    ]
    args = (free_port(), model, pad, batch, overrides, str(tmp_path))
    mp.spawn(_one_rank_pass, args=args, nprocs=WORLD, join=True)
    ref = Learner(copy.deepcopy(model), pad, load_config(None, [*REFERENCE, *overrides]))
    ref.fuse_behaviour_recompute = False
    ref.version = 1
    m = ref.train_step(batch[0::WORLD] + batch[1::WORLD], np.random.default_rng(0), step=1)
    if case == "refresh":
        assert m["behaviour_refreshed"] == 6  # rank 0's half only
    got = load_file(str(tmp_path / "loss.safetensors"))["loss"]
    assert abs(float(got) - m["loss"]) < 1e-6, (float(got), m["loss"])
    step = load_file(str(tmp_path / "step.safetensors"))
    moved = 0.0
    for k, v in ref.model.state_dict().items():
        torch.testing.assert_close(step[k], v, atol=1e-6, rtol=0)
        moved = max(moved, float((v - model.state_dict()[k]).abs().max()))
    assert moved > 5e-5  # the step changed the weights: the comparison is not vacuous


def _token_budget_rank(
    rank: int, port: int, model, pad_id: int, batch, budget: list[str], out: str
) -> None:
    """Rank `rank` under a token budget: its rows pack into its own number of micro-batches
    (saved), and the step must still pair every rank's collectives."""
    from safetensors.torch import save_file

    from replayrl.run.distributed import fsdp
    from replayrl.run.distributed.ddp import init_group

    torch.set_num_threads(1)
    init_group(rank, WORLD, "127.0.0.1", port, timeout_s=GROUP_TIMEOUT_S)
    lean_calls = _lean_only()
    learner = Learner(copy.deepcopy(model), pad_id, load_config(None, [*OVERRIDES, *budget]))
    fsdp.shard_learner(learner, WORLD)
    half = batch[rank::WORLD]
    lengths = [r.prompt_ids.numel() + r.completion_ids.numel() for r in half]
    # the micro-batches of the update (rows in shared-prompt order, as `_update` cuts them)
    order = learner.assembly.shared_rows(half, range(len(half)))
    parts = torch.tensor([len(learner.assembly.micro(order, lengths))])
    counts = [torch.zeros_like(parts) for _ in range(WORLD)]
    torch.distributed.all_gather(counts, parts)
    m = learner.train_step(half, np.random.default_rng(rank), step=0)
    loss = torch.tensor([m["loss"]], dtype=torch.float64)
    torch.distributed.all_reduce(loss)
    final = fsdp.full_state(learner.model)
    assert lean_calls[0] > 0
    if rank == 0:
        save_file({k: v.clone() for k, v in final.items()}, f"{out}/step.safetensors")
        save_file({"loss": loss / WORLD, "parts": torch.cat(counts)}, f"{out}/loss.safetensors")
    torch.distributed.destroy_process_group()


def _uneven_split(rollouts: list[Rollout]) -> tuple[list[Rollout], list[str]]:
    """A batch whose ranks pack different numbers of micro-batches, and the token budget that
    does it: rank 0 (even rows) gets the 6 longest rows, rank 1 (odd rows) the 6 shortest,
    and the budget (padded tokens per micro-batch: rows x longest row) fits two short rows
    but not two long ones."""
    by_length = sorted(rollouts, key=lambda r: r.prompt_ids.numel() + r.completion_ids.numel())
    batch = [r for pair in zip(by_length[-6:], by_length[:6], strict=True) for r in pair]
    size = [r.prompt_ids.numel() + r.completion_ids.numel() for r in by_length]
    assert max(size[:6]) < min(size[-6:])
    budget = [f"train.max_tokens_per_micro_batch={2 * max(size[:6])}", "train.micro_batch_size=2"]
    return batch, budget


def test_a_sharded_step_under_a_token_budget_equals_the_unsharded_one(
    model, rollouts, char_tokenizer, tmp_path: Path
):
    """Under `train.max_tokens_per_micro_batch` each rank packs its rows into its own number
    of micro-batches; the rank with fewer runs idle ones (every sharded pass is a
    collective), and the step equals the unsharded one."""
    from safetensors.torch import load_file

    from replayrl.run.distributed.ddp import free_port

    pad = char_tokenizer.pad_token_id
    batch, budget = _uneven_split(rollouts)
    mp.spawn(
        _token_budget_rank,
        args=(free_port(), model, pad, batch, budget, str(tmp_path)),
        nprocs=WORLD,
        join=True,
    )
    got = load_file(str(tmp_path / "loss.safetensors"))
    parts = got["parts"].tolist()
    assert parts == [6, 3], parts  # the ranks packed different numbers of micro-batches
    ref = Learner(copy.deepcopy(model), pad, load_config(None, [*REFERENCE, *budget]))
    m = ref.train_step(batch[0::WORLD] + batch[1::WORLD], np.random.default_rng(0), step=0)
    assert abs(float(got["loss"]) - m["loss"]) < 1e-6, (float(got["loss"]), m["loss"])
    step = load_file(str(tmp_path / "step.safetensors"))
    moved = 0.0
    for k, v in ref.model.state_dict().items():
        torch.testing.assert_close(step[k], v, atol=1e-6, rtol=0)
        moved = max(moved, float((v - model.state_dict()[k]).abs().max()))
    assert moved > 5e-5


# PPO: per-token GAE advantages from the critic (rewards alternate 0 / 1 in these rollouts)
PPO = ["algorithm.advantage=gae", "algorithm.loss_type=grpo_clip", "critic.lr=1e-4"]


def _policy_and_critic(learner: Learner) -> dict[str, torch.Tensor]:
    """An unsharded PPO learner's weights: the policy's, then the critic's as `critic.*`."""
    assert learner.critic is not None
    critic = {f"critic.{k}": v for k, v in learner.critic.state_dict().items()}
    return {**learner.model.state_dict(), **critic}


def _ppo_learner(model, pad_id: int, cfg) -> Learner:
    from replayrl.learner.critic import ValueModel

    critic = ValueModel(copy.deepcopy(unwrap_model(model).model), model.config.hidden_size)
    torch.nn.init.normal_(critic.head.weight, std=0.1, generator=torch.Generator().manual_seed(3))
    return Learner(copy.deepcopy(model), pad_id, cfg, critic=critic)


def _ppo_rank(rank: int, port: int, model, pad_id: int, batches, out: str) -> None:
    """A sharded PPO learner: the critic is sharded like the policy; two steps, then the
    second step again from the gathered state (a whole-state resume) and from this rank's
    DCP shards (a sharded checkpoint's resume)."""
    from safetensors.torch import save_file
    from torch.distributed.tensor import DTensor

    from replayrl.run.distributed import fsdp
    from replayrl.run.distributed.ddp import init_group, leave_group
    from replayrl.run.distributed.fsdp_learner import (
        load_learner_shards,
        save_learner_shards,
        sharded_learner_state,
    )
    from replayrl.storage.sharded_checkpoint import save_sharded

    torch.set_num_threads(1)
    init_group(rank, WORLD, "127.0.0.1", port)
    cfg = load_config(None, [*OVERRIDES, *PPO])
    half = [b[rank::WORLD] for b in batches]

    def sharded(policy, state=None) -> Learner:
        learner = _ppo_learner(policy, pad_id, cfg)
        if state is not None:
            learner.load_state_dict(state)
        fsdp.shard_learner(learner, WORLD)
        return learner

    def both(learner: Learner) -> dict[str, torch.Tensor]:
        assert learner.critic is not None
        critic = {f"critic.{k}": v for k, v in fsdp.full_state(learner.critic).items()}
        return {**fsdp.full_state(learner.model), **critic}

    learner = sharded(model)
    assert learner.critic is not None
    params = dict(learner.critic.named_parameters())
    assert all(isinstance(p, DTensor) for p in params.values())  # nothing replicated
    embed = params["backbone.embed_tokens.weight"]
    assert 0 < embed.to_local().shape[0] < embed.shape[0]  # this rank's part only
    losses = [learner.train_step(half[0], np.random.default_rng(rank), step=0)["value_loss"]]
    policy1 = copy.deepcopy(model)
    policy1.load_state_dict(fsdp.full_state(learner.model))
    whole = fsdp.full_learner_state(learner)  # what a checkpoint of whole state keeps
    partial = sharded_learner_state(learner)  # a sharded checkpoint's state file ...
    assert "critic" not in partial and partial["optimizer"] is None
    save_learner_shards(learner, Path(out) / "shards")  # ... and its shards
    # a sharded checkpoint written before critics were sharded: the critic whole in the
    # state file, the DCP shards without it
    old = {**partial, "critic": whole["critic"], "critic_optimizer": whole["critic_optimizer"]}
    save_sharded(Path(out) / "old", learner.model, learner.optimizer)
    losses.append(learner.train_step(half[1], np.random.default_rng(rank), step=1)["value_loss"])
    final = both(learner)
    # each resume loads its own copy, as from disk (a learner trains the tensors it loads)
    for how, resumed in (
        ("whole", lambda: sharded(policy1, copy.deepcopy(whole))),
        ("shards", lambda: sharded(model, copy.deepcopy(partial))),
        ("old", lambda: sharded(model, copy.deepcopy(old))),
    ):
        again = resumed()
        if how != "whole":
            load_learner_shards(again, Path(out) / how)
        again.train_step(half[1], np.random.default_rng(rank), step=1)
        for k, v in both(again).items():
            assert torch.equal(v, final[k]), (how, rank, k)  # the resume is exact
    value_loss = torch.tensor(losses, dtype=torch.float64)
    torch.distributed.all_reduce(value_loss)  # each rank's loss is over its own rows
    value_loss /= WORLD
    if rank == 0:
        save_file({k: v.clone() for k, v in final.items()}, f"{out}/final.safetensors")
        save_file({"value_loss": value_loss}, f"{out}/loss.safetensors")
    leave_group()


def test_a_sharded_ppo_step_shards_the_critic_equals_the_unsharded_one_and_resumes(
    model, rollouts, char_tokenizer, tmp_path: Path
):
    """PPO's critic under train.sharding=fsdp: sharded over the ranks like the policy (each
    rank holds its part of every critic tensor), two steps equal the unsharded learner's
    on the whole batch (policy and critic weights, value loss), and a resume from whole
    state or from the ranks' DCP shards takes the same second step."""
    from safetensors.torch import load_file

    from replayrl.run.distributed.ddp import free_port

    pad = char_tokenizer.pad_token_id
    batches = [rollouts[:12], rollouts[12:]]
    mp.spawn(
        _ppo_rank, args=(free_port(), model, pad, batches, str(tmp_path)), nprocs=WORLD, join=True
    )
    ref = _ppo_learner(model, pad, load_config(None, [*REFERENCE, *PPO]))
    whole = [b[0::WORLD] + b[1::WORLD] for b in batches]
    losses = [
        ref.train_step(whole[s], np.random.default_rng(0), step=s)["value_loss"] for s in (0, 1)
    ]
    got = load_file(str(tmp_path / "loss.safetensors"))
    assert min(losses) > 1e-4  # the critic has something to learn
    torch.testing.assert_close(
        got["value_loss"], torch.tensor(losses, dtype=torch.float64), atol=1e-6, rtol=0
    )
    final = load_file(str(tmp_path / "final.safetensors"))
    expected = _policy_and_critic(ref)
    assert set(final) == set(expected)
    start = _ppo_learner(model, pad, load_config(None, [*REFERENCE, *PPO])).critic
    assert start is not None
    for k, v in start.state_dict().items():  # the critic trained: every tensor moved
        assert not torch.equal(final[f"critic.{k}"], v), k
    # the policy too: its GAE advantages are whitened over both ranks' rows, as over the batch
    for k, v in final.items():
        torch.testing.assert_close(v, expected[k], atol=1e-6, rtol=0, msg=k)


def _ppo_replica_rank(rank: int, port: int, model, pad_id: int, batches, out: str) -> None:
    """A data-parallel PPO learner (whole replicas, gradients averaged): two steps."""
    from safetensors.torch import save_file

    from replayrl.run.distributed.ddp import data_parallel_ranks, init_group, leave_group

    torch.set_num_threads(1)
    init_group(rank, WORLD, "127.0.0.1", port)
    learner = _ppo_learner(model, pad_id, load_config(None, [*OVERRIDES, *PPO]))
    learner.join(data_parallel_ranks(WORLD))
    for s, batch in enumerate(batches):
        learner.train_step(batch[rank::WORLD], np.random.default_rng(rank), step=s)
    assert learner.critic is not None
    if rank == 0:
        critic = {f"critic.{k}": v for k, v in learner.critic.state_dict().items()}
        weights = {**learner.model.state_dict(), **critic}
        save_file({k: v.detach().clone() for k, v in weights.items()}, f"{out}/final.safetensors")
    leave_group()


def test_data_parallel_ppo_whitens_over_both_replicas_and_equals_the_whole_batch_step(
    model, rollouts, char_tokenizer, tmp_path: Path
):
    """Data-parallel PPO (`workers.learners=2` without sharding): the GAE advantages are
    whitened over both replicas' rows, so two steps equal one learner's on the whole batch."""
    from safetensors.torch import load_file

    from replayrl.run.distributed.ddp import free_port

    pad = char_tokenizer.pad_token_id
    batches = [rollouts[:12], rollouts[12:]]
    mp.spawn(
        _ppo_replica_rank,
        args=(free_port(), model, pad, batches, str(tmp_path)),
        nprocs=WORLD,
        join=True,
    )
    ref = _ppo_learner(model, pad, load_config(None, [*REFERENCE, *PPO]))
    for s, b in enumerate(batches):
        ref.train_step(b[0::WORLD] + b[1::WORLD], np.random.default_rng(0), step=s)
    expected = _policy_and_critic(ref)
    final = load_file(str(tmp_path / "final.safetensors"))
    assert set(final) == set(expected)
    for k, v in final.items():
        torch.testing.assert_close(v, expected[k], atol=1e-6, rtol=0, msg=k)


def _ppo_budget_rank(rank: int, port: int, model, pad_id: int, batch, budget, out: str) -> None:
    """Sharded PPO under a token budget, the ranks packing different numbers of micro-batches:
    a critic warm-up step (the policy frozen), then a full step."""
    from safetensors.torch import save_file

    from replayrl.run.distributed import fsdp
    from replayrl.run.distributed.ddp import init_group, leave_group

    torch.set_num_threads(1)
    init_group(rank, WORLD, "127.0.0.1", port, timeout_s=120)  # a mismatch fails, not hangs
    learner = _ppo_learner(model, pad_id, load_config(None, [*OVERRIDES, *PPO, *budget]))
    fsdp.shard_learner(learner, WORLD)
    half = batch[rank::WORLD]
    learner.train_step(half, np.random.default_rng(rank), step=0, policy_frozen=True)
    learner.train_step(half, np.random.default_rng(rank), step=1)
    assert learner.critic is not None
    critic = {f"critic.{k}": v for k, v in fsdp.full_state(learner.critic).items()}
    weights = {**fsdp.full_state(learner.model), **critic}
    if rank == 0:
        save_file({k: v.clone() for k, v in weights.items()}, f"{out}/final.safetensors")
    leave_group()


def test_sharded_ppo_ranks_with_fewer_micro_batches_join_the_critics_passes(
    model, rollouts, char_tokenizer, tmp_path: Path
):
    """The critic's passes are collectives once it is sharded: a rank with fewer micro-batches
    (a token budget) runs idle critic passes too, in a critic warm-up step and a full one,
    and both steps equal the unsharded learner's."""
    from safetensors.torch import load_file

    from replayrl.run.distributed.ddp import free_port

    pad = char_tokenizer.pad_token_id
    batch, budget = _uneven_split(rollouts)
    mp.spawn(
        _ppo_budget_rank,
        args=(free_port(), model, pad, batch, budget, str(tmp_path)),
        nprocs=WORLD,
        join=True,
    )
    ref = _ppo_learner(model, pad, load_config(None, [*REFERENCE, *PPO, *budget]))
    whole = batch[0::WORLD] + batch[1::WORLD]
    ref.train_step(whole, np.random.default_rng(0), step=0, policy_frozen=True)
    ref.train_step(whole, np.random.default_rng(0), step=1)
    expected = _policy_and_critic(ref)
    final = load_file(str(tmp_path / "final.safetensors"))
    assert set(final) == set(expected)
    # two steps: twice the one step's allowance for the ranks' summation order (OVERRIDES)
    for k, v in final.items():
        torch.testing.assert_close(v, expected[k], atol=2e-6, rtol=0, msg=k)
