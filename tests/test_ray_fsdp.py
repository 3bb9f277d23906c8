"""Sharded learners on Ray (`train.sharding: fsdp`, run/distributed/fsdp_learner.py): a sharded
step over two learner ranks (this process as rank 0, a follower actor as rank 1) equals the
single-learner step, the generators receive full tensors, and a sharded run evaluates,
checkpoints a full policy with every rank's AdamW shards, and resumes with them
(tests/test_ray_fsdp_checkpoint.py: the shards themselves, and the resumed step's equality)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from replayrl.config.schema import ModelConfig, config_to_yaml, load_config
from replayrl.models.loading import build_tiny_model
from replayrl.rollout.generation import HFGenerator, SamplingParams
from tiny import TINY_RUN, as_rollouts

pytestmark = pytest.mark.ray

# two decoder layers: two layer shard groups besides the root
LAYERS = ["model.tiny.num_layers=2"]
SHARDED = [
    "runtime=ray",
    "workers.learners=2",
    "train.sharding=fsdp",
    "method.name=replay",
    "buffer.capacity=32",
    "train.batch_size=16",
    "train.threads=1",
    "workers.max_staleness=3",
    "ray.num_cpus=2",
    "ray.generator_num_cpus=0.5",
    "ray.learner_num_cpus=0.5",
]


def quiet(_: str) -> None:
    pass


def sharded_adam(ckpt: Path) -> dict[str, dict[str, torch.Tensor]]:
    """A checkpoint's AdamW state by parameter name, read whole from every rank's DCP
    shards (`learner_shards/`) in this one process."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    folder = str(ckpt / "learner_shards")
    keys = FileSystemReader(folder).read_metadata().state_dict_metadata
    state = _load_state_dict_from_keys(
        {k for k in keys if k.startswith("optim.state.")}, checkpoint_id=folder
    )
    return state["optim"]["state"]


@pytest.fixture(scope="module")
def local_ray():
    import ray

    # a new local instance even where another one runs on the machine (RayDriver joins this)
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield ray
    finally:
        ray.shutdown()


def test_a_sharded_ray_step_equals_the_single_learner_step_and_publishes_full_weights(
    char_tokenizer, local_ray, tmp_path: Path
) -> None:
    import torch.distributed as dist

    from replayrl.learner.learner import Learner
    from replayrl.run.components import build_learner
    from replayrl.run.distributed.ddp import free_port, init_group
    from replayrl.run.distributed.fsdp_learner import FullWeightsPool, ShardedLeader, join_learners
    from replayrl.run.distributed.ray_runtime import (
        BufferActor,
        FollowerActor,
        RayGeneratorPool,
        _per_rank,
    )
    from replayrl.run.distributed.weights import load_trainable

    ray = local_ray
    cfg = load_config(None, [*TINY_RUN, *LAYERS, *SHARDED, "train.lr=1e-4"])
    tiny = ModelConfig.model_validate({"tiny": {"num_layers": 2, "hidden_size": 32}})
    model = build_tiny_model(tiny, vocab_size=len(char_tokenizer), seed=0)
    folder = tmp_path / "policy"
    model.save_pretrained(folder)
    char_tokenizer.save_pretrained(folder)
    gen = HFGenerator(copy.deepcopy(model).eval(), char_tokenizer)
    torch.manual_seed(5)
    samples = gen.generate(["1+2=", "12+34=", "7+80=", "5+5="], 4, SamplingParams(max_new_tokens=5))
    rollouts = as_rollouts(samples, np.random.default_rng(0).normal(size=16).tolist())
    halves = [rollouts[0::2], rollouts[1::2]]

    follower = ray.remote(num_cpus=0.5)(FollowerActor).remote(
        config_to_yaml(cfg), 1, 2, str(folder)
    )
    shard = ray.remote(num_cpus=0.1)(BufferActor).remote("onpolicy", None, {})
    ray.get(shard.call.remote("push", halves[1]))
    learner = build_learner(
        _per_rank(cfg, 2), copy.deepcopy(model), char_tokenizer.pad_token_id, ""
    )
    port = free_port()
    joined = follower.join.remote("127.0.0.1", port)
    init_group(0, 2, "127.0.0.1", port)
    try:
        join_learners(learner, 2)
        ray.get(joined)
        stepped = follower.train_step.remote(shard, 8, 0, 1)
        learner.train_step(halves[0], np.random.default_rng(0), step=1)
        assert ray.get(stepped)["rollouts"] == 8  # the follower trained on its shard's half
        pool = FullWeightsPool(
            RayGeneratorPool(cfg, quiet), ShardedLeader(learner, [follower], ray)
        )
        pool.publish(learner.model, 1)
        received = ray.get(pool.weights)  # what every generator's `generate` call is handed
    finally:
        dist.destroy_process_group()
    assert pool.version == 1  # the wrapped pool's own state, read through the wrapper

    # the single learner on the path sharded learners take too (the chunked head)
    ref_cfg = load_config(None, [*TINY_RUN, *LAYERS, "train.lr=1e-4"])
    ref = Learner(copy.deepcopy(model), char_tokenizer.pad_token_id, ref_cfg)
    ref.train_step(halves[0] + halves[1], np.random.default_rng(0), step=1)
    expected = {n: p.detach() for n, p in ref.model.named_parameters()}
    assert set(received) == set(expected)
    moved = 0.0
    for name, tensor in received.items():
        # plain full tensors, not rank 0's shard (a DTensor's .shape is the global one)
        assert type(tensor) is torch.Tensor, (name, type(tensor))
        assert tensor.shape == expected[name].shape, name
        torch.testing.assert_close(tensor, expected[name], atol=1e-6, rtol=0)
        moved = max(moved, float((tensor - model.state_dict()[name]).abs().max()))
    assert moved > 5e-5  # the step changed the weights: the comparison is not vacuous
    generator_model = copy.deepcopy(model)
    load_trainable(generator_model, received)  # a generator loads them as they are


def test_a_sharded_ray_run_evaluates_checkpoints_full_state_and_resumes(
    local_ray, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    from replayrl.cli.main import main
    from replayrl.run.metrics import read_metrics
    from replayrl.run.start import resume, train
    from replayrl.storage.checkpoint import latest_checkpoint, load_state

    # weights reach the generators every second step: the last step of the resumed run is
    # evaluated off that grid (its weights sent to generator 0 alone)
    cfg = load_config(
        None,
        [
            *TINY_RUN,
            *LAYERS,
            *SHARDED,
            "train.steps=2",
            "workers.sync_every=2",
            f"logging.run_dir={tmp_path}",
        ],
    )
    summary = train(cfg, log=quiet)
    run = tmp_path / "demo"

    def evals() -> dict[int, dict]:
        return {m["step"]: m for m in read_metrics(run / "metrics.jsonl") if "eval/accuracy" in m}

    def agrees_with_replayrl_eval(ckpt: Path, step: int) -> None:
        """The run's evaluation at `step` was of the weights the learners held: `replayrl
        eval` of the checkpoint's policy scores the same."""
        out = tmp_path / f"eval{step}.json"
        args = ["eval", "--model", str(ckpt / "policy"), "--run", str(run), "--out", str(out)]
        assert main(args) == 0
        again, logged = json.loads(out.read_text()), evals()[step]
        assert again["num_prompts"] == summary["num_eval_prompts"]
        for key in ("eval/accuracy", "eval/completion_length"):
            assert again[key] == logged[key], (step, key)

    assert summary["steps"] == 2
    assert summary["accounting"]["trainers"] == 2
    assert sorted(evals()) == [0, 2]  # the starting policy and the last one
    # evaluated by a generator actor, never by a gathered copy on a learner's device
    assert summary["evaluations_on_generators"] == 2
    ckpt = latest_checkpoint(run)
    assert ckpt is not None and ckpt.name == "step_000002"
    agrees_with_replayrl_eval(ckpt, 2)
    policy = AutoModelForCausalLM.from_pretrained(ckpt / "policy")
    assert policy.config.num_hidden_layers == 2
    params = dict(policy.named_parameters())
    assert load_state(ckpt)["learner"]["optimizer"] is None  # not gathered: DCP shards
    adam = sharded_adam(ckpt)
    assert set(adam) == set(params)
    for name, entries in adam.items():
        assert entries["exp_avg"].shape == params[name].shape, name  # every rank's shards
        assert float(entries["step"]) == 2.0

    resumed = resume(run, ["train.steps=3"], log=quiet)
    assert resumed["steps"] == 3
    assert resumed["evaluations_on_generators"] == 1  # the last step's, off the sync grid
    agrees_with_replayrl_eval(latest_checkpoint(run), 3)
    adam = sharded_adam(latest_checkpoint(run))
    # the resumed AdamW went on from the checkpoint's state: its step count is 3, not 1
    assert {float(s["step"]) for s in adam.values()} == {3.0}


def test_a_sharded_lora_ray_run_checkpoints_the_adapters_and_resumes(
    local_ray, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from replayrl.models.loading import is_adapter_folder
    from replayrl.run.start import resume, train
    from replayrl.storage.checkpoint import latest_checkpoint

    reward = tmp_path / "length.py"  # varies within a group, so advantages are not all zero
    reward.write_text(
        "def length(prompts, completions, **kw):\n    return [len(c) for c in completions]\n"
    )
    lora = ["model.lora.enabled=true", "model.lora.r=4", "model.lora.alpha=8"]
    cfg = load_config(
        None,
        [
            *TINY_RUN,
            *LAYERS,
            *SHARDED,
            *lora,
            f"rewards=[{{name: '{reward}:length'}}]",
            "train.lr=2e-2",
            "train.steps=2",
            f"logging.run_dir={tmp_path}",
        ],
    )
    summary = train(cfg, log=quiet)
    assert summary["steps"] == 2 and summary["accounting"]["trainers"] == 2
    run = tmp_path / "demo"
    ckpt = latest_checkpoint(run)
    assert ckpt is not None and ckpt.name == "step_000002"
    # what an unsharded LoRA learner writes: the adapter folder, AdamW over the adapters
    assert is_adapter_folder(ckpt / "policy")
    adapters = load_file(str(ckpt / "policy" / "adapter_model.safetensors"))
    assert adapters and all(".lora_" in n for n in adapters)
    assert any(t.abs().max() > 0 for n, t in adapters.items() if "lora_B" in n)  # it trained
    adam = sharded_adam(ckpt)
    assert len(adam) == len(adapters)  # q and v of 2 layers, A and B each
    shapes = sorted(tuple(t.shape) for t in adapters.values())
    assert sorted(tuple(s["exp_avg"].shape) for s in adam.values()) == shapes
    assert {float(s["step"]) for s in adam.values()} == {2.0}

    resumed = resume(run, ["train.steps=3"], log=quiet)
    assert resumed["steps"] == 3
    again = latest_checkpoint(run)
    adam = sharded_adam(again)
    # the adapter folder loaded, sharded again, and AdamW went on from its state
    assert {float(s["step"]) for s in adam.values()} == {3.0}
    moved = load_file(str(again / "policy" / "adapter_model.safetensors"))
    assert set(moved) == set(adapters)
    assert any(not torch.equal(moved[n], adapters[n]) for n in adapters)
