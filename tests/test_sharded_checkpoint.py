"""Sharded checkpoints (storage/sharded_checkpoint.py) on CPU with gloo: 2 ranks each write
their shards; a resume at 2 ranks equals the uninterrupted run exactly (RNG states included),
and one unsharded learner loads the same folder and takes the same next step."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from replayrl.config.schema import ModelConfig, load_config
from replayrl.learner.learner import Learner
from replayrl.models.loading import build_tiny_model
from replayrl.rollout.generation import HFGenerator, SamplingParams
from tiny import as_rollouts

WORLD = 2
OVERRIDES = ["rollout.prompts_per_step=3", "rollout.num_generations=4", "train.lr=1e-4"]


@pytest.fixture(scope="module")
def model(char_tokenizer):
    cfg = ModelConfig.model_validate({"tiny": {"num_layers": 2, "hidden_size": 32}})
    return build_tiny_model(cfg, vocab_size=len(char_tokenizer), seed=0)


@pytest.fixture(scope="module")
def rollouts(model, char_tokenizer):
    gen = HFGenerator(model.eval(), char_tokenizer)
    torch.manual_seed(5)
    prompts = ["1+2=", "12+34=", "7+80=", "5+5=", "40+2=", "9+19="]
    samples = gen.generate(prompts, 4, SamplingParams(max_new_tokens=5))
    return as_rollouts(samples, np.random.default_rng(0).normal(size=len(samples)).tolist())


def _rank(rank: int, port: int, model, pad_id: int, batches, out: str) -> None:
    from safetensors.torch import save_file

    from replayrl.run.distributed import fsdp
    from replayrl.run.distributed.ddp import init_group, leave_group
    from replayrl.storage.sharded_checkpoint import gathered_state, load_sharded, save_sharded

    torch.set_num_threads(1)
    init_group(rank, WORLD, "127.0.0.1", port, timeout_s=300)
    cfg = load_config(None, OVERRIDES)
    half = [b[rank::WORLD] for b in batches]

    def sharded() -> Learner:
        learner = Learner(copy.deepcopy(model), pad_id, cfg)
        fsdp.shard_learner(learner, WORLD)
        return learner

    ckpt = Path(out) / "ckpt"
    learner = sharded()
    learner.train_step(half[0], np.random.default_rng(rank), step=0)
    torch.manual_seed(100 + rank)  # each rank's generator in its own state
    save_sharded(ckpt, learner.model, learner.optimizer)
    assert (ckpt / f"__{rank}_0.distcp").is_file()  # this rank wrote its own shards
    drawn = torch.rand(4)
    step1 = gathered_state(learner.model)
    learner.train_step(half[1], np.random.default_rng(rank), step=1)
    final = fsdp.full_state(learner.model)

    resumed = sharded()
    assert load_sharded(ckpt, resumed.model, resumed.optimizer)
    assert torch.equal(torch.rand(4), drawn)  # this rank's RNG states came back
    resumed.train_step(half[1], np.random.default_rng(rank), step=1)
    for k, v in fsdp.full_state(resumed.model).items():
        assert torch.equal(v, final[k]), (rank, k)  # the resume is exact
    if rank == 0:
        save_file(step1, f"{out}/step1.safetensors")
        save_file({k: v.clone() for k, v in final.items()}, f"{out}/final.safetensors")
    else:
        assert step1 == {}  # gathered to rank 0 only
    leave_group()


def test_a_sharded_checkpoint_resumes_exactly_and_loads_at_one_rank(
    model, rollouts, char_tokenizer, tmp_path: Path
):
    from safetensors.torch import load_file

    from replayrl.run.distributed.ddp import free_port
    from replayrl.storage.sharded_checkpoint import load_sharded

    pad = char_tokenizer.pad_token_id
    batches = [rollouts[:12], rollouts[12:]]
    mp.spawn(_rank, args=(free_port(), model, pad, batches, str(tmp_path)), nprocs=WORLD, join=True)
    step1 = load_file(str(tmp_path / "step1.safetensors"))
    final = load_file(str(tmp_path / "final.safetensors"))
    assert set(step1) == set(model.state_dict())
    # one unsharded learner (no process group) loads the 2-rank folder
    one = Learner(copy.deepcopy(model), pad, load_config(None, OVERRIDES))
    assert not load_sharded(tmp_path / "ckpt", one.model, one.optimizer, restore_rng=False)
    for k, v in one.model.state_dict().items():
        assert torch.equal(v, step1[k]), k
    assert all(float(one.optimizer.state[p]["step"]) == 1 for p in one.model.parameters())
    whole = batches[1][0::WORLD] + batches[1][1::WORLD]
    one.train_step(whole, np.random.default_rng(0), step=1)
    moved = 0.0
    for k, v in one.model.state_dict().items():
        torch.testing.assert_close(v, final[k], atol=1e-6, rtol=0)
        moved = max(moved, float((v - step1[k]).abs().max()))
    assert moved > 5e-5  # the step after the load moved the weights
